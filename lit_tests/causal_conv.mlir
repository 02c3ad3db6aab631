// RUN: autosp-opt %s --split-input-file --autosp-causal-conv | FileCheck %s

// A left pad of k - 1 = 3 zeros, then a valid convolution of kernel 4 (Qwen3.5,
// torchtitan): becomes the convolution with padding 3 cut back to the input's length, the
// form autosp-shard-sequence proves causal. The length is read with size.int (static here).
// CHECK-LABEL: func.func @static_length_rewritten
// CHECK-NOT: torch.aten.constant_pad_nd
// CHECK: %[[K1:int3_[^ ]+]] = torch.constant.int 3
// CHECK: %[[PAD:[^ ]+]] = torch.prim.ListConstruct %[[K1]] : (!torch.int) -> !torch.list<int>
// CHECK: %[[LONG:[^ ]+]] = torch.aten.convolution %arg0, %arg1, %arg2, %{{[^,]+}}, %[[PAD]], %{{[^,]+}}, %false, %{{[^,]+}}, %int8 : {{.*}} -> !torch.vtensor<[2,8,18],f32>
// CHECK: %[[TWO:[^ ]+]] = torch.constant.int 2
// CHECK: %[[LEN:[^ ]+]] = torch.aten.size.int %arg0, %[[TWO]] : !torch.vtensor<[2,8,15],f32>, !torch.int -> !torch.int
// CHECK: %[[ZERO:[^ ]+]] = torch.constant.int 0
// CHECK: %[[ONE:[^ ]+]] = torch.constant.int 1
// CHECK: %[[CUT:[^ ]+]] = torch.aten.slice.Tensor %[[LONG]], %[[TWO]], %[[ZERO]], %[[LEN]], %[[ONE]] : {{.*}} -> !torch.vtensor<[2,8,15],f32>
// CHECK-NOT: torch.aten.constant_pad_nd
// CHECK: return %[[CUT]]
func.func @static_length_rewritten(%arg0: !torch.vtensor<[2,8,15],f32>, %arg1: !torch.vtensor<[8,1,4],f32>, %arg2: !torch.vtensor<[8],f32>) -> !torch.vtensor<[2,8,15],f32> {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int3 = torch.constant.int 3
  %int8 = torch.constant.int 8
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %pad = torch.prim.ListConstruct %int3, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %xp = torch.aten.constant_pad_nd %arg0, %pad, %float0 : !torch.vtensor<[2,8,15],f32>, !torch.list<int>, !torch.float -> !torch.vtensor<[2,8,18],f32>
  %one = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %zero = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %xp, %arg1, %arg2, %one, %zero, %one, %false, %zero, %int8 : !torch.vtensor<[2,8,18],f32>, !torch.vtensor<[8,1,4],f32>, !torch.vtensor<[8],f32>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,8,15],f32>
  return %y : !torch.vtensor<[2,8,15],f32>
}

// -----

// A dynamic length, as imported (symbolic shapes bound, an integer pad value): the padded
// convolution is bound one kernel - 1 longer, the cut keeps the old binding. The pad has
// another user, so it stays for it.
// CHECK-LABEL: func.func @dynamic_length_rewritten
// CHECK: %[[PADDED:[^ ]+]] = torch.aten.constant_pad_nd %arg0
// CHECK: %[[LONG:[^ ]+]] = torch.aten.convolution %arg0, %arg1, %none, {{.*}} -> !torch.vtensor<[1,4,?],f32>
// CHECK: %[[LEN:[^ ]+]] = torch.aten.size.int %arg0, %{{[^ ]+}} : !torch.vtensor<[1,4,?],f32>, !torch.int -> !torch.int
// CHECK: %[[CUT:[^ ]+]] = torch.aten.slice.Tensor %[[LONG]], %{{[^,]+}}, %{{[^,]+}}, %[[LEN]], %{{[^ ]+}} : {{.*}} -> !torch.vtensor<[1,4,?],f32>
// CHECK: torch.bind_symbolic_shape %[[LONG]], [%[[S:[^ ]+]]], affine_map<()[s0] -> (1, 4, s0 + 2)>
// CHECK: torch.bind_symbolic_shape %[[CUT]], [%[[S]]], affine_map<()[s0] -> (1, 4, s0)>
// CHECK: return %[[CUT]], %[[PADDED]]
func.func @dynamic_length_rewritten(%arg0: !torch.vtensor<[1,4,?],f32>, %arg1: !torch.vtensor<[4,1,3],f32>) -> (!torch.vtensor<[1,4,?],f32>, !torch.vtensor<[1,4,?],f32>) {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 9223372036854775807} : !torch.int
  torch.bind_symbolic_shape %arg0, [%s], affine_map<()[s0] -> (1, 4, s0)> : !torch.vtensor<[1,4,?],f32>
  %pad = torch.prim.ListConstruct %int2, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %xp = torch.aten.constant_pad_nd %arg0, %pad, %int0 : !torch.vtensor<[1,4,?],f32>, !torch.list<int>, !torch.int -> !torch.vtensor<[1,4,?],f32>
  torch.bind_symbolic_shape %xp, [%s], affine_map<()[s0] -> (1, 4, s0 + 2)> : !torch.vtensor<[1,4,?],f32>
  %one = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %zero = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %xp, %arg1, %none, %one, %zero, %one, %false, %zero, %int4 : !torch.vtensor<[1,4,?],f32>, !torch.vtensor<[4,1,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[1,4,?],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (1, 4, s0)> : !torch.vtensor<[1,4,?],f32>
  return %y, %xp : !torch.vtensor<[1,4,?],f32>, !torch.vtensor<[1,4,?],f32>
}

// -----

// torch.aten.pad with mode "constant" and no value (zeros) is the same pad: rewritten, and
// the pad, now unused, is erased with its binding.
// CHECK-LABEL: func.func @aten_pad_constant_rewritten
// CHECK-NOT: torch.aten.pad
// CHECK: %[[LONG:[^ ]+]] = torch.aten.convolution %arg0,
// CHECK: torch.aten.slice.Tensor %[[LONG]]
// CHECK-NOT: torch.aten.pad
func.func @aten_pad_constant_rewritten(%arg0: !torch.vtensor<[1,4,?],f32>, %arg1: !torch.vtensor<[4,1,3],f32>) -> !torch.vtensor<[1,4,?],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %str = torch.constant.str "constant"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 9223372036854775807} : !torch.int
  %pad = torch.prim.ListConstruct %int2, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %xp = torch.aten.pad %arg0, %pad, %str, %none : !torch.vtensor<[1,4,?],f32>, !torch.list<int>, !torch.str, !torch.none -> !torch.vtensor<[1,4,?],f32>
  torch.bind_symbolic_shape %xp, [%s], affine_map<()[s0] -> (1, 4, s0 + 2)> : !torch.vtensor<[1,4,?],f32>
  %one = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %zero = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %xp, %arg1, %none, %one, %zero, %one, %false, %zero, %int4 : !torch.vtensor<[1,4,?],f32>, !torch.vtensor<[4,1,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[1,4,?],f32>
  return %y : !torch.vtensor<[1,4,?],f32>
}

// -----

// A right pad ([0, k - 1]): anti-causal, left as written.
// CHECK-LABEL: func.func @right_pad_untouched
// CHECK: %[[PADDED:[^ ]+]] = torch.aten.constant_pad_nd %arg0
// CHECK: torch.aten.convolution %[[PADDED]],
// CHECK-NOT: torch.aten.slice.Tensor
// CHECK: return
func.func @right_pad_untouched(%arg0: !torch.vtensor<[1,4,?],f32>, %arg1: !torch.vtensor<[4,1,3],f32>) -> !torch.vtensor<[1,4,?],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %pad = torch.prim.ListConstruct %int0, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %xp = torch.aten.constant_pad_nd %arg0, %pad, %float0 : !torch.vtensor<[1,4,?],f32>, !torch.list<int>, !torch.float -> !torch.vtensor<[1,4,?],f32>
  %one = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %zero = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %xp, %arg1, %none, %one, %zero, %one, %false, %zero, %int4 : !torch.vtensor<[1,4,?],f32>, !torch.vtensor<[4,1,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[1,4,?],f32>
  return %y : !torch.vtensor<[1,4,?],f32>
}

// -----

// A pad value of 1.0: the first outputs read ones, not zeros: left as written.
// CHECK-LABEL: func.func @pad_value_one_untouched
// CHECK: %[[PADDED:[^ ]+]] = torch.aten.constant_pad_nd %arg0
// CHECK: torch.aten.convolution %[[PADDED]],
// CHECK-NOT: torch.aten.slice.Tensor
// CHECK: return
func.func @pad_value_one_untouched(%arg0: !torch.vtensor<[1,4,?],f32>, %arg1: !torch.vtensor<[4,1,3],f32>) -> !torch.vtensor<[1,4,?],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %float1 = torch.constant.float 1.000000e+00
  %pad = torch.prim.ListConstruct %int2, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %xp = torch.aten.constant_pad_nd %arg0, %pad, %float1 : !torch.vtensor<[1,4,?],f32>, !torch.list<int>, !torch.float -> !torch.vtensor<[1,4,?],f32>
  %one = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %zero = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %xp, %arg1, %none, %one, %zero, %one, %false, %zero, %int4 : !torch.vtensor<[1,4,?],f32>, !torch.vtensor<[4,1,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[1,4,?],f32>
  return %y : !torch.vtensor<[1,4,?],f32>
}

// -----

// Stride 2: not the cut form's computation: left as written.
// CHECK-LABEL: func.func @stride_two_untouched
// CHECK: %[[PADDED:[^ ]+]] = torch.aten.constant_pad_nd %arg0
// CHECK: torch.aten.convolution %[[PADDED]],
// CHECK-NOT: torch.aten.slice.Tensor
// CHECK: return
func.func @stride_two_untouched(%arg0: !torch.vtensor<[1,4,16],f32>, %arg1: !torch.vtensor<[4,1,3],f32>) -> !torch.vtensor<[1,4,8],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %pad = torch.prim.ListConstruct %int2, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %xp = torch.aten.constant_pad_nd %arg0, %pad, %float0 : !torch.vtensor<[1,4,16],f32>, !torch.list<int>, !torch.float -> !torch.vtensor<[1,4,18],f32>
  %one = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %two = torch.prim.ListConstruct %int2 : (!torch.int) -> !torch.list<int>
  %zero = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %xp, %arg1, %none, %two, %zero, %one, %false, %zero, %int4 : !torch.vtensor<[1,4,18],f32>, !torch.vtensor<[4,1,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[1,4,8],f32>
  return %y : !torch.vtensor<[1,4,8],f32>
}

// -----

// A pad of k zeros ([k, 0] with kernel 3): output t reads inputs t - 3 .. t - 1, shifted by
// one: left as written.
// CHECK-LABEL: func.func @pad_of_kernel_untouched
// CHECK: %[[PADDED:[^ ]+]] = torch.aten.constant_pad_nd %arg0
// CHECK: torch.aten.convolution %[[PADDED]],
// CHECK-NOT: torch.aten.slice.Tensor
// CHECK: return
func.func @pad_of_kernel_untouched(%arg0: !torch.vtensor<[1,4,?],f32>, %arg1: !torch.vtensor<[4,1,3],f32>) -> !torch.vtensor<[1,4,?],f32> {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %pad = torch.prim.ListConstruct %int3, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %xp = torch.aten.constant_pad_nd %arg0, %pad, %float0 : !torch.vtensor<[1,4,?],f32>, !torch.list<int>, !torch.float -> !torch.vtensor<[1,4,?],f32>
  %one = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %zero = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %xp, %arg1, %none, %one, %zero, %one, %false, %zero, %int4 : !torch.vtensor<[1,4,?],f32>, !torch.vtensor<[4,1,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[1,4,?],f32>
  return %y : !torch.vtensor<[1,4,?],f32>
}
