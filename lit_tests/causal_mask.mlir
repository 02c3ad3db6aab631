// RUN: autosp-opt %s --split-input-file --autosp-causal-mask | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-causal-mask --autosp-dce | FileCheck %s --check-prefix=DCE

// k <= q from arange(S) (only the size of %arg0 is read): proven causal, the mask is
// replaced by is_causal and its computation becomes dead.
// CHECK-LABEL: func.func @causal_folds
// CHECK: torch.aten.le.Tensor
// CHECK: %[[NONE:[^ ]+]] = torch.constant.none
// CHECK: %[[TRUE:[^ ]+]] = torch.constant.bool true
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[NONE]], %{{[^,]*}}, %[[TRUE]],
// DCE-LABEL: func.func @causal_folds
// DCE-NOT: torch.aten.le.Tensor
// DCE-NOT: torch.aten.arange
// DCE: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %{{[^,]*}}, %{{[^,]*}}, %true,
func.func @causal_folds(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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

// A sliding window (k > q - 64 and k <= q) looks causal at every length up to 64, but is
// not the causal mask: it becomes is_causal with autosp.window = 64 (the backend's windowed
// kernel), never plain is_causal.
// CHECK-LABEL: func.func @sliding_window_folds_to_a_window
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %none_0, %{{[^,]*}}, %true, %none, %false {autosp.window = 64 : i64}
// DCE-LABEL: func.func @sliding_window_folds_to_a_window
// DCE-NOT: torch.aten.bitwise_and.Tensor
func.func @sliding_window_folds_to_a_window(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %int64 = torch.constant.int 64
  %low = torch.aten.sub.Scalar %rows, %int64, %int1 : !torch.vtensor<[?,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[?,1],si64>
  %in_window = torch.aten.gt.Tensor %cols, %low : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %causal = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %m = torch.aten.bitwise_and.Tensor %in_window, %causal : !torch.vtensor<[?,?],i1>, !torch.vtensor<[?,?],i1> -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// With dropout the windowed kernel does not apply: the mask stays.
// CHECK-LABEL: func.func @sliding_window_with_dropout_kept
// CHECK: %[[M:.*]] = torch.aten.bitwise_and.Tensor
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false,
// CHECK-NOT: autosp.window
// DCE-LABEL: func.func @sliding_window_with_dropout_kept
func.func @sliding_window_with_dropout_kept(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 1.000000e-01
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %rows = torch.aten.unsqueeze %pos, %int1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  %cols = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %int64 = torch.constant.int 64
  %low = torch.aten.sub.Scalar %rows, %int64, %int1 : !torch.vtensor<[?,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[?,1],si64>
  %in_window = torch.aten.gt.Tensor %cols, %low : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %causal = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %m = torch.aten.bitwise_and.Tensor %in_window, %causal : !torch.vtensor<[?,?],i1>, !torch.vtensor<[?,?],i1> -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// An offset (k <= q + 1) is not the causal mask: kept.
// CHECK-LABEL: func.func @offset_kept
// CHECK: %[[M:.*]] = torch.aten.le.Tensor
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false,
func.func @offset_kept(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %shifted = torch.aten.add.Scalar %rows, %int1, %int1 : !torch.vtensor<[?,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[?,1],si64>
  %m = torch.aten.le.Tensor %cols, %shifted : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// k <= q over positions of another input's length n: SDPA would broadcast it if n were 1,
// and nothing says n equals the query length: kept.
// CHECK-LABEL: func.func @other_length_kept
// CHECK: %[[M:.*]] = torch.aten.le.Tensor
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false,
func.func @other_length_kept(%arg0: !torch.vtensor<[1,2,?,8],f32>, %arg1: !torch.vtensor<[?],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg1, %int0 : !torch.vtensor<[?],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %rows = torch.aten.unsqueeze %pos, %int1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  %cols = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %m = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// The same comparison on positions read from an input (position ids): the data is not
// known, so the mask is kept.
// CHECK-LABEL: func.func @input_positions_kept
// CHECK: %[[M:.*]] = torch.aten.le.Tensor
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false,
func.func @input_positions_kept(%arg0: !torch.vtensor<[1,2,?,8],f32>, %arg1: !torch.vtensor<[?],si64>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %prow = torch.aten.unsqueeze %arg1, %int1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  %pcol = torch.aten.unsqueeze %arg1, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %m = torch.aten.le.Tensor %pcol, %prow : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// A mask sliced from a registered buffer (a tril held as data): kept, whatever it holds.
// CHECK-LABEL: func.func @buffer_mask_kept
// CHECK: %[[M:.*]] = torch.aten.slice.Tensor %{{[0-9]+}}, %int1,
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false,
func.func @buffer_mask_kept(%arg0: !torch.vtensor<[1,2,?,8],f32>, %arg1: !torch.vtensor<[64,64],i1>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %rows_b = torch.aten.slice.Tensor %arg1, %int0, %int0, %s, %int1 : !torch.vtensor<[64,64],i1>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[?,64],i1>
  %m = torch.aten.slice.Tensor %rows_b, %int1, %int0, %s, %int1 : !torch.vtensor<[?,64],i1>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// Built from sizes but the upper triangle (k >= q): kept.
// CHECK-LABEL: func.func @upper_triangle_kept
// CHECK: %[[M:.*]] = torch.aten.ge.Tensor
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false,
func.func @upper_triangle_kept(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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

// tril of a tensor of ones made in forward (torch.ones(S, S, dtype=bool).tril()): folds.
// CHECK-LABEL: func.func @tril_of_ones_folds
// CHECK: torch.aten.tril
// CHECK: %[[NONE:[^ ]+]] = torch.constant.none
// CHECK: %[[TRUE:[^ ]+]] = torch.constant.bool true
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[NONE]], %{{[^,]*}}, %[[TRUE]],
func.func @tril_of_ones_folds(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %int11 = torch.constant.int 11
  %sizes = torch.prim.ListConstruct %s, %s : (!torch.int, !torch.int) -> !torch.list<int>
  %ones = torch.aten.ones %sizes, %int11, %none, %cpu, %false : !torch.list<int>, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?,?],i1>
  %m = torch.aten.tril %ones, %int0 : !torch.vtensor<[?,?],i1>, !torch.int -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// A random mask: not modelled, kept.
// CHECK-LABEL: func.func @random_kept
// CHECK: %[[M:.*]] = torch.aten.lt.Scalar
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false,
func.func @random_kept(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %sizes = torch.prim.ListConstruct %s, %s : (!torch.int, !torch.int) -> !torch.list<int>
  %int6 = torch.constant.int 6
  %half = torch.constant.float 5.000000e-01
  %r = torch.aten.rand %sizes, %int6, %none, %cpu, %false : !torch.list<int>, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?,?],f32>
  %m = torch.aten.lt.Scalar %r, %half : !torch.vtensor<[?,?],f32>, !torch.float -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// The mask of transformers' LlamaForCausalLM (sdpa, no position_ids) as imported (the
// symbolic shapes say the ids and the query have the same length s22):
// positions from arange(S) gathered per batch, k <= q, AND the packed-sequence check
// (documents from cumsum(positions[1:] - positions[:-1] != 1), provably all 0, so equal).
// CHECK-LABEL: func.func @hf_llama_mask_folds
// CHECK: torch.aten.broadcast_to %{{.*}} -> !torch.vtensor<[2,1,?,?],i1>
// CHECK: %[[NONE:[^ ]+]] = torch.constant.none
// CHECK: %[[TRUE:[^ ]+]] = torch.constant.bool true
// CHECK: torch.aten.scaled_dot_product_attention %arg1, %arg1, %arg1, %[[NONE]], %{{[^,]*}}, %[[TRUE]],
func.func @hf_llama_mask_folds(%arg0: !torch.vtensor<[2,?],si64>, %arg1: !torch.vtensor<[2,4,?,16],f32>) -> !torch.vtensor<[2,4,?,16],f32> {
  %sym = torch.symbolic_int "s22" {min_val = 2, max_val = 9223372036854775807} : !torch.int
  torch.bind_symbolic_shape %arg0, [%sym], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  torch.bind_symbolic_shape %arg1, [%sym], affine_map<()[s0] -> (2, 4, s0, 16)> : !torch.vtensor<[2,4,?,16],f32>
  %float0 = torch.constant.float 0.000000e+00
  %scale = torch.constant.float 2.500000e-01
  %2 = torch.vtensor.literal(dense<true> : tensor<i1>) : !torch.vtensor<[],i1>
  %int3 = torch.constant.int 3
  %int2 = torch.constant.int 2
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %false = torch.constant.bool false
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %4 = torch.aten.size.int %arg0, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  %cpu = torch.constant.device "cpu"
  %6 = torch.aten.arange.start_step %int0, %4, %int1, %none, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %7 = torch.aten.add.Scalar %6, %int0, %int1 : !torch.vtensor<[?],si64>, !torch.int, !torch.int -> !torch.vtensor<[?],si64>
  %8 = torch.aten.unsqueeze %7, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %9 = torch.prim.ListConstruct %int2, %int-1 : (!torch.int, !torch.int) -> !torch.list<int>
  %10 = torch.aten.broadcast_to %8, %9 : !torch.vtensor<[1,?],si64>, !torch.list<int> -> !torch.vtensor<[2,?],si64>
  %11 = torch.aten.slice.Tensor %10, %int1, %int0, %int1, %int1 : !torch.vtensor<[2,?],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,1],si64>
  %12 = torch.aten.sub.Scalar %11, %int1, %int1 : !torch.vtensor<[2,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[2,1],si64>
  %13 = torch.prim.ListConstruct %12, %10 : (!torch.vtensor<[2,1],si64>, !torch.vtensor<[2,?],si64>) -> !torch.list<vtensor>
  %14 = torch.aten.cat %13, %int-1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,?],si64>
  %15 = torch.aten.add.int %int1, %4 : !torch.int, !torch.int -> !torch.int
  %16 = torch.aten.slice.Tensor %14, %int-1, %int0, %4, %int1 : !torch.vtensor<[2,?],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?],si64>
  %17 = torch.aten.slice.Tensor %14, %int-1, %int1, %15, %int1 : !torch.vtensor<[2,?],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?],si64>
  %18 = torch.aten.sub.Tensor %17, %16, %int1 : !torch.vtensor<[2,?],si64>, !torch.vtensor<[2,?],si64>, !torch.int -> !torch.vtensor<[2,?],si64>
  %19 = torch.aten.ne.Scalar %18, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.vtensor<[2,?],i1>
  %20 = torch.aten.cumsum %19, %int-1, %none : !torch.vtensor<[2,?],i1>, !torch.int, !torch.none -> !torch.vtensor<[2,?],si64>
  %21 = torch.prim.ListConstruct %int2, %int-1 : (!torch.int, !torch.int) -> !torch.list<int>
  %22 = torch.aten.broadcast_to %8, %21 : !torch.vtensor<[1,?],si64>, !torch.list<int> -> !torch.vtensor<[2,?],si64>
  %cpu_0 = torch.constant.device "cpu"
  %23 = torch.aten.arange.start_step %int0, %int2, %int1, %none, %int0, %cpu_0, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[2],si64>
  %cpu_1 = torch.constant.device "cpu"
  %24 = torch.aten.arange.start_step %int0, %4, %int1, %none, %int0, %cpu_1, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %25 = torch.aten.add.Scalar %24, %int0, %int1 : !torch.vtensor<[?],si64>, !torch.int, !torch.int -> !torch.vtensor<[?],si64>
  %cpu_2 = torch.constant.device "cpu"
  %26 = torch.aten.arange.start_step %int0, %4, %int1, %none, %int0, %cpu_2, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %27 = torch.aten.add.Scalar %26, %int0, %int1 : !torch.vtensor<[?],si64>, !torch.int, !torch.int -> !torch.vtensor<[?],si64>
  %28 = torch.aten.unsqueeze %23, %int1 : !torch.vtensor<[2],si64>, !torch.int -> !torch.vtensor<[2,1],si64>
  %29 = torch.aten.unsqueeze %28, %int2 : !torch.vtensor<[2,1],si64>, !torch.int -> !torch.vtensor<[2,1,1],si64>
  %30 = torch.aten.unsqueeze %29, %int3 : !torch.vtensor<[2,1,1],si64>, !torch.int -> !torch.vtensor<[2,1,1,1],si64>
  %31 = torch.aten.unsqueeze %25, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %32 = torch.aten.unsqueeze %31, %int1 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %33 = torch.aten.unsqueeze %32, %int3 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?,1],si64>
  %34 = torch.aten.unsqueeze %27, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %35 = torch.aten.unsqueeze %34, %int1 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %36 = torch.aten.unsqueeze %35, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %39 = torch.prim.ListConstruct %30, %33 : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,?,1],si64>) -> !torch.list<vtensor>
  %40 = torch.aten.index.Tensor_hacked_twin %22, %39 : !torch.vtensor<[2,?],si64>, !torch.list<vtensor> -> !torch.vtensor<[2,1,?,1],si64>
  %41 = torch.prim.ListConstruct %30, %36 : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,1,?],si64>) -> !torch.list<vtensor>
  %42 = torch.aten.index.Tensor_hacked_twin %22, %41 : !torch.vtensor<[2,?],si64>, !torch.list<vtensor> -> !torch.vtensor<[2,1,1,?],si64>
  %43 = torch.aten.le.Tensor %42, %40 : !torch.vtensor<[2,1,1,?],si64>, !torch.vtensor<[2,1,?,1],si64> -> !torch.vtensor<[2,1,?,?],i1>
  %44 = torch.aten.bitwise_and.Tensor %2, %43 : !torch.vtensor<[],i1>, !torch.vtensor<[2,1,?,?],i1> -> !torch.vtensor<[2,1,?,?],i1>
  %45 = torch.prim.ListConstruct %30, %33 : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,?,1],si64>) -> !torch.list<vtensor>
  %46 = torch.aten.index.Tensor_hacked_twin %20, %45 : !torch.vtensor<[2,?],si64>, !torch.list<vtensor> -> !torch.vtensor<[2,1,?,1],si64>
  %47 = torch.prim.ListConstruct %30, %36 : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,1,?],si64>) -> !torch.list<vtensor>
  %48 = torch.aten.index.Tensor_hacked_twin %20, %47 : !torch.vtensor<[2,?],si64>, !torch.list<vtensor> -> !torch.vtensor<[2,1,1,?],si64>
  %49 = torch.aten.eq.Tensor %46, %48 : !torch.vtensor<[2,1,?,1],si64>, !torch.vtensor<[2,1,1,?],si64> -> !torch.vtensor<[2,1,?,?],i1>
  %50 = torch.aten.bitwise_and.Tensor %44, %49 : !torch.vtensor<[2,1,?,?],i1>, !torch.vtensor<[2,1,?,?],i1> -> !torch.vtensor<[2,1,?,?],i1>
  %51 = torch.prim.ListConstruct %int2, %int-1, %4, %4 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %52 = torch.aten.broadcast_to %50, %51 : !torch.vtensor<[2,1,?,?],i1>, !torch.list<int> -> !torch.vtensor<[2,1,?,?],i1>
  %out = torch.aten.scaled_dot_product_attention %arg1, %arg1, %arg1, %52, %float0, %false, %scale, %false : !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,1,?,?],i1>, !torch.float, !torch.bool, !torch.float, !torch.bool -> !torch.vtensor<[2,4,?,16],f32>
  return %out : !torch.vtensor<[2,4,?,16],f32>
}

// -----

// MistralForCausalLM with sliding_window=8: the same mask AND k > q - 8: a window of 8.
// CHECK-LABEL: func.func @hf_mistral_window_folds
// CHECK: torch.aten.scaled_dot_product_attention %arg1, %arg1, %arg1, %none{{[_0-9]*}}, %{{[^,]*}}, %true, %{{[^,]*}}, %false {autosp.window = 8 : i64}
func.func @hf_mistral_window_folds(%arg0: !torch.vtensor<[2,?],si64>, %arg1: !torch.vtensor<[2,4,?,16],f32>) -> !torch.vtensor<[2,4,?,16],f32> {
  %sym = torch.symbolic_int "s22" {min_val = 2, max_val = 9223372036854775807} : !torch.int
  torch.bind_symbolic_shape %arg0, [%sym], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  torch.bind_symbolic_shape %arg1, [%sym], affine_map<()[s0] -> (2, 4, s0, 16)> : !torch.vtensor<[2,4,?,16],f32>
  %float0 = torch.constant.float 0.000000e+00
  %scale = torch.constant.float 2.500000e-01
  %2 = torch.vtensor.literal(dense<true> : tensor<i1>) : !torch.vtensor<[],i1>
  %int8 = torch.constant.int 8
  %int3 = torch.constant.int 3
  %int2 = torch.constant.int 2
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %false = torch.constant.bool false
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %4 = torch.aten.size.int %arg0, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  %cpu = torch.constant.device "cpu"
  %6 = torch.aten.arange.start_step %int0, %4, %int1, %none, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %7 = torch.aten.add.Scalar %6, %int0, %int1 : !torch.vtensor<[?],si64>, !torch.int, !torch.int -> !torch.vtensor<[?],si64>
  %8 = torch.aten.unsqueeze %7, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %9 = torch.prim.ListConstruct %int2, %int-1 : (!torch.int, !torch.int) -> !torch.list<int>
  %10 = torch.aten.broadcast_to %8, %9 : !torch.vtensor<[1,?],si64>, !torch.list<int> -> !torch.vtensor<[2,?],si64>
  %11 = torch.aten.slice.Tensor %10, %int1, %int0, %int1, %int1 : !torch.vtensor<[2,?],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,1],si64>
  %12 = torch.aten.sub.Scalar %11, %int1, %int1 : !torch.vtensor<[2,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[2,1],si64>
  %13 = torch.prim.ListConstruct %12, %10 : (!torch.vtensor<[2,1],si64>, !torch.vtensor<[2,?],si64>) -> !torch.list<vtensor>
  %14 = torch.aten.cat %13, %int-1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,?],si64>
  %15 = torch.aten.add.int %int1, %4 : !torch.int, !torch.int -> !torch.int
  %16 = torch.aten.slice.Tensor %14, %int-1, %int0, %4, %int1 : !torch.vtensor<[2,?],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?],si64>
  %17 = torch.aten.slice.Tensor %14, %int-1, %int1, %15, %int1 : !torch.vtensor<[2,?],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?],si64>
  %18 = torch.aten.sub.Tensor %17, %16, %int1 : !torch.vtensor<[2,?],si64>, !torch.vtensor<[2,?],si64>, !torch.int -> !torch.vtensor<[2,?],si64>
  %19 = torch.aten.ne.Scalar %18, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.vtensor<[2,?],i1>
  %20 = torch.aten.cumsum %19, %int-1, %none : !torch.vtensor<[2,?],i1>, !torch.int, !torch.none -> !torch.vtensor<[2,?],si64>
  %21 = torch.prim.ListConstruct %int2, %int-1 : (!torch.int, !torch.int) -> !torch.list<int>
  %22 = torch.aten.broadcast_to %8, %21 : !torch.vtensor<[1,?],si64>, !torch.list<int> -> !torch.vtensor<[2,?],si64>
  %cpu_0 = torch.constant.device "cpu"
  %23 = torch.aten.arange.start_step %int0, %int2, %int1, %none, %int0, %cpu_0, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[2],si64>
  %cpu_1 = torch.constant.device "cpu"
  %24 = torch.aten.arange.start_step %int0, %4, %int1, %none, %int0, %cpu_1, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %25 = torch.aten.add.Scalar %24, %int0, %int1 : !torch.vtensor<[?],si64>, !torch.int, !torch.int -> !torch.vtensor<[?],si64>
  %cpu_2 = torch.constant.device "cpu"
  %26 = torch.aten.arange.start_step %int0, %4, %int1, %none, %int0, %cpu_2, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %27 = torch.aten.add.Scalar %26, %int0, %int1 : !torch.vtensor<[?],si64>, !torch.int, !torch.int -> !torch.vtensor<[?],si64>
  %28 = torch.aten.unsqueeze %23, %int1 : !torch.vtensor<[2],si64>, !torch.int -> !torch.vtensor<[2,1],si64>
  %29 = torch.aten.unsqueeze %28, %int2 : !torch.vtensor<[2,1],si64>, !torch.int -> !torch.vtensor<[2,1,1],si64>
  %30 = torch.aten.unsqueeze %29, %int3 : !torch.vtensor<[2,1,1],si64>, !torch.int -> !torch.vtensor<[2,1,1,1],si64>
  %31 = torch.aten.unsqueeze %25, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %32 = torch.aten.unsqueeze %31, %int1 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %33 = torch.aten.unsqueeze %32, %int3 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?,1],si64>
  %34 = torch.aten.unsqueeze %27, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %35 = torch.aten.unsqueeze %34, %int1 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %36 = torch.aten.unsqueeze %35, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %39 = torch.prim.ListConstruct %30, %33 : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,?,1],si64>) -> !torch.list<vtensor>
  %40 = torch.aten.index.Tensor_hacked_twin %22, %39 : !torch.vtensor<[2,?],si64>, !torch.list<vtensor> -> !torch.vtensor<[2,1,?,1],si64>
  %41 = torch.prim.ListConstruct %30, %36 : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,1,?],si64>) -> !torch.list<vtensor>
  %42 = torch.aten.index.Tensor_hacked_twin %22, %41 : !torch.vtensor<[2,?],si64>, !torch.list<vtensor> -> !torch.vtensor<[2,1,1,?],si64>
  %45 = torch.aten.sub.Scalar %40, %int8, %int1 : !torch.vtensor<[2,1,?,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[2,1,?,1],si64>
  %46 = torch.aten.gt.Tensor %42, %45 : !torch.vtensor<[2,1,1,?],si64>, !torch.vtensor<[2,1,?,1],si64> -> !torch.vtensor<[2,1,?,?],i1>
  %47 = torch.aten.bitwise_and.Tensor %2, %46 : !torch.vtensor<[],i1>, !torch.vtensor<[2,1,?,?],i1> -> !torch.vtensor<[2,1,?,?],i1>
  %48 = torch.aten.le.Tensor %42, %40 : !torch.vtensor<[2,1,1,?],si64>, !torch.vtensor<[2,1,?,1],si64> -> !torch.vtensor<[2,1,?,?],i1>
  %49 = torch.aten.bitwise_and.Tensor %47, %48 : !torch.vtensor<[2,1,?,?],i1>, !torch.vtensor<[2,1,?,?],i1> -> !torch.vtensor<[2,1,?,?],i1>
  %50 = torch.aten.bitwise_and.Tensor %2, %49 : !torch.vtensor<[],i1>, !torch.vtensor<[2,1,?,?],i1> -> !torch.vtensor<[2,1,?,?],i1>
  %51 = torch.prim.ListConstruct %30, %33 : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,?,1],si64>) -> !torch.list<vtensor>
  %52 = torch.aten.index.Tensor_hacked_twin %20, %51 : !torch.vtensor<[2,?],si64>, !torch.list<vtensor> -> !torch.vtensor<[2,1,?,1],si64>
  %53 = torch.prim.ListConstruct %30, %36 : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,1,?],si64>) -> !torch.list<vtensor>
  %54 = torch.aten.index.Tensor_hacked_twin %20, %53 : !torch.vtensor<[2,?],si64>, !torch.list<vtensor> -> !torch.vtensor<[2,1,1,?],si64>
  %55 = torch.aten.eq.Tensor %52, %54 : !torch.vtensor<[2,1,?,1],si64>, !torch.vtensor<[2,1,1,?],si64> -> !torch.vtensor<[2,1,?,?],i1>
  %56 = torch.aten.bitwise_and.Tensor %50, %55 : !torch.vtensor<[2,1,?,?],i1>, !torch.vtensor<[2,1,?,?],i1> -> !torch.vtensor<[2,1,?,?],i1>
  %57 = torch.prim.ListConstruct %int2, %int-1, %4, %4 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %58 = torch.aten.broadcast_to %56, %57 : !torch.vtensor<[2,1,?,?],i1>, !torch.list<int> -> !torch.vtensor<[2,1,?,?],i1>
  %out = torch.aten.scaled_dot_product_attention %arg1, %arg1, %arg1, %58, %float0, %false, %scale, %false : !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,1,?,?],i1>, !torch.float, !torch.bool, !torch.float, !torch.bool -> !torch.vtensor<[2,4,?,16],f32>
  return %out : !torch.vtensor<[2,4,?,16],f32>
}

// -----

// An additive float mask: zeros, -inf where k > q (masked_fill): folds.
// CHECK-LABEL: func.func @additive_masked_fill_folds
// CHECK: torch.aten.masked_fill.Scalar
// CHECK: %[[NONE:[^ ]+]] = torch.constant.none
// CHECK: %[[TRUE:[^ ]+]] = torch.constant.bool true
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[NONE]], %{{[^,]*}}, %[[TRUE]],
func.func @additive_masked_fill_folds(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %int6 = torch.constant.int 6
  %ninf = torch.constant.float 0xFFF0000000000000
  %sizes = torch.prim.ListConstruct %s, %s : (!torch.int, !torch.int) -> !torch.list<int>
  %z = torch.aten.zeros %sizes, %int6, %none, %cpu, %false : !torch.list<int>, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?,?],f32>
  %future = torch.aten.gt.Tensor %cols, %rows : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %m = torch.aten.masked_fill.Scalar %z, %future, %ninf : !torch.vtensor<[?,?],f32>, !torch.vtensor<[?,?],i1>, !torch.float -> !torch.vtensor<[?,?],f32>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// full(S, S, finfo.min).triu(1): 0 on and below the diagonal, the lowest float above: folds.
// CHECK-LABEL: func.func @additive_triu_folds
// CHECK: torch.aten.triu
// CHECK: %[[NONE:[^ ]+]] = torch.constant.none
// CHECK: %[[TRUE:[^ ]+]] = torch.constant.bool true
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[NONE]], %{{[^,]*}}, %[[TRUE]],
func.func @additive_triu_folds(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %int6 = torch.constant.int 6
  %min = torch.constant.float -3.4028234663852886E+38
  %sizes = torch.prim.ListConstruct %s, %s : (!torch.int, !torch.int) -> !torch.list<int>
  %full = torch.aten.full %sizes, %min, %int6, %none, %cpu, %false : !torch.list<int>, !torch.float, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?,?],f32>
  %m = torch.aten.triu %full, %int1 : !torch.vtensor<[?,?],f32>, !torch.int -> !torch.vtensor<[?,?],f32>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// An additive mask whose masked value (-1.0) does not zero the probability: kept.
// CHECK-LABEL: func.func @additive_soft_penalty_kept
// CHECK: %[[M:.*]] = torch.aten.where.Scalar
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false,
func.func @additive_soft_penalty_kept(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
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
  %minus1 = torch.constant.float -1.000000e+00
  %allowed = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %m = torch.aten.where.Scalar %allowed, %float0, %minus1 : !torch.vtensor<[?,?],i1>, !torch.float, !torch.float -> !torch.vtensor<[?,?],f32>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// Causal and a key padding mask read from an input (transformers' padding_mask_function:
// pad[b, k]): the mask operand becomes pad as [B, 1, 1, S], with is_causal and
// autosp.key_padding (the backend's causal + key padding kernel, O(S) bytes).
// CHECK-LABEL: func.func @causal_and_key_padding
// CHECK: %[[U1:.*]] = torch.aten.unsqueeze %arg1, %{{.*}} -> !torch.vtensor<[2,1,?],i1>
// CHECK: %[[U2:.*]] = torch.aten.unsqueeze %[[U1]], %{{.*}} -> !torch.vtensor<[2,1,1,?],i1>
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[U2]], %{{[^,]*}}, %true, %none, %false {autosp.key_padding}
// DCE-LABEL: func.func @causal_and_key_padding
// DCE-NOT: torch.aten.index.Tensor_hacked_twin
func.func @causal_and_key_padding(%arg0: !torch.vtensor<[2,2,?,8],f32>, %arg1: !torch.vtensor<[2,?],i1>) -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.int
  %b = torch.aten.arange.start_step %int0, %int2, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[2],si64>
  %b1 = torch.aten.unsqueeze %b, %int1 : !torch.vtensor<[2],si64>, !torch.int -> !torch.vtensor<[2,1],si64>
  %b2 = torch.aten.unsqueeze %b1, %int2 : !torch.vtensor<[2,1],si64>, !torch.int -> !torch.vtensor<[2,1,1],si64>
  %b3 = torch.aten.unsqueeze %b2, %int3 : !torch.vtensor<[2,1,1],si64>, !torch.int -> !torch.vtensor<[2,1,1,1],si64>
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int1 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %rows = torch.aten.unsqueeze %p2, %int3 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?,1],si64>
  %cols = torch.aten.unsqueeze %p2, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %causal = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %list = torch.prim.ListConstruct %b3, %cols : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,1,?],si64>) -> !torch.list<vtensor>
  %kp = torch.aten.index.Tensor_hacked_twin %arg1, %list : !torch.vtensor<[2,?],i1>, !torch.list<vtensor> -> !torch.vtensor<[2,1,1,?],i1>
  %m = torch.aten.bitwise_and.Tensor %causal, %kp : !torch.vtensor<[1,1,?,?],i1>, !torch.vtensor<[2,1,1,?],i1> -> !torch.vtensor<[2,1,?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,1,?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// Batch 1: broadcasting reads pad[0, k], still the key padding of the only row.
// CHECK-LABEL: func.func @causal_and_key_padding_batch_1
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %{{[0-9]+}}, %{{[^,]*}}, %true, %none, %false {autosp.key_padding}
func.func @causal_and_key_padding_batch_1(%arg0: !torch.vtensor<[1,2,?,8],f32>, %arg1: !torch.vtensor<[1,?],i1>) -> !torch.vtensor<[1,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.int
  %b = torch.aten.arange.start_step %int0, %int1, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[1],si64>
  %b1 = torch.aten.unsqueeze %b, %int1 : !torch.vtensor<[1],si64>, !torch.int -> !torch.vtensor<[1,1],si64>
  %b2 = torch.aten.unsqueeze %b1, %int2 : !torch.vtensor<[1,1],si64>, !torch.int -> !torch.vtensor<[1,1,1],si64>
  %b3 = torch.aten.unsqueeze %b2, %int3 : !torch.vtensor<[1,1,1],si64>, !torch.int -> !torch.vtensor<[1,1,1,1],si64>
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int1 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %rows = torch.aten.unsqueeze %p2, %int3 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?,1],si64>
  %cols = torch.aten.unsqueeze %p2, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %causal = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %list = torch.prim.ListConstruct %b3, %cols : (!torch.vtensor<[1,1,1,1],si64>, !torch.vtensor<[1,1,1,?],si64>) -> !torch.list<vtensor>
  %kp = torch.aten.index.Tensor_hacked_twin %arg1, %list : !torch.vtensor<[1,?],i1>, !torch.list<vtensor> -> !torch.vtensor<[1,1,1,?],i1>
  %m = torch.aten.bitwise_and.Tensor %causal, %kp : !torch.vtensor<[1,1,?,?],i1>, !torch.vtensor<[1,1,1,?],i1> -> !torch.vtensor<[1,1,?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,1,?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}

// -----

// The same with the padding read at the query index (pad[b, q]): not key padding, kept.
// CHECK-LABEL: func.func @query_padding_kept
// CHECK: %[[M:.*]] = torch.aten.bitwise_and.Tensor
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[M]], %{{[^,]*}}, %false, %none, %false {autosp.mask_kept =
// DCE-LABEL: func.func @query_padding_kept
func.func @query_padding_kept(%arg0: !torch.vtensor<[2,2,?,8],f32>, %arg1: !torch.vtensor<[2,?],i1>) -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.int
  %b = torch.aten.arange.start_step %int0, %int2, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[2],si64>
  %b1 = torch.aten.unsqueeze %b, %int1 : !torch.vtensor<[2],si64>, !torch.int -> !torch.vtensor<[2,1],si64>
  %b2 = torch.aten.unsqueeze %b1, %int2 : !torch.vtensor<[2,1],si64>, !torch.int -> !torch.vtensor<[2,1,1],si64>
  %b3 = torch.aten.unsqueeze %b2, %int3 : !torch.vtensor<[2,1,1],si64>, !torch.int -> !torch.vtensor<[2,1,1,1],si64>
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int1 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %rows = torch.aten.unsqueeze %p2, %int3 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?,1],si64>
  %cols = torch.aten.unsqueeze %p2, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %causal = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %list = torch.prim.ListConstruct %b3, %rows : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,?,1],si64>) -> !torch.list<vtensor>
  %qp = torch.aten.index.Tensor_hacked_twin %arg1, %list : !torch.vtensor<[2,?],i1>, !torch.list<vtensor> -> !torch.vtensor<[2,1,?,1],i1>
  %m = torch.aten.bitwise_and.Tensor %causal, %qp : !torch.vtensor<[1,1,?,?],i1>, !torch.vtensor<[2,1,?,1],i1> -> !torch.vtensor<[2,1,?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,1,?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// Packed documents as transformers builds them (batch 1): doc = cumsum(diff(pos) != 1) with
// torch.diff's prepend of pos[:, :1] - 1, and the mask causal on positions within a
// document: pos[k] <= pos[q] and doc[q] == doc[k]. Where doc[q] == doc[k] every step
// between k and q is +1, so pos[q] - pos[k] == q - k: causal within documents. The doc ids
// become the mask operand ([1, 1, 1, S]) with autosp.documents.
// CHECK-LABEL: func.func @packed_documents
// CHECK: %[[DOC:.*]] = torch.aten.cumsum
// CHECK: %[[D1:.*]] = torch.aten.unsqueeze %[[DOC]], %int1{{[_0-9]*}} : {{.*}} -> !torch.vtensor<[1,1,16],si64>
// CHECK: %[[D2:.*]] = torch.aten.unsqueeze %[[D1]], %int2{{[_0-9]*}} : {{.*}} -> !torch.vtensor<[1,1,1,16],si64>
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[D2]], %{{[^,]*}}, %true, %none, %false {autosp.documents}
// DCE-LABEL: func.func @packed_documents
// DCE-NOT: torch.aten.eq.Tensor
// DCE-NOT: torch.aten.le.Tensor
// DCE: torch.aten.scaled_dot_product_attention {{.*}} {autosp.documents}
func.func @packed_documents(%arg0: !torch.vtensor<[1,2,16,8],f32>, %arg1: !torch.vtensor<[1,16],si64>) -> !torch.vtensor<[1,2,16,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg1, %int1 : !torch.vtensor<[1,16],si64>, !torch.int -> !torch.int
  // doc = cumsum(diff(pos, prepend=pos[:, :1] - 1) != 1)
  %first = torch.aten.slice.Tensor %arg1, %int1, %int0, %int1, %int1 : !torch.vtensor<[1,16],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[1,1],si64>
  %dummy = torch.aten.sub.Scalar %first, %int1, %int1 : !torch.vtensor<[1,1],si64>, !torch.int, !torch.int -> !torch.vtensor<[1,1],si64>
  %parts = torch.prim.ListConstruct %dummy, %arg1 : (!torch.vtensor<[1,1],si64>, !torch.vtensor<[1,16],si64>) -> !torch.list<vtensor>
  %ext = torch.aten.cat %parts, %int-1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[1,16],si64>
  %s1 = torch.aten.add.int %int1, %s : !torch.int, !torch.int -> !torch.int
  %hi = torch.aten.slice.Tensor %ext, %int-1, %int1, %s1, %int1 : !torch.vtensor<[1,16],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[1,16],si64>
  %lo = torch.aten.slice.Tensor %ext, %int-1, %int0, %s, %int1 : !torch.vtensor<[1,16],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[1,16],si64>
  %diff = torch.aten.sub.Tensor %hi, %lo, %int1 : !torch.vtensor<[1,16],si64>, !torch.vtensor<[1,16],si64>, !torch.int -> !torch.vtensor<[1,16],si64>
  %new = torch.aten.ne.Scalar %diff, %int1 : !torch.vtensor<[1,16],si64>, !torch.int -> !torch.vtensor<[1,16],i1>
  %doc = torch.aten.cumsum %new, %int-1, %none : !torch.vtensor<[1,16],i1>, !torch.int, !torch.none -> !torch.vtensor<[1,16],si64>
  // index tensors: batch [1,1,1,1], queries [1,1,16,1], keys [1,1,1,16]
  %b = torch.aten.arange.start_step %int0, %int1, %int1, %none, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[1],si64>
  %b1 = torch.aten.unsqueeze %b, %int1 : !torch.vtensor<[1],si64>, !torch.int -> !torch.vtensor<[1,1],si64>
  %b2 = torch.aten.unsqueeze %b1, %int2 : !torch.vtensor<[1,1],si64>, !torch.int -> !torch.vtensor<[1,1,1],si64>
  %b3 = torch.aten.unsqueeze %b2, %int3 : !torch.vtensor<[1,1,1],si64>, !torch.int -> !torch.vtensor<[1,1,1,1],si64>
  %i = torch.aten.arange.start_step %int0, %s, %int1, %none, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[16],si64>
  %i1 = torch.aten.unsqueeze %i, %int0 : !torch.vtensor<[16],si64>, !torch.int -> !torch.vtensor<[1,16],si64>
  %i2 = torch.aten.unsqueeze %i1, %int1 : !torch.vtensor<[1,16],si64>, !torch.int -> !torch.vtensor<[1,1,16],si64>
  %rows = torch.aten.unsqueeze %i2, %int3 : !torch.vtensor<[1,1,16],si64>, !torch.int -> !torch.vtensor<[1,1,16,1],si64>
  %cols = torch.aten.unsqueeze %i2, %int2 : !torch.vtensor<[1,1,16],si64>, !torch.int -> !torch.vtensor<[1,1,1,16],si64>
  // causal on positions: pos[b, k] <= pos[b, q]
  %lq = torch.prim.ListConstruct %b3, %rows : (!torch.vtensor<[1,1,1,1],si64>, !torch.vtensor<[1,1,16,1],si64>) -> !torch.list<vtensor>
  %lk = torch.prim.ListConstruct %b3, %cols : (!torch.vtensor<[1,1,1,1],si64>, !torch.vtensor<[1,1,1,16],si64>) -> !torch.list<vtensor>
  %pq = torch.aten.index.Tensor_hacked_twin %arg1, %lq : !torch.vtensor<[1,16],si64>, !torch.list<vtensor> -> !torch.vtensor<[1,1,16,1],si64>
  %pk = torch.aten.index.Tensor_hacked_twin %arg1, %lk : !torch.vtensor<[1,16],si64>, !torch.list<vtensor> -> !torch.vtensor<[1,1,1,16],si64>
  %causal = torch.aten.le.Tensor %pk, %pq : !torch.vtensor<[1,1,1,16],si64>, !torch.vtensor<[1,1,16,1],si64> -> !torch.vtensor<[1,1,16,16],i1>
  // same document: doc[b, q] == doc[b, k]
  %dq = torch.aten.index.Tensor_hacked_twin %doc, %lq : !torch.vtensor<[1,16],si64>, !torch.list<vtensor> -> !torch.vtensor<[1,1,16,1],si64>
  %dk = torch.aten.index.Tensor_hacked_twin %doc, %lk : !torch.vtensor<[1,16],si64>, !torch.list<vtensor> -> !torch.vtensor<[1,1,1,16],si64>
  %same = torch.aten.eq.Tensor %dq, %dk : !torch.vtensor<[1,1,16,1],si64>, !torch.vtensor<[1,1,1,16],si64> -> !torch.vtensor<[1,1,16,16],i1>
  %m = torch.aten.bitwise_and.Tensor %causal, %same : !torch.vtensor<[1,1,16,16],i1>, !torch.vtensor<[1,1,16,16],i1> -> !torch.vtensor<[1,1,16,16],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,16,8],f32>, !torch.vtensor<[1,2,16,8],f32>, !torch.vtensor<[1,2,16,8],f32>, !torch.vtensor<[1,1,16,16],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,16,8],f32>
  return %0 : !torch.vtensor<[1,2,16,8],f32>
}

// -----

// Document ids from resets to 0 (cumsum(pos == 0)) say nothing about the steps in between:
// within a "document" pos may jump, so pos[k] <= pos[q] is not k <= q. Kept.
// CHECK-LABEL: func.func @documents_from_zeros_with_position_causal_kept
// DCE-LABEL: func.func @documents_from_zeros_with_position_causal_kept
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %{{[0-9]+}}, %{{[^,]*}}, %false, %none, %false {autosp.mask_kept = "formula is not k <= q: and(%arg1[0, i2] - %arg1[0, i3] >= 0, %1[0, i2] - %1[0, i3] == 0); data read: %arg1: reads the data of block argument %arg1; %1: cumsum of a value that is not constant"}
func.func @documents_from_zeros_with_position_causal_kept(%arg0: !torch.vtensor<[1,2,16,8],f32>, %arg1: !torch.vtensor<[1,16],si64>) -> !torch.vtensor<[1,2,16,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int-1 = torch.constant.int -1
  %zero = torch.aten.eq.Scalar %arg1, %int0 : !torch.vtensor<[1,16],si64>, !torch.int -> !torch.vtensor<[1,16],i1>
  %doc = torch.aten.cumsum %zero, %int-1, %none : !torch.vtensor<[1,16],i1>, !torch.int, !torch.none -> !torch.vtensor<[1,16],si64>
  %p0 = torch.aten.unsqueeze %arg1, %int1 : !torch.vtensor<[1,16],si64>, !torch.int -> !torch.vtensor<[1,1,16],si64>
  %pq = torch.aten.unsqueeze %p0, %int-1 : !torch.vtensor<[1,1,16],si64>, !torch.int -> !torch.vtensor<[1,1,16,1],si64>
  %pk = torch.aten.unsqueeze %p0, %int2 : !torch.vtensor<[1,1,16],si64>, !torch.int -> !torch.vtensor<[1,1,1,16],si64>
  %causal = torch.aten.le.Tensor %pk, %pq : !torch.vtensor<[1,1,1,16],si64>, !torch.vtensor<[1,1,16,1],si64> -> !torch.vtensor<[1,1,16,16],i1>
  %d0 = torch.aten.unsqueeze %doc, %int1 : !torch.vtensor<[1,16],si64>, !torch.int -> !torch.vtensor<[1,1,16],si64>
  %dq = torch.aten.unsqueeze %d0, %int-1 : !torch.vtensor<[1,1,16],si64>, !torch.int -> !torch.vtensor<[1,1,16,1],si64>
  %dk = torch.aten.unsqueeze %d0, %int2 : !torch.vtensor<[1,1,16],si64>, !torch.int -> !torch.vtensor<[1,1,1,16],si64>
  %same = torch.aten.eq.Tensor %dq, %dk : !torch.vtensor<[1,1,16,1],si64>, !torch.vtensor<[1,1,1,16],si64> -> !torch.vtensor<[1,1,16,16],i1>
  %m = torch.aten.bitwise_and.Tensor %causal, %same : !torch.vtensor<[1,1,16,16],i1>, !torch.vtensor<[1,1,16,16],i1> -> !torch.vtensor<[1,1,16,16],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,16,8],f32>, !torch.vtensor<[1,2,16,8],f32>, !torch.vtensor<[1,2,16,8],f32>, !torch.vtensor<[1,1,16,16],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,16,8],f32>
  return %0 : !torch.vtensor<[1,2,16,8],f32>
}

// -----

// A segment-id input (batch 2) and a tril of ones, as a hand-written model builds it:
// same segment & k <= q, whatever the ids are (the kernel groups equal ids).
// CHECK-LABEL: func.func @segment_ids_and_tril
// CHECK: %[[S1:.*]] = torch.aten.unsqueeze %arg1, %int1{{[_0-9]+}} : {{.*}} -> !torch.vtensor<[2,1,16],si64>
// CHECK: %[[S2:.*]] = torch.aten.unsqueeze %[[S1]], %int2{{[_0-9]+}} : {{.*}} -> !torch.vtensor<[2,1,1,16],si64>
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[S2]], %{{[^,]*}}, %true{{[_0-9]*}}, %none, %false {autosp.documents}
func.func @segment_ids_and_tril(%arg0: !torch.vtensor<[2,2,16,8],f32>, %arg1: !torch.vtensor<[2,16],si64>) -> !torch.vtensor<[2,2,16,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int11 = torch.constant.int 11
  %int-1 = torch.constant.int -1
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg1, %int1 : !torch.vtensor<[2,16],si64>, !torch.int -> !torch.int
  %d0 = torch.aten.unsqueeze %arg1, %int1 : !torch.vtensor<[2,16],si64>, !torch.int -> !torch.vtensor<[2,1,16],si64>
  %dq = torch.aten.unsqueeze %d0, %int-1 : !torch.vtensor<[2,1,16],si64>, !torch.int -> !torch.vtensor<[2,1,16,1],si64>
  %dk = torch.aten.unsqueeze %d0, %int2 : !torch.vtensor<[2,1,16],si64>, !torch.int -> !torch.vtensor<[2,1,1,16],si64>
  %same = torch.aten.eq.Tensor %dq, %dk : !torch.vtensor<[2,1,16,1],si64>, !torch.vtensor<[2,1,1,16],si64> -> !torch.vtensor<[2,1,16,16],i1>
  %size = torch.prim.ListConstruct %s, %s : (!torch.int, !torch.int) -> !torch.list<int>
  %ones = torch.aten.ones %size, %int11, %none, %cpu, %false : !torch.list<int>, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[16,16],i1>
  %tril = torch.aten.tril %ones, %int0 : !torch.vtensor<[16,16],i1>, !torch.int -> !torch.vtensor<[16,16],i1>
  %m = torch.aten.bitwise_and.Tensor %same, %tril : !torch.vtensor<[2,1,16,16],i1>, !torch.vtensor<[16,16],i1> -> !torch.vtensor<[2,1,16,16],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,1,16,16],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,16,8],f32>
  return %0 : !torch.vtensor<[2,2,16,8],f32>
}

// -----

// Causal + key padding as eager attention's additive mask (0 / finfo.min): recognised, and a
// query whose keys are all padded keeps eager's answer (equal scores: uniform softmax):
// autosp.empty_rows = "uniform".
// CHECK-LABEL: func.func @additive_key_padding_empty_rows_uniform
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %{{[0-9]+}}, %{{[^,]*}}, %true, %none, %false {autosp.empty_rows = "uniform", autosp.key_padding}
func.func @additive_key_padding_empty_rows_uniform(%arg0: !torch.vtensor<[2,2,16,8],f32>, %arg1: !torch.vtensor<[2,16],i1>) -> !torch.vtensor<[2,2,16,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %min = torch.constant.float -3.4028234663852886E+38
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %int16 = torch.constant.int 16
  %cpu = torch.constant.device "cpu"
  %b = torch.aten.arange.start_step %int0, %int2, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[2],si64>
  %b1 = torch.aten.unsqueeze %b, %int1 : !torch.vtensor<[2],si64>, !torch.int -> !torch.vtensor<[2,1],si64>
  %b2 = torch.aten.unsqueeze %b1, %int2 : !torch.vtensor<[2,1],si64>, !torch.int -> !torch.vtensor<[2,1,1],si64>
  %b3 = torch.aten.unsqueeze %b2, %int3 : !torch.vtensor<[2,1,1],si64>, !torch.int -> !torch.vtensor<[2,1,1,1],si64>
  %pos = torch.aten.arange.start_step %int0, %int16, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[16],si64>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[16],si64>, !torch.int -> !torch.vtensor<[1,16],si64>
  %p2 = torch.aten.unsqueeze %p1, %int1 : !torch.vtensor<[1,16],si64>, !torch.int -> !torch.vtensor<[1,1,16],si64>
  %rows = torch.aten.unsqueeze %p2, %int3 : !torch.vtensor<[1,1,16],si64>, !torch.int -> !torch.vtensor<[1,1,16,1],si64>
  %cols = torch.aten.unsqueeze %p2, %int2 : !torch.vtensor<[1,1,16],si64>, !torch.int -> !torch.vtensor<[1,1,1,16],si64>
  %causal = torch.aten.le.Tensor %cols, %rows : !torch.vtensor<[1,1,1,16],si64>, !torch.vtensor<[1,1,16,1],si64> -> !torch.vtensor<[1,1,16,16],i1>
  %list = torch.prim.ListConstruct %b3, %cols : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,1,16],si64>) -> !torch.list<vtensor>
  %kp = torch.aten.index.Tensor_hacked_twin %arg1, %list : !torch.vtensor<[2,16],i1>, !torch.list<vtensor> -> !torch.vtensor<[2,1,1,16],i1>
  %allowed = torch.aten.bitwise_and.Tensor %causal, %kp : !torch.vtensor<[1,1,16,16],i1>, !torch.vtensor<[2,1,1,16],i1> -> !torch.vtensor<[2,1,16,16],i1>
  %m = torch.aten.where.Scalar %allowed, %float0, %min : !torch.vtensor<[2,1,16,16],i1>, !torch.float, !torch.float -> !torch.vtensor<[2,1,16,16],f32>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,1,16,16],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,16,8],f32>
  return %0 : !torch.vtensor<[2,2,16,8],f32>
}

// -----

// transformers 4.x's _prepare_4d_causal_attention_mask_with_cache_position: triu of
// finfo.min times (arange > cache_position), expanded, cloned, and the padding written into
// a slice (masked_fill where mask + attention_mask == 0, then slice_scatter). An integer
// attention_mask read != 0 is key padding: causal + key padding, the padding compared
// to 0 as the mask operand.
// CHECK-LABEL: func.func @old_4d_helper
// CHECK: %[[NZ:.*]] = torch.aten.ne.Scalar %arg1, %{{.*}} -> !torch.vtensor<[2,16],i1>
// CHECK: %[[U1:.*]] = torch.aten.unsqueeze %[[NZ]]
// CHECK: %[[U2:.*]] = torch.aten.unsqueeze %[[U1]]
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[U2]], %{{[^,]*}}, %true, %none, %false {autosp.empty_rows = "uniform", autosp.key_padding}
func.func @old_4d_helper(%arg0: !torch.vtensor<[2,2,16,8],f32>, %arg1: !torch.vtensor<[2,16],si64>) -> !torch.vtensor<[2,2,16,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %min = torch.constant.float -3.4028234663852886E+38
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %int6 = torch.constant.int 6
  %int16 = torch.constant.int 16
  %int-1 = torch.constant.int -1
  %cpu = torch.constant.device "cpu"
  %ss = torch.prim.ListConstruct %int16, %int16 : (!torch.int, !torch.int) -> !torch.list<int>
  %full = torch.aten.full %ss, %min, %int6, %none, %cpu, %false : !torch.list<int>, !torch.float, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[16,16],f32>
  %triu = torch.aten.triu %full, %int1 : !torch.vtensor<[16,16],f32>, !torch.int -> !torch.vtensor<[16,16],f32>
  %ar = torch.aten.arange.start_step %int0, %int16, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[16],si64>
  %cp = torch.aten.arange.start_step %int0, %int16, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[16],si64>
  %shape = torch.prim.ListConstruct %int-1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %cpcol = torch.aten.view %cp, %shape : !torch.vtensor<[16],si64>, !torch.list<int> -> !torch.vtensor<[16,1],si64>
  %later = torch.aten.gt.Tensor %ar, %cpcol : !torch.vtensor<[16],si64>, !torch.vtensor<[16,1],si64> -> !torch.vtensor<[16,16],i1>
  %causal = torch.aten.mul.Tensor %triu, %later : !torch.vtensor<[16,16],f32>, !torch.vtensor<[16,16],i1> -> !torch.vtensor<[16,16],f32>
  %c1 = torch.aten.unsqueeze %causal, %int0 : !torch.vtensor<[16,16],f32>, !torch.int -> !torch.vtensor<[1,16,16],f32>
  %c2 = torch.aten.unsqueeze %c1, %int1 : !torch.vtensor<[1,16,16],f32>, !torch.int -> !torch.vtensor<[1,1,16,16],f32>
  %es = torch.prim.ListConstruct %int2, %int1, %int-1, %int-1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %exp = torch.aten.expand %c2, %es, %false : !torch.vtensor<[1,1,16,16],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,1,16,16],f32>
  %cl = torch.aten.clone %exp, %none : !torch.vtensor<[2,1,16,16],f32>, !torch.none -> !torch.vtensor<[2,1,16,16],f32>
  %sl = torch.aten.slice.Tensor %cl, %int3, %none, %int16, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.int, !torch.none, !torch.int, !torch.int -> !torch.vtensor<[2,1,16,16],f32>
  %a1 = torch.aten.unsqueeze %arg1, %int1 : !torch.vtensor<[2,16],si64>, !torch.int -> !torch.vtensor<[2,1,16],si64>
  %a2 = torch.aten.unsqueeze %a1, %int2 : !torch.vtensor<[2,1,16],si64>, !torch.int -> !torch.vtensor<[2,1,1,16],si64>
  %sum = torch.aten.add.Tensor %sl, %a2, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.vtensor<[2,1,1,16],si64>, !torch.int -> !torch.vtensor<[2,1,16,16],f32>
  %padm = torch.aten.eq.Scalar %sum, %int0 : !torch.vtensor<[2,1,16,16],f32>, !torch.int -> !torch.vtensor<[2,1,16,16],i1>
  %sl2 = torch.aten.slice.Tensor %cl, %int3, %none, %int16, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.int, !torch.none, !torch.int, !torch.int -> !torch.vtensor<[2,1,16,16],f32>
  %filled = torch.aten.masked_fill.Scalar %sl2, %padm, %min : !torch.vtensor<[2,1,16,16],f32>, !torch.vtensor<[2,1,16,16],i1>, !torch.float -> !torch.vtensor<[2,1,16,16],f32>
  %m = torch.aten.slice_scatter %cl, %filled, %int3, %none, %int16, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.vtensor<[2,1,16,16],f32>, !torch.int, !torch.none, !torch.int, !torch.int -> !torch.vtensor<[2,1,16,16],f32>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,1,16,16],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,16,8],f32>
  return %0 : !torch.vtensor<[2,2,16,8],f32>
}

// -----

// The same helper comparing (mask + attention_mask) < 1 instead of == 0: an ordered float
// comparison of integer data is not modelled (a large integer may round), so the mask is kept.
// CHECK-LABEL: func.func @old_4d_helper_ordered_comparison_kept
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %{{[0-9]+}}, %{{[^,]*}}, %false, %none, %false {autosp.mask_kept = "{{.*}}ordered float comparison
func.func @old_4d_helper_ordered_comparison_kept(%arg0: !torch.vtensor<[2,2,16,8],f32>, %arg1: !torch.vtensor<[2,16],si64>) -> !torch.vtensor<[2,2,16,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %min = torch.constant.float -3.4028234663852886E+38
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %int6 = torch.constant.int 6
  %int16 = torch.constant.int 16
  %int-1 = torch.constant.int -1
  %cpu = torch.constant.device "cpu"
  %ss = torch.prim.ListConstruct %int16, %int16 : (!torch.int, !torch.int) -> !torch.list<int>
  %full = torch.aten.full %ss, %min, %int6, %none, %cpu, %false : !torch.list<int>, !torch.float, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[16,16],f32>
  %triu = torch.aten.triu %full, %int1 : !torch.vtensor<[16,16],f32>, !torch.int -> !torch.vtensor<[16,16],f32>
  %ar = torch.aten.arange.start_step %int0, %int16, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[16],si64>
  %cp = torch.aten.arange.start_step %int0, %int16, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[16],si64>
  %shape = torch.prim.ListConstruct %int-1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %cpcol = torch.aten.view %cp, %shape : !torch.vtensor<[16],si64>, !torch.list<int> -> !torch.vtensor<[16,1],si64>
  %later = torch.aten.gt.Tensor %ar, %cpcol : !torch.vtensor<[16],si64>, !torch.vtensor<[16,1],si64> -> !torch.vtensor<[16,16],i1>
  %causal = torch.aten.mul.Tensor %triu, %later : !torch.vtensor<[16,16],f32>, !torch.vtensor<[16,16],i1> -> !torch.vtensor<[16,16],f32>
  %c1 = torch.aten.unsqueeze %causal, %int0 : !torch.vtensor<[16,16],f32>, !torch.int -> !torch.vtensor<[1,16,16],f32>
  %c2 = torch.aten.unsqueeze %c1, %int1 : !torch.vtensor<[1,16,16],f32>, !torch.int -> !torch.vtensor<[1,1,16,16],f32>
  %es = torch.prim.ListConstruct %int2, %int1, %int-1, %int-1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %exp = torch.aten.expand %c2, %es, %false : !torch.vtensor<[1,1,16,16],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,1,16,16],f32>
  %cl = torch.aten.clone %exp, %none : !torch.vtensor<[2,1,16,16],f32>, !torch.none -> !torch.vtensor<[2,1,16,16],f32>
  %sl = torch.aten.slice.Tensor %cl, %int3, %none, %int16, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.int, !torch.none, !torch.int, !torch.int -> !torch.vtensor<[2,1,16,16],f32>
  %a1 = torch.aten.unsqueeze %arg1, %int1 : !torch.vtensor<[2,16],si64>, !torch.int -> !torch.vtensor<[2,1,16],si64>
  %a2 = torch.aten.unsqueeze %a1, %int2 : !torch.vtensor<[2,1,16],si64>, !torch.int -> !torch.vtensor<[2,1,1,16],si64>
  %sum = torch.aten.add.Tensor %sl, %a2, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.vtensor<[2,1,1,16],si64>, !torch.int -> !torch.vtensor<[2,1,16,16],f32>
  %padm = torch.aten.lt.Scalar %sum, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.int -> !torch.vtensor<[2,1,16,16],i1>
  %sl2 = torch.aten.slice.Tensor %cl, %int3, %none, %int16, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.int, !torch.none, !torch.int, !torch.int -> !torch.vtensor<[2,1,16,16],f32>
  %filled = torch.aten.masked_fill.Scalar %sl2, %padm, %min : !torch.vtensor<[2,1,16,16],f32>, !torch.vtensor<[2,1,16,16],i1>, !torch.float -> !torch.vtensor<[2,1,16,16],f32>
  %m = torch.aten.slice_scatter %cl, %filled, %int3, %none, %int16, %int1 : !torch.vtensor<[2,1,16,16],f32>, !torch.vtensor<[2,1,16,16],f32>, !torch.int, !torch.none, !torch.int, !torch.int -> !torch.vtensor<[2,1,16,16],f32>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,2,16,8],f32>, !torch.vtensor<[2,1,16,16],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,16,8],f32>
  return %0 : !torch.vtensor<[2,2,16,8],f32>
}

// -----

// An encoder's mask: key padding alone, expanded to [B, 1, S, S] (transformers' bidirectional
// mask, pad[b, k] for every query). Proven key padding without causality: the operand
// becomes pad as [B, 1, 1, S] with autosp.key_padding, and is_causal stays false (the
// backend's bidirectional key padding kernel, O(S) bytes).
// CHECK-LABEL: func.func @bidirectional_key_padding
// CHECK: %[[U1:.*]] = torch.aten.unsqueeze %arg1, %{{.*}} -> !torch.vtensor<[2,1,?],i1>
// CHECK: %[[U2:.*]] = torch.aten.unsqueeze %[[U1]], %{{.*}} -> !torch.vtensor<[2,1,1,?],i1>
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[U2]], %{{[^,]*}}, %false, %none, %false {autosp.key_padding}
func.func @bidirectional_key_padding(%arg0: !torch.vtensor<[2,2,?,8],f32>, %arg1: !torch.vtensor<[2,?],i1>) -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.int
  %b = torch.aten.arange.start_step %int0, %int2, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[2],si64>
  %b1 = torch.aten.unsqueeze %b, %int1 : !torch.vtensor<[2],si64>, !torch.int -> !torch.vtensor<[2,1],si64>
  %b2 = torch.aten.unsqueeze %b1, %int2 : !torch.vtensor<[2,1],si64>, !torch.int -> !torch.vtensor<[2,1,1],si64>
  %b3 = torch.aten.unsqueeze %b2, %int3 : !torch.vtensor<[2,1,1],si64>, !torch.int -> !torch.vtensor<[2,1,1,1],si64>
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int1 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %cols = torch.aten.unsqueeze %p2, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %list = torch.prim.ListConstruct %b3, %cols : (!torch.vtensor<[2,1,1,1],si64>, !torch.vtensor<[1,1,1,?],si64>) -> !torch.list<vtensor>
  %kp = torch.aten.index.Tensor_hacked_twin %arg1, %list : !torch.vtensor<[2,?],i1>, !torch.list<vtensor> -> !torch.vtensor<[2,1,1,?],i1>
  %sizes = torch.prim.ListConstruct %int2, %int1, %s, %s : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %m = torch.aten.expand %kp, %sizes, %false : !torch.vtensor<[2,1,1,?],i1>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,1,?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,1,?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// The same padding as a one-row mask ([B, 1, 1, S], as encoders written by hand pass it):
// the same row for every query, allowed because the formula reads no query index.
// CHECK-LABEL: func.func @one_row_key_padding
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %{{[0-9]+}}, %{{[^,]*}}, %false, %none, %false {autosp.key_padding}
func.func @one_row_key_padding(%arg0: !torch.vtensor<[2,2,?,8],f32>, %arg1: !torch.vtensor<[2,?],i1>) -> !torch.vtensor<[2,2,?,8],f32> {
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %arg0, [%s], affine_map<()[s0] -> (2, 2, s0, 8)> : !torch.vtensor<[2,2,?,8],f32>
  torch.bind_symbolic_shape %arg1, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],i1>
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %u1 = torch.aten.unsqueeze %arg1, %int1 : !torch.vtensor<[2,?],i1>, !torch.int -> !torch.vtensor<[2,1,?],i1>
  %m = torch.aten.unsqueeze %u1, %int2 : !torch.vtensor<[2,1,?],i1>, !torch.int -> !torch.vtensor<[2,1,1,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,1,1,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// A one-row mask that is not key padding alone (it reads the query index 0 for every
// query: causal at row 0 only): kept.
// CHECK-LABEL: func.func @one_row_causal_kept
// CHECK: torch.aten.scaled_dot_product_attention {{.*}} {autosp.mask_kept =
func.func @one_row_causal_kept(%arg0: !torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %le = torch.aten.le.Scalar %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?],i1>
  %u0 = torch.aten.unsqueeze %le, %int0 : !torch.vtensor<[?],i1>, !torch.int -> !torch.vtensor<[1,?],i1>
  %u1 = torch.aten.unsqueeze %u0, %int1 : !torch.vtensor<[1,?],i1>, !torch.int -> !torch.vtensor<[1,1,?],i1>
  %m = torch.aten.unsqueeze %u1, %int2 : !torch.vtensor<[1,1,?],i1>, !torch.int -> !torch.vtensor<[1,1,1,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[1,1,1,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// Llama 4's chunked attention: q // 4 == k // 4 and k <= q. The chunk ids floor(i / 4)
// are one derived tensor (same formula, whatever its broadcast): proven documents, built
// from the keys' ids by reading index 0 of the dims they do not use, as [1, 1, 1, S].
// CHECK-LABEL: func.func @chunked_attention_documents
// CHECK: %[[KC:.*]] = torch.aten.div.Tensor_mode %{{.*}} -> !torch.vtensor<[1,1,1,?],si64>
// CHECK: %[[A:.*]] = torch.aten.select.int %[[KC]], %int2{{[_0-9]*}}, %int0{{[_0-9]*}} : {{.*}} -> !torch.vtensor<[1,1,?],si64>
// CHECK: %[[B:.*]] = torch.aten.select.int %[[A]], %int1{{[_0-9]*}}, %int0{{[_0-9]*}} : {{.*}} -> !torch.vtensor<[1,?],si64>
// CHECK: %[[C:.*]] = torch.aten.select.int %[[B]], %int0{{[_0-9]*}}, %int0{{[_0-9]*}} : {{.*}} -> !torch.vtensor<[?],si64>
// CHECK: %[[D:.*]] = torch.aten.unsqueeze %[[C]], %int0{{[_0-9]*}} : {{.*}} -> !torch.vtensor<[1,?],si64>
// CHECK: %[[E:.*]] = torch.aten.unsqueeze %[[D]], %int1{{[_0-9]*}} : {{.*}} -> !torch.vtensor<[1,1,?],si64>
// CHECK: %[[F:.*]] = torch.aten.unsqueeze %[[E]], %int2{{[_0-9]*}} : {{.*}} -> !torch.vtensor<[1,1,1,?],si64>
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %[[F]], %{{[^,]*}}, %true{{[_0-9]*}}, %none{{[_0-9]*}}, %false {autosp.documents}
func.func @chunked_attention_documents(%arg0: !torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %floor = torch.constant.str "floor"
  %cpu = torch.constant.device "cpu"
  %c = torch.vtensor.literal(dense<4> : tensor<si64>) : !torch.vtensor<[],si64>
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int0 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %qi = torch.aten.unsqueeze %p2, %int3 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?,1],si64>
  %ki = torch.aten.unsqueeze %p2, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %qc = torch.aten.div.Tensor_mode %qi, %c, %floor : !torch.vtensor<[1,1,?,1],si64>, !torch.vtensor<[],si64>, !torch.str -> !torch.vtensor<[1,1,?,1],si64>
  %kc = torch.aten.div.Tensor_mode %ki, %c, %floor : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[],si64>, !torch.str -> !torch.vtensor<[1,1,1,?],si64>
  %same = torch.aten.eq.Tensor %kc, %qc : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %causal = torch.aten.le.Tensor %ki, %qi : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %m = torch.aten.bitwise_and.Tensor %same, %causal : !torch.vtensor<[1,1,?,?],i1>, !torch.vtensor<[1,1,?,?],i1> -> !torch.vtensor<[1,1,?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[1,1,?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// q // 4 == k // 8 is not one tensor of ids read at q and at k: kept.
// CHECK-LABEL: func.func @chunks_of_different_sizes_kept
// CHECK: torch.aten.scaled_dot_product_attention {{.*}} {autosp.mask_kept = "formula is not k <= q
func.func @chunks_of_different_sizes_kept(%arg0: !torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %floor = torch.constant.str "floor"
  %cpu = torch.constant.device "cpu"
  %c = torch.vtensor.literal(dense<4> : tensor<si64>) : !torch.vtensor<[],si64>
  %c8 = torch.vtensor.literal(dense<8> : tensor<si64>) : !torch.vtensor<[],si64>
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int0 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %qi = torch.aten.unsqueeze %p2, %int3 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?,1],si64>
  %ki = torch.aten.unsqueeze %p2, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %qc = torch.aten.div.Tensor_mode %qi, %c, %floor : !torch.vtensor<[1,1,?,1],si64>, !torch.vtensor<[],si64>, !torch.str -> !torch.vtensor<[1,1,?,1],si64>
  %kc = torch.aten.div.Tensor_mode %ki, %c8, %floor : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[],si64>, !torch.str -> !torch.vtensor<[1,1,1,?],si64>
  %same = torch.aten.eq.Tensor %kc, %qc : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %causal = torch.aten.le.Tensor %ki, %qi : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %m = torch.aten.bitwise_and.Tensor %same, %causal : !torch.vtensor<[1,1,?,?],i1>, !torch.vtensor<[1,1,?,?],i1> -> !torch.vtensor<[1,1,?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[1,1,?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// Only rounding_mode = "floor" is modelled: truncating division is data, and the two
// tensors of ids are different data: kept, naming the op.
// CHECK-LABEL: func.func @truncated_chunks_kept
// CHECK: torch.aten.scaled_dot_product_attention {{.*}} {autosp.mask_kept = "formula is not k <= q{{.*}}only rounding_mode='floor' is modelled
func.func @truncated_chunks_kept(%arg0: !torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %floor = torch.constant.str "trunc"
  %cpu = torch.constant.device "cpu"
  %c = torch.vtensor.literal(dense<4> : tensor<si64>) : !torch.vtensor<[],si64>
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int0 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?],si64>
  %qi = torch.aten.unsqueeze %p2, %int3 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,?,1],si64>
  %ki = torch.aten.unsqueeze %p2, %int2 : !torch.vtensor<[1,1,?],si64>, !torch.int -> !torch.vtensor<[1,1,1,?],si64>
  %qc = torch.aten.div.Tensor_mode %qi, %c, %floor : !torch.vtensor<[1,1,?,1],si64>, !torch.vtensor<[],si64>, !torch.str -> !torch.vtensor<[1,1,?,1],si64>
  %kc = torch.aten.div.Tensor_mode %ki, %c, %floor : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[],si64>, !torch.str -> !torch.vtensor<[1,1,1,?],si64>
  %same = torch.aten.eq.Tensor %kc, %qc : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %causal = torch.aten.le.Tensor %ki, %qi : !torch.vtensor<[1,1,1,?],si64>, !torch.vtensor<[1,1,?,1],si64> -> !torch.vtensor<[1,1,?,?],i1>
  %m = torch.aten.bitwise_and.Tensor %same, %causal : !torch.vtensor<[1,1,?,?],i1>, !torch.vtensor<[1,1,?,?],i1> -> !torch.vtensor<[1,1,?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[1,1,?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// MPT's mask: an additive float mask (finfo.min where k > q, else 0) cast to bool (True:
// masked) and negated by autosp-fuse-attention's masked_fill form. The cast reads "nonzero"
// of each piece: exactly k > q; its negation k <= q is causal.
// CHECK-LABEL: func.func @float_mask_cast_to_bool_folds
// CHECK: torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %none{{[_0-9]*}}, %{{[^,]*}}, %true,
// DCE-LABEL: func.func @float_mask_cast_to_bool_folds
// DCE-NOT: torch.aten.where.self
func.func @float_mask_cast_to_bool_folds(%arg0: !torch.vtensor<[1,2,?,8],f32>) -> !torch.vtensor<[1,2,?,8],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int11 = torch.constant.int 11
  %cpu = torch.constant.device "cpu"
  %s = torch.aten.size.int %arg0, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %rows = torch.aten.unsqueeze %pos, %int1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  %cols = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %future = torch.aten.gt.Tensor %cols, %rows : !torch.vtensor<[1,?],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,?],i1>
  %min = torch.vtensor.literal(dense<-3.40282347E+38> : tensor<f32>) : !torch.vtensor<[],f32>
  %zero = torch.vtensor.literal(dense<0.000000e+00> : tensor<f32>) : !torch.vtensor<[],f32>
  %f = torch.aten.where.self %future, %min, %zero : !torch.vtensor<[?,?],i1>, !torch.vtensor<[],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[?,?],f32>
  %b = torch.aten.to.dtype %f, %int11, %false, %false, %none : !torch.vtensor<[?,?],f32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[?,?],i1>
  %m = torch.aten.logical_not %b : !torch.vtensor<[?,?],i1> -> !torch.vtensor<[?,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %arg0, %arg0, %arg0, %m, %float0, %false, %none, %false : !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[?,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,2,?,8],f32>
  return %0 : !torch.vtensor<[1,2,?,8],f32>
}
