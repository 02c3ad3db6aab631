// RUN: autosp-opt %s --split-input-file --autosp-partition-attention=sp-size=2 | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention=sp-size=4 | FileCheck %s --check-prefix=P4

// MLA-like attention: k and v are one projection (kv_b) of an 8-value latent per token,
// viewed as 4 heads of 16 and split. At sp-size=2 the latent costs fewer bytes than the
// all-to-alls of k and v: it is gathered (an all-to-all of P copies: the all-gather whose
// backward sums what every rank's heads contribute), each rank projects it with its heads'
// rows of kv_b (autosp.local_heads, no communication) over the whole sequence, and k and v
// never cross the ranks; q and the output do, as before. The choice and its price are in
// autosp.sp_choice. At sp-size=4 the all-to-alls of k and v (64 bytes per token each) cost what the latent does: no cut.
// CHECK: autosp.sp_choice = "ulysses: requested; k, v computed from gathered [2,?,8]xf32 (64 bytes/token) instead of all-to-alls: 1.60x fewer bytes per layer forward"
// CHECK-LABEL: func.func @latent_kv
// CHECK-SAME: %[[Q:[^:]*]]: !torch.vtensor<[2,4,?,8],f32>
// CHECK-SAME: %[[WB:[^:]*]]: !torch.vtensor<[64,8],f32> {autosp.parameter = "kv_b.weight"}
// CHECK: %[[LAT:.*]] = torch.aten.view %{{.*}} -> !torch.vtensor<[2,?,8],f32>
// CHECK: %[[ONE:.*]] = torch.aten.unsqueeze %[[LAT]], %{{.*}} -> !torch.vtensor<[1,2,?,8],f32>
// CHECK: %[[COPIES:.*]] = torch.aten.broadcast_to %[[ONE]], %{{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: %[[GOT:.*]] = "autosp.all_to_all"(%[[COPIES]], %{{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 0 : i64} : (!torch.vtensor<[2,2,?,8],f32>, !torch.int) -> !torch.vtensor<[1,2,?,8],f32>
// CHECK: %[[WHOLE:.*]] = torch.aten.squeeze.dim %[[GOT]], %{{.*}} -> !torch.vtensor<[2,?,8],f32>
// CHECK: %[[ROWS:.*]] = torch.aten.view %[[WHOLE]], %{{.*}} -> !torch.vtensor<[?,8],f32>
// CHECK: %[[SPLIT:.*]] = torch.aten.view %[[WB]], %{{.*}} -> !torch.vtensor<[4,16,8],f32>
// CHECK: %[[MINE:.*]] = "autosp.local_heads"(%[[SPLIT]]) {dim = 0 : i64, group = "sp", heads = 4 : i64} : (!torch.vtensor<[4,16,8],f32>) -> !torch.vtensor<[2,16,8],f32>
// CHECK: %[[W:.*]] = torch.aten.view %[[MINE]], %{{.*}} -> !torch.vtensor<[32,8],f32>
// CHECK: %[[WT:.*]] = torch.aten.permute %[[W]], %{{.*}} -> !torch.vtensor<[8,32],f32>
// CHECK: %[[KV:.*]] = torch.aten.mm %[[ROWS]], %[[WT]] : {{.*}} -> !torch.vtensor<[?,32],f32>
// CHECK: %[[KV4:.*]] = torch.aten.view %[[KV]], %{{.*}} -> !torch.vtensor<[2,?,2,16],f32>
// CHECK: %[[KVH:.*]] = torch.aten.permute %[[KV4]], %{{.*}} -> !torch.vtensor<[2,2,?,16],f32>
// CHECK: %[[K:.*]] = torch.aten.slice.Tensor %[[KVH]], {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: %[[V:.*]] = torch.aten.slice.Tensor %[[KVH]], {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: %[[QH:.*]] = "autosp.all_to_all"(%[[Q]], %{{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64}
// CHECK-NOT: "autosp.all_to_all"
// CHECK: %[[O:.*]] = torch.aten.scaled_dot_product_attention %[[QH]], %[[K]], %[[V]], {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: "autosp.all_to_all"(%[[O]]) {concat_dim = 1 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 2 : i64}
// P4: autosp.sp_choice = "ulysses: requested"
// P4-LABEL: func.func @latent_kv
// P4-NOT: split_dim = 0
// P4-NOT: autosp.local_heads
// P4-COUNT-4: "autosp.all_to_all"

func.func @latent_kv(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                     %h: !torch.vtensor<[2,?,32],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64},
                     %wa: !torch.vtensor<[8,32],f32> {autosp.parameter = "kv_a.weight"},
                     %wb: !torch.vtensor<[64,8],f32> {autosp.parameter = "kv_b.weight"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %int16 = torch.constant.int 16
  %int32 = torch.constant.int 32
  %int-1 = torch.constant.int -1
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %h, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %S = torch.aten.size.int %h, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.int
  %twoS = torch.aten.mul.int %int2, %S : !torch.int, !torch.int -> !torch.int
  %rows = torch.prim.ListConstruct %twoS, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  %x = torch.aten.view %h, %rows : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %t = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %wat = torch.aten.permute %wa, %t : !torch.vtensor<[8,32],f32>, !torch.list<int> -> !torch.vtensor<[32,8],f32>
  %lat = torch.aten.mm %x, %wat : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,8],f32> -> !torch.vtensor<[?,8],f32>
  torch.bind_symbolic_shape %lat, [%s], affine_map<()[s0] -> (s0 * 2, 8)> : !torch.vtensor<[?,8],f32>
  %l3 = torch.prim.ListConstruct %int2, %S, %int8 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %lat3 = torch.aten.view %lat, %l3 : !torch.vtensor<[?,8],f32>, !torch.list<int> -> !torch.vtensor<[2,?,8],f32>
  torch.bind_symbolic_shape %lat3, [%s], affine_map<()[s0] -> (2, s0, 8)> : !torch.vtensor<[2,?,8],f32>
  %r16 = torch.prim.ListConstruct %twoS, %int8 : (!torch.int, !torch.int) -> !torch.list<int>
  %lat2 = torch.aten.view %lat3, %r16 : !torch.vtensor<[2,?,8],f32>, !torch.list<int> -> !torch.vtensor<[?,8],f32>
  torch.bind_symbolic_shape %lat2, [%s], affine_map<()[s0] -> (s0 * 2, 8)> : !torch.vtensor<[?,8],f32>
  %wbt = torch.aten.permute %wb, %t : !torch.vtensor<[64,8],f32>, !torch.list<int> -> !torch.vtensor<[8,64],f32>
  %kv = torch.aten.mm %lat2, %wbt : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,64],f32> -> !torch.vtensor<[?,64],f32>
  torch.bind_symbolic_shape %kv, [%s], affine_map<()[s0] -> (s0 * 2, 64)> : !torch.vtensor<[?,64],f32>
  %l4 = torch.prim.ListConstruct %int2, %S, %int-1, %int16 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kv4 = torch.aten.view %kv, %l4 : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,16],f32>
  torch.bind_symbolic_shape %kv4, [%s], affine_map<()[s0] -> (2, s0, 4, 16)> : !torch.vtensor<[2,?,4,16],f32>
  %p = torch.prim.ListConstruct %int0, %int2, %int1, %int3 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kvh = torch.aten.permute %kv4, %p : !torch.vtensor<[2,?,4,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,?,16],f32>
  torch.bind_symbolic_shape %kvh, [%s], affine_map<()[s0] -> (2, 4, s0, 16)> : !torch.vtensor<[2,4,?,16],f32>
  %k = torch.aten.slice.Tensor %kvh, %int-1, %int0, %int8, %int1 : !torch.vtensor<[2,4,?,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
  %v = torch.aten.slice.Tensor %kvh, %int-1, %int8, %int16, %int1 : !torch.vtensor<[2,4,?,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %k, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %v, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %o : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// The same, with a softmax over the heads between the projection and k, v: no rule proves
// a rank's heads of it from its heads alone, so k and v are all-to-all'd as before.
// CHECK: autosp.sp_choice = "ulysses: requested"
// CHECK-LABEL: func.func @mixed_over_heads
// CHECK-NOT: split_dim = 0
// CHECK-NOT: autosp.local_heads
// CHECK-COUNT-4: "autosp.all_to_all"
func.func @mixed_over_heads(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                     %h: !torch.vtensor<[2,?,32],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64},
                     %wa: !torch.vtensor<[8,32],f32> {autosp.parameter = "kv_a.weight"},
                     %wb: !torch.vtensor<[64,8],f32> {autosp.parameter = "kv_b.weight"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %int16 = torch.constant.int 16
  %int32 = torch.constant.int 32
  %int-1 = torch.constant.int -1
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %h, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %S = torch.aten.size.int %h, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.int
  %twoS = torch.aten.mul.int %int2, %S : !torch.int, !torch.int -> !torch.int
  %rows = torch.prim.ListConstruct %twoS, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  %x = torch.aten.view %h, %rows : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %t = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %wat = torch.aten.permute %wa, %t : !torch.vtensor<[8,32],f32>, !torch.list<int> -> !torch.vtensor<[32,8],f32>
  %lat = torch.aten.mm %x, %wat : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,8],f32> -> !torch.vtensor<[?,8],f32>
  torch.bind_symbolic_shape %lat, [%s], affine_map<()[s0] -> (s0 * 2, 8)> : !torch.vtensor<[?,8],f32>
  %l3 = torch.prim.ListConstruct %int2, %S, %int8 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %lat3 = torch.aten.view %lat, %l3 : !torch.vtensor<[?,8],f32>, !torch.list<int> -> !torch.vtensor<[2,?,8],f32>
  torch.bind_symbolic_shape %lat3, [%s], affine_map<()[s0] -> (2, s0, 8)> : !torch.vtensor<[2,?,8],f32>
  %r16 = torch.prim.ListConstruct %twoS, %int8 : (!torch.int, !torch.int) -> !torch.list<int>
  %lat2 = torch.aten.view %lat3, %r16 : !torch.vtensor<[2,?,8],f32>, !torch.list<int> -> !torch.vtensor<[?,8],f32>
  torch.bind_symbolic_shape %lat2, [%s], affine_map<()[s0] -> (s0 * 2, 8)> : !torch.vtensor<[?,8],f32>
  %wbt = torch.aten.permute %wb, %t : !torch.vtensor<[64,8],f32>, !torch.list<int> -> !torch.vtensor<[8,64],f32>
  %kv = torch.aten.mm %lat2, %wbt : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,64],f32> -> !torch.vtensor<[?,64],f32>
  torch.bind_symbolic_shape %kv, [%s], affine_map<()[s0] -> (s0 * 2, 64)> : !torch.vtensor<[?,64],f32>
  %l4 = torch.prim.ListConstruct %int2, %S, %int-1, %int16 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kv4 = torch.aten.view %kv, %l4 : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,16],f32>
  torch.bind_symbolic_shape %kv4, [%s], affine_map<()[s0] -> (2, s0, 4, 16)> : !torch.vtensor<[2,?,4,16],f32>
  %p = torch.prim.ListConstruct %int0, %int2, %int1, %int3 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kvh = torch.aten.permute %kv4, %p : !torch.vtensor<[2,?,4,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,?,16],f32>
  torch.bind_symbolic_shape %kvh, [%s], affine_map<()[s0] -> (2, 4, s0, 16)> : !torch.vtensor<[2,4,?,16],f32>
  %mix = torch.aten._softmax %kvh, %int1, %false : !torch.vtensor<[2,4,?,16],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,4,?,16],f32>
  torch.bind_symbolic_shape %mix, [%s], affine_map<()[s0] -> (2, 4, s0, 16)> : !torch.vtensor<[2,4,?,16],f32>
  %k = torch.aten.slice.Tensor %mix, %int-1, %int0, %int8, %int1 : !torch.vtensor<[2,4,?,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
  %v = torch.aten.slice.Tensor %mix, %int-1, %int8, %int16, %int1 : !torch.vtensor<[2,4,?,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %k, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %v, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %o : !torch.vtensor<[2,4,?,8],f32>
}
