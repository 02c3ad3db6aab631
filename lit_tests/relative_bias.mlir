// RUN: autosp-opt %s --split-input-file --autosp-relative-bias | FileCheck %s

// T5's bias: a learned table indexed by buckets of the distance k - q (here min(|k - q|, 7)),
// [1, H, S, S] as SDPA's mask. The chain from sub(arange along the keys, arange along the
// queries) to the buckets is element-wise with constants only, so the buckets are computed
// once per distance: arange(1 - S, S) through the same ops, [2 S - 1] integers. The op
// becomes relative_bias_attention with the table and those buckets; no [S, S] is built.
// CHECK-LABEL: func.func @buckets_of_the_distance
// CHECK-SAME: %[[TABLE:[^:]*]]: !torch.vtensor<[8,4],f32>
// CHECK: %[[START:.*]] = torch.aten.sub.int %{{.*}}, %[[S:.*]] : !torch.int, !torch.int -> !torch.int
// CHECK: %[[D:.*]] = torch.aten.arange.start_step %[[START]], %[[S]], {{.*}} -> !torch.vtensor<[?],si64>
// CHECK: %[[A:.*]] = torch.aten.abs %[[D]] : !torch.vtensor<[?],si64> -> !torch.vtensor<[?],si64>
// CHECK: %[[B:.*]] = torch.aten.minimum %[[A]], %{{.*}} : !torch.vtensor<[?],si64>, !torch.vtensor<[],si64> -> !torch.vtensor<[?],si64>
// CHECK: torch.operator "torch.autosp.relative_bias_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %none{{.*}}, %[[TABLE]], %[[B]], %none{{.*}}) : {{.*}} -> !torch.vtensor<[2,4,?,8],f32>
// CHECK-NOT: scaled_dot_product_attention
func.func @buckets_of_the_distance(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                %table: !torch.vtensor<[8,4],f32> {autosp.parameter = "relative_attention_bias.weight"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %float1 = torch.constant.float 1.000000e+00
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int7 = torch.constant.int 7
  %int-1 = torch.constant.int -1
  %cpu = torch.constant.device "cpu"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %S = torch.aten.size.int %q, %int2 : !torch.vtensor<[2,4,?,8],f32>, !torch.int -> !torch.int
  %ar0 = torch.aten.arange.start_step %int0, %S, %int1, %int4, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %qp = torch.aten.unsqueeze %ar0, %int1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  %qo = torch.aten.add.Scalar %qp, %int0, %int1 : !torch.vtensor<[?,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[?,1],si64>
  %ar1 = torch.aten.arange.start_step %int0, %S, %int1, %int4, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %kp = torch.aten.unsqueeze %ar1, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %d = torch.aten.sub.Tensor %kp, %qo, %int1 : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64>, !torch.int -> !torch.vtensor<[?,?],si64>
  %a = torch.aten.abs %d : !torch.vtensor<[?,?],si64> -> !torch.vtensor<[?,?],si64>
  %cap = torch.vtensor.literal(dense<7> : tensor<si64>) : !torch.vtensor<[],si64>
  %buckets = torch.aten.minimum %a, %cap : !torch.vtensor<[?,?],si64>, !torch.vtensor<[],si64> -> !torch.vtensor<[?,?],si64>
  %e = torch.aten.embedding %table, %buckets, %int-1, %false, %false : !torch.vtensor<[8,4],f32>, !torch.vtensor<[?,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,?,4],f32>
  %perm = torch.prim.ListConstruct %int2, %int0, %int1 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %p = torch.aten.permute %e, %perm : !torch.vtensor<[?,?,4],f32>, !torch.list<int> -> !torch.vtensor<[4,?,?],f32>
  %bias = torch.aten.unsqueeze %p, %int0 : !torch.vtensor<[4,?,?],f32>, !torch.int -> !torch.vtensor<[1,4,?,?],f32>
  %o = torch.aten.scaled_dot_product_attention %q, %q, %q, %bias, %float0, %false, %float1, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[1,4,?,?],f32>, !torch.float, !torch.bool, !torch.float, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %o : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Control: the product k * q in place of the difference: not a function of k - q, so
// nothing is proven and SDPA keeps its [1, H, S, S] mask.
// CHECK-LABEL: func.func @product_of_positions
// CHECK-NOT: relative_bias_attention
// CHECK: torch.aten.scaled_dot_product_attention
func.func @product_of_positions(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                %table: !torch.vtensor<[8,4],f32> {autosp.parameter = "relative_attention_bias.weight"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %float1 = torch.constant.float 1.000000e+00
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int7 = torch.constant.int 7
  %int-1 = torch.constant.int -1
  %cpu = torch.constant.device "cpu"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %S = torch.aten.size.int %q, %int2 : !torch.vtensor<[2,4,?,8],f32>, !torch.int -> !torch.int
  %ar0 = torch.aten.arange.start_step %int0, %S, %int1, %int4, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %qp = torch.aten.unsqueeze %ar0, %int1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  %qo = torch.aten.add.Scalar %qp, %int0, %int1 : !torch.vtensor<[?,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[?,1],si64>
  %ar1 = torch.aten.arange.start_step %int0, %S, %int1, %int4, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %kp = torch.aten.unsqueeze %ar1, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %d = torch.aten.mul.Tensor %kp, %qo : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],si64>
  %a = torch.aten.abs %d : !torch.vtensor<[?,?],si64> -> !torch.vtensor<[?,?],si64>
  %cap = torch.vtensor.literal(dense<7> : tensor<si64>) : !torch.vtensor<[],si64>
  %buckets = torch.aten.minimum %a, %cap : !torch.vtensor<[?,?],si64>, !torch.vtensor<[],si64> -> !torch.vtensor<[?,?],si64>
  %e = torch.aten.embedding %table, %buckets, %int-1, %false, %false : !torch.vtensor<[8,4],f32>, !torch.vtensor<[?,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,?,4],f32>
  %perm = torch.prim.ListConstruct %int2, %int0, %int1 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %p = torch.aten.permute %e, %perm : !torch.vtensor<[?,?,4],f32>, !torch.list<int> -> !torch.vtensor<[4,?,?],f32>
  %bias = torch.aten.unsqueeze %p, %int0 : !torch.vtensor<[4,?,?],f32>, !torch.int -> !torch.vtensor<[1,4,?,?],f32>
  %o = torch.aten.scaled_dot_product_attention %q, %q, %q, %bias, %float0, %false, %float1, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[1,4,?,?],f32>, !torch.float, !torch.bool, !torch.float, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %o : !torch.vtensor<[2,4,?,8],f32>
}
