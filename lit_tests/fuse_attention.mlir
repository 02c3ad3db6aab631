// RUN: autosp-opt %s --split-input-file --autosp-fuse-attention | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-fuse-attention --autosp-dce | FileCheck %s --check-prefix=DCE

// softmax(q @ k^T * scale + mask) @ v with torch.aten.matmul: one SDPA with the mask and
// the scale; the chain becomes dead.
// CHECK-LABEL: func.func @matmul_scale_mask
// CHECK: %[[O:.*]] = torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg2, %arg3, %{{[^,]*}}, %false{{[_0-9]*}}, %float2.500000e-01{{[_0-9]*}}, %false{{[_0-9]*}}
// CHECK: return %[[O]]
// DCE-LABEL: func.func @matmul_scale_mask
// DCE-NOT: torch.aten.softmax.int
// DCE-NOT: torch.aten.matmul
func.func @matmul_scale_mask(%arg0: !torch.vtensor<[2,4,?,16],f32>, %arg1: !torch.vtensor<[2,4,?,16],f32>, %arg2: !torch.vtensor<[2,4,?,16],f32>, %arg3: !torch.vtensor<[2,1,?,?],f32>) -> !torch.vtensor<[2,4,?,16],f32> {
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %float = torch.constant.float 2.500000e-01
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,?,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,16,?],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,16,?],f32> -> !torch.vtensor<[2,4,?,?],f32>
  %ss = torch.aten.mul.Scalar %s, %float : !torch.vtensor<[2,4,?,?],f32>, !torch.float -> !torch.vtensor<[2,4,?,?],f32>
  %sm = torch.aten.add.Tensor %ss, %arg3, %int1 : !torch.vtensor<[2,4,?,?],f32>, !torch.vtensor<[2,1,?,?],f32>, !torch.int -> !torch.vtensor<[2,4,?,?],f32>
  %p = torch.aten.softmax.int %sm, %int-1, %none : !torch.vtensor<[2,4,?,?],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,?,?],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,?,?],f32>, !torch.vtensor<[2,4,?,16],f32> -> !torch.vtensor<[2,4,?,16],f32>
  return %o : !torch.vtensor<[2,4,?,16],f32>
}

// -----

// The decomposed form torch.export produces (matmul -> expand, view, bmm, view; the key
// transposed by permute [0, 1, 3, 2]; dropout with p = 0), no mask, divided by 4: scale 0.25.
// CHECK-LABEL: func.func @bmm_decomposition
// CHECK: %[[O:.*]] = torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg2, %none{{[_0-9]*}}, %{{[^,]*}}, %false{{[_0-9]*}}, %float2.500000e-01{{[_0-9]*}}, %false{{[_0-9]*}}
// CHECK: return %[[O]]
// DCE-LABEL: func.func @bmm_decomposition
// DCE-NOT: torch.aten.bmm
func.func @bmm_decomposition(%arg0: !torch.vtensor<[2,4,16,8],f32>, %arg1: !torch.vtensor<[2,4,16,8],f32>, %arg2: !torch.vtensor<[2,4,16,8],f32>) -> !torch.vtensor<[2,4,16,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %int16 = torch.constant.int 16
  %int-1 = torch.constant.int -1
  %float0 = torch.constant.float 0.000000e+00
  %four = torch.constant.float 4.000000e+00
  %perm = torch.prim.ListConstruct %int0, %int1, %int3, %int2 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kt = torch.aten.permute %arg1, %perm : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,8,16],f32>
  %qs = torch.prim.ListConstruct %int2, %int4, %int16, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %qe = torch.aten.broadcast_to %arg0, %qs : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,8],f32>
  %q3s = torch.prim.ListConstruct %int8, %int16, %int8 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %q3 = torch.aten.view %qe, %q3s : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,16,8],f32>
  %ks = torch.prim.ListConstruct %int2, %int4, %int8, %int16 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %ke = torch.aten.broadcast_to %kt, %ks : !torch.vtensor<[2,4,8,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,8,16],f32>
  %k3s = torch.prim.ListConstruct %int8, %int8, %int16 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %k3 = torch.aten.view %ke, %k3s : !torch.vtensor<[2,4,8,16],f32>, !torch.list<int> -> !torch.vtensor<[8,8,16],f32>
  %s3 = torch.aten.bmm %q3, %k3 : !torch.vtensor<[8,16,8],f32>, !torch.vtensor<[8,8,16],f32> -> !torch.vtensor<[8,16,16],f32>
  %s4s = torch.prim.ListConstruct %int2, %int4, %int16, %int16 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %s = torch.aten.view %s3, %s4s : !torch.vtensor<[8,16,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,16],f32>
  %ss = torch.aten.div.Scalar %s, %four : !torch.vtensor<[2,4,16,16],f32>, !torch.float -> !torch.vtensor<[2,4,16,16],f32>
  %p = torch.aten._softmax %ss, %int-1, %false : !torch.vtensor<[2,4,16,16],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,4,16,16],f32>
  %pd = torch.aten.dropout %p, %float0, %true : !torch.vtensor<[2,4,16,16],f32>, !torch.float, !torch.bool -> !torch.vtensor<[2,4,16,16],f32>
  %pe = torch.aten.broadcast_to %pd, %s4s : !torch.vtensor<[2,4,16,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,16],f32>
  %p3s = torch.prim.ListConstruct %int8, %int16, %int16 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %p3 = torch.aten.view %pe, %p3s : !torch.vtensor<[2,4,16,16],f32>, !torch.list<int> -> !torch.vtensor<[8,16,16],f32>
  %ve = torch.aten.broadcast_to %arg2, %qs : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,8],f32>
  %v3 = torch.aten.view %ve, %q3s : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,16,8],f32>
  %o3 = torch.aten.bmm %p3, %v3 : !torch.vtensor<[8,16,16],f32>, !torch.vtensor<[8,16,8],f32> -> !torch.vtensor<[8,16,8],f32>
  %o = torch.aten.view %o3, %qs : !torch.vtensor<[8,16,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,8],f32>
  return %o : !torch.vtensor<[2,4,16,8],f32>
}

// -----

// The probabilities are also returned (output_attentions): not fused, nothing changes.
// CHECK-LABEL: func.func @probabilities_returned_kept
// CHECK-NOT: torch.aten.scaled_dot_product_attention
// CHECK: return
func.func @probabilities_returned_kept(%arg0: !torch.vtensor<[2,4,?,16],f32>, %arg1: !torch.vtensor<[2,4,?,16],f32>, %arg2: !torch.vtensor<[2,4,?,16],f32>) -> (!torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,?,?],f32>) {
  %none = torch.constant.none
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,?,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,16,?],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,16,?],f32> -> !torch.vtensor<[2,4,?,?],f32>
  %p = torch.aten.softmax.int %s, %int-1, %none : !torch.vtensor<[2,4,?,?],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,?,?],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,?,?],f32>, !torch.vtensor<[2,4,?,16],f32> -> !torch.vtensor<[2,4,?,16],f32>
  return %o, %p : !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,?,?],f32>
}

// -----

// Attention dropout with p > 0 in training: SDPA would draw other numbers. Not fused.
// CHECK-LABEL: func.func @dropout_kept
// CHECK-NOT: torch.aten.scaled_dot_product_attention
// CHECK: torch.aten.dropout
func.func @dropout_kept(%arg0: !torch.vtensor<[2,4,?,16],f32>, %arg1: !torch.vtensor<[2,4,?,16],f32>, %arg2: !torch.vtensor<[2,4,?,16],f32>) -> !torch.vtensor<[2,4,?,16],f32> {
  %none = torch.constant.none
  %true = torch.constant.bool true
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %float = torch.constant.float 1.000000e-01
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,?,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,16,?],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,16,?],f32> -> !torch.vtensor<[2,4,?,?],f32>
  %p = torch.aten.softmax.int %s, %int-1, %none : !torch.vtensor<[2,4,?,?],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,?,?],f32>
  %pd = torch.aten.dropout %p, %float, %true : !torch.vtensor<[2,4,?,?],f32>, !torch.float, !torch.bool -> !torch.vtensor<[2,4,?,?],f32>
  %o = torch.aten.matmul %pd, %arg2 : !torch.vtensor<[2,4,?,?],f32>, !torch.vtensor<[2,4,?,16],f32> -> !torch.vtensor<[2,4,?,16],f32>
  return %o : !torch.vtensor<[2,4,?,16],f32>
}

// -----

// The key is not transposed (q @ k with k already [B, H, D, S] from an input): SDPA takes
// k as [B, H, S, D], and nothing here proves a transpose exists. Not fused.
// CHECK-LABEL: func.func @key_not_transposed_kept
// CHECK-NOT: torch.aten.scaled_dot_product_attention
// CHECK: torch.aten.softmax.int
func.func @key_not_transposed_kept(%arg0: !torch.vtensor<[2,4,16,8],f32>, %arg1: !torch.vtensor<[2,4,8,16],f32>, %arg2: !torch.vtensor<[2,4,16,8],f32>) -> !torch.vtensor<[2,4,16,8],f32> {
  %none = torch.constant.none
  %int-1 = torch.constant.int -1
  %s = torch.aten.matmul %arg0, %arg1 : !torch.vtensor<[2,4,16,8],f32>, !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,16,16],f32>
  %p = torch.aten.softmax.int %s, %int-1, %none : !torch.vtensor<[2,4,16,16],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,16,16],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[2,4,16,8],f32> -> !torch.vtensor<[2,4,16,8],f32>
  return %o : !torch.vtensor<[2,4,16,8],f32>
}

// -----

// Softmax over the query dim (-2) is not attention over keys. Not fused.
// CHECK-LABEL: func.func @softmax_over_queries_kept
// CHECK-NOT: torch.aten.scaled_dot_product_attention
// CHECK: torch.aten.softmax.int
func.func @softmax_over_queries_kept(%arg0: !torch.vtensor<[2,4,16,8],f32>, %arg1: !torch.vtensor<[2,4,16,8],f32>, %arg2: !torch.vtensor<[2,4,16,8],f32>) -> !torch.vtensor<[2,4,16,8],f32> {
  %none = torch.constant.none
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-2 = torch.constant.int -2
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,16,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,16],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,16,8],f32>, !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,16,16],f32>
  %p = torch.aten.softmax.int %s, %int-2, %none : !torch.vtensor<[2,4,16,16],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,16,16],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[2,4,16,8],f32> -> !torch.vtensor<[2,4,16,8],f32>
  return %o : !torch.vtensor<[2,4,16,8],f32>
}

// -----

// scores.masked_fill(cond, finfo.min) (nanoGPT, a tril buffer): the mask is `not cond`, and a
// row masked everywhere keeps eager's answer (the mean of the values): autosp.empty_rows = "mean".
// CHECK-LABEL: func.func @masked_fill_form
// CHECK: %[[M:.*]] = torch.aten.logical_not %arg3
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg2, %[[M]], %{{[^,]*}}, %false{{[_0-9]*}}, %float1.000000e00{{[_0-9]*}}, %false{{[_0-9]*}} {autosp.empty_rows = "mean"}
func.func @masked_fill_form(%arg0: !torch.vtensor<[2,4,16,8],f32>, %arg1: !torch.vtensor<[2,4,16,8],f32>, %arg2: !torch.vtensor<[2,4,16,8],f32>, %arg3: !torch.vtensor<[1,1,16,16],i1>) -> !torch.vtensor<[2,4,16,8],f32> {
  %none = torch.constant.none
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %min = torch.constant.float -3.4028234663852886E+38
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,16,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,16],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,16,8],f32>, !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,16,16],f32>
  %sm = torch.aten.masked_fill.Scalar %s, %arg3, %min : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[1,1,16,16],i1>, !torch.float -> !torch.vtensor<[2,4,16,16],f32>
  %p = torch.aten.softmax.int %sm, %int-1, %none : !torch.vtensor<[2,4,16,16],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,16,16],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[2,4,16,8],f32> -> !torch.vtensor<[2,4,16,8],f32>
  return %o : !torch.vtensor<[2,4,16,8],f32>
}

// -----

// gpt-oss: per-head sink logits concatenated to the masked scores as one more column,
// the row maximum subtracted, softmax, the sink column dropped, @ v. One sink attention
// op: SDPA's operands and the [H] sinks (operand 8); the chain becomes dead.
// CHECK-LABEL: func.func @attention_sinks
// CHECK: %[[O:.*]] = torch.operator "torch.autosp.sink_attention"(%arg0, %arg1, %arg2, %arg3, %{{[^,]*}}, %false{{[_0-9]*}}, %float2.500000e-01{{[_0-9]*}}, %false{{[_0-9]*}}, %arg4)
// CHECK: return %[[O]]
// DCE-LABEL: func.func @attention_sinks
// DCE-NOT: torch.aten.cat
// DCE-NOT: torch.aten.softmax.int
func.func @attention_sinks(%arg0: !torch.vtensor<[2,4,8,16],f32>, %arg1: !torch.vtensor<[2,4,8,16],f32>, %arg2: !torch.vtensor<[2,4,8,16],f32>, %arg3: !torch.vtensor<[2,1,8,8],f32>, %arg4: !torch.vtensor<[4],f32>) -> !torch.vtensor<[2,4,8,16],f32> {
  %true = torch.constant.bool true
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int6 = torch.constant.int 6
  %int8 = torch.constant.int 8
  %int-1 = torch.constant.int -1
  %float = torch.constant.float 2.500000e-01
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,8,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,16,8],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,16,8],f32> -> !torch.vtensor<[2,4,8,8],f32>
  %ss = torch.aten.mul.Scalar %s, %float : !torch.vtensor<[2,4,8,8],f32>, !torch.float -> !torch.vtensor<[2,4,8,8],f32>
  %sm = torch.aten.add.Tensor %ss, %arg3, %int1 : !torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[2,1,8,8],f32>, !torch.int -> !torch.vtensor<[2,4,8,8],f32>
  %shape = torch.prim.ListConstruct %int1, %int-1, %int1, %int1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %sv = torch.aten.view %arg4, %shape : !torch.vtensor<[4],f32>, !torch.list<int> -> !torch.vtensor<[1,4,1,1],f32>
  %wide = torch.prim.ListConstruct %int2, %int-1, %int8, %int-1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %col = torch.aten.broadcast_to %sv, %wide : !torch.vtensor<[1,4,1,1],f32>, !torch.list<int> -> !torch.vtensor<[2,4,8,1],f32>
  %parts = torch.prim.ListConstruct %sm, %col : (!torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[2,4,8,1],f32>) -> !torch.list<vtensor>
  %c = torch.aten.cat %parts, %int-1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,4,8,9],f32>
  %values, %indices = torch.aten.max.dim %c, %int-1, %true : !torch.vtensor<[2,4,8,9],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,4,8,1],f32>, !torch.vtensor<[2,4,8,1],si64>
  %shifted = torch.aten.sub.Tensor %c, %values, %int1 : !torch.vtensor<[2,4,8,9],f32>, !torch.vtensor<[2,4,8,1],f32>, !torch.int -> !torch.vtensor<[2,4,8,9],f32>
  %p = torch.aten.softmax.int %shifted, %int-1, %int6 : !torch.vtensor<[2,4,8,9],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,9],f32>
  %pk = torch.aten.slice.Tensor %p, %int3, %int0, %int-1, %int1 : !torch.vtensor<[2,4,8,9],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,8],f32>
  %o = torch.aten.matmul %pk, %arg2 : !torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,8,16],f32>
  return %o : !torch.vtensor<[2,4,8,16],f32>
}

// -----

// A column concatenated to the scores that is not one value per head (here an input
// [B, H, S, 1]: it may differ per query) is not a sink: the chain is kept as written.
// CHECK-LABEL: func.func @sink_column_not_per_head_kept
// DCE-LABEL: func.func @sink_column_not_per_head_kept
// CHECK-NOT: torch.autosp.sink_attention
// CHECK: torch.aten.softmax.int
func.func @sink_column_not_per_head_kept(%arg0: !torch.vtensor<[2,4,8,16],f32>, %arg1: !torch.vtensor<[2,4,8,16],f32>, %arg2: !torch.vtensor<[2,4,8,16],f32>, %arg3: !torch.vtensor<[2,4,8,1],f32>) -> !torch.vtensor<[2,4,8,16],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,8,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,16,8],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,16,8],f32> -> !torch.vtensor<[2,4,8,8],f32>
  %parts = torch.prim.ListConstruct %s, %arg3 : (!torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[2,4,8,1],f32>) -> !torch.list<vtensor>
  %c = torch.aten.cat %parts, %int-1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,4,8,9],f32>
  %p = torch.aten.softmax.int %c, %int-1, %none : !torch.vtensor<[2,4,8,9],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,8,9],f32>
  %pk = torch.aten.slice.Tensor %p, %int3, %int0, %int-1, %int1 : !torch.vtensor<[2,4,8,9],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,8],f32>
  %o = torch.aten.matmul %pk, %arg2 : !torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,8,16],f32>
  return %o : !torch.vtensor<[2,4,8,16],f32>
}

// -----

// The sink column kept in the probabilities (the slice ends at 9 = S + 1, not before the
// sink): it would reach the values; not the sink attention form, kept.
// CHECK-LABEL: func.func @sink_column_not_dropped_kept
// CHECK-NOT: torch.autosp.sink_attention
// CHECK: torch.aten.softmax.int
func.func @sink_column_not_dropped_kept(%arg0: !torch.vtensor<[2,4,8,16],f32>, %arg1: !torch.vtensor<[2,4,8,16],f32>, %arg2: !torch.vtensor<[2,4,9,16],f32>, %arg4: !torch.vtensor<[4],f32>) -> !torch.vtensor<[2,4,8,16],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int8 = torch.constant.int 8
  %int9 = torch.constant.int 9
  %int-1 = torch.constant.int -1
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,8,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,16,8],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,16,8],f32> -> !torch.vtensor<[2,4,8,8],f32>
  %shape = torch.prim.ListConstruct %int1, %int-1, %int1, %int1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %sv = torch.aten.view %arg4, %shape : !torch.vtensor<[4],f32>, !torch.list<int> -> !torch.vtensor<[1,4,1,1],f32>
  %wide = torch.prim.ListConstruct %int2, %int-1, %int8, %int-1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %col = torch.aten.broadcast_to %sv, %wide : !torch.vtensor<[1,4,1,1],f32>, !torch.list<int> -> !torch.vtensor<[2,4,8,1],f32>
  %parts = torch.prim.ListConstruct %s, %col : (!torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[2,4,8,1],f32>) -> !torch.list<vtensor>
  %c = torch.aten.cat %parts, %int-1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,4,8,9],f32>
  %p = torch.aten.softmax.int %c, %int-1, %none : !torch.vtensor<[2,4,8,9],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,8,9],f32>
  %pk = torch.aten.slice.Tensor %p, %int3, %int0, %int9, %int1 : !torch.vtensor<[2,4,8,9],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,9],f32>
  %o = torch.aten.matmul %pk, %arg2 : !torch.vtensor<[2,4,8,9],f32>, !torch.vtensor<[2,4,9,16],f32> -> !torch.vtensor<[2,4,8,16],f32>
  return %o : !torch.vtensor<[2,4,8,16],f32>
}

// -----

// ALiBi as MPT writes it: a per-head [H, 1, 128] table sliced to the last S keys
// (alibi[:, max(1 - S, 0):, max(128 - S, 0):]), added to the scaled scores, then
// masked_fill(cond, finfo.min) as where(cond, min, scores). The slice's query dim is proven 1
// from the size symbol's range (S >= 2 pins its start to 0): a key bias, the same for every
// query of a row. One `torch.autosp.key_bias_attention` with SDPA's operands, the mask
// `not cond`, and the bias as [1, H, 1, S].
// CHECK-LABEL: func.func @alibi_sliced_key_bias
// CHECK: %[[M:.*]] = torch.aten.logical_not %arg4
// CHECK: %[[B:.*]] = torch.aten.unsqueeze %{{.*}} -> !torch.vtensor<[1,4,1,?],f32>
// CHECK: torch.operator "torch.autosp.key_bias_attention"(%arg0, %arg1, %arg2, %[[M]], %{{[^,]*}}, %false{{[_0-9]*}}, %float3.535530e-01{{[_0-9]*}}, %false{{[_0-9]*}}, %[[B]]) {autosp.empty_rows = "mean"}
// DCE-LABEL: func.func @alibi_sliced_key_bias
// DCE-NOT: torch.aten.softmax.int
func.func @alibi_sliced_key_bias(%arg0: !torch.vtensor<[2,4,?,8],f32>, %arg1: !torch.vtensor<[2,4,?,8],f32>, %arg2: !torch.vtensor<[2,4,?,8],f32>, %arg3: !torch.vtensor<[4,1,128],f32>, %arg4: !torch.vtensor<[2,1,?,?],i1>) -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %int128 = torch.constant.int 128
  %float = torch.constant.float 0.35355339059327373
  %s0 = torch.symbolic_int "s0" {min_val = 2, max_val = 128} : !torch.int
  torch.bind_symbolic_shape %arg0, [%s0], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %S = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,4,?,8],f32>, !torch.int -> !torch.int
  %a = torch.aten.sub.int %int1, %S : !torch.int, !torch.int -> !torch.int
  %start1 = torch.prim.max.int %a, %int0 : !torch.int, !torch.int -> !torch.int
  %c = torch.aten.sub.int %int128, %S : !torch.int, !torch.int -> !torch.int
  %start2 = torch.prim.max.int %c, %int0 : !torch.int, !torch.int -> !torch.int
  %x1 = torch.aten.slice.Tensor %arg3, %int1, %start1, %none, %int1 : !torch.vtensor<[4,1,128],f32>, !torch.int, !torch.int, !torch.none, !torch.int -> !torch.vtensor<[4,?,128],f32>
  %x2 = torch.aten.slice.Tensor %x1, %int2, %start2, %none, %int1 : !torch.vtensor<[4,?,128],f32>, !torch.int, !torch.int, !torch.none, !torch.int -> !torch.vtensor<[4,?,?],f32>
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,?,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,?],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,8,?],f32> -> !torch.vtensor<[2,4,?,?],f32>
  %ss = torch.aten.mul.Scalar %s, %float : !torch.vtensor<[2,4,?,?],f32>, !torch.float -> !torch.vtensor<[2,4,?,?],f32>
  %sb = torch.aten.add.Tensor %ss, %x2, %int1 : !torch.vtensor<[2,4,?,?],f32>, !torch.vtensor<[4,?,?],f32>, !torch.int -> !torch.vtensor<[2,4,?,?],f32>
  %min = torch.vtensor.literal(dense<-3.40282347E+38> : tensor<f32>) : !torch.vtensor<[],f32>
  %sm = torch.aten.where.self %arg4, %min, %sb : !torch.vtensor<[2,1,?,?],i1>, !torch.vtensor<[],f32>, !torch.vtensor<[2,4,?,?],f32> -> !torch.vtensor<[2,4,?,?],f32>
  %p = torch.aten.softmax.int %sm, %int-1, %none : !torch.vtensor<[2,4,?,?],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,?,?],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,?,?],f32>, !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  return %o : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// The same slice where the sizes admit S = 1 (min_val = 1): max(1 - S, 0) may be 0 or 1, so
// the query dim is not proven 1 and the term may vary with the query: a per-head bias of
// (q, k), not fused (the compile warns that the scores are kept).
// CHECK-LABEL: func.func @alibi_slice_not_proven
// DCE-LABEL: func.func @alibi_slice_not_proven
// CHECK-NOT: key_bias_attention
// CHECK: torch.aten.softmax.int
// CHECK-NOT: key_bias_attention
func.func @alibi_slice_not_proven(%arg0: !torch.vtensor<[2,4,?,8],f32>, %arg1: !torch.vtensor<[2,4,?,8],f32>, %arg2: !torch.vtensor<[2,4,?,8],f32>, %arg3: !torch.vtensor<[4,1,128],f32>) -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %float = torch.constant.float 0.35355339059327373
  %s0 = torch.symbolic_int "s0" {min_val = 0, max_val = 128} : !torch.int
  torch.bind_symbolic_shape %arg0, [%s0], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %S = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,4,?,8],f32>, !torch.int -> !torch.int
  %a = torch.aten.sub.int %int1, %S : !torch.int, !torch.int -> !torch.int
  %start1 = torch.prim.max.int %a, %int0 : !torch.int, !torch.int -> !torch.int
  %x1 = torch.aten.slice.Tensor %arg3, %int1, %start1, %none, %int1 : !torch.vtensor<[4,1,128],f32>, !torch.int, !torch.int, !torch.none, !torch.int -> !torch.vtensor<[4,?,128],f32>
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,?,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,?],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,8,?],f32> -> !torch.vtensor<[2,4,?,?],f32>
  %ss = torch.aten.mul.Scalar %s, %float : !torch.vtensor<[2,4,?,?],f32>, !torch.float -> !torch.vtensor<[2,4,?,?],f32>
  %sb = torch.aten.add.Tensor %ss, %x1, %int1 : !torch.vtensor<[2,4,?,?],f32>, !torch.vtensor<[4,?,128],f32>, !torch.int -> !torch.vtensor<[2,4,?,?],f32>
  %p = torch.aten.softmax.int %sb, %int-1, %none : !torch.vtensor<[2,4,?,?],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,?,?],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,?,?],f32>, !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  return %o : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// ALiBi as BLOOM writes it: baddbmm(alibi, q, kᵀ) on the heads folded into the batch
// ([B * H, S, D], the key transposed after its leading dims are merged), viewed up to
// [B, H, S, S], plus the causal mask. The [B * H, 1, S] bias becomes [B, H, 1, S].
// CHECK-LABEL: func.func @folded_heads_key_bias
// CHECK: %[[B:.*]] = torch.aten.unflatten.int %arg3, %{{.*}} -> !torch.vtensor<[2,4,1,16],f32>
// CHECK: torch.operator "torch.autosp.key_bias_attention"(%arg0, %arg1, %arg2, %arg4, %{{[^,]*}}, %false{{[_0-9]*}}, %float2.500000e-01{{[_0-9]*}}, %false{{[_0-9]*}}, %[[B]])
// DCE-LABEL: func.func @folded_heads_key_bias
// DCE-NOT: torch.aten.bmm
func.func @folded_heads_key_bias(%arg0: !torch.vtensor<[2,4,16,8],f32>, %arg1: !torch.vtensor<[2,4,16,8],f32>, %arg2: !torch.vtensor<[2,4,16,8],f32>, %arg3: !torch.vtensor<[8,1,16],f32>, %arg4: !torch.vtensor<[2,1,16,16],f32>) -> !torch.vtensor<[2,4,16,8],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %int16 = torch.constant.int 16
  %int-1 = torch.constant.int -1
  %float = torch.constant.float 2.500000e-01
  %l3 = torch.prim.ListConstruct %int8, %int16, %int8 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %q3 = torch.aten.view %arg0, %l3 : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,16,8],f32>
  %k3 = torch.aten.view %arg1, %l3 : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,16,8],f32>
  %v3 = torch.aten.view %arg2, %l3 : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,16,8],f32>
  %perm = torch.prim.ListConstruct %int0, %int2, %int1 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kt = torch.aten.permute %k3, %perm : !torch.vtensor<[8,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,8,16],f32>
  %s = torch.aten.bmm %q3, %kt : !torch.vtensor<[8,16,8],f32>, !torch.vtensor<[8,8,16],f32> -> !torch.vtensor<[8,16,16],f32>
  %ss = torch.aten.mul.Scalar %s, %float : !torch.vtensor<[8,16,16],f32>, !torch.float -> !torch.vtensor<[8,16,16],f32>
  %sb = torch.aten.add.Tensor %arg3, %ss, %int1 : !torch.vtensor<[8,1,16],f32>, !torch.vtensor<[8,16,16],f32>, !torch.int -> !torch.vtensor<[8,16,16],f32>
  %l4 = torch.prim.ListConstruct %int2, %int4, %int16, %int-1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %s4 = torch.aten.view %sb, %l4 : !torch.vtensor<[8,16,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,16],f32>
  %sm = torch.aten.add.Tensor %s4, %arg4, %int1 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[2,1,16,16],f32>, !torch.int -> !torch.vtensor<[2,4,16,16],f32>
  %p = torch.aten.softmax.int %sm, %int-1, %none : !torch.vtensor<[2,4,16,16],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,16,16],f32>
  %lp = torch.prim.ListConstruct %int8, %int16, %int-1 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %p3 = torch.aten.view %p, %lp : !torch.vtensor<[2,4,16,16],f32>, !torch.list<int> -> !torch.vtensor<[8,16,16],f32>
  %o3 = torch.aten.bmm %p3, %v3 : !torch.vtensor<[8,16,16],f32>, !torch.vtensor<[8,16,8],f32> -> !torch.vtensor<[8,16,8],f32>
  %lo = torch.prim.ListConstruct %int2, %int4, %int16, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %o = torch.aten.view %o3, %lo : !torch.vtensor<[8,16,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,8],f32>
  return %o : !torch.vtensor<[2,4,16,8],f32>
}

// -----

// A per-head bias that varies with the query ([1, H, S, S]: T5's buckets written out) is
// not a key bias: not fused, the scores kept.
// CHECK-LABEL: func.func @per_head_query_bias_kept
// DCE-LABEL: func.func @per_head_query_bias_kept
// CHECK-NOT: key_bias_attention
// CHECK: torch.aten.softmax.int {{.*}} {autosp.unfused_attention = "a per-head additive mask that varies with the query"}
func.func @per_head_query_bias_kept(%arg0: !torch.vtensor<[2,4,16,8],f32>, %arg1: !torch.vtensor<[2,4,16,8],f32>, %arg2: !torch.vtensor<[2,4,16,8],f32>, %arg3: !torch.vtensor<[1,4,16,16],f32>) -> !torch.vtensor<[2,4,16,8],f32> {
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,16,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,16],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,16,8],f32>, !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,16,16],f32>
  %sb = torch.aten.add.Tensor %s, %arg3, %int1 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[1,4,16,16],f32>, !torch.int -> !torch.vtensor<[2,4,16,16],f32>
  %p = torch.aten.softmax.int %sb, %int-1, %none : !torch.vtensor<[2,4,16,16],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,16,16],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[2,4,16,8],f32> -> !torch.vtensor<[2,4,16,8],f32>
  return %o : !torch.vtensor<[2,4,16,8],f32>
}

// -----

// A head-shared key bias ([1, 1, 1, S]) added outside the [B, 1, S, S] mask: met first, it
// looks like the mask; when the real mask comes it becomes the key bias (both fuse).
// CHECK-LABEL: func.func @shared_key_bias_outside_the_mask
// DCE-LABEL: func.func @shared_key_bias_outside_the_mask
// CHECK: torch.operator "torch.autosp.key_bias_attention"(%arg0, %arg1, %arg2, %arg3, %{{[^,]*}}, %false{{[_0-9]*}}, %float2.500000e-01{{[_0-9]*}}, %false{{[_0-9]*}}, %arg4)
func.func @shared_key_bias_outside_the_mask(%arg0: !torch.vtensor<[2,4,16,8],f32>, %arg1: !torch.vtensor<[2,4,16,8],f32>, %arg2: !torch.vtensor<[2,4,16,8],f32>, %arg3: !torch.vtensor<[2,1,16,16],f32>, %arg4: !torch.vtensor<[1,1,1,16],f32>) -> !torch.vtensor<[2,4,16,8],f32> {
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %float = torch.constant.float 2.500000e-01
  %kt = torch.aten.transpose.int %arg1, %int2, %int3 : !torch.vtensor<[2,4,16,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,8,16],f32>
  %s = torch.aten.matmul %arg0, %kt : !torch.vtensor<[2,4,16,8],f32>, !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,16,16],f32>
  %ss = torch.aten.mul.Scalar %s, %float : !torch.vtensor<[2,4,16,16],f32>, !torch.float -> !torch.vtensor<[2,4,16,16],f32>
  %sm = torch.aten.add.Tensor %ss, %arg3, %int1 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[2,1,16,16],f32>, !torch.int -> !torch.vtensor<[2,4,16,16],f32>
  %sb = torch.aten.add.Tensor %sm, %arg4, %int1 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[1,1,1,16],f32>, !torch.int -> !torch.vtensor<[2,4,16,16],f32>
  %p = torch.aten.softmax.int %sb, %int-1, %none : !torch.vtensor<[2,4,16,16],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,16,16],f32>
  %o = torch.aten.matmul %p, %arg2 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[2,4,16,8],f32> -> !torch.vtensor<[2,4,16,8],f32>
  return %o : !torch.vtensor<[2,4,16,8],f32>
}

// -----

// A head-shared [S] bias added to folded scores: unsqueezed to [1, 1, 1, S] (not unflattened
// as if it held the B * H rows).
// CHECK-LABEL: func.func @folded_heads_shared_key_bias
// DCE-LABEL: func.func @folded_heads_shared_key_bias
// CHECK-NOT: unflatten
// CHECK: %[[B:.*]] = torch.aten.unsqueeze %{{.*}} -> !torch.vtensor<[1,1,1,16],f32>
// CHECK: torch.operator "torch.autosp.key_bias_attention"(%arg0, %arg1, %arg2, %arg4, %{{[^,]*}}, %false{{[_0-9]*}}, %float2.500000e-01{{[_0-9]*}}, %false{{[_0-9]*}}, %[[B]])
func.func @folded_heads_shared_key_bias(%arg0: !torch.vtensor<[2,4,16,8],f32>, %arg1: !torch.vtensor<[2,4,16,8],f32>, %arg2: !torch.vtensor<[2,4,16,8],f32>, %arg3: !torch.vtensor<[16],f32>, %arg4: !torch.vtensor<[2,1,16,16],f32>) -> !torch.vtensor<[2,4,16,8],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %int16 = torch.constant.int 16
  %int-1 = torch.constant.int -1
  %float = torch.constant.float 2.500000e-01
  %l3 = torch.prim.ListConstruct %int8, %int16, %int8 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %q3 = torch.aten.view %arg0, %l3 : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,16,8],f32>
  %k3 = torch.aten.view %arg1, %l3 : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,16,8],f32>
  %v3 = torch.aten.view %arg2, %l3 : !torch.vtensor<[2,4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,16,8],f32>
  %perm = torch.prim.ListConstruct %int0, %int2, %int1 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kt = torch.aten.permute %k3, %perm : !torch.vtensor<[8,16,8],f32>, !torch.list<int> -> !torch.vtensor<[8,8,16],f32>
  %s = torch.aten.bmm %q3, %kt : !torch.vtensor<[8,16,8],f32>, !torch.vtensor<[8,8,16],f32> -> !torch.vtensor<[8,16,16],f32>
  %ss = torch.aten.mul.Scalar %s, %float : !torch.vtensor<[8,16,16],f32>, !torch.float -> !torch.vtensor<[8,16,16],f32>
  %sb = torch.aten.add.Tensor %arg3, %ss, %int1 : !torch.vtensor<[16],f32>, !torch.vtensor<[8,16,16],f32>, !torch.int -> !torch.vtensor<[8,16,16],f32>
  %l4 = torch.prim.ListConstruct %int2, %int4, %int16, %int-1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %s4 = torch.aten.view %sb, %l4 : !torch.vtensor<[8,16,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,16],f32>
  %sm = torch.aten.add.Tensor %s4, %arg4, %int1 : !torch.vtensor<[2,4,16,16],f32>, !torch.vtensor<[2,1,16,16],f32>, !torch.int -> !torch.vtensor<[2,4,16,16],f32>
  %p = torch.aten.softmax.int %sm, %int-1, %none : !torch.vtensor<[2,4,16,16],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,4,16,16],f32>
  %lp = torch.prim.ListConstruct %int8, %int16, %int-1 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %p3 = torch.aten.view %p, %lp : !torch.vtensor<[2,4,16,16],f32>, !torch.list<int> -> !torch.vtensor<[8,16,16],f32>
  %o3 = torch.aten.bmm %p3, %v3 : !torch.vtensor<[8,16,16],f32>, !torch.vtensor<[8,16,8],f32> -> !torch.vtensor<[8,16,8],f32>
  %lo = torch.prim.ListConstruct %int2, %int4, %int16, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %o = torch.aten.view %o3, %lo : !torch.vtensor<[8,16,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,16,8],f32>
  return %o : !torch.vtensor<[2,4,16,8],f32>
}
