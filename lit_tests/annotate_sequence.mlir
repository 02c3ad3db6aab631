// RUN: autosp-opt %s --split-input-file --autosp-annotate-sequence | FileCheck %s

// An SDPA block: every value of [B, S, D] or [B, H, S, Dh] gets its sequence dim; the
// scalar S and sizes computed from it get their expression; the SDPA op is marked.
// CHECK-LABEL: func.func @sdpa_block
func.func @sdpa_block(%w: !torch.vtensor<[32,32],f32>,
                      %x: !torch.vtensor<[2,?,32],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %int32 = torch.constant.int 32
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // CHECK: %[[S:.*]] = torch.aten.size.int %{{.*}}, %{{.*}} {autosp.seq = "S"}
  %0 = torch.aten.size.int %x, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.int
  // CHECK: torch.aten.mul.int %{{.*}}, %[[S]] {autosp.seq = "2 * S"}
  %1 = torch.aten.mul.int %int2, %0 : !torch.int, !torch.int -> !torch.int
  // CHECK: torch.aten.sub.int %[[S]], %{{.*}} {autosp.seq = "S - 1"}
  %2 = torch.aten.sub.int %0, %int1 : !torch.int, !torch.int -> !torch.int
  %3 = torch.prim.ListConstruct %1, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  // CHECK: torch.aten.view {{.*}} {autosp.seq = ["2 * S", "_"]}
  %4 = torch.aten.view %x, %3 : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %4, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  // A weight does not touch the sequence: no annotation.
  // CHECK: torch.aten.permute %{{[^{]*}} : !torch.vtensor<[32,32],f32>
  %perm = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %wt = torch.aten.permute %w, %perm : !torch.vtensor<[32,32],f32>, !torch.list<int> -> !torch.vtensor<[32,32],f32>
  %5 = torch.aten.mm %4, %wt : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,32],f32> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %5, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %6 = torch.prim.ListConstruct %int2, %0, %int4, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  // CHECK: torch.aten.view {{.*}} {autosp.seq = ["_", "S", "_", "_"]}
  %7 = torch.aten.view %5, %6 : !torch.vtensor<[?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %7, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  %int3 = torch.constant.int 3
  %8 = torch.prim.ListConstruct %int0, %int2, %int1, %int3 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  // CHECK: %[[Q:.*]] = torch.aten.permute {{.*}} {autosp.seq = ["_", "_", "S", "_"]}
  %9 = torch.aten.permute %7, %8 : !torch.vtensor<[2,?,4,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %9, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  // CHECK: torch.aten.scaled_dot_product_attention %[[Q]], %[[Q]], %[[Q]], {{.*}} {autosp.attention = "sdpa", autosp.seq = ["_", "_", "S", "_"]}
  %10 = torch.aten.scaled_dot_product_attention %9, %9, %9, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %10, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  return %10 : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Manual attention: the softmax over a [.., S, S] score tensor is the attention op; a
// keepdim reduction without a binding inherits the sequence dim from its operand; the
// sequence may be the first dimension.
// CHECK-LABEL: func.func @manual_attention_seq_first
func.func @manual_attention_seq_first(%x: !torch.vtensor<[?,4,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 0 : i64})
    -> !torch.vtensor<[4,?,1],f32> {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %none = torch.constant.none
  %s = torch.symbolic_int "s7" {min_val = 2, max_val = 100} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0, 4, 8)> : !torch.vtensor<[?,4,8],f32>
  // CHECK: torch.aten.transpose.int {{.*}} {autosp.seq = ["_", "S", "_"]}
  %q = torch.aten.transpose.int %x, %int0, %int1 : !torch.vtensor<[?,4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,?,8],f32>
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (4, s0, 8)> : !torch.vtensor<[4,?,8],f32>
  %kt = torch.aten.transpose.int %q, %int1, %int2 : !torch.vtensor<[4,?,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,8,?],f32>
  torch.bind_symbolic_shape %kt, [%s], affine_map<()[s0] -> (4, 8, s0)> : !torch.vtensor<[4,8,?],f32>
  // CHECK: torch.aten.bmm {{.*}} {autosp.seq = ["_", "S", "S"]}
  %scores = torch.aten.bmm %q, %kt : !torch.vtensor<[4,?,8],f32>, !torch.vtensor<[4,8,?],f32> -> !torch.vtensor<[4,?,?],f32>
  torch.bind_symbolic_shape %scores, [%s], affine_map<()[s0] -> (4, s0, s0)> : !torch.vtensor<[4,?,?],f32>
  // CHECK: torch.aten.softmax.int {{.*}} {autosp.attention = "manual", autosp.seq = ["_", "S", "S"]}
  %p = torch.aten.softmax.int %scores, %int-1, %none : !torch.vtensor<[4,?,?],f32>, !torch.int, !torch.none -> !torch.vtensor<[4,?,?],f32>
  torch.bind_symbolic_shape %p, [%s], affine_map<()[s0] -> (4, s0, s0)> : !torch.vtensor<[4,?,?],f32>
  %o = torch.aten.bmm %p, %q : !torch.vtensor<[4,?,?],f32>, !torch.vtensor<[4,?,8],f32> -> !torch.vtensor<[4,?,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (4, s0, 8)> : !torch.vtensor<[4,?,8],f32>
  %dims = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  // CHECK: torch.aten.sum.dim_IntList {{.*}} {autosp.seq = ["_", "S", "_"]}
  %r = torch.aten.sum.dim_IntList %o, %dims, %true, %none : !torch.vtensor<[4,?,8],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[4,?,1],f32>
  return %r : !torch.vtensor<[4,?,1],f32>
}



// -----

// Dropout's mask in train mode: a 0-d tensor broadcast to a size list built from S, then
// drawn (`uniform`) and compared, none of it bound. The broadcast's sequence dim comes from
// its size list, and the ops after it inherit it, so the mask is sliced where it meets the
// sharded activations.
// CHECK-LABEL: func.func @dropout_mask_from_size_list
func.func @dropout_mask_from_size_list(%x: !torch.vtensor<[2,?,32],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,1,?,32],f32> {
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int6 = torch.constant.int 6
  %int32 = torch.constant.int 32
  %false = torch.constant.bool false
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %float1 = torch.constant.float 1.000000e+00
  %zero = torch.vtensor.literal(dense<0.000000e+00> : tensor<f64>) : !torch.vtensor<[],f64>
  %keep = torch.vtensor.literal(dense<9.000000e-01> : tensor<f64>) : !torch.vtensor<[],f64>
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %0 = torch.aten.size.int %x, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.int
  %1 = torch.prim.ListConstruct %int2, %0, %int32 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  // CHECK: torch.aten.broadcast_to {{.*}} {autosp.seq = ["_", "S", "_"]}
  %2 = torch.aten.broadcast_to %zero, %1 : !torch.vtensor<[],f64>, !torch.list<int> -> !torch.vtensor<[2,?,32],f64>
  // CHECK: torch.aten.uniform {{.*}} {autosp.seq = ["_", "S", "_"]}
  %3 = torch.aten.uniform %2, %float0, %float1, %none : !torch.vtensor<[2,?,32],f64>, !torch.float, !torch.float, !torch.none -> !torch.vtensor<[2,?,32],f64>
  // CHECK: torch.aten.lt.Tensor {{.*}} {autosp.seq = ["_", "S", "_"]}
  %4 = torch.aten.lt.Tensor %3, %keep : !torch.vtensor<[2,?,32],f64>, !torch.vtensor<[],f64> -> !torch.vtensor<[2,?,32],i1>
  %5 = torch.aten.to.dtype %4, %int6, %false, %false, %none : !torch.vtensor<[2,?,32],i1>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[2,?,32],f32>
  // CHECK: torch.aten.mul.Tensor {{.*}} {autosp.seq = ["_", "S", "_"]}
  %6 = torch.aten.mul.Tensor %5, %x : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,32],f32> -> !torch.vtensor<[2,?,32],f32>
  %q = torch.aten.unsqueeze %6, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.vtensor<[2,1,?,32],f32>
  %true = torch.constant.bool true
  %7 = torch.aten.scaled_dot_product_attention %q, %q, %q, %none, %float0, %true, %none, %false : !torch.vtensor<[2,1,?,32],f32>, !torch.vtensor<[2,1,?,32],f32>, !torch.vtensor<[2,1,?,32],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,1,?,32],f32>
  return %7 : !torch.vtensor<[2,1,?,32],f32>
}

// -----

// Attention over another axis (a vision tower's 17 patches, no size from S) is not
// attention over the sequence: it is left unmarked (replicated work), the text's is marked.
// CHECK-LABEL: func.func @patch_attention_is_not_sequence_attention
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0
// CHECK-NOT: autosp.attention
// CHECK-SAME: -> !torch.vtensor<[1,2,17,8],f32>
// CHECK: torch.aten.scaled_dot_product_attention %arg1, %arg1, %arg1, {{.*}} {autosp.attention = "sdpa"
func.func @patch_attention_is_not_sequence_attention(
    %p: !torch.vtensor<[1,2,17,8],f32>,
    %x: !torch.vtensor<[1,2,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64})
    -> (!torch.vtensor<[1,2,17,8],f32>, !torch.vtensor<[1,2,?,8],f32>) {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %float0 = torch.constant.float 0.000000e+00
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (1, 2, s0, 8)> : !torch.vtensor<[1,2,?,8],f32>
  %a = torch.aten.scaled_dot_product_attention %p, %p, %p, %none, %float0, %false, %none, %false : !torch.vtensor<[1,2,17,8],f32>, !torch.vtensor<[1,2,17,8],f32>, !torch.vtensor<[1,2,17,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,17,8],f32>
  %o = torch.aten.scaled_dot_product_attention %x, %x, %x, %none, %float0, %true, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (1, 2, s0, 8)> : !torch.vtensor<[1,2,?,8],f32>
  return %a, %o : !torch.vtensor<[1,2,17,8],f32>, !torch.vtensor<[1,2,?,8],f32>
}
