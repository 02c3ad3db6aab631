// RUN: autosp-opt %s --split-input-file --autosp-tile-tokens=tiles=3 | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-tile-tokens=tiles=1 | FileCheck %s --check-prefix=ONE

// The inputs carry autosp.region / autosp.segment as autosp-checkpoint leaves them.
// tiles=1 does nothing anywhere in this file (checked up to the last function, which
// is not tiled in any case).
// ONE-NOT: autosp.tile
// ONE:     func.func @two_token_layouts

// A SwiGLU MLP in one segment: flatten [2, S, 64] to [2S, 64] (the size 2 * %s, an
// !torch.int argument), gate and up projections, silu, product, down projection (its
// weight transposed by a permute inside the segment: an op on a weight alone), view back
// to [2, S, 64] and the residual add. Every op is row-wise and the run has matmuls: all of
// it (the permute included) gets autosp.tile = 0 and autosp.tiles = 3. The views' one
// sequence-derived size becomes -1, in fresh lists (so each chunk computes its own size);
// the size arithmetic (mul.int) and the lists are neither tiled nor break the run.
// CHECK-LABEL: func.func @mlp
// CHECK:       %[[N:.*]] = torch.aten.mul.int %arg4, %int2 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.int, !torch.int -> !torch.int
// CHECK:       %[[M1:.*]] = torch.constant.int -1
// CHECK-NEXT:  %[[L2:.*]] = torch.prim.ListConstruct %[[M1]], %int64 : (!torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT:  %[[X2:.*]] = torch.aten.view %arg0, %[[L2]] {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
// CHECK-NEXT:  %[[G:.*]] = torch.aten.mm %[[X2]], %arg1 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  %[[A:.*]] = torch.aten.silu %[[G]] {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  %[[U:.*]] = torch.aten.mm %[[X2]], %arg2 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  %[[M:.*]] = torch.aten.mul.Tensor %[[A]], %[[U]] {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.prim.ListConstruct %int1, %int0
// CHECK-NEXT:  %[[W3T:.*]] = torch.aten.permute %arg3, %{{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  %[[D:.*]] = torch.aten.mm %[[M]], %[[W3T]] {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.prim.ListConstruct %int2, %arg4, %int64 {autosp.region = 0 : i64, autosp.segment = 1 : i64}
// CHECK-NEXT:  %[[M1B:.*]] = torch.constant.int -1
// CHECK-NEXT:  %[[L3:.*]] = torch.prim.ListConstruct %int2, %[[M1B]], %int64 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT:  %[[D3:.*]] = torch.aten.view %[[D]], %[[L3]] {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64} : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,64],f32>
// CHECK-NEXT:  %[[R:.*]] = torch.aten.add.Tensor %arg0, %[[D3]], %int1 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  return %[[R]]
func.func @mlp(%x: !torch.vtensor<[2,?,64],f32>, %w1: !torch.vtensor<[64,256],f32>, %w2: !torch.vtensor<[64,256],f32>, %w3: !torch.vtensor<[64,256],f32>, %s: !torch.int) -> !torch.vtensor<[2,?,64],f32> {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int64 = torch.constant.int 64
  %n = torch.aten.mul.int %s, %int2 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.int, !torch.int -> !torch.int
  %l2 = torch.prim.ListConstruct %n, %int64 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : (!torch.int, !torch.int) -> !torch.list<int>
  %x2 = torch.aten.view %x, %l2 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
  %g = torch.aten.mm %x2, %w1 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,256],f32> -> !torch.vtensor<[?,256],f32>
  %a = torch.aten.silu %g {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,256],f32> -> !torch.vtensor<[?,256],f32>
  %u = torch.aten.mm %x2, %w2 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,256],f32> -> !torch.vtensor<[?,256],f32>
  %m = torch.aten.mul.Tensor %a, %u {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,256],f32>, !torch.vtensor<[?,256],f32> -> !torch.vtensor<[?,256],f32>
  %perm = torch.prim.ListConstruct %int1, %int0 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : (!torch.int, !torch.int) -> !torch.list<int>
  %w3t = torch.aten.permute %w3, %perm {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[64,256],f32>, !torch.list<int> -> !torch.vtensor<[256,64],f32>
  %d = torch.aten.mm %m, %w3t {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,256],f32>, !torch.vtensor<[256,64],f32> -> !torch.vtensor<[?,64],f32>
  %l3 = torch.prim.ListConstruct %int2, %s, %int64 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %d3 = torch.aten.view %d, %l3 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,64],f32>
  %r = torch.aten.add.Tensor %x, %d3, %int1 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[2,?,64],f32>, !torch.int -> !torch.vtensor<[2,?,64],f32>
  return %r : !torch.vtensor<[2,?,64],f32>
}

// -----

// A rank's shard (from autosp.shard) and the whole sequence (a key padding mask, an
// argument) both print as [1, ?]: the mask's cast between the shard's ops is on another
// sequence extent, so it is not part of the run (chunks of the shard cannot cut the
// whole mask), and the projection on the shard is still tiled.
// CHECK-LABEL: func.func @shard_and_whole_sequence
// CHECK:       "autosp.shard"
// CHECK-NEXT:  torch.aten.to.dtype %arg1, %int11, %false, %false, %none {autosp.region = 0 : i64, autosp.segment = 1 : i64} :
// CHECK:       torch.aten.view %{{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.aten.mm %{{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
func.func @shard_and_whole_sequence(%x: !torch.vtensor<[1,?,64],f32>, %mask: !torch.vtensor<[1,?],si64>, %w: !torch.vtensor<[64,64],f32>, %s: !torch.int) -> (!torch.vtensor<[1,?,64],f32>, !torch.vtensor<[1,?],i1>) {
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %none = torch.constant.none
  %int11 = torch.constant.int 11
  %int64 = torch.constant.int 64
  %intm1 = torch.constant.int -1
  %xs = "autosp.shard"(%x, %s) {autosp.region = 0 : i64, autosp.segment = 1 : i64, dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[1,?,64],f32>, !torch.int) -> !torch.vtensor<[1,?,64],f32>
  %m = torch.aten.to.dtype %mask, %int11, %false, %false, %none {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[1,?],si64>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[1,?],i1>
  %l = torch.prim.ListConstruct %intm1, %int64 : (!torch.int, !torch.int) -> !torch.list<int>
  %v = torch.aten.view %xs, %l {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[1,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
  %y = torch.aten.mm %v, %w {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,64],f32> -> !torch.vtensor<[?,64],f32>
  %l3 = torch.prim.ListConstruct %int1, %intm1, %int64 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %y3 = torch.aten.view %y, %l3 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[1,?,64],f32>
  return %y3, %m : !torch.vtensor<[1,?,64],f32>, !torch.vtensor<[1,?],i1>
}

// -----

// Views whose size lists already infer one size (-1, the batch) and take the sequence
// from torch.aten.size.int: the sequence size cannot also become -1, so it is rewritten to
// the size of the view's own input along its sequence dim (a new size.int, marked with
// the view's segment and tile); a softmax over the features (dim -1) is row-wise and
// joins the run.
// CHECK-LABEL: func.func @size_int_and_inferred_dim
// CHECK:       %[[Y:.*]] = torch.aten.matmul %arg0, %arg1 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK:       %[[D1:.*]] = torch.constant.int 1
// CHECK-NEXT:  %[[SY:.*]] = torch.aten.size.int %[[Y]], %[[D1]] {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.int -> !torch.int
// CHECK-NEXT:  %[[L4:.*]] = torch.prim.ListConstruct %int-1, %[[SY]], %int4, %int16 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT:  %[[Y4:.*]] = torch.aten.view %[[Y]], %[[L4]] {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,16],f32>
// CHECK-NEXT:  %[[P:.*]] = torch.aten.softmax.int %[[Y4]], %int-1, %none {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK:       %[[SP:.*]] = torch.aten.size.int %[[P]], %{{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  %[[L3:.*]] = torch.prim.ListConstruct %int-1, %[[SP]], %int64
// CHECK-NEXT:  %[[Z:.*]] = torch.aten.view %[[P]], %[[L3]] {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64} : !torch.vtensor<[2,?,4,16],f32>, !torch.list<int> -> !torch.vtensor<[2,?,64],f32>
// CHECK-NEXT:  return %[[Z]]
func.func @size_int_and_inferred_dim(%x: !torch.vtensor<[2,?,64],f32>, %w: !torch.vtensor<[64,64],f32>) -> !torch.vtensor<[2,?,64],f32> {
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int-1 = torch.constant.int -1
  %int4 = torch.constant.int 4
  %int16 = torch.constant.int 16
  %int64 = torch.constant.int 64
  %s = torch.aten.size.int %x, %int1 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.int -> !torch.int
  %y = torch.aten.matmul %x, %w {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64,64],f32> -> !torch.vtensor<[2,?,64],f32>
  %l4 = torch.prim.ListConstruct %int-1, %s, %int4, %int16 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %y4 = torch.aten.view %y, %l4 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,16],f32>
  %p = torch.aten.softmax.int %y4, %int-1, %none {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,4,16],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,?,4,16],f32>
  %l3 = torch.prim.ListConstruct %int-1, %s, %int64 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %z = torch.aten.view %p, %l3 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,4,16],f32>, !torch.list<int> -> !torch.vtensor<[2,?,64],f32>
  return %z : !torch.vtensor<[2,?,64],f32>
}

// -----

// A run ends where the segment changes: two segments give two runs, tile ids 0 and 1.
// CHECK-LABEL: func.func @two_segments
// CHECK:       torch.aten.matmul %arg0, %arg1 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.aten.neg %{{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.aten.matmul %{{.*}}, %arg1 {autosp.region = 0 : i64, autosp.segment = 2 : i64, autosp.tile = 1 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.aten.neg %{{.*}} {autosp.region = 0 : i64, autosp.segment = 2 : i64, autosp.tile = 1 : i64, autosp.tiles = 3 : i64}
func.func @two_segments(%x: !torch.vtensor<[2,?,64],f32>, %w: !torch.vtensor<[64,64],f32>) -> !torch.vtensor<[2,?,64],f32> {
  %y = torch.aten.matmul %x, %w {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64,64],f32> -> !torch.vtensor<[2,?,64],f32>
  %a = torch.aten.neg %y {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32> -> !torch.vtensor<[2,?,64],f32>
  %z = torch.aten.matmul %a, %w {autosp.region = 0 : i64, autosp.segment = 2 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64,64],f32> -> !torch.vtensor<[2,?,64],f32>
  %b = torch.aten.neg %z {autosp.region = 0 : i64, autosp.segment = 2 : i64} : !torch.vtensor<[2,?,64],f32> -> !torch.vtensor<[2,?,64],f32>
  return %b : !torch.vtensor<[2,?,64],f32>
}

// -----

// Not in a checkpoint segment (a region kept whole: autosp.region only, as with
// layers=keep): nothing to recompute in chunks, not tiled.
// CHECK-LABEL: func.func @not_in_segment
// CHECK-NOT:   autosp.tile
// CHECK:       return
func.func @not_in_segment(%x: !torch.vtensor<[2,?,64],f32>, %w1: !torch.vtensor<[64,256],f32>, %w2: !torch.vtensor<[256,64],f32>) -> !torch.vtensor<[2,?,64],f32> {
  %y = torch.aten.matmul %x, %w1 {autosp.region = 0 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64,256],f32> -> !torch.vtensor<[2,?,256],f32>
  %a = torch.aten.silu %y {autosp.region = 0 : i64} : !torch.vtensor<[2,?,256],f32> -> !torch.vtensor<[2,?,256],f32>
  %z = torch.aten.matmul %a, %w2 {autosp.region = 0 : i64} : !torch.vtensor<[2,?,256],f32>, !torch.vtensor<[256,64],f32> -> !torch.vtensor<[2,?,64],f32>
  return %z : !torch.vtensor<[2,?,64],f32>
}

// -----

// A cumulative sum along the sequence mixes positions: it is no part of any run and
// splits the segment's ops into two runs (each with a matmul: tiles 0 and 1).
// CHECK-LABEL: func.func @cumsum_breaks_run
// CHECK:       torch.aten.matmul %arg0, %arg1 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.aten.cumsum %{{[^{]*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64} :
// CHECK-NEXT:  torch.aten.matmul %{{.*}}, %arg2 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 1 : i64, autosp.tiles = 3 : i64}
func.func @cumsum_breaks_run(%x: !torch.vtensor<[2,?,64],f32>, %w1: !torch.vtensor<[64,256],f32>, %w2: !torch.vtensor<[256,64],f32>) -> !torch.vtensor<[2,?,64],f32> {
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %y = torch.aten.matmul %x, %w1 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64,256],f32> -> !torch.vtensor<[2,?,256],f32>
  %c = torch.aten.cumsum %y, %int1, %none {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,256],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,?,256],f32>
  %z = torch.aten.matmul %c, %w2 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,256],f32>, !torch.vtensor<[256,64],f32> -> !torch.vtensor<[2,?,64],f32>
  return %z : !torch.vtensor<[2,?,64],f32>
}

// -----

// A softmax over the sequence dim (1) is not row-wise: the softmax is not tiled, and
// the silu after it, alone in its run without a matmul, neither.
// CHECK-LABEL: func.func @softmax_over_sequence
// CHECK:       torch.aten.matmul %arg0, %arg1 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.aten.softmax.int %{{[^{]*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64} :
// CHECK-NEXT:  torch.aten.silu %{{[^{]*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64} :
func.func @softmax_over_sequence(%x: !torch.vtensor<[2,?,64],f32>, %w: !torch.vtensor<[64,64],f32>) -> !torch.vtensor<[2,?,64],f32> {
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %y = torch.aten.matmul %x, %w {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64,64],f32> -> !torch.vtensor<[2,?,64],f32>
  %p = torch.aten.softmax.int %y, %int1, %none {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,?,64],f32>
  %a = torch.aten.silu %p {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32> -> !torch.vtensor<[2,?,64],f32>
  return %a : !torch.vtensor<[2,?,64],f32>
}

// -----

// Row-wise ops without any matmul (a norm-like chain): nothing worth chunking, not tiled.
// CHECK-LABEL: func.func @no_matmul
// CHECK-NOT:   autosp.tile
// CHECK:       return
func.func @no_matmul(%x: !torch.vtensor<[2,?,64],f32>, %w: !torch.vtensor<[64],f32>) -> !torch.vtensor<[2,?,64],f32> {
  %int1 = torch.constant.int 1
  %a = torch.aten.silu %x {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32> -> !torch.vtensor<[2,?,64],f32>
  %m = torch.aten.mul.Tensor %a, %w {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64],f32> -> !torch.vtensor<[2,?,64],f32>
  %r = torch.aten.add.Tensor %x, %m, %int1 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[2,?,64],f32>, !torch.int -> !torch.vtensor<[2,?,64],f32>
  return %r : !torch.vtensor<[2,?,64],f32>
}

// -----

// Every op is row-wise, but the run reads rows in two layouts, [N, 64] (%x) and
// [2, S, 64] (%y): no one set of sequence chunks cuts both. Its longest leading part in one
// layout (the mm on [N, 64] rows) is tiled alone; the view and the add are not.
// CHECK-LABEL: func.func @two_token_layouts
// CHECK:       torch.aten.mm {{.*}}autosp.tile = 0
// CHECK:       torch.aten.add.Tensor %{{.*}}, %{{.*}}, %{{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64} :
// CHECK:       return
func.func @two_token_layouts(%x: !torch.vtensor<[?,64],f32>, %y: !torch.vtensor<[2,?,64],f32>, %w: !torch.vtensor<[64,64],f32>, %s: !torch.int) -> !torch.vtensor<[2,?,64],f32> {
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int64 = torch.constant.int 64
  %p = torch.aten.mm %x, %w {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,64],f32> -> !torch.vtensor<[?,64],f32>
  %l = torch.prim.ListConstruct %int2, %s, %int64 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %p3 = torch.aten.view %p, %l {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,64],f32>
  %r = torch.aten.add.Tensor %y, %p3, %int1 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[2,?,64],f32>, !torch.int -> !torch.vtensor<[2,?,64],f32>
  return %r : !torch.vtensor<[2,?,64],f32>
}

// -----

// Attention's projections: q and k of one normalised input, each viewed to heads and
// transposed (not row-wise: the sequence moves behind the heads). A transpose that no
// later op of the run reads is deferred past the run instead of ending it, so the norm
// and both projections form one run (tile 0): the normalised input is neither an output
// of the run nor kept whole for its backward. The transposes stay outside the run.
// CHECK-LABEL: func.func @projections_then_transposes
// CHECK:       torch.aten.mul.Tensor %arg0, %arg1 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK:       torch.aten.matmul %{{.*}}, %arg2 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK:       torch.aten.view %{{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.aten.transpose.int %{{[^{]*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64} :
// CHECK-NEXT:  torch.aten.matmul %{{.*}}, %arg3 {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK:       torch.aten.view %{{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 3 : i64}
// CHECK-NEXT:  torch.aten.transpose.int %{{[^{]*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64} :
// CHECK-NOT:   autosp.tile = 1
func.func @projections_then_transposes(%x: !torch.vtensor<[2,?,64],f32>, %g: !torch.vtensor<[64],f32>, %wq: !torch.vtensor<[64,64],f32>, %wk: !torch.vtensor<[64,32],f32>, %s: !torch.int) -> (!torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,2,?,16],f32>) {
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int16 = torch.constant.int 16
  %n = torch.aten.mul.Tensor %x, %g {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64],f32> -> !torch.vtensor<[2,?,64],f32>
  %q = torch.aten.matmul %n, %wq {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64,64],f32> -> !torch.vtensor<[2,?,64],f32>
  %lq = torch.prim.ListConstruct %int2, %s, %int4, %int16 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %q4 = torch.aten.view %q, %lq {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,16],f32>
  %qt = torch.aten.transpose.int %q4, %int1, %int2 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,4,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,4,?,16],f32>
  %k = torch.aten.matmul %n, %wk {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[64,32],f32> -> !torch.vtensor<[2,?,32],f32>
  %lk = torch.prim.ListConstruct %int2, %s, %int2, %int16 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %k4 = torch.aten.view %k, %lk {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,2,16],f32>
  %kt = torch.aten.transpose.int %k4, %int1, %int2 {autosp.region = 0 : i64, autosp.segment = 1 : i64} : !torch.vtensor<[2,?,2,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,2,?,16],f32>
  return %qt, %kt : !torch.vtensor<[2,4,?,16],f32>, !torch.vtensor<[2,2,?,16],f32>
}
