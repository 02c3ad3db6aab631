// RUN: autosp-opt %s --split-input-file --autosp-checkpoint=mode=sac | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-checkpoint=mode=full | FileCheck %s --check-prefix=FULL
// RUN: autosp-opt %s --split-input-file --autosp-checkpoint=mode=sac-min | FileCheck %s --check-prefix=MIN

// Two attention layers. The region cut falls after the first residual add, where only
// the residual stream %h crosses. sac: attention and collectives are kept
// (autosp.save); the rest of each layer forms segments, split at every kept op.
// full: one segment per region, attention included.
// CHECK-LABEL: func.func @two_layers
// CHECK:      %[[Q:.*]] = torch.aten.neg %arg0 {autosp.region = 0 : i64, autosp.segment = 0 : i64}
// CHECK:      %[[A:.*]] = "autosp.all_to_all"(%[[Q]]) {autosp.region = 0 : i64, autosp.save
// CHECK:      torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 0 : i64, autosp.save}
// CHECK:      %[[H:.*]] = torch.aten.add.Tensor {{.*}} {autosp.region = 0 : i64, autosp.segment = 1 : i64}
// CHECK:      torch.aten.neg %[[H]] {autosp.region = 1 : i64, autosp.segment = 2 : i64}
// CHECK:      torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 1 : i64, autosp.save}
// CHECK:      torch.aten.add.Tensor {{.*}} {autosp.region = 1 : i64, autosp.segment = 3 : i64}
// FULL-LABEL: func.func @two_layers
// FULL-NOT:   autosp.save
// FULL:       "autosp.all_to_all"{{.*}} {autosp.region = 0 : i64, autosp.segment = 0 : i64
// FULL:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 0 : i64, autosp.segment = 0 : i64}
// FULL:       torch.aten.add.Tensor {{.*}} {autosp.region = 0 : i64, autosp.segment = 0 : i64}
// FULL:       torch.aten.neg {{.*}} {autosp.region = 1 : i64, autosp.segment = 1 : i64}
// FULL:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 1 : i64, autosp.segment = 1 : i64}
// sac-min: one segment per region like full, SDPA marked for replay (its output is kept).
// MIN-LABEL: func.func @two_layers
// MIN-NOT:   autosp.save
// MIN:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 0 : i64, autosp.replay, autosp.segment = 0 : i64}
// MIN:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 1 : i64, autosp.replay, autosp.segment = 1 : i64}
func.func @two_layers(%arg0: !torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %q = torch.aten.neg %arg0 : !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  %a = "autosp.all_to_all"(%q) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,2,?,8],f32>
  %o = torch.aten.scaled_dot_product_attention %a, %a, %a, %none, %float0, %true, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  %b = "autosp.all_to_all"(%o) {concat_dim = 1 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 2 : i64} : (!torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>
  %h = torch.aten.add.Tensor %b, %arg0, %int1 : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
  %q2 = torch.aten.neg %h : !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  %o2 = torch.aten.scaled_dot_product_attention %q2, %q2, %q2, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  %r = torch.aten.add.Tensor %o2, %h, %int1 : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
  return %r : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Ring attention (autosp.ring_attention, which runs its own sends) starts a layer like
// SDPA and is kept in sac; sac-min keeps it too (a replay cannot stand in for a ring);
// full recomputes it with its region.
// CHECK-LABEL: func.func @ring
// CHECK:      torch.aten.neg %arg0 {autosp.region = 0 : i64, autosp.segment = 0
// CHECK:      "autosp.ring_attention"{{.*}} {autosp.region = 0 : i64, autosp.save
// CHECK:      "autosp.ring_attention"{{.*}} {autosp.region = 1 : i64, autosp.save
// MIN-LABEL: func.func @ring
// MIN:        "autosp.ring_attention"{{.*}} {autosp.region = 0 : i64, autosp.save
// MIN:        "autosp.ring_attention"{{.*}} {autosp.region = 1 : i64, autosp.save
// FULL-LABEL: func.func @ring
// FULL:       "autosp.ring_attention"{{.*}} {autosp.region = 0 : i64, autosp.segment = 0
// FULL:       "autosp.ring_attention"{{.*}} {autosp.region = 1 : i64, autosp.segment = 1
func.func @ring(%x: !torch.vtensor<[2,4,?,8],f32>, %s: !torch.int) -> !torch.vtensor<[2,4,?,8],f32> {
  %q = torch.aten.neg %x : !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  %a = "autosp.ring_attention"(%q, %q, %q, %s) {group = "sp:ring", is_causal = 1 : i64, key_padding = 0 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 0>, scale = 0.0 : f64, window = 0 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,4,?,8],f32>
  %h = torch.aten.neg %a : !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  %b = "autosp.ring_attention"(%h, %h, %h, %s) {group = "sp:ring", is_causal = 1 : i64, key_padding = 0 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 0>, scale = 0.0 : f64, window = 0 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,4,?,8],f32>
  %r = torch.aten.neg %b : !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  return %r : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Hand-written attention: every op on an [.., S, S] tensor (scores, softmax, the
// product with v) is attention and kept in sac mode.
// MIN-LABEL: func.func @manual
// CHECK-LABEL: func.func @manual
// CHECK:      torch.aten.transpose.int {{.*}} autosp.segment = 0
// CHECK:      torch.aten.matmul {{.*}} autosp.save
// CHECK:      torch.aten._softmax {{.*}} autosp.save
// CHECK:      torch.aten.matmul {{.*}} autosp.save
// CHECK:      torch.aten.neg {{.*}} autosp.segment = 1
func.func @manual(%x: !torch.vtensor<[2,?,8],f32>) -> !torch.vtensor<[2,?,8],f32> {
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %false = torch.constant.bool false
  %int-1 = torch.constant.int -1
  %t = torch.aten.transpose.int %x, %int1, %int2 : !torch.vtensor<[2,?,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,8,?],f32>
  %s = torch.aten.matmul %x, %t : !torch.vtensor<[2,?,8],f32>, !torch.vtensor<[2,8,?],f32> -> !torch.vtensor<[2,?,?],f32>
  %p = torch.aten._softmax %s, %int-1, %false : !torch.vtensor<[2,?,?],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,?,?],f32>
  %o = torch.aten.matmul %p, %x : !torch.vtensor<[2,?,?],f32>, !torch.vtensor<[2,?,8],f32> -> !torch.vtensor<[2,?,8],f32>
  %r = torch.aten.neg %o : !torch.vtensor<[2,?,8],f32> -> !torch.vtensor<[2,?,8],f32>
  return %r : !torch.vtensor<[2,?,8],f32>
}

// -----

// Option layers: one choice per region instead of mode for all (mode is then unused).
// These RUN lines feed only this last chunk to autosp-opt: the chunks above have other
// numbers of regions, and a layers list of the wrong length is an error. Keep this
// chunk last (new chunks go above it).
// RUN: %python -c "import sys; print(open(sys.argv[1]).read().rpartition('// ' + '-' * 5)[2])" %s \
// RUN:   | autosp-opt --autosp-checkpoint='mode=full layers=keep,sac' | FileCheck %s --check-prefix=KEEP
// RUN: %python -c "import sys; print(open(sys.argv[1]).read().rpartition('// ' + '-' * 5)[2])" %s \
// RUN:   | autosp-opt --autosp-checkpoint='layers=sac+offload,full' | FileCheck %s --check-prefix=MIXED
// RUN: %python -c "import sys; print(open(sys.argv[1]).read().rpartition('// ' + '-' * 5)[2])" %s \
// RUN:   | autosp-opt --autosp-checkpoint='layers=full+offload,sac-min' | FileCheck %s --check-prefix=OFFLOAD
// The plain per-mode runs above also plan this function like @two_layers.
// CHECK-LABEL: func.func @per_layer
// CHECK:       torch.aten.neg %arg0 {autosp.region = 0 : i64, autosp.segment = 0 : i64}

// keep,sac: region 0 is kept whole, its ops carry autosp.region only (no segment, no
// save, not even on attention and the all-to-alls); region 1 is planned as in sac mode,
// its segments numbered from 0. mode=full is overridden.
// KEEP-LABEL: func.func @per_layer
// KEEP:       torch.aten.neg %arg0 {autosp.region = 0 : i64} :
// KEEP:       "autosp.all_to_all"(%{{.*}}) {autosp.region = 0 : i64, concat_dim
// KEEP:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 0 : i64} :
// KEEP:       "autosp.all_to_all"(%{{.*}}) {autosp.region = 0 : i64, concat_dim
// KEEP:       torch.aten.add.Tensor {{.*}} {autosp.region = 0 : i64} :
// KEEP:       torch.aten.neg {{.*}} {autosp.region = 1 : i64, autosp.segment = 0 : i64} :
// KEEP:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 1 : i64, autosp.save} :
// KEEP:       torch.aten.add.Tensor {{.*}} {autosp.region = 1 : i64, autosp.segment = 1 : i64} :

// sac+offload,full: region 0 in sac mode with its segment ops marked autosp.offload (the
// kept anchors are not: they are no segment's); region 1 one full segment, not offloaded.
// MIXED-LABEL: func.func @per_layer
// MIXED:       torch.aten.neg %arg0 {autosp.offload, autosp.region = 0 : i64, autosp.segment = 0 : i64} :
// MIXED:       "autosp.all_to_all"(%{{.*}}) {autosp.region = 0 : i64, autosp.save, concat_dim
// MIXED:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 0 : i64, autosp.save} :
// MIXED:       "autosp.all_to_all"(%{{.*}}) {autosp.region = 0 : i64, autosp.save, concat_dim
// MIXED:       torch.aten.add.Tensor {{.*}} {autosp.offload, autosp.region = 0 : i64, autosp.segment = 1 : i64} :
// MIXED:       torch.aten.neg {{.*}} {autosp.region = 1 : i64, autosp.segment = 2 : i64} :
// MIXED:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 1 : i64, autosp.segment = 2 : i64} :
// MIXED:       torch.aten.add.Tensor {{.*}} {autosp.region = 1 : i64, autosp.segment = 2 : i64} :

// full+offload,sac-min: every op of region 0 (attention and the all-to-alls included) is
// in one offloaded segment; region 1 is sac-min (SDPA replayed), not offloaded.
// OFFLOAD-LABEL: func.func @per_layer
// OFFLOAD:       torch.aten.neg %arg0 {autosp.offload, autosp.region = 0 : i64, autosp.segment = 0 : i64} :
// OFFLOAD:       "autosp.all_to_all"(%{{.*}}) {autosp.offload, autosp.region = 0 : i64, autosp.segment = 0 : i64, concat_dim
// OFFLOAD:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.offload, autosp.region = 0 : i64, autosp.segment = 0 : i64} :
// OFFLOAD:       "autosp.all_to_all"(%{{.*}}) {autosp.offload, autosp.region = 0 : i64, autosp.segment = 0 : i64, concat_dim
// OFFLOAD:       torch.aten.add.Tensor {{.*}} {autosp.offload, autosp.region = 0 : i64, autosp.segment = 0 : i64} :
// OFFLOAD:       torch.aten.neg {{.*}} {autosp.region = 1 : i64, autosp.segment = 1 : i64} :
// OFFLOAD:       torch.aten.scaled_dot_product_attention {{.*}} {autosp.region = 1 : i64, autosp.replay, autosp.segment = 1 : i64} :
// OFFLOAD:       torch.aten.add.Tensor {{.*}} {autosp.region = 1 : i64, autosp.segment = 1 : i64} :
func.func @per_layer(%arg0: !torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %q = torch.aten.neg %arg0 : !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  %a = "autosp.all_to_all"(%q) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,2,?,8],f32>
  %o = torch.aten.scaled_dot_product_attention %a, %a, %a, %none, %float0, %true, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  %b = "autosp.all_to_all"(%o) {concat_dim = 1 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 2 : i64} : (!torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>
  %h = torch.aten.add.Tensor %b, %arg0, %int1 : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
  %q2 = torch.aten.neg %h : !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  %o2 = torch.aten.scaled_dot_product_attention %q2, %q2, %q2, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  %r = torch.aten.add.Tensor %o2, %h, %int1 : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
  return %r : !torch.vtensor<[2,4,?,8],f32>
}
