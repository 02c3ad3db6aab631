// RUN: autosp-opt %s --split-input-file --autosp-dce | FileCheck %s

// Unused constants go.
// CHECK-LABEL: func.func @dead_constants
// CHECK-NOT:     torch.constant
// CHECK:         return %arg0 : !torch.vtensor<[4],f32>
func.func @dead_constants(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %int1 = torch.constant.int 1
  %float2 = torch.constant.float 2.000000e+00
  %none = torch.constant.none
  %str = torch.constant.str "unused"
  return %arg0 : !torch.vtensor<[4],f32>
}

// -----

// A dead chain is removed transitively: once neg/size go, their operands are dead too.
// CHECK-LABEL: func.func @dead_chain
// CHECK-NEXT:    return %arg1 : !torch.vtensor<[4],f32>
// CHECK-NEXT:  }
func.func @dead_chain(%arg0: !torch.vtensor<[2,?],si64>, %arg1: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %int1 = torch.constant.int 1
  %0 = torch.aten.size.int %arg0, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  %1 = torch.aten.neg %arg1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %2 = torch.aten.mul.Tensor %1, %1 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %arg1 : !torch.vtensor<[4],f32>
}

// -----

// A bind_symbolic_shape whose value has no other user is dead, and so is the value;
// the binding of a live value (and the symbol it uses) stays.
// CHECK-LABEL: func.func @dead_symbolic_shape
// CHECK:         %[[S0:.*]] = torch.symbolic_int "s0"
// CHECK-NEXT:    torch.bind_symbolic_shape %arg0, [%[[S0]]]
// CHECK-NOT:     torch.aten.neg
// CHECK-NOT:     torch.aten.exp
// CHECK-NOT:     torch.bind_symbolic_shape
// CHECK:         return %arg0
func.func @dead_symbolic_shape(%arg0: !torch.vtensor<[?,8],f32>) -> !torch.vtensor<[?,8],f32> {
  %0 = torch.symbolic_int "s0" {min_val = 2, max_val = 1024} : !torch.int
  torch.bind_symbolic_shape %arg0, [%0], affine_map<()[s0] -> (s0, 8)> : !torch.vtensor<[?,8],f32>
  %1 = torch.aten.neg %arg0 : !torch.vtensor<[?,8],f32> -> !torch.vtensor<[?,8],f32>
  torch.bind_symbolic_shape %1, [%0], affine_map<()[s0] -> (s0, 8)> : !torch.vtensor<[?,8],f32>
  // Bound twice (the importer does that for softmax): both bindings and the value are dead.
  %2 = torch.aten.exp %arg0 : !torch.vtensor<[?,8],f32> -> !torch.vtensor<[?,8],f32>
  torch.bind_symbolic_shape %2, [%0], affine_map<()[s0] -> (s0, 8)> : !torch.vtensor<[?,8],f32>
  torch.bind_symbolic_shape %2, [%0], affine_map<()[s0] -> (s0, 8)> : !torch.vtensor<[?,8],f32>
  return %arg0 : !torch.vtensor<[?,8],f32>
}

// -----

// Everything that feeds the result is kept, in order; only the unused op goes.
// CHECK-LABEL: func.func @used_ops_kept
// CHECK:         %[[ONE:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[NEG:.*]] = torch.aten.neg %arg0
// CHECK-NEXT:    %[[ADD:.*]] = torch.aten.add.Tensor %[[NEG]], %arg0, %[[ONE]]
// CHECK-NEXT:    return %[[ADD]]
func.func @used_ops_kept(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %int1 = torch.constant.int 1
  %0 = torch.aten.neg %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.add.Tensor %0, %arg0, %int1 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
  %2 = torch.aten.exp %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %1 : !torch.vtensor<[4],f32>
}

// -----

// In-place ops write their operand: they stay even though their result is unused,
// and so do their operands. overwrite.tensor.contents has no result and stays too.
// CHECK-LABEL: func.func @in_place_kept
// CHECK:         %[[ONE:.*]] = torch.constant.int 1
// CHECK:         torch.aten.add_.Tensor %arg0, %arg0, %[[ONE]]
// CHECK:         torch.overwrite.tensor.contents %arg1 overwrites %arg0
// CHECK-NOT:     torch.aten.neg
// CHECK:         return
func.func @in_place_kept(%arg0: !torch.tensor<[4],f32>, %arg1: !torch.vtensor<[4],f32>) {
  %int1 = torch.constant.int 1
  %0 = torch.aten.add_.Tensor %arg0, %arg0, %int1 : !torch.tensor<[4],f32>, !torch.tensor<[4],f32>, !torch.int -> !torch.tensor<[4],f32>
  torch.overwrite.tensor.contents %arg1 overwrites %arg0 : !torch.vtensor<[4],f32>, !torch.tensor<[4],f32>
  %1 = torch.aten.neg %arg1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return
}
