// RUN: autosp-opt %s --split-input-file --autosp-shard-sequence | FileCheck %s

// Sharding starts at the first op that reads a parameter (the embedding): its token
// input is sliced to this rank's part. Sizes from S that shape sharded values become the
// local length; parameter-free positions stay replicated and are sliced where they meet
// sharded values; a slice along the sequence narrows the window; a sum over the sequence
// becomes a local sum plus an all_reduce. The shape bindings are dropped (they state
// global sizes).
// CHECK-LABEL: func.func @embed_view_positions_loss
// CHECK-SAME: (%[[W:[^:]*]]: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"}, %[[IDS:[^:]*]]: !torch.vtensor<[2,?],si64>
// CHECK: %[[S:.*]] = torch.aten.size.int %[[IDS]]
// CHECK-NEXT: %[[L00:.*]] = "autosp.local_len"(%[[S]]) {group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK-NOT: torch.bind_symbolic_shape
// Positions over the whole sequence, replicated:
// CHECK: %[[POS:.*]] = torch.aten.arange.start_step %{{.*}}, %{{.*}}, {{.*}} -> !torch.vtensor<[?],si64>
// CHECK: %[[IDS_R:.*]] = "autosp.shard"(%[[IDS]], %[[S]]) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: %[[E:.*]] = torch.aten.embedding %[[W]], %[[IDS_R]]
// CHECK: %[[N:.*]] = torch.aten.mul.int %[[L00]], %{{.*}}
// CHECK: %[[LIST:.*]] = torch.prim.ListConstruct %[[N]], %{{.*}}
// CHECK: %[[V:.*]] = torch.aten.view %[[E]], %[[LIST]]
// CHECK: %[[NARROW:.*]] = "autosp.rewindow"(%[[E]], %[[S]]) {dim = 1 : i64, group = "sp", lo = 0 : i64, new_lo = 0 : i64, new_trim = 1 : i64, trim = 0 : i64}
// CHECK: %[[SUM:.*]] = torch.aten.sum.dim_IntList %[[NARROW]]
// CHECK: %[[TOTAL:.*]] = "autosp.all_reduce"(%[[SUM]]) {group = "sp", reduce_op = "sum"}
// CHECK: %[[POS_R:.*]] = "autosp.shard"(%{{.*}}, %[[S]]) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: %[[M:.*]] = torch.aten.mul.Tensor %[[E]], %[[POS_R]]
// CHECK: return %[[V]], %[[M]], %[[TOTAL]]
func.func @embed_view_positions_loss(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                     %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[?,32],f32>, !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[],f32>) {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int6 = torch.constant.int 6
  %int32 = torch.constant.int 32
  %false = torch.constant.bool false
  %none = torch.constant.none
  %cpu = torch.constant.device "cpu"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %S = torch.aten.size.int %ids, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %S, %int1, %none, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  torch.bind_symbolic_shape %pos, [%s], affine_map<()[s0] -> (s0)> : !torch.vtensor<[?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %n = torch.aten.mul.int %int2, %S : !torch.int, !torch.int -> !torch.int
  %l = torch.prim.ListConstruct %n, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  %v = torch.aten.view %e, %l : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %v, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %sl = torch.aten.slice.Tensor %e, %int1, %int0, %int-1, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %sl, [%s], affine_map<()[s0] -> (2, s0 - 1, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %sum = torch.aten.sum.dim_IntList %sl, %dims, %false, %none : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  torch.bind_symbolic_shape %p1, [%s], affine_map<()[s0] -> (1, s0)> : !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int2 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,?,1],si64>
  torch.bind_symbolic_shape %p2, [%s], affine_map<()[s0] -> (1, s0, 1)> : !torch.vtensor<[1,?,1],si64>
  %m = torch.aten.mul.Tensor %e, %p2 : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[1,?,1],si64> -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %m, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %v, %m, %sum : !torch.vtensor<[?,32],f32>, !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[],f32>
}

// -----

// With gather-outputs, a sharded result is gathered to its full length before return.
// RUN: autosp-opt %s --split-input-file --autosp-shard-sequence=gather-outputs=true | FileCheck %s --check-prefix=GATHER
// GATHER-LABEL: func.func @gathered
// GATHER: %[[E:.*]] = torch.aten.embedding
// GATHER: %[[FULL:.*]] = "autosp.all_gather"(%[[E]], %{{.*}}) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// GATHER: return %[[FULL]]
func.func @gathered(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                    %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %e : !torch.vtensor<[2,?,32],f32>
}
