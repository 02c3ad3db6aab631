// RUN: autosp-opt %s --split-input-file --autosp-fuse-gqa | FileCheck %s

// Hugging Face's repeat_kv on key and value (unsqueeze(2) -> expand -> reshape, 2 KV heads
// repeated twice for 4 query heads): SDPA takes the 2 KV heads with enable_gqa = true and
// the repeats are erased.
// CHECK-LABEL: func.func @repeat_kv
// CHECK-SAME:  %[[Q:[^:]*]]: !torch.vtensor<[1,4,?,8],f32>, %[[K:[^:]*]]: !torch.vtensor<[1,2,?,8],f32>, %[[V:[^:]*]]: !torch.vtensor<[1,2,?,8],f32>
// CHECK-NOT:   torch.aten.expand
// CHECK:       %[[GQA:true_[0-9]+]] = torch.constant.bool true
// CHECK-NEXT:  torch.aten.scaled_dot_product_attention %[[Q]], %[[K]], %[[V]], %none, %{{.*}}, %true, %none, %[[GQA]] : !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>, !torch.vtensor<[1,2,?,8],f32>
// CHECK-NOT:   torch.aten.reshape
func.func @repeat_kv(%q: !torch.vtensor<[1,4,?,8],f32>, %k: !torch.vtensor<[1,2,?,8],f32>, %v: !torch.vtensor<[1,2,?,8],f32>, %s: !torch.int) -> !torch.vtensor<[1,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %wide = torch.prim.ListConstruct %int1, %int2, %int2, %s, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %flat = torch.prim.ListConstruct %int1, %int4, %s, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %ku = torch.aten.unsqueeze %k, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.vtensor<[1,2,1,?,8],f32>
  %ke = torch.aten.expand %ku, %wide, %false : !torch.vtensor<[1,2,1,?,8],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[1,2,2,?,8],f32>
  %kr = torch.aten.reshape %ke, %flat : !torch.vtensor<[1,2,2,?,8],f32>, !torch.list<int> -> !torch.vtensor<[1,4,?,8],f32>
  %vu = torch.aten.unsqueeze %v, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.vtensor<[1,2,1,?,8],f32>
  %ve = torch.aten.expand %vu, %wide, %false : !torch.vtensor<[1,2,1,?,8],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[1,2,2,?,8],f32>
  %vr = torch.aten.reshape %ve, %flat : !torch.vtensor<[1,2,2,?,8],f32>, !torch.list<int> -> !torch.vtensor<[1,4,?,8],f32>
  %0 = torch.aten.scaled_dot_product_attention %q, %kr, %vr, %none, %float0, %true, %none, %false : !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,4,?,8],f32>
  return %0 : !torch.vtensor<[1,4,?,8],f32>
}

// -----

// repeat_interleave(2, dim=1) as exported (broadcast_to, a clone for contiguity, view),
// the same value as key and value (MQA-style sharing): fused.
// CHECK-LABEL: func.func @broadcast_clone_view
// CHECK:       %[[GQA:true_[0-9]+]] = torch.constant.bool true
// CHECK-NEXT:  torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg1, {{.*}}, %[[GQA]] :
func.func @broadcast_clone_view(%q: !torch.vtensor<[2,4,?,8],f32>, %k: !torch.vtensor<[2,2,?,8],f32>, %s: !torch.int) -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %u = torch.aten.unsqueeze %k, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.vtensor<[2,2,1,?,8],f32>
  %wide = torch.prim.ListConstruct %int2, %int2, %int2, %s, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %w = torch.aten.broadcast_to %u, %wide : !torch.vtensor<[2,2,1,?,8],f32>, !torch.list<int> -> !torch.vtensor<[2,2,2,?,8],f32>
  %c = torch.aten.clone %w, %none : !torch.vtensor<[2,2,2,?,8],f32>, !torch.none -> !torch.vtensor<[2,2,2,?,8],f32>
  %flat = torch.prim.ListConstruct %int2, %int4, %s, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kr = torch.aten.view %c, %flat : !torch.vtensor<[2,2,2,?,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,?,8],f32>
  %0 = torch.aten.scaled_dot_product_attention %q, %kr, %kr, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Not the repeat SDPA's enable_gqa performs, so left as written: only the key repeated
// (the value has all 4 heads), and a tile (unsqueeze at dim 1: heads [a, b, a, b], not
// [a, a, b, b]).
// CHECK-LABEL: func.func @not_gqa
// CHECK:       torch.aten.scaled_dot_product_attention %arg0, %{{.*}}, %arg2, {{.*}}, %false
// CHECK:       torch.aten.scaled_dot_product_attention %arg0, %{{.*}}, %{{.*}}, {{.*}}, %false
func.func @not_gqa(%q: !torch.vtensor<[1,4,?,8],f32>, %k: !torch.vtensor<[1,2,?,8],f32>, %v4: !torch.vtensor<[1,4,?,8],f32>, %s: !torch.int) -> (!torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>) {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %wide = torch.prim.ListConstruct %int1, %int2, %int2, %s, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %flat = torch.prim.ListConstruct %int1, %int4, %s, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %ku = torch.aten.unsqueeze %k, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.vtensor<[1,2,1,?,8],f32>
  %ke = torch.aten.expand %ku, %wide, %false : !torch.vtensor<[1,2,1,?,8],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[1,2,2,?,8],f32>
  %kr = torch.aten.reshape %ke, %flat : !torch.vtensor<[1,2,2,?,8],f32>, !torch.list<int> -> !torch.vtensor<[1,4,?,8],f32>
  %0 = torch.aten.scaled_dot_product_attention %q, %kr, %v4, %none, %float0, %true, %none, %false : !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,4,?,8],f32>
  %tile = torch.prim.ListConstruct %int1, %int2, %int2, %s, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %tu = torch.aten.unsqueeze %k, %int1 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.vtensor<[1,1,2,?,8],f32>
  %te = torch.aten.expand %tu, %tile, %false : !torch.vtensor<[1,1,2,?,8],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[1,2,2,?,8],f32>
  %tr = torch.aten.reshape %te, %flat : !torch.vtensor<[1,2,2,?,8],f32>, !torch.list<int> -> !torch.vtensor<[1,4,?,8],f32>
  %1 = torch.aten.scaled_dot_product_attention %q, %tr, %tr, %none, %float0, %true, %none, %false : !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[1,4,?,8],f32>
  return %0, %1 : !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>
}
