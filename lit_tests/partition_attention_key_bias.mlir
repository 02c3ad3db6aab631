// RUN: autosp-opt %s --split-input-file --autosp-partition-attention=sp-size=2 | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention='sp-size=4 strategy=ring' | FileCheck %s --check-prefix=RING
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention='sp-size=4 strategy=hybrid ulysses-degree=2' \
// RUN:   | FileCheck %s --check-prefix=HYB

// Attention with a key bias (autosp-fuse-attention's `torch.autosp.key_bias_attention`:
// ALiBi, [1, H, 1, S], computed whole on every rank): partitioned as SDPA under Ulysses, the
// bias cut to this rank's heads by `autosp.local_heads` (no communication); the keys stay
// whole inside Ulysses attention, so the bias keeps every key. A ring takes the whole bias as
// its `key_bias` operand (each pair of blocks adds its keys' slice); a hybrid mesh cuts it to
// the Ulysses heads first.
// CHECK-LABEL: func.func @key_bias_heads
// CHECK-SAME: %[[BIAS:[^:]*]]: !torch.vtensor<[1,4,1,?],f32>
// CHECK: %[[Q:.*]] = "autosp.all_to_all"
// CHECK: %[[LOCAL:.*]] = "autosp.local_heads"(%[[BIAS]]) {dim = 1 : i64, group = "sp", heads = 4 : i64} : (!torch.vtensor<[1,4,1,?],f32>) -> !torch.vtensor<[1,2,1,?],f32>
// CHECK: torch.operator "torch.autosp.key_bias_attention"(%[[Q]], {{.*}}, %[[LOCAL]]) : ({{.*}}) -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: "autosp.all_to_all"
// RING-LABEL: func.func @key_bias_heads
// RING-SAME: %[[BIAS:[^:]*]]: !torch.vtensor<[1,4,1,?],f32>
// RING: "autosp.ring_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[BIAS]]) {group = "sp:ring", {{.*}}operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 1>{{.*}}} : ({{.*}}, !torch.int, !torch.vtensor<[1,4,1,?],f32>) -> !torch.vtensor<[2,4,?,8],f32>
// HYB-LABEL: func.func @key_bias_heads
// HYB: %[[LOCAL:.*]] = "autosp.local_heads"(%{{.*}}) {dim = 1 : i64, group = "sp:ulysses", heads = 4 : i64} : (!torch.vtensor<[1,4,1,?],f32>) -> !torch.vtensor<[1,2,1,?],f32>
// HYB: "autosp.ring_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[LOCAL]]) {group = "sp:ring", {{.*}}operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 1>{{.*}}} : ({{.*}}) -> !torch.vtensor<[2,2,?,8],f32>
func.func @key_bias_heads(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                          %bias: !torch.vtensor<[1,4,1,?],f32> {autosp.parameter = "alibi"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %0 = torch.operator "torch.autosp.key_bias_attention"(%q, %q, %q, %none, %float0, %true, %none, %false, %bias) : (!torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool, !torch.vtensor<[1,4,1,?],f32>) -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}
