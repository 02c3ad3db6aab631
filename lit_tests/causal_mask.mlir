// RUN: autosp-opt %s --split-input-file --autosp-causal-mask | FileCheck %s

// A mask built from the sequence length alone (arange(S) compared with itself) that is
// causal at every length becomes is_causal; the mask computation is left for dce.
// CHECK-LABEL: func.func @size_only_causal
// CHECK: %[[M:.*]] = torch.aten.le.Tensor
// CHECK: %[[NONE:[^ ]+]] = torch.constant.none
// CHECK: %[[TRUE:[^ ]+]] = torch.constant.bool true
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[NONE]], %{{[^,]*}}, %[[TRUE]],
func.func @size_only_causal(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %rows = torch.aten.unsqueeze %pos, %int1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  %cols = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %m = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// Built from sizes alone but not causal (ge: the upper triangle): kept.
// CHECK-LABEL: func.func @size_only_not_causal
// CHECK: %[[M:.*]] = torch.aten.ge.Tensor
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{.*}}, %false,
func.func @size_only_not_causal(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %rows = torch.aten.unsqueeze %pos, %int1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  %cols = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %m = torch.aten.ge.Tensor %cols, %rows : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// Computed from input data (a padding mask): kept, whatever its values.
// CHECK-LABEL: func.func @from_input
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %arg1, %{{.*}}, %false,
func.func @from_input(%arg0: !torch.vtensor<[1,2,?,8],f32>, %arg1: !torch.vtensor<[?,?],i1>) -> !torch.vtensor<[1,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %arg1, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}
