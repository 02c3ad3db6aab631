// RUN: autosp-opt %s --split-input-file --autosp-partition-attention=sp-size=2 | FileCheck %s

// Attention with a key bias (autosp-fuse-attention's `torch.autosp.key_bias_attention`:
// ALiBi, [1, H, 1, S], computed whole on every rank): partitioned as SDPA under Ulysses, the
// bias cut to this rank's heads by `autosp.local_heads` (no communication); the keys stay
// whole inside Ulysses attention, so the bias keeps every key. (Ring attention refuses it:
// partition_attention_ring_invalid.mlir.)
// CHECK-LABEL: func.func @key_bias_heads
// CHECK-SAME: %[[BIAS:[^:]*]]: !torch.vtensor<[1,4,1,?],f32>
// CHECK: %[[Q:.*]] = "autosp.all_to_all"
// CHECK: %[[LOCAL:.*]] = "autosp.local_heads"(%[[BIAS]]) {dim = 1 : i64, group = "sp", heads = 4 : i64} : (!torch.vtensor<[1,4,1,?],f32>) -> !torch.vtensor<[1,2,1,?],f32>
// CHECK: torch.operator "torch.autosp.key_bias_attention"(%[[Q]], {{.*}}, %[[LOCAL]]) : ({{.*}}) -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: "autosp.all_to_all"
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
