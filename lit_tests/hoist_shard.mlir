// RUN: autosp-opt %s --split-input-file --autosp-hoist-shard | FileCheck %s

// LlamaLike's RoPE: positions (arange broadcast to [1, S]) -> unsqueeze -> float -> times
// inv_freq -> cat(freqs, freqs) -> cos / sin -> unsqueeze(1) per use, each sliced where
// it meets q (dim 2). The shards move up to the positions (stopping at broadcast_to, whose
// size list holds S): one shard of [1, S] int64, then the tables for the rank's rows only;
// cos and sin share one sharded chain.
// CHECK-LABEL: func.func @rope
// CHECK:       %[[POS:.*]] = torch.aten.broadcast_to
// CHECK-NEXT:  %[[POS_R:.*]] = "autosp.shard"(%[[POS]], %arg2) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?],si64>, !torch.int) -> !torch.vtensor<[1,?],si64>
// CHECK-NEXT:  %[[U:.*]] = torch.aten.unsqueeze %[[POS_R]], %int2
// CHECK-NEXT:  %[[F:.*]] = torch.aten.to.dtype %[[U]]
// CHECK-NEXT:  %[[FR:.*]] = torch.aten.mul.Tensor %[[F]], %arg1 : !torch.vtensor<[1,?,1],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[1,?,4],f32>
// CHECK-NEXT:  %[[L:.*]] = torch.prim.ListConstruct %[[FR]], %[[FR]]
// CHECK-NEXT:  %[[E:.*]] = torch.aten.cat %[[L]], %int-1
// CHECK-NEXT:  %[[C:.*]] = torch.aten.cos %[[E]]
// CHECK-NEXT:  %[[CU:.*]] = torch.aten.unsqueeze %[[C]], %int1
// CHECK-NEXT:  %[[QC:.*]] = torch.aten.mul.Tensor %arg0, %[[CU]]
// CHECK-NEXT:  %[[S:.*]] = torch.aten.sin %[[E]]
// CHECK-NEXT:  %[[SU:.*]] = torch.aten.unsqueeze %[[S]], %int1
// CHECK-NEXT:  %[[QS:.*]] = torch.aten.mul.Tensor %arg0, %[[SU]]
// CHECK-NOT:   autosp.shard
// CHECK:       return
func.func @rope(%q: !torch.vtensor<[1,4,?,8],f32>, %inv_freq: !torch.vtensor<[4],f32>, %s: !torch.int) -> (!torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>) {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int6 = torch.constant.int 6
  %false = torch.constant.bool false
  %none = torch.constant.none
  %cpu = torch.constant.device "cpu"
  %0 = torch.aten.arange.start_step %int0, %s, %int1, %none, %int0, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.none, !torch.int, !torch.Device, !torch.bool -> !torch.vtensor<[?],si64>
  %1 = torch.aten.unsqueeze %0, %int0 : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[1,?],si64>
  %2 = torch.prim.ListConstruct %int1, %s : (!torch.int, !torch.int) -> !torch.list<int>
  %3 = torch.aten.broadcast_to %1, %2 : !torch.vtensor<[1,?],si64>, !torch.list<int> -> !torch.vtensor<[1,?],si64>
  %4 = torch.aten.unsqueeze %3, %int2 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,?,1],si64>
  %5 = torch.aten.to.dtype %4, %int6, %false, %false, %none : !torch.vtensor<[1,?,1],si64>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[1,?,1],f32>
  %6 = torch.aten.mul.Tensor %5, %inv_freq : !torch.vtensor<[1,?,1],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[1,?,4],f32>
  %7 = torch.prim.ListConstruct %6, %6 : (!torch.vtensor<[1,?,4],f32>, !torch.vtensor<[1,?,4],f32>) -> !torch.list<vtensor>
  %8 = torch.aten.cat %7, %int-1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[1,?,8],f32>
  %cos = torch.aten.cos %8 : !torch.vtensor<[1,?,8],f32> -> !torch.vtensor<[1,?,8],f32>
  %sin = torch.aten.sin %8 : !torch.vtensor<[1,?,8],f32> -> !torch.vtensor<[1,?,8],f32>
  %9 = torch.aten.unsqueeze %cos, %int1 : !torch.vtensor<[1,?,8],f32>, !torch.int -> !torch.vtensor<[1,1,?,8],f32>
  %10 = "autosp.shard"(%9, %s) {dim = 2 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,1,?,8],f32>
  %11 = torch.aten.mul.Tensor %q, %10 : !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,1,?,8],f32> -> !torch.vtensor<[1,4,?,8],f32>
  %12 = torch.aten.unsqueeze %sin, %int1 : !torch.vtensor<[1,?,8],f32>, !torch.int -> !torch.vtensor<[1,1,?,8],f32>
  %13 = "autosp.shard"(%12, %s) {dim = 2 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,1,?,8],f32>
  %14 = torch.aten.mul.Tensor %q, %13 : !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,1,?,8],f32> -> !torch.vtensor<[1,4,?,8],f32>
  return %11, %14 : !torch.vtensor<[1,4,?,8],f32>, !torch.vtensor<[1,4,?,8],f32>
}

// -----

// Hugging Face's RoPE: inv_freq [1, 4, 1] @ positions [1, 1, S] -> [1, 4, S] -> transpose
// to [1, S, 4]. Each column of the matmul reads one position: the shard goes through the
// transpose (dim 1 -> 2) and the matmul's right operand (its last dim); the left operand,
// all static, is used whole.
// CHECK-LABEL: func.func @hf_rope
// CHECK:       %[[P:.*]] = "autosp.shard"(%arg1, %arg2) {dim = 2 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,1,?],f32>
// CHECK-NEXT:  %[[M:.*]] = torch.aten.matmul %arg0, %[[P]]
// CHECK-NEXT:  %[[T:.*]] = torch.aten.transpose.int %[[M]], %int1, %int2
// CHECK-NEXT:  return %[[T]]
func.func @hf_rope(%inv: !torch.vtensor<[1,4,1],f32>, %pos: !torch.vtensor<[1,1,?],f32>, %s: !torch.int) -> !torch.vtensor<[1,?,4],f32> {
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %0 = torch.aten.matmul %inv, %pos : !torch.vtensor<[1,4,1],f32>, !torch.vtensor<[1,1,?],f32> -> !torch.vtensor<[1,4,?],f32>
  %1 = torch.aten.transpose.int %0, %int1, %int2 : !torch.vtensor<[1,4,?],f32>, !torch.int, !torch.int -> !torch.vtensor<[1,?,4],f32>
  %2 = "autosp.shard"(%1, %s) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?,4],f32>, !torch.int) -> !torch.vtensor<[1,?,4],f32>
  return %2 : !torch.vtensor<[1,?,4],f32>
}

// -----

// The whole table is also used unsliced (here returned): computing it twice would cost
// more, so the shard stays where it is.
// CHECK-LABEL: func.func @used_whole
// CHECK:       %[[C:.*]] = torch.aten.cos %arg0
// CHECK-NEXT:  "autosp.shard"(%[[C]], %arg1) {dim = 1 : i64
func.func @used_whole(%x: !torch.vtensor<[1,?,8],f32>, %s: !torch.int) -> (!torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>) {
  %0 = torch.aten.cos %x : !torch.vtensor<[1,?,8],f32> -> !torch.vtensor<[1,?,8],f32>
  %1 = "autosp.shard"(%0, %s) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,?,8],f32>
  return %0, %1 : !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>
}

// -----

// Two shards of one value with different windows (the whole sequence and the shifted
// one): not one slice, so neither moves.
// CHECK-LABEL: func.func @two_windows
// CHECK:       %[[C:.*]] = torch.aten.cos %arg0
// CHECK-NEXT:  "autosp.shard"(%[[C]], %arg1) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK-NEXT:  "autosp.shard"(%[[C]], %arg1) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 1 : i64}
func.func @two_windows(%x: !torch.vtensor<[1,?,8],f32>, %s: !torch.int) -> (!torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>) {
  %0 = torch.aten.cos %x : !torch.vtensor<[1,?,8],f32> -> !torch.vtensor<[1,?,8],f32>
  %1 = "autosp.shard"(%0, %s) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,?,8],f32>
  %2 = "autosp.shard"(%0, %s) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 1 : i64} : (!torch.vtensor<[1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,?,8],f32>
  return %1, %2 : !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>
}

// -----

// Ops that read other rows stop the hoist: a cumulative sum along the sequence, a cat
// along it, a view with a size list. Shards of the same value with the same attributes
// are merged into the first.
// CHECK-LABEL: func.func @stops
// CHECK:       %[[CS:.*]] = torch.aten.cumsum %arg0
// CHECK-NEXT:  %[[A:.*]] = "autosp.shard"(%[[CS]], %arg1) {dim = 1 : i64
// CHECK-NEXT:  torch.prim.ListConstruct %arg0, %arg0
// CHECK-NEXT:  %[[CAT:.*]] = torch.aten.cat
// CHECK-NEXT:  %[[B:.*]] = "autosp.shard"(%[[CAT]], %arg1) {dim = 1 : i64
// CHECK-NEXT:  torch.prim.ListConstruct %int1, %arg1, %int8
// CHECK-NEXT:  %[[V:.*]] = torch.aten.view
// CHECK-NEXT:  %[[C:.*]] = "autosp.shard"(%[[V]], %arg1) {dim = 1 : i64
// CHECK-NOT:   autosp.shard
// CHECK:       return %[[A]], %[[A]], %[[B]], %[[C]]
func.func @stops(%x: !torch.vtensor<[1,?,8],f32>, %s: !torch.int) -> (!torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>) {
  %int1 = torch.constant.int 1
  %int8 = torch.constant.int 8
  %none = torch.constant.none
  %0 = torch.aten.cumsum %x, %int1, %none : !torch.vtensor<[1,?,8],f32>, !torch.int, !torch.none -> !torch.vtensor<[1,?,8],f32>
  %1 = "autosp.shard"(%0, %s) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,?,8],f32>
  %2 = "autosp.shard"(%0, %s) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,?,8],f32>
  %l = torch.prim.ListConstruct %x, %x : (!torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>) -> !torch.list<vtensor>
  %3 = torch.aten.cat %l, %int1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[1,?,8],f32>
  %4 = "autosp.shard"(%3, %s) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,?,8],f32>
  %sizes = torch.prim.ListConstruct %int1, %s, %int8 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %5 = torch.aten.view %x, %sizes : !torch.vtensor<[1,?,8],f32>, !torch.list<int> -> !torch.vtensor<[1,?,8],f32>
  %6 = "autosp.shard"(%5, %s) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?,8],f32>, !torch.int) -> !torch.vtensor<[1,?,8],f32>
  return %1, %2, %4, %6 : !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,8],f32>
}
