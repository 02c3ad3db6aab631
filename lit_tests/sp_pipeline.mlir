// The whole transformation on the imported 2-layer Llama-style reference model (RoPE in
// the graph, GQA, tied embeddings, loss with labels shifted inside). The model is
// imported once (the import costs seconds) and every check reads the saved files.
// RUN: %python -m autosp.frontend llama --layers 2 > %t.llama.mlir
// RUN: autosp-opt %t.llama.mlir --autosp-sp-pipeline=sp-size=4 > %t.sp4.mlir
// RUN: FileCheck %s --input-file %t.sp4.mlir
// Per attention layer exactly the Ulysses minimum crosses ranks: 3 all-to-alls in, 1 out.
// RUN: grep -c '"autosp.all_to_all"' %t.sp4.mlir | FileCheck %s --check-prefix=COUNT
// COUNT: 8
// Nothing else communicates except the one all_reduce of the loss's sum.
// RUN: grep -c -E '"autosp.(all_gather|reduce_scatter|all_reduce)"' %t.sp4.mlir | FileCheck %s --check-prefix=OTHER
// OTHER: 1
// A ring over the 4 ranks: no all-to-all; each layer's attention is one ring op on the
// ":ring" sub-group, reading the 2 shared KV heads (the GQA repeat fused away), and the
// module records the zigzag layout shard, rewindow and the loss follow.
// RUN: autosp-opt %t.llama.mlir --autosp-sp-pipeline='sp-size=4 strategy=ring' > %t.ring4.mlir
// RUN: FileCheck %s --input-file %t.ring4.mlir --check-prefix=RING
// RUN: not grep -q '"autosp.all_to_all"' %t.ring4.mlir
// RING: autosp.sp_layout = "ulysses=1 ring=4 zigzag"
// RING-LABEL: func.func @main(
// RING: "autosp.shard"
// RING-COUNT-2: "autosp.ring_attention"({{.*}}) {group = "sp:ring", is_causal = 1 : i64, {{.*}}} : (!torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.int) -> !torch.vtensor<[2,4,?,8],f32>
// RING: "autosp.all_reduce"
// Hybrid 2 x 2: per layer 3 + 1 all-to-alls on ":ulysses" around a ring on ":ring".
// RUN: autosp-opt %t.llama.mlir --autosp-sp-pipeline='sp-size=4 strategy=hybrid ulysses-degree=2' > %t.hyb4.mlir
// RUN: grep -c '"autosp.all_to_all".*group = "sp:ulysses"' %t.hyb4.mlir | FileCheck %s --check-prefix=COUNT
// RUN: grep -c '"autosp.ring_attention".*group = "sp:ring"' %t.hyb4.mlir | FileCheck %s --check-prefix=TWO
// TWO: 2
// With sp-size=1 the pipeline only removes dead code.
// RUN: autosp-opt %t.llama.mlir --autosp-sp-pipeline=sp-size=1 | FileCheck %s --check-prefix=P1
// P1-NOT: "autosp.

// CHECK-LABEL: func.func @main(
// CHECK-SAME: %[[IDS:[^:]*]]: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}
// CHECK-SAME: %[[LABELS:[^:]*]]: !torch.vtensor<[2,?],si64> {autosp.input = "kwargs['labels']", autosp.seq_dim = 1 : i64}
// CHECK: %[[S:.*]] = torch.aten.size.int %[[IDS]]
// Sizes divided by P: the local length of the whole sequence and of the shifted window.
// CHECK-DAG: "autosp.local_len"(%[[S]]) {group = "sp", lo = 0 : i64, trim = 0 : i64}
// CHECK-DAG: "autosp.local_len"(%[[S]]) {group = "sp", lo = 0 : i64, trim = 1 : i64}
// CHECK-NOT: torch.bind_symbolic_shape
// Tokens are sliced to this rank's part before the embedding.
// CHECK: %[[IDS_R:.*]] = "autosp.shard"(%[[IDS]], %[[S]]) {dim = 1 : i64
// CHECK: torch.aten.embedding %{{.*}}, %[[IDS_R]]
// RoPE tables are computed for the rank's positions only: the positions are sliced
// before the tables are built (autosp-hoist-shard).
// CHECK: "autosp.shard"(%{{.*}}, %[[S]]) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[2,?],si64>
// CHECK: torch.aten.cos {{.*}} : !torch.vtensor<[2,?,8],f32>
// CHECK: "autosp.all_to_all"({{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK: torch.aten.scaled_dot_product_attention {{.*}} -> !torch.vtensor<[2,1,?,8],f32>
// CHECK: "autosp.all_to_all"({{.*}}) {concat_dim = 1 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 2 : i64}
// The loss: logits[:, :-1] narrows the window, the shifted labels are sliced into it, the
// local sum is reduced; the count of valid labels is computed replicated.
// CHECK: "autosp.rewindow"(%{{.*}}, %[[S]]) {dim = 1 : i64, group = "sp", lo = 0 : i64, new_lo = 0 : i64, new_trim = 1 : i64, trim = 0 : i64}
// CHECK: "autosp.shard"(%{{.*}}, %[[S]]) {dim = 0 : i64, group = "sp", lo = 0 : i64, trim = 1 : i64}
// CHECK: %[[SUM:.*]] = "autosp.all_reduce"(%{{.*}}) {group = "sp", reduce_op = "sum"}
// CHECK: %[[LOSS:.*]] = torch.aten.div.Tensor %[[SUM]], %{{.*}}
// CHECK: return %{{.*}}, %[[LOSS]]

// The file's own IR: the imported SDPA attention block (python -m autosp.frontend attention).
// RUN: autosp-opt %s --autosp-sp-pipeline=sp-size=2 | FileCheck %s --check-prefix=BLOCK
// The pipeline runs as its sub-passes: --mlir-print-ir-after-all names each of them
// (with its options), and with sp-size=1 the only ones are autosp-fuse-gqa and autosp-dce.
// RUN: autosp-opt %s --autosp-sp-pipeline='sp-size=4 group=sp2' --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=AFTER
// RUN: autosp-opt %s --pass-pipeline='builtin.module(autosp-sp-pipeline{sp-size=1})' --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=AFTER1
// AFTER:      // -----// IR Dump After autosp-causal-mask //----- //
// AFTER:      // -----// IR Dump After autosp-fuse-gqa //----- //
// AFTER:      // -----// IR Dump After autosp-dce //----- //
// AFTER:      // -----// IR Dump After autosp-annotate-sequence //----- //
// AFTER:      // -----// IR Dump After autosp-partition-attention{sp-size=4 group=sp2} //----- //
// AFTER:      // -----// IR Dump After autosp-shard-sequence{group=sp2} //----- //
// AFTER:      // -----// IR Dump After autosp-hoist-shard //----- //
// AFTER:      // -----// IR Dump After autosp-dce //----- //
// AFTER-NOT:  IR Dump
// AFTER:      "autosp.all_to_all"{{.*}}group = "sp2"
// AFTER-NOT:  autosp-sp-pipeline
// AFTER1:     // -----// IR Dump After autosp-fuse-gqa //----- //
// AFTER1:     // -----// IR Dump After autosp-dce //----- //
// AFTER1-NOT: IR Dump
// BLOCK-LABEL: func.func @main(
// BLOCK-SAME: %[[X:[^:]*]]: !torch.vtensor<[2,?,32],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}
// BLOCK: %[[S:.*]] = torch.aten.size.int %[[X]]
// The layer norm's statistics need no parameter and run replicated; the input is sliced
// where it meets the norm's weight, once (the residual connection uses the same slice).
// BLOCK: %[[RES:.*]] = "autosp.shard"(%[[X]], %[[S]]) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
// BLOCK-NOT: "autosp.shard"(%[[X]]
// BLOCK-COUNT-3: "autosp.all_to_all"({{.*}}, %[[S]]) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64}
// BLOCK: torch.aten.scaled_dot_product_attention {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// BLOCK: "autosp.all_to_all"
// BLOCK: %[[OUT:.*]] = torch.aten.add.Tensor %[[RES]]
// BLOCK: return %[[OUT]]
// BLOCK-NOT: autosp.all_reduce
module {
  func.func @main(%arg0: !torch.vtensor<[32],f32> {autosp.parameter = "norm.weight"}, %arg1: !torch.vtensor<[32],f32> {autosp.parameter = "norm.bias"}, %arg2: !torch.vtensor<[32,32],f32> {autosp.parameter = "q.weight"}, %arg3: !torch.vtensor<[32],f32> {autosp.parameter = "q.bias"}, %arg4: !torch.vtensor<[64,32],f32> {autosp.parameter = "kv.weight"}, %arg5: !torch.vtensor<[64],f32> {autosp.parameter = "kv.bias"}, %arg6: !torch.vtensor<[32,32],f32> {autosp.parameter = "out.weight"}, %arg7: !torch.vtensor<[32],f32> {autosp.parameter = "out.bias"}, %arg8: !torch.vtensor<[2,?,32],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}) -> !torch.vtensor<[2,?,32],f32> attributes {torch.assume_strict_symbolic_shapes} {
    %int6 = torch.constant.int 6
    %float1.000000e00 = torch.constant.float 1.000000e+00
    %int7 = torch.constant.int 7
    %false = torch.constant.bool false
    %float0.000000e00 = torch.constant.float 0.000000e+00
    %none = torch.constant.none
    %int64 = torch.constant.int 64
    %int3 = torch.constant.int 3
    %int8 = torch.constant.int 8
    %int4 = torch.constant.int 4
    %int32 = torch.constant.int 32
    %float1.000000e-05 = torch.constant.float 1.000000e-05
    %true = torch.constant.bool true
    %int0 = torch.constant.int 0
    %int2 = torch.constant.int 2
    %int1 = torch.constant.int 1
    %0 = torch.symbolic_int "s41" {min_val = 2, max_val = 9223372036854775807} : !torch.int
    torch.bind_symbolic_shape %arg8, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    %1 = torch.aten.size.int %arg8, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.int
    %2 = torch.prim.ListConstruct %int2 : (!torch.int) -> !torch.list<int>
    %3 = torch.aten.to.dtype %arg8, %int7, %false, %false, %none : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[2,?,32],f64>
    %4 = torch.aten.sum.dim_IntList %3, %2, %true, %none : !torch.vtensor<[2,?,32],f64>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[2,?,1],f64>
    %5 = torch.aten.div.Scalar %4, %int32 : !torch.vtensor<[2,?,1],f64>, !torch.int -> !torch.vtensor<[2,?,1],f64>
    %6 = torch.aten.sub.Tensor %3, %5, %float1.000000e00 : !torch.vtensor<[2,?,32],f64>, !torch.vtensor<[2,?,1],f64>, !torch.float -> !torch.vtensor<[2,?,32],f64>
    %7 = torch.aten.mul.Tensor %6, %6 : !torch.vtensor<[2,?,32],f64>, !torch.vtensor<[2,?,32],f64> -> !torch.vtensor<[2,?,32],f64>
    %8 = torch.aten.sum.dim_IntList %7, %2, %true, %none : !torch.vtensor<[2,?,32],f64>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[2,?,1],f64>
    %9 = torch.aten.div.Scalar %8, %int32 : !torch.vtensor<[2,?,1],f64>, !torch.int -> !torch.vtensor<[2,?,1],f64>
    %10 = torch.aten.to.dtype %9, %int6, %false, %false, %none : !torch.vtensor<[2,?,1],f64>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[2,?,1],f32>
    %11 = torch.aten.sum.dim_IntList %arg8, %2, %true, %none : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[2,?,1],f32>
    %12 = torch.aten.div.Scalar %11, %int32 : !torch.vtensor<[2,?,1],f32>, !torch.int -> !torch.vtensor<[2,?,1],f32>
    torch.bind_symbolic_shape %10, [%0], affine_map<()[s0] -> (2, s0, 1)> : !torch.vtensor<[2,?,1],f32>
    torch.bind_symbolic_shape %12, [%0], affine_map<()[s0] -> (2, s0, 1)> : !torch.vtensor<[2,?,1],f32>
    %13 = torch.aten.add.Scalar %10, %float1.000000e-05, %int1 : !torch.vtensor<[2,?,1],f32>, !torch.float, !torch.int -> !torch.vtensor<[2,?,1],f32>
    torch.bind_symbolic_shape %13, [%0], affine_map<()[s0] -> (2, s0, 1)> : !torch.vtensor<[2,?,1],f32>
    %14 = torch.aten.rsqrt %13 : !torch.vtensor<[2,?,1],f32> -> !torch.vtensor<[2,?,1],f32>
    torch.bind_symbolic_shape %14, [%0], affine_map<()[s0] -> (2, s0, 1)> : !torch.vtensor<[2,?,1],f32>
    %15 = torch.aten.sub.Tensor %arg8, %12, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,1],f32>, !torch.int -> !torch.vtensor<[2,?,32],f32>
    torch.bind_symbolic_shape %15, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    %16 = torch.aten.mul.Tensor %15, %14 : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,1],f32> -> !torch.vtensor<[2,?,32],f32>
    torch.bind_symbolic_shape %16, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    %17 = torch.aten.mul.Tensor %16, %arg0 : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[32],f32> -> !torch.vtensor<[2,?,32],f32>
    torch.bind_symbolic_shape %17, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    %18 = torch.aten.add.Tensor %17, %arg1, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[32],f32>, !torch.int -> !torch.vtensor<[2,?,32],f32>
    torch.bind_symbolic_shape %18, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    %19 = torch.aten.mul.int %int2, %1 : !torch.int, !torch.int -> !torch.int
    %20 = torch.prim.ListConstruct %19, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
    %21 = torch.aten.view %18, %20 : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %21, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %22 = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
    %23 = torch.aten.permute %arg2, %22 : !torch.vtensor<[32,32],f32>, !torch.list<int> -> !torch.vtensor<[32,32],f32>
    %24 = torch.aten.mm %21, %23 : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,32],f32> -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %24, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %25 = torch.aten.mul.Scalar %24, %int1 : !torch.vtensor<[?,32],f32>, !torch.int -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %25, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %26 = torch.aten.mul.Scalar %arg3, %int1 : !torch.vtensor<[32],f32>, !torch.int -> !torch.vtensor<[32],f32>
    %27 = torch.aten.add.Tensor %25, %26, %int1 : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32],f32>, !torch.int -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %27, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %28 = torch.prim.ListConstruct %int2, %1, %int32 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %29 = torch.aten.view %27, %28 : !torch.vtensor<[?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,32],f32>
    torch.bind_symbolic_shape %29, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    %30 = torch.prim.ListConstruct %int2, %1, %int4, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %31 = torch.aten.view %29, %30 : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,8],f32>
    torch.bind_symbolic_shape %31, [%0], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
    %32 = torch.prim.ListConstruct %int0, %int2, %int1, %int3 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %33 = torch.aten.permute %31, %32 : !torch.vtensor<[2,?,4,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,?,8],f32>
    torch.bind_symbolic_shape %33, [%0], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
    %34 = torch.prim.ListConstruct %19, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
    %35 = torch.aten.view %18, %34 : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %35, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %36 = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
    %37 = torch.aten.permute %arg4, %36 : !torch.vtensor<[64,32],f32>, !torch.list<int> -> !torch.vtensor<[32,64],f32>
    %38 = torch.aten.mm %35, %37 : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,64],f32> -> !torch.vtensor<[?,64],f32>
    torch.bind_symbolic_shape %38, [%0], affine_map<()[s0] -> (s0 * 2, 64)> : !torch.vtensor<[?,64],f32>
    %39 = torch.aten.mul.Scalar %38, %int1 : !torch.vtensor<[?,64],f32>, !torch.int -> !torch.vtensor<[?,64],f32>
    torch.bind_symbolic_shape %39, [%0], affine_map<()[s0] -> (s0 * 2, 64)> : !torch.vtensor<[?,64],f32>
    %40 = torch.aten.mul.Scalar %arg5, %int1 : !torch.vtensor<[64],f32>, !torch.int -> !torch.vtensor<[64],f32>
    %41 = torch.aten.add.Tensor %39, %40, %int1 : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64],f32>, !torch.int -> !torch.vtensor<[?,64],f32>
    torch.bind_symbolic_shape %41, [%0], affine_map<()[s0] -> (s0 * 2, 64)> : !torch.vtensor<[?,64],f32>
    %42 = torch.prim.ListConstruct %int2, %1, %int64 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %43 = torch.aten.view %41, %42 : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,64],f32>
    torch.bind_symbolic_shape %43, [%0], affine_map<()[s0] -> (2, s0, 64)> : !torch.vtensor<[2,?,64],f32>
    %44 = torch.prim.ListConstruct %int2, %1, %int2, %int4, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %45 = torch.aten.view %43, %44 : !torch.vtensor<[2,?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,2,4,8],f32>
    torch.bind_symbolic_shape %45, [%0], affine_map<()[s0] -> (2, s0, 2, 4, 8)> : !torch.vtensor<[2,?,2,4,8],f32>
    %46 = torch.prim.ListConstruct %int2, %int0, %int3, %int1, %int4 : (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %47 = torch.aten.permute %45, %46 : !torch.vtensor<[2,?,2,4,8],f32>, !torch.list<int> -> !torch.vtensor<[2,2,4,?,8],f32>
    torch.bind_symbolic_shape %47, [%0], affine_map<()[s0] -> (2, 2, 4, s0, 8)> : !torch.vtensor<[2,2,4,?,8],f32>
    %48 = torch.aten.slice.Tensor %47, %int0, %int0, %int1, %int1 : !torch.vtensor<[2,2,4,?,8],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[1,2,4,?,8],f32>
    torch.bind_symbolic_shape %48, [%0], affine_map<()[s0] -> (1, 2, 4, s0, 8)> : !torch.vtensor<[1,2,4,?,8],f32>
    %49 = torch.aten.slice.Tensor %47, %int0, %int1, %int2, %int1 : !torch.vtensor<[2,2,4,?,8],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[1,2,4,?,8],f32>
    torch.bind_symbolic_shape %49, [%0], affine_map<()[s0] -> (1, 2, 4, s0, 8)> : !torch.vtensor<[1,2,4,?,8],f32>
    %50 = torch.aten.squeeze.dim %48, %int0 : !torch.vtensor<[1,2,4,?,8],f32>, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
    torch.bind_symbolic_shape %50, [%0], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
    %51 = torch.aten.squeeze.dim %49, %int0 : !torch.vtensor<[1,2,4,?,8],f32>, !torch.int -> !torch.vtensor<[2,4,?,8],f32>
    torch.bind_symbolic_shape %51, [%0], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
    %52 = torch.aten.scaled_dot_product_attention %33, %50, %51, %none, %float0.000000e00, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
    torch.bind_symbolic_shape %52, [%0], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
    %53 = torch.prim.ListConstruct %int0, %int2, %int1, %int3 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %54 = torch.aten.permute %52, %53 : !torch.vtensor<[2,4,?,8],f32>, !torch.list<int> -> !torch.vtensor<[2,?,4,8],f32>
    torch.bind_symbolic_shape %54, [%0], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
    %55 = torch.prim.ListConstruct %int2, %1, %int32 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %56 = torch.aten.view %54, %55 : !torch.vtensor<[2,?,4,8],f32>, !torch.list<int> -> !torch.vtensor<[2,?,32],f32>
    torch.bind_symbolic_shape %56, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    %57 = torch.prim.ListConstruct %19, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
    %58 = torch.aten.view %56, %57 : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %58, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %59 = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
    %60 = torch.aten.permute %arg6, %59 : !torch.vtensor<[32,32],f32>, !torch.list<int> -> !torch.vtensor<[32,32],f32>
    %61 = torch.aten.mm %58, %60 : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,32],f32> -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %61, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %62 = torch.aten.mul.Scalar %61, %int1 : !torch.vtensor<[?,32],f32>, !torch.int -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %62, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %63 = torch.aten.mul.Scalar %arg7, %int1 : !torch.vtensor<[32],f32>, !torch.int -> !torch.vtensor<[32],f32>
    %64 = torch.aten.add.Tensor %62, %63, %int1 : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32],f32>, !torch.int -> !torch.vtensor<[?,32],f32>
    torch.bind_symbolic_shape %64, [%0], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
    %65 = torch.prim.ListConstruct %int2, %1, %int32 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %66 = torch.aten.view %64, %65 : !torch.vtensor<[?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,32],f32>
    torch.bind_symbolic_shape %66, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    %67 = torch.aten.add.Tensor %arg8, %66, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,32],f32>, !torch.int -> !torch.vtensor<[2,?,32],f32>
    torch.bind_symbolic_shape %67, [%0], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
    return %67 : !torch.vtensor<[2,?,32],f32>
  }
}
