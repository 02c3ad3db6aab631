// RUN: autosp-opt %s --split-input-file --autosp-shard-sequence | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-shard-sequence=gather-outputs=true | FileCheck %s --check-prefix=GATHER

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

// -----

// Slice bounds are classified exactly: a constant >= 0 counts from the start, a negative
// constant, INT64_MAX (no end) or S + c from the end. Each slice that trims a constant
// number of positions from either end narrows the window.
// CHECK-LABEL: func.func @slice_bounds
// CHECK: "autosp.rewindow"(%[[E:[^,]*]], %{{.*}}) {dim = 1 : i64, group = "sp", lo = 0 : i64, new_lo = 1 : i64, new_trim = 0 : i64, trim = 0 : i64}
// CHECK: "autosp.rewindow"(%[[E]], %{{.*}}) {dim = 1 : i64, group = "sp", lo = 0 : i64, new_lo = 2 : i64, new_trim = 1 : i64, trim = 0 : i64}
// CHECK: "autosp.rewindow"(%[[E]], %{{.*}}) {dim = 1 : i64, group = "sp", lo = 0 : i64, new_lo = 2 : i64, new_trim = 3 : i64, trim = 0 : i64}
// CHECK-NOT: torch.aten.slice.Tensor
func.func @slice_bounds(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                        %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,32],f32>) {
  %int-1 = torch.constant.int -1
  %int-3 = torch.constant.int -3
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %max = torch.constant.int 9223372036854775807
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 8, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // x[:, 1:]
  %a = torch.aten.slice.Tensor %e, %int1, %int1, %max, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %a, [%s], affine_map<()[s0] -> (2, s0 - 1, 32)> : !torch.vtensor<[2,?,32],f32>
  // x[:, 2:x.size(1) - 1]
  %n = torch.aten.size.int %e, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.int
  %n1 = torch.aten.sub.int %n, %int1 : !torch.int, !torch.int -> !torch.int
  %b = torch.aten.slice.Tensor %e, %int1, %int2, %n1, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %b, [%s], affine_map<()[s0] -> (2, s0 - 3, 32)> : !torch.vtensor<[2,?,32],f32>
  // x[:, 2:-3]
  %c = torch.aten.slice.Tensor %e, %int1, %int2, %int-3, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %c, [%s], affine_map<()[s0] -> (2, s0 - 5, 32)> : !torch.vtensor<[2,?,32],f32>
  return %a, %b, %c : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,32],f32>
}

// -----

// A size read from a sharded value (q.shape[1], as Hugging Face Falcon does) stands for
// the global length: it is computed from S, so positions built from it (arange) are
// replicated over the whole sequence and sliced where they meet the sharded values,
// while a view of a sharded value gets the local length.
// CHECK-LABEL: func.func @size_of_sharded_value
// CHECK-SAME: %[[IDS:[^:]*]]: !torch.vtensor<[2,?],si64>
// CHECK: %[[S:.*]] = torch.aten.size.int %[[IDS]]
// CHECK-NEXT: %[[L:.*]] = "autosp.local_len"(%[[S]]) {group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[POS:.*]] = torch.aten.arange.start_step %{{.*}}, %[[S]], %{{.*}}
// CHECK: %[[LIST:.*]] = torch.prim.ListConstruct %{{.*}}, %[[L]], %{{.*}}
// CHECK: %[[V:.*]] = torch.aten.view %[[E]], %[[LIST]]
// CHECK: %[[POS_R:.*]] = "autosp.shard"(%{{.*}}, %[[S]]) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: torch.aten.mul.Tensor %[[V]], %[[POS_R]]
func.func @size_of_sharded_value(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                 %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,4,8],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %false = torch.constant.bool false
  %none = torch.constant.none
  %cpu = torch.constant.device "cpu"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %n = torch.aten.size.int %e, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %n, %int1, %none, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  torch.bind_symbolic_shape %pos, [%s], affine_map<()[s0] -> (s0)> : !torch.vtensor<[?],si64>
  %l = torch.prim.ListConstruct %int2, %n, %int4, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %v = torch.aten.view %e, %l : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %v, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  %p1 = torch.aten.unsqueeze %pos, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  torch.bind_symbolic_shape %p1, [%s], affine_map<()[s0] -> (1, s0)> : !torch.vtensor<[1,?],si64>
  %p2 = torch.aten.unsqueeze %p1, %int2 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,?,1],si64>
  torch.bind_symbolic_shape %p2, [%s], affine_map<()[s0] -> (1, s0, 1)> : !torch.vtensor<[1,?,1],si64>
  %p3 = torch.aten.unsqueeze %p2, %int3 : !torch.vtensor<[1,?,1],si64>, !torch.int -> !torch.vtensor<[1,?,1,1],si64>
  torch.bind_symbolic_shape %p3, [%s], affine_map<()[s0] -> (1, s0, 1, 1)> : !torch.vtensor<[1,?,1,1],si64>
  %m = torch.aten.mul.Tensor %v, %p3 : !torch.vtensor<[2,?,4,8],f32>, !torch.vtensor<[1,?,1,1],si64> -> !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %m, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  return %m : !torch.vtensor<[2,?,4,8],f32>
}

// -----

// x[:, :, [1]] exports as advanced indexing with the full range 0..S-1 on the sequence
// dim (built from a size of the sharded value). That range keeps every position where
// it is: each rank indexes its shard with its local range, arange(local length).
// CHECK-LABEL: func.func @identity_index
// CHECK: %[[L:.*]] = "autosp.local_len"
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[R:.*]] = torch.aten.arange.start_step %{{.*}}, %[[L]], %{{.*}}
// CHECK: %[[R1:.*]] = torch.aten.unsqueeze %[[R]], %{{.*}}
// CHECK: %[[IDX:.*]] = torch.prim.ListConstruct %{{.*}}, %[[R1]], %{{.*}}
// CHECK: torch.aten.index.Tensor_hacked_twin %[[E]], %[[IDX]]
func.func @identity_index(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                          %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,1],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %b = torch.aten.arange.start_step %int0, %int2, %int1, %int4, %none, %none, %none : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[2],si64>
  %b1 = torch.aten.unsqueeze %b, %int-1 : !torch.vtensor<[2],si64>, !torch.int -> !torch.vtensor<[2,1],si64>
  %b2 = torch.aten.unsqueeze %b1, %int-1 : !torch.vtensor<[2,1],si64>, !torch.int -> !torch.vtensor<[2,1,1],si64>
  %n = torch.aten.size.int %e, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.int
  %r = torch.aten.arange.start_step %int0, %n, %int1, %int4, %none, %none, %none : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[?],si64>
  torch.bind_symbolic_shape %r, [%s], affine_map<()[s0] -> (s0)> : !torch.vtensor<[?],si64>
  %r1 = torch.aten.unsqueeze %r, %int-1 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
  torch.bind_symbolic_shape %r1, [%s], affine_map<()[s0] -> (s0, 1)> : !torch.vtensor<[?,1],si64>
  %k = torch.vtensor.literal(dense<1> : tensor<1xsi64>) : !torch.vtensor<[1],si64>
  %idx = torch.prim.ListConstruct %b2, %r1, %k : (!torch.vtensor<[2,1,1],si64>, !torch.vtensor<[?,1],si64>, !torch.vtensor<[1],si64>) -> !torch.list<vtensor>
  %x = torch.aten.index.Tensor_hacked_twin %e, %idx : !torch.vtensor<[2,?,32],f32>, !torch.list<vtensor> -> !torch.vtensor<[2,?,1],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 1)> : !torch.vtensor<[2,?,1],f32>
  return %x : !torch.vtensor<[2,?,1],f32>
}

// -----

// Ops along a feature dim keep every position where it is: they stay sharded, however
// their dims are written (a list, a negative int, a cat's dim). Only the sequence dim
// (1, or -2) would make them mix positions across ranks.
// CHECK-LABEL: func.func @along_features
// CHECK: %[[IDS_R:.*]] = "autosp.shard"(%{{.*}}, %{{.*}}) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: %[[E:.*]] = torch.aten.embedding %{{.*}}, %[[IDS_R]]
// CHECK: %[[F:.*]] = torch.aten.flip %[[E]], %{{.*}} : !torch.vtensor<[2,?,32],f32>, !torch.list<int>
// CHECK: %[[P:.*]] = torch.aten.softmax.int %[[F]], %{{.*}}, %{{.*}} : !torch.vtensor<[2,?,32],f32>, !torch.int
// CHECK: %[[L:.*]] = torch.prim.ListConstruct %[[E]], %[[P]]
// CHECK: %[[C:.*]] = torch.aten.cat %[[L]], %{{.*}} : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,?,64],f32>
// CHECK-NOT: autosp.all_reduce
// CHECK: return %[[C]]
func.func @along_features(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                          %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,64],f32> {
  %int-1 = torch.constant.int -1
  %int2 = torch.constant.int 2
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %f = torch.aten.flip %e, %dims : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %f, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %p = torch.aten.softmax.int %f, %int2, %none : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %p, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %l = torch.prim.ListConstruct %e, %p : (!torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,32],f32>) -> !torch.list<vtensor>
  %c = torch.aten.cat %l, %int-1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,?,64],f32>
  torch.bind_symbolic_shape %c, [%s], affine_map<()[s0] -> (2, s0, 64)> : !torch.vtensor<[2,?,64],f32>
  return %c : !torch.vtensor<[2,?,64],f32>
}

// -----

// A sum over the features without keepdim (how x.mean(-1) decomposes) often has no shape
// binding: its result's sequence dim is the operand's, minus the reduced dims (read from
// the schema). It stays sharded: a sum is all-reduced only when its dims name the sequence.
// CHECK-LABEL: func.func @unbound_sum_over_features
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[SUM:.*]] = torch.aten.sum.dim_IntList %[[E]], %{{.*}} -> !torch.vtensor<[2,?],f32>
// CHECK-NOT: autosp.all_reduce
// CHECK: %[[M:.*]] = torch.aten.div.Scalar %[[SUM]]
// CHECK: return %[[M]]
func.func @unbound_sum_over_features(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                     %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?],f32> {
  %int-1 = torch.constant.int -1
  %int32 = torch.constant.int 32
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %sum = torch.aten.sum.dim_IntList %e, %dims, %false, %none : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[2,?],f32>
  %m = torch.aten.div.Scalar %sum, %int32 : !torch.vtensor<[2,?],f32>, !torch.int -> !torch.vtensor<[2,?],f32>
  torch.bind_symbolic_shape %m, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  return %m : !torch.vtensor<[2,?],f32>
}

// -----

// MoE routing: the experts module as autosp's op with stated semantics
// (torch.autosp.token_experts, row-wise over the tokens) runs on the rank's rows; histc
// counts the rank's values into fixed bins (min 0 < max 4): counts over a split
// add up, so it becomes a local count plus an all_reduce (the aux loss's statistics).
// CHECK-LABEL: func.func @moe_experts_and_counts
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[X:.*]] = torch.aten.view %[[E]]
// CHECK: %[[Y:.*]] = torch.operator "torch.autosp.token_experts"
// CHECK: %[[C:.*]] = torch.operator "torch.aten.histc"
// CHECK-NEXT: %[[CT:.*]] = "autosp.all_reduce"(%[[C]]) {group = "sp", reduce_op = "sum"}
// CHECK: return %[[Y]], %[[CT]]
func.func @moe_experts_and_counts(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                  %gu: !torch.vtensor<[4,16,32],f32> {autosp.parameter = "gate_up"},
                                  %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[?,32],f32>, !torch.vtensor<[4],f32>) {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int32 = torch.constant.int 32
  %false = torch.constant.bool false
  %str = torch.constant.str "model.layers.0.mlp.experts"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %l = torch.prim.ListConstruct %int-1, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  %x = torch.aten.view %e, %l : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %lr = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %flat = torch.aten.view %ids, %lr : !torch.vtensor<[2,?],si64>, !torch.list<int> -> !torch.vtensor<[?],si64>
  torch.bind_symbolic_shape %flat, [%s], affine_map<()[s0] -> (s0 * 2)> : !torch.vtensor<[?],si64>
  %inputs = torch.prim.ListConstruct %x, %flat : (!torch.vtensor<[?,32],f32>, !torch.vtensor<[?],si64>) -> !torch.list<vtensor>
  %weights = torch.prim.ListConstruct %gu : (!torch.vtensor<[4,16,32],f32>) -> !torch.list<vtensor>
  %y = torch.operator "torch.autosp.token_experts"(%inputs, %weights, %str) : (!torch.list<vtensor>, !torch.list<vtensor>, !torch.str) -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %f = torch.aten.view %e, %lr : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %f, [%s], affine_map<()[s0] -> (s0 * 64)> : !torch.vtensor<[?],f32>
  %c = torch.operator "torch.aten.histc"(%f, %int4, %int0, %int4) : (!torch.vtensor<[?],f32>, !torch.int, !torch.int, !torch.int) -> !torch.vtensor<[4],f32>
  return %y, %c : !torch.vtensor<[?,32],f32>, !torch.vtensor<[4],f32>
}

// -----

// A model's own autograd.Function kept whole (torch.autosp.autograd_function, its
// statement checked at export: row-wise over the tokens): it runs on the rank's positions,
// as a token-wise op; its parameter operand stays whole.
// CHECK-LABEL: func.func @autograd_function
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[L:.*]] = torch.prim.ListConstruct %[[E]], %arg1
// CHECK: %[[Y:.*]] = torch.operator "torch.autosp.autograd_function"(%[[L]], %str)
// CHECK: return %[[Y]]
// GATHER-LABEL: func.func @autograd_function
// GATHER: torch.operator "torch.autosp.autograd_function"
// GATHER: "autosp.all_gather"
func.func @autograd_function(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                             %scale: !torch.vtensor<[32],f32> {autosp.parameter = "scale"},
                             %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  %str = torch.constant.str "{\"fn\": \"test_autograd_functions:RowScale\", \"args\": [{\"tensor\": 0}, {\"tensor\": 1}]}"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %inputs = torch.prim.ListConstruct %e, %scale : (!torch.vtensor<[2,?,32],f32>, !torch.vtensor<[32],f32>) -> !torch.list<vtensor>
  %y = torch.operator "torch.autosp.autograd_function"(%inputs, %str) : (!torch.list<vtensor>, !torch.str) -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %y : !torch.vtensor<[2,?,32],f32>
}

// -----

// A returned value whose rows fold the batch with the sequence ([2 * S, E]: a router's
// logits from hidden.view(-1, H)), gathered (gather-outputs): unfolded to [2, S, E] (the
// view that merged them says the batch comes first), gathered along the sequence, and
// folded back; concatenating the ranks' folded rows would interleave them wrongly.
// GATHER-LABEL: func.func @gather_folded_rows
// GATHER: %[[R:.*]] = torch.aten.mm
// GATHER: %[[U:.*]] = torch.aten.view %[[R]], %{{.*}} : !torch.vtensor<[?,4],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4],f32>
// GATHER-NEXT: %[[G:.*]] = "autosp.all_gather"(%[[U]], %{{.*}}) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// GATHER: %[[F:.*]] = torch.aten.view %[[G]], %{{.*}} : !torch.vtensor<[2,?,4],f32>, !torch.list<int> -> !torch.vtensor<[?,4],f32>
// GATHER: return %[[F]]
func.func @gather_folded_rows(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                              %r: !torch.vtensor<[32,4],f32> {autosp.parameter = "router"},
                              %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[?,4],f32> {
  %int-1 = torch.constant.int -1
  %int32 = torch.constant.int 32
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %l = torch.prim.ListConstruct %int-1, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  %x = torch.aten.view %e, %l : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %y = torch.aten.mm %x, %r : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,4],f32> -> !torch.vtensor<[?,4],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (s0 * 2, 4)> : !torch.vtensor<[?,4],f32>
  return %y : !torch.vtensor<[?,4],f32>
}

// -----

// scatter_add of this rank's routed tokens (index and src sharded along the scattered dim)
// into proven zeros: the parts' scatters add up, a local scatter plus an all_reduce (the
// aux loss's masked counts).
// CHECK-LABEL: func.func @scatter_add_into_zeros
// CHECK: %[[Z:.*]] = torch.aten.zeros
// CHECK: %[[C:.*]] = torch.aten.scatter_add %[[Z]]
// CHECK-NEXT: %[[CT:.*]] = "autosp.all_reduce"(%[[C]]) {group = "sp", reduce_op = "sum"}
// CHECK: return %[[CT]]
func.func @scatter_add_into_zeros(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                  %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[4],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int4 = torch.constant.int 4
  %int6 = torch.constant.int 6
  %false = torch.constant.bool false
  %none = torch.constant.none
  %cpu = torch.constant.device "cpu"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %lr = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %src = torch.aten.view %e, %lr : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %src, [%s], affine_map<()[s0] -> (s0 * 64)> : !torch.vtensor<[?],f32>
  %idx = torch.aten.remainder.Scalar %src, %int4 : !torch.vtensor<[?],f32>, !torch.int -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %idx, [%s], affine_map<()[s0] -> (s0 * 64)> : !torch.vtensor<[?],f32>
  %idx64 = torch.aten.to.dtype %idx, %int4, %false, %false, %none : !torch.vtensor<[?],f32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[?],si64>
  torch.bind_symbolic_shape %idx64, [%s], affine_map<()[s0] -> (s0 * 64)> : !torch.vtensor<[?],si64>
  %l4 = torch.prim.ListConstruct %int4 : (!torch.int) -> !torch.list<int>
  %z = torch.aten.zeros %l4, %int6, %none, %cpu, %false : !torch.list<int>, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[4],f32>
  %c = torch.aten.scatter_add %z, %int0, %idx64, %src : !torch.vtensor<[4],f32>, !torch.int, !torch.vtensor<[?],si64>, !torch.vtensor<[?],f32> -> !torch.vtensor<[4],f32>
  return %c : !torch.vtensor<[4],f32>
}

// -----

// A replicated value whose flattened rows hold each token's k rows inside the sequence
// ([B*S] -> [B*S, 2] -> [B*S*2], as mask.reshape(-1).repeat_interleave(2)), used with
// sharded rows folded the same way ([B, S, 2] flattened): the fold is read through both
// views ([2, None, 2]), the value unfolded, sliced along the sequence and folded back, so
// each rank holds the rows of its own tokens.
// CHECK-LABEL: func.func @fold_with_inner_dim
// CHECK: %[[FLAT:.*]] = torch.aten.view %{{.*}} : !torch.vtensor<[2,?,2],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
// CHECK: %[[R:.*]] = torch.aten.view %{{.*}} : !torch.vtensor<[?,2],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
// CHECK: %[[DIMS:.*]] = torch.prim.ListConstruct %{{.*}}, %{{.*}}, %{{.*}} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK: %[[OPEN:.*]] = torch.aten.view %[[R]], %[[DIMS]] : !torch.vtensor<[?],f32>, !torch.list<int> -> !torch.vtensor<[2,?,2],f32>
// CHECK: %[[SLICE:.*]] = "autosp.shard"(%[[OPEN]], %{{.*}}) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: %[[BACK:.*]] = torch.aten.view %[[SLICE]], %{{.*}} : !torch.vtensor<[2,?,2],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
// CHECK: torch.aten.mul.Tensor %[[FLAT]], %[[BACK]]
func.func @fold_with_inner_dim(%w: !torch.vtensor<[64,2],f32> {autosp.parameter = "w"},
                               %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                               %mask: !torch.vtensor<[2,?],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[?],f32> {
  %int-1 = torch.constant.int -1
  %int2 = torch.constant.int 2
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  torch.bind_symbolic_shape %mask, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,2],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,2],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 2)> : !torch.vtensor<[2,?,2],f32>
  %lr = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %flat = torch.aten.view %e, %lr : !torch.vtensor<[2,?,2],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %flat, [%s], affine_map<()[s0] -> (s0 * 4)> : !torch.vtensor<[?],f32>
  %m1 = torch.aten.view %mask, %lr : !torch.vtensor<[2,?],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %m1, [%s], affine_map<()[s0] -> (s0 * 2)> : !torch.vtensor<[?],f32>
  %l2 = torch.prim.ListConstruct %int-1, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %u = torch.aten.unsqueeze %m1, %int-1 : !torch.vtensor<[?],f32>, !torch.int -> !torch.vtensor<[?,1],f32>
  torch.bind_symbolic_shape %u, [%s], affine_map<()[s0] -> (s0 * 2, 1)> : !torch.vtensor<[?,1],f32>
  %x = torch.aten.expand %u, %l2, %false : !torch.vtensor<[?,1],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[?,2],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0 * 2, 2)> : !torch.vtensor<[?,2],f32>
  %r = torch.aten.view %x, %lr : !torch.vtensor<[?,2],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %r, [%s], affine_map<()[s0] -> (s0 * 4)> : !torch.vtensor<[?],f32>
  %y = torch.aten.mul.Tensor %flat, %r : !torch.vtensor<[?],f32>, !torch.vtensor<[?],f32> -> !torch.vtensor<[?],f32>
  return %y : !torch.vtensor<[?],f32>
}

// -----

// A replicated operand whose rows fold the batch with the sequence ([2 * S, 4]) but whose
// fold no view records: full_like(logits, -inf) as exported (a 0-d literal broadcast to
// the logits' size). Every row is alike, so this rank's rows need no fold: autosp.shard
// takes as many as its logits have (Llama 4's router).
// CHECK-LABEL: func.func @uniform_fold_operand
// CHECK: %[[Y:.*]] = torch.aten.mm
// CHECK: %[[T:.*]] = torch.aten.broadcast_to %{{.*}} : !torch.vtensor<[],f32>, !torch.list<int> -> !torch.vtensor<[?,4],f32>
// CHECK-NEXT: %[[TS:.*]] = "autosp.shard"(%[[T]], %{{.*}}) {dim = 0 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: torch.aten.maximum %[[Y]], %[[TS]]
func.func @uniform_fold_operand(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                %r: !torch.vtensor<[32,4],f32> {autosp.parameter = "router"},
                                %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[?,4],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int4 = torch.constant.int 4
  %int32 = torch.constant.int 32
  %false = torch.constant.bool false
  %inf = torch.vtensor.literal(dense<0xFF800000> : tensor<f32>) : !torch.vtensor<[],f32>
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %l = torch.prim.ListConstruct %int-1, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  %x = torch.aten.view %e, %l : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %y = torch.aten.mm %x, %r : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,4],f32> -> !torch.vtensor<[?,4],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (s0 * 2, 4)> : !torch.vtensor<[?,4],f32>
  %n = torch.aten.size.int %y, %int0 : !torch.vtensor<[?,4],f32>, !torch.int -> !torch.int
  %sz = torch.prim.ListConstruct %n, %int4 : (!torch.int, !torch.int) -> !torch.list<int>
  %t = torch.aten.broadcast_to %inf, %sz : !torch.vtensor<[],f32>, !torch.list<int> -> !torch.vtensor<[?,4],f32>
  torch.bind_symbolic_shape %t, [%s], affine_map<()[s0] -> (s0 * 2, 4)> : !torch.vtensor<[?,4],f32>
  %z = torch.aten.maximum %y, %t : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32> -> !torch.vtensor<[?,4],f32>
  torch.bind_symbolic_shape %z, [%s], affine_map<()[s0] -> (s0 * 2, 4)> : !torch.vtensor<[?,4],f32>
  return %z : !torch.vtensor<[?,4],f32>
}

// -----

// torch.repeat(E, 1) of [2 * S, 32] tokens, as torch-mlir decomposes it: an unsqueeze
// (no shape binding: the analysis inserts the new dim), a broadcast_to from a size list
// and a view merging the experts with the tokens ([4 * 2 * S, 32], the experts outermost).
// Each rank repeats its own tokens: no collective, every op local.
// CHECK-LABEL: func.func @repeat_per_expert
// CHECK: torch.aten.embedding
// CHECK: %[[U:.*]] = torch.aten.unsqueeze
// CHECK-NOT: autosp.shard
// CHECK-NOT: autosp.all_gather
// CHECK: %[[B:.*]] = torch.aten.broadcast_to %[[U]]
// CHECK-NOT: autosp.shard
// CHECK-NOT: autosp.all_gather
// CHECK: %[[V:.*]] = torch.aten.view %[[B]]
// CHECK-NEXT: return %[[V]]
func.func @repeat_per_expert(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                             %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[?,32],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int4 = torch.constant.int 4
  %int32 = torch.constant.int 32
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %l = torch.prim.ListConstruct %int-1, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  %x = torch.aten.view %e, %l : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %u = torch.aten.unsqueeze %x, %int0 : !torch.vtensor<[?,32],f32>, !torch.int -> !torch.vtensor<[1,?,32],f32>
  %n = torch.aten.size.int %u, %int1 : !torch.vtensor<[1,?,32],f32>, !torch.int -> !torch.int
  %sz = torch.prim.ListConstruct %int4, %n, %int32 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %b = torch.aten.broadcast_to %u, %sz : !torch.vtensor<[1,?,32],f32>, !torch.list<int> -> !torch.vtensor<[4,?,32],f32>
  %v = torch.aten.view %b, %l : !torch.vtensor<[4,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %v, [%s], affine_map<()[s0] -> (s0 * 8, 32)> : !torch.vtensor<[?,32],f32>
  return %v : !torch.vtensor<[?,32],f32>
}

// -----

// A causal depthwise convolution along the sequence (kernel 4, padding 3, output cut back
// to S: transformers' causal_conv1d_fn): output t reads inputs t - 3 .. t, so each rank
// takes the 3 positions before its part (autosp.halo: an all-gather of the ranks' last 3
// positions, zeros before the sequence) and convolves without padding; the cut is then
// the identity on its part.
// CHECK-LABEL: func.func @causal_conv_halo
// CHECK: %[[X:.*]] = torch.aten.transpose.int
// CHECK: %[[H:.*]] = "autosp.halo"(%[[X]], %{{.*}}) {dim = 2 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64, width = 3 : i64}
// CHECK: %[[Z:.*]] = torch.prim.ListConstruct %int0{{[_0-9]*}} : (!torch.int) -> !torch.list<int>
// CHECK: %[[Y:.*]] = torch.aten.convolution %[[H]], %arg1, %arg2, %{{[^,]*}}, %[[Z]],
// CHECK: "autosp.rewindow"(%[[Y]], %{{.*}}) {dim = 2 : i64, group = "sp", lo = 0 : i64, new_lo = 0 : i64, new_trim = 0 : i64, trim = 0 : i64}
func.func @causal_conv_halo(%w: !torch.vtensor<[64,8],f32> {autosp.parameter = "w"},
                      %cw: !torch.vtensor<[8,1,4],f32> {autosp.parameter = "conv.weight"},
                      %cb: !torch.vtensor<[8],f32> {autosp.parameter = "conv.bias"},
                      %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,8,?],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int8 = torch.constant.int 8
  %intP = torch.constant.int 3
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,8],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,8],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 8)> : !torch.vtensor<[2,?,8],f32>
  %x = torch.aten.transpose.int %e, %int1, %int2 : !torch.vtensor<[2,?,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,8,?],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, 8, s0)> : !torch.vtensor<[2,8,?],f32>
  %n = torch.aten.size.int %x, %int2 : !torch.vtensor<[2,8,?],f32>, !torch.int -> !torch.int
  %stride = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %intP : (!torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %opad = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %x, %cw, %cb, %stride, %pad, %dil, %false, %opad, %int8 : !torch.vtensor<[2,8,?],f32>, !torch.vtensor<[8,1,4],f32>, !torch.vtensor<[8],f32>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,8,?],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (2, 8, s0 + 3)> : !torch.vtensor<[2,8,?],f32>
  %z = torch.aten.slice.Tensor %y, %int2, %none, %n, %int1 : !torch.vtensor<[2,8,?],f32>, !torch.int, !torch.none, !torch.int, !torch.int -> !torch.vtensor<[2,8,?],f32>
  torch.bind_symbolic_shape %z, [%s], affine_map<()[s0] -> (2, 8, s0)> : !torch.vtensor<[2,8,?],f32>
  return %z : !torch.vtensor<[2,8,?],f32>
}

// -----

// Image features merged at the image tokens: masked_scatter reads its (replicated) source
// in the whole mask's order, so it is not token-wise. It becomes autosp.masked_scatter on
// this rank's embeddings and mask, with the whole source and the sequence length. The
// features, computed whole from the parameters and also returned, get their gradient
// shared at the return (autosp.grad_share: 1/P a rank).
// CHECK-LABEL: func.func @image_features_merged
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[F:.*]] = torch.aten.mm %arg2, %arg1
// CHECK: %[[M:.*]] = "autosp.masked_scatter"(%[[E]], %{{.*}}, %[[F]], %{{.*}}) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK-NOT: torch.aten.masked_scatter
// CHECK: %[[S:.*]] = "autosp.grad_share"(%[[F]]) {group = "sp"}
// CHECK: return %[[M]], %[[S]]
func.func @image_features_merged(%w: !torch.vtensor<[64,8],f32> {autosp.parameter = "w"},
                                 %proj: !torch.vtensor<[8,8],f32> {autosp.parameter = "proj"},
                                 %patches: !torch.vtensor<[4,8],f32> {autosp.input = "args[1]"},
                                 %ids: !torch.vtensor<[1,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[1,?,8],f32>, !torch.vtensor<[4,8],f32>) {
  %int-1 = torch.constant.int -1
  %int8 = torch.constant.int 8
  %int60 = torch.constant.int 60
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (1, s0)> : !torch.vtensor<[1,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,8],f32>, !torch.vtensor<[1,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[1,?,8],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (1, s0, 8)> : !torch.vtensor<[1,?,8],f32>
  %f = torch.aten.mm %patches, %proj : !torch.vtensor<[4,8],f32>, !torch.vtensor<[8,8],f32> -> !torch.vtensor<[4,8],f32>
  %is = torch.aten.eq.Scalar %ids, %int60 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,?],i1>
  torch.bind_symbolic_shape %is, [%s], affine_map<()[s0] -> (1, s0)> : !torch.vtensor<[1,?],i1>
  %u = torch.aten.unsqueeze %is, %int-1 : !torch.vtensor<[1,?],i1>, !torch.int -> !torch.vtensor<[1,?,1],i1>
  torch.bind_symbolic_shape %u, [%s], affine_map<()[s0] -> (1, s0, 1)> : !torch.vtensor<[1,?,1],i1>
  %m = torch.aten.masked_scatter %e, %u, %f : !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,1],i1>, !torch.vtensor<[4,8],f32> -> !torch.vtensor<[1,?,8],f32>
  torch.bind_symbolic_shape %m, [%s], affine_map<()[s0] -> (1, s0, 8)> : !torch.vtensor<[1,?,8],f32>
  return %m, %f : !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[4,8],f32>
}

// -----

// Selections along the sequence: the sharded operand gets one zero row, the positions
// become this rank's rows (autosp.local_positions: its local length where another rank
// holds one), and the local result is summed over the group (replicated). x[:, -1]:
// CHECK-LABEL: func.func @select_last_position
// CHECK: %[[S:.*]] = torch.aten.size.int
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[PAD:.*]] = torch.prim.ListConstruct %[[Z0:[^,]*]], %[[Z0]], %[[Z1:[^,]*]], %[[ONE:[^ ]*]] :
// CHECK: %[[EP:.*]] = torch.aten.constant_pad_nd %[[E]], %[[PAD]], %{{.*}} : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.int -> !torch.vtensor<[2,?,32],f32>
// CHECK: %[[LIT:.*]] = torch.vtensor.literal(dense<-1> : tensor<1xsi64>)
// CHECK: %[[LOCAL:.*]] = "autosp.local_positions"(%[[LIT]], %[[S]]) {group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: %[[PICK:.*]] = torch.aten.index_select %[[EP]], %{{.*}}, %[[LOCAL]] : {{.*}} -> !torch.vtensor<[2,1,32],f32>
// CHECK: %[[ROW:.*]] = torch.aten.squeeze.dim %[[PICK]], %{{.*}} -> !torch.vtensor<[2,32],f32>
// CHECK: %[[SUM:.*]] = "autosp.all_reduce"(%[[ROW]]) {group = "sp", reduce_op = "sum"}
// CHECK: return %[[SUM]]
func.func @select_last_position(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,32],f32> {
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %t = torch.aten.select.int %e, %int1, %int-1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,32],f32>
  return %t : !torch.vtensor<[2,32],f32>
}

// -----

// BERT's [CLS] (x[:, 0:1]) and the last 5 positions (x[:, -5:]): fixed positions, by a literal.
// CHECK-LABEL: func.func @fixed_slices
// CHECK: torch.vtensor.literal(dense<0> : tensor<1xsi64>)
// CHECK: "autosp.local_positions"
// CHECK: %[[CLS:.*]] = torch.aten.index_select {{.*}} -> !torch.vtensor<[2,1,32],f32>
// CHECK: %[[CLS_R:.*]] = "autosp.all_reduce"(%[[CLS]])
// CHECK: torch.vtensor.literal(dense<[-5, -4, -3, -2, -1]> : tensor<5xsi64>)
// CHECK: "autosp.local_positions"
// CHECK: %[[LAST:.*]] = torch.aten.index_select {{.*}} -> !torch.vtensor<[2,5,32],f32>
// CHECK: %[[LAST_R:.*]] = "autosp.all_reduce"(%[[LAST]])
// CHECK: return %[[CLS_R]], %[[LAST_R]]
func.func @fixed_slices(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                        %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[2,1,32],f32>, !torch.vtensor<[2,5,32],f32>) {
  %int-1 = torch.constant.int -1
  %int-5 = torch.constant.int -5
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %none = torch.constant.none
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 8, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %cls = torch.aten.slice.Tensor %e, %int1, %int0, %int1, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,1,32],f32>
  %t = torch.aten.slice.Tensor %e, %int1, %int-5, %none, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.none, !torch.int -> !torch.vtensor<[2,5,32],f32>
  return %cls, %t : !torch.vtensor<[2,1,32],f32>, !torch.vtensor<[2,5,32],f32>
}

// -----

// A reward model's last non-pad token: an index tensor every rank computes whole from the
// input ids, at the sequence dim of an advanced index (the batch indexed by its arange).
// CHECK-LABEL: func.func @index_last_token
// CHECK-SAME: %[[LASTARG:[^:]*]]: !torch.vtensor<[2],si64> {autosp.input = "args[1]"}
// CHECK: %[[S:.*]] = torch.aten.size.int
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[ROWS:.*]] = torch.aten.arange.start_step
// CHECK: %[[EP:.*]] = torch.aten.constant_pad_nd %[[E]]
// CHECK: %[[LOCAL:.*]] = "autosp.local_positions"(%[[LASTARG]], %[[S]]) {group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK: %[[IDX:.*]] = torch.prim.ListConstruct %[[ROWS]], %[[LOCAL]]
// CHECK: %[[PICK:.*]] = torch.aten.index.Tensor_hacked_twin %[[EP]], %[[IDX]]
// CHECK: %[[SUM:.*]] = "autosp.all_reduce"(%[[PICK]]) {group = "sp", reduce_op = "sum"}
// CHECK: return %[[SUM]]
func.func @index_last_token(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                            %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                            %last: !torch.vtensor<[2],si64> {autosp.input = "args[1]"})
    -> !torch.vtensor<[2,32],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %none = torch.constant.none
  %cpu = torch.constant.device "cpu"
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %rows = torch.aten.arange.start_step %int0, %int2, %int1, %none, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[2],si64>
  %idx = torch.prim.ListConstruct %rows, %last : (!torch.vtensor<[2],si64>, !torch.vtensor<[2],si64>) -> !torch.list<vtensor>
  %x = torch.aten.index.Tensor_hacked_twin %e, %idx : !torch.vtensor<[2,?,32],f32>, !torch.list<vtensor> -> !torch.vtensor<[2,32],f32>
  return %x : !torch.vtensor<[2,32],f32>
}

// -----

// Extractive QA: a log-softmax over the positions (autosp.softmax: the result stays
// sharded), then the label's position read by gather (a selection).
// CHECK-LABEL: func.func @qa_log_softmax_gather
// CHECK-SAME: %[[START:[^:]*]]: !torch.vtensor<[2,1],si64> {autosp.input = "args[1]"}
// CHECK: %[[LOGITS:.*]] = torch.aten.squeeze.dim
// CHECK: %[[LSM:.*]] = "autosp.softmax"(%[[LOGITS]]) {dim = 1 : i64, dtype = "", group = "sp", log = 1 : i64} : (!torch.vtensor<[2,?],f32>) -> !torch.vtensor<[2,?],f32>
// CHECK: %[[LP:.*]] = torch.aten.constant_pad_nd %[[LSM]]
// CHECK: %[[LOCAL:.*]] = "autosp.local_positions"(%[[START]], %{{.*}})
// CHECK: %[[PICK:.*]] = torch.aten.gather %[[LP]], %{{.*}}, %[[LOCAL]], %{{.*}}
// CHECK: %[[SUM:.*]] = "autosp.all_reduce"(%[[PICK]])
// CHECK: return %[[SUM]]
func.func @qa_log_softmax_gather(%w: !torch.vtensor<[64,1],f32> {autosp.parameter = "w"},
                                 %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                                 %start: !torch.vtensor<[2,1],si64> {autosp.input = "args[1]"})
    -> !torch.vtensor<[2,1],f32> {
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int6 = torch.constant.int 6
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,1],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,1],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 1)> : !torch.vtensor<[2,?,1],f32>
  %logits = torch.aten.squeeze.dim %e, %int2 : !torch.vtensor<[2,?,1],f32>, !torch.int -> !torch.vtensor<[2,?],f32>
  torch.bind_symbolic_shape %logits, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  %lsm = torch.aten.log_softmax.int %logits, %int1, %int6 : !torch.vtensor<[2,?],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,?],f32>
  torch.bind_symbolic_shape %lsm, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  %picked = torch.aten.gather %lsm, %int1, %start, %false : !torch.vtensor<[2,?],f32>, !torch.int, !torch.vtensor<[2,1],si64>, !torch.bool -> !torch.vtensor<[2,1],f32>
  return %picked : !torch.vtensor<[2,1],f32>
}

// -----

// logsumexp and amax over the sequence alone: autosp.logsumexp / autosp.amax (keepdim,
// then squeezed where the op drops the dim), replicated.
// CHECK-LABEL: func.func @logsumexp_amax
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[LSE:.*]] = "autosp.logsumexp"(%[[E]]) {dim = 1 : i64, group = "sp"} : (!torch.vtensor<[2,?,32],f32>) -> !torch.vtensor<[2,1,32],f32>
// CHECK: %[[LSE2:.*]] = torch.aten.squeeze.dim %[[LSE]], %{{.*}} -> !torch.vtensor<[2,32],f32>
// CHECK: %[[MAX:.*]] = "autosp.amax"(%[[E]]) {dim = 1 : i64, group = "sp"} : (!torch.vtensor<[2,?,32],f32>) -> !torch.vtensor<[2,1,32],f32>
// CHECK: return %[[LSE2]], %[[MAX]]
func.func @logsumexp_amax(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                          %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[2,32],f32>, !torch.vtensor<[2,1,32],f32>) {
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %lse = torch.aten.logsumexp %e, %dims, %false : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,32],f32>
  %max = torch.aten.amax %e, %dims, %true : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,1,32],f32>
  return %lse, %max : !torch.vtensor<[2,32],f32>, !torch.vtensor<[2,1,32],f32>
}

// -----

// The position of the largest value along the sequence (max.dim: values and indices):
// autosp.amax for the values, autosp.argmax for the positions (window coordinates),
// both replicated. argmax alone: only autosp.argmax.
// CHECK-LABEL: func.func @max_dim_and_argmax
// CHECK: %[[S:.*]] = torch.aten.size.int
// CHECK: %[[E:.*]] = torch.aten.embedding
// CHECK: %[[V:.*]] = "autosp.amax"(%[[E]]) {dim = 1 : i64, group = "sp"} : (!torch.vtensor<[2,?,32],f32>) -> !torch.vtensor<[2,1,32],f32>
// CHECK: %[[V2:.*]] = torch.aten.squeeze.dim %[[V]]
// CHECK: %[[I:.*]] = "autosp.argmax"(%[[E]], %[[S]]) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[2,?,32],f32>, !torch.int) -> !torch.vtensor<[2,1,32],si64>
// CHECK: %[[I2:.*]] = torch.aten.squeeze.dim %[[I]]
// CHECK-NOT: torch.aten.max.dim
// CHECK: %[[J:.*]] = "autosp.argmax"(%[[E]], %[[S]])
// CHECK-NOT: "autosp.amax"
// CHECK: return %[[V2]], %[[I2]], %[[J]]
func.func @max_dim_and_argmax(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                              %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[2,32],f32>, !torch.vtensor<[2,32],si64>, !torch.vtensor<[2,1,32],si64>) {
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %values, %indices = torch.aten.max.dim %e, %int1, %false : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,32],f32>, !torch.vtensor<[2,32],si64>
  %v2, %i2 = torch.aten.max.dim %e, %int1, %true : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,1,32],f32>, !torch.vtensor<[2,1,32],si64>
  return %values, %indices, %i2 : !torch.vtensor<[2,32],f32>, !torch.vtensor<[2,32],si64>, !torch.vtensor<[2,1,32],si64>
}

// -----

// A buffer the forward writes (autosp.buffer_writes: result 0 goes to argument 1): a count
// over the sequence, reduced over the group like any sum, the same on every rank.
// CHECK-LABEL: func.func @buffer_write_count
// CHECK: %[[LOCAL:.*]] = torch.aten.sum.dim_IntList
// CHECK: %[[TOTAL:.*]] = "autosp.all_reduce"(%[[LOCAL]]) {group = "sp", reduce_op = "sum"}
// CHECK: %[[NEW:.*]] = torch.aten.add.Tensor %{{.*}}, %[[TOTAL]]
// CHECK: return %[[NEW]],
func.func @buffer_write_count(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                              %count: !torch.vtensor<[32],f32> {autosp.buffer = "count"},
                              %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[32],f32>, !torch.vtensor<[2,?,32],f32>) attributes {autosp.buffer_writes = [1]} {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct %int0, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %sum = torch.aten.sum.dim_IntList %e, %dims, %false, %none : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[32],f32>
  %new = torch.aten.add.Tensor %count, %sum, %int1 : !torch.vtensor<[32],f32>, !torch.vtensor<[32],f32>, !torch.int -> !torch.vtensor<[32],f32>
  return %new, %e : !torch.vtensor<[32],f32>, !torch.vtensor<[2,?,32],f32>
}
