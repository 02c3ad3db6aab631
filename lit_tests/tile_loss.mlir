// RUN: autosp-opt %s --split-input-file --autosp-tile-loss | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-tile-loss --autosp-dce | FileCheck %s --check-prefix=DCE
// RUN: autosp-opt %s --split-input-file --autosp-tile-loss='chunk=128 drop-logits=true' --autosp-dce | FileCheck %s --check-prefix=DROP

// The plain form: gather(log_softmax(h @ W^T, dim 1), dim 1, labels) becomes one
// autosp.vocab_logprob over the hidden rows, the weight and the labels; no step between
// the head and the log-softmax, no softmax dtype. The log-softmax is erased; the mm stays
// until autosp-dce. chunk is the option's (0 by default: chosen at run time).
// CHECK-LABEL: func.func @plain
// CHECK:       torch.aten.mm %arg0, %arg1
// CHECK-NOT:   torch.aten.log_softmax.int
// CHECK:       %[[P:.*]] = "autosp.vocab_logprob"(%arg0, %arg1, %arg2) {chunk = 0 : i64, softmax_dtype = "", steps = ""} : (!torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32>, !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32>
// CHECK-NEXT:  return %[[P]]
// DCE-LABEL:   func.func @plain
// DCE-NOT:     torch.aten.mm
// DCE-NOT:     torch.aten.log_softmax.int
// DCE:         %[[P:.*]] = "autosp.vocab_logprob"(%arg0, %arg1, %arg2)
// DCE-NEXT:    return %[[P]]
// DROP-LABEL:  func.func @plain
// DROP:        "autosp.vocab_logprob"(%arg0, %arg1, %arg2) {chunk = 128 : i64, softmax_dtype = "", steps = ""}
func.func @plain(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %l, %int1, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// Hugging Face's form: bf16 logits viewed to [B, S, V] (the sequence size a !torch.int),
// back to [-1, V], cast to f32, log-softmax and gather over dim -1. The two views are
// replayed on h with the hidden size (64) last instead of the vocabulary (512), the same
// sequence size and -1; the cast becomes the step "cast(f32)" and h stays bf16.
// CHECK-LABEL: func.func @hf_views_and_cast
// CHECK:       torch.aten.to.dtype
// CHECK-NEXT:  %[[H1:int64[_0-9]*]] = torch.constant.int 64
// CHECK-NEXT:  %[[S3:.*]] = torch.prim.ListConstruct %int2, %arg3, %[[H1]] : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT:  %[[V3:.*]] = torch.aten.view %arg0, %[[S3]] : !torch.vtensor<[?,64],bf16>, !torch.list<int> -> !torch.vtensor<[2,?,64],bf16>
// CHECK-NEXT:  %[[H2:int64[_0-9]*]] = torch.constant.int 64
// CHECK-NEXT:  %[[S2:.*]] = torch.prim.ListConstruct %int-1, %[[H2]] : (!torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT:  %[[V2:.*]] = torch.aten.view %[[V3]], %[[S2]] : !torch.vtensor<[2,?,64],bf16>, !torch.list<int> -> !torch.vtensor<[?,64],bf16>
// CHECK-NEXT:  %[[P:.*]] = "autosp.vocab_logprob"(%[[V2]], %arg1, %arg2) {chunk = 0 : i64, softmax_dtype = "", steps = "cast(f32)"} : (!torch.vtensor<[?,64],bf16>, !torch.vtensor<[64,512],bf16>, !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32>
// CHECK:       return %[[P]]
// The logits chain (mm, views, cast) is dead: autosp-dce removes it.
// DCE-LABEL:   func.func @hf_views_and_cast
// DCE-NOT:     torch.aten.mm
// DCE-NOT:     torch.aten.to.dtype
// DCE-NOT:     vtensor<[?,512]
// DCE:         "autosp.vocab_logprob"
func.func @hf_views_and_cast(%h: !torch.vtensor<[?,64],bf16>, %wt: !torch.vtensor<[64,512],bf16>, %idx: !torch.vtensor<[?,1],si64>, %s: !torch.int) -> !torch.vtensor<[?,1],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int2 = torch.constant.int 2
  %int6 = torch.constant.int 6
  %int-1 = torch.constant.int -1
  %int512 = torch.constant.int 512
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],bf16>, !torch.vtensor<[64,512],bf16> -> !torch.vtensor<[?,512],bf16>
  %s3 = torch.prim.ListConstruct %int2, %s, %int512 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %l3 = torch.aten.view %l, %s3 : !torch.vtensor<[?,512],bf16>, !torch.list<int> -> !torch.vtensor<[2,?,512],bf16>
  %s2 = torch.prim.ListConstruct %int-1, %int512 : (!torch.int, !torch.int) -> !torch.list<int>
  %l2 = torch.aten.view %l3, %s2 : !torch.vtensor<[2,?,512],bf16>, !torch.list<int> -> !torch.vtensor<[?,512],bf16>
  %lf = torch.aten.to.dtype %l2, %int6, %false, %false, %none : !torch.vtensor<[?,512],bf16>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %lf, %int-1, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int-1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// Gemma-style soft-capping, tanh(x / 30) * 30, with the log-softmax computed in f32 (its
// dtype operand 6): the steps in execution order, the softmax dtype named.
// CHECK-LABEL: func.func @soft_capping
// CHECK:       %[[P:.*]] = "autosp.vocab_logprob"(%arg0, %arg1, %arg2) {chunk = 0 : i64, softmax_dtype = "f32", steps = "div(30.0) tanh mul(30.0)"}
// CHECK:       return %[[P]]
// DCE-LABEL:   func.func @soft_capping
// DCE-NOT:     torch.aten.tanh
// DCE:         "autosp.vocab_logprob"
func.func @soft_capping(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32> {
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %int6 = torch.constant.int 6
  %cap = torch.constant.float 3.000000e+01
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %d = torch.aten.div.Scalar %l, %cap : !torch.vtensor<[?,512],f32>, !torch.float -> !torch.vtensor<[?,512],f32>
  %t = torch.aten.tanh %d : !torch.vtensor<[?,512],f32> -> !torch.vtensor<[?,512],f32>
  %c = torch.aten.mul.Scalar %t, %cap : !torch.vtensor<[?,512],f32>, !torch.float -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %c, %int1, %int6 : !torch.vtensor<[?,512],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// The labels' shift after sequence parallelism: the [B, S/P, V] logits are rewindowed
// along the sequence (dim 1) before the flattening view. The view, the rewindow (same
// attributes, same length operand) and the second view are replayed on h.
// CHECK-LABEL: func.func @rewindow
// CHECK:       %[[V3:.*]] = torch.aten.view %arg0, %{{.*}} : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,64],f32>
// CHECK:       %[[R:.*]] = "autosp.rewindow"(%[[V3]], %arg3) {dim = 1 : i64, group = "sp", lo = 0 : i64, new_lo = 0 : i64, new_trim = 1 : i64, trim = 0 : i64} : (!torch.vtensor<[2,?,64],f32>, !torch.int) -> !torch.vtensor<[2,?,64],f32>
// CHECK:       %[[V2:.*]] = torch.aten.view %[[R]], %{{.*}} : !torch.vtensor<[2,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
// CHECK:       "autosp.vocab_logprob"(%[[V2]], %arg1, %arg2) {chunk = 0 : i64, softmax_dtype = "", steps = ""}
func.func @rewindow(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>, %n: !torch.int) -> !torch.vtensor<[?,1],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int-1 = torch.constant.int -1
  %int512 = torch.constant.int 512
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %s3 = torch.prim.ListConstruct %int2, %int-1, %int512 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %l3 = torch.aten.view %l, %s3 : !torch.vtensor<[?,512],f32>, !torch.list<int> -> !torch.vtensor<[2,?,512],f32>
  %r = "autosp.rewindow"(%l3, %n) {dim = 1 : i64, group = "sp", lo = 0 : i64, new_lo = 0 : i64, new_trim = 1 : i64, trim = 0 : i64} : (!torch.vtensor<[2,?,512],f32>, !torch.int) -> !torch.vtensor<[2,?,512],f32>
  %s2 = torch.prim.ListConstruct %int-1, %int512 : (!torch.int, !torch.int) -> !torch.list<int>
  %l2 = torch.aten.view %r, %s2 : !torch.vtensor<[2,?,512],f32>, !torch.list<int> -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %l2, %int1, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// Without sequence parallelism the shift is a slice along the sequence, logits[:, :-1]:
// replayed on h as the same slice of [2, S, 64]. The log-softmax here is _log_softmax.
// CHECK-LABEL: func.func @sequence_slice
// CHECK-NOT:   torch.aten._log_softmax
// CHECK:       %[[V3:.*]] = torch.aten.view %arg0, %{{.*}} : !torch.vtensor<[?,64],f32>, !torch.list<int> -> !torch.vtensor<[2,?,64],f32>
// CHECK:       %[[SL:.*]] = torch.aten.slice.Tensor %[[V3]], %int1, %int0, %int-1, %int1 : !torch.vtensor<[2,?,64],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?,64],f32>
// CHECK:       %[[V2:.*]] = torch.aten.view %[[SL]], %{{.*}} : !torch.vtensor<[2,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
// CHECK:       "autosp.vocab_logprob"(%[[V2]], %arg1, %arg2) {chunk = 0 : i64, softmax_dtype = "", steps = ""}
func.func @sequence_slice(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32> {
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int-1 = torch.constant.int -1
  %int512 = torch.constant.int 512
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %s3 = torch.prim.ListConstruct %int2, %int-1, %int512 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %l3 = torch.aten.view %l, %s3 : !torch.vtensor<[?,512],f32>, !torch.list<int> -> !torch.vtensor<[2,?,512],f32>
  %sl = torch.aten.slice.Tensor %l3, %int1, %int0, %int-1, %int1 : !torch.vtensor<[2,?,512],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?,512],f32>
  %s2 = torch.prim.ListConstruct %int-1, %int512 : (!torch.int, !torch.int) -> !torch.list<int>
  %l2 = torch.aten.view %sl, %s2 : !torch.vtensor<[2,?,512],f32>, !torch.list<int> -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten._log_softmax %l2, %int1, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.bool -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// Not fused: the log-probabilities are also summed (a second user), so the [N, V] tensor
// must exist anyway; nothing changes.
// CHECK-LABEL: func.func @logprobs_second_user
// CHECK-NOT:   autosp.vocab_logprob
// CHECK:       torch.aten.log_softmax.int
// CHECK:       torch.aten.gather
// CHECK:       torch.aten.sum
func.func @logprobs_second_user(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> (!torch.vtensor<[?,1],f32>, !torch.vtensor<[],f32>) {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %l, %int1, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  %sum = torch.aten.sum %lp, %none : !torch.vtensor<[?,512],f32>, !torch.none -> !torch.vtensor<[],f32>
  return %p, %sum : !torch.vtensor<[?,1],f32>, !torch.vtensor<[],f32>
}

// -----

// Not fused: the gather picks along dim 0 (rows), not one entry of each row.
// CHECK-LABEL: func.func @gather_dim0
// CHECK-NOT:   autosp.vocab_logprob
// CHECK:       torch.aten.gather %{{.*}}, %int0
func.func @gather_dim0(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[1,512],si64>) -> !torch.vtensor<[1,512],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %l, %int1, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int0, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[1,512],si64>, !torch.bool -> !torch.vtensor<[1,512],f32>
  return %p : !torch.vtensor<[1,512],f32>
}

// -----

// Not fused: the log-softmax is over dim 0 (the rows), though the gather is over dim 1.
// CHECK-LABEL: func.func @log_softmax_dim0
// CHECK-NOT:   autosp.vocab_logprob
// CHECK:       torch.aten.log_softmax.int %{{.*}}, %int0
func.func @log_softmax_dim0(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %l, %int0, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// Not fused: a view between changes the last dim (each 512-wide row of logits becomes two
// 256-wide rows), so a softmax over 256 entries is not one over the vocabulary.
// CHECK-LABEL: func.func @view_splits_vocabulary
// CHECK-NOT:   autosp.vocab_logprob
// CHECK:       torch.aten.gather
func.func @view_splits_vocabulary(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %int-1 = torch.constant.int -1
  %int256 = torch.constant.int 256
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %s = torch.prim.ListConstruct %int-1, %int256 : (!torch.int, !torch.int) -> !torch.list<int>
  %v = torch.aten.view %l, %s : !torch.vtensor<[?,512],f32>, !torch.list<int> -> !torch.vtensor<[?,256],f32>
  %lp = torch.aten.log_softmax.int %v, %int1, %none : !torch.vtensor<[?,256],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,256],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,256],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// Not fused: a slice along the vocabulary (logits[:, :256]) changes the last dim.
// CHECK-LABEL: func.func @slice_vocabulary
// CHECK-NOT:   autosp.vocab_logprob
// CHECK:       torch.aten.gather
func.func @slice_vocabulary(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int256 = torch.constant.int 256
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %v = torch.aten.slice.Tensor %l, %int1, %int0, %int256, %int1 : !torch.vtensor<[?,512],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[?,256],f32>
  %lp = torch.aten.log_softmax.int %v, %int1, %none : !torch.vtensor<[?,256],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,256],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,256],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// Not fused: an op between that is not row-wise by a constant (a per-vocabulary bias
// added), and a scaling by a run-time float.
// CHECK-LABEL: func.func @bias_between
// CHECK-NOT:   autosp.vocab_logprob
// CHECK:       torch.aten.gather
func.func @bias_between(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %bias: !torch.vtensor<[512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %b = torch.aten.add.Tensor %l, %bias, %int1 : !torch.vtensor<[?,512],f32>, !torch.vtensor<[512],f32>, !torch.int -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %b, %int1, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// CHECK-LABEL: func.func @scale_not_constant
// CHECK-NOT:   autosp.vocab_logprob
// CHECK:       torch.aten.gather
func.func @scale_not_constant(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %t: !torch.float, %idx: !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32> {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %d = torch.aten.div.Scalar %l, %t : !torch.vtensor<[?,512],f32>, !torch.float -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %d, %int1, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  return %p : !torch.vtensor<[?,1],f32>
}

// -----

// The model returns its [B, S, V] logits and the loss. The pick is fused either way; by
// default the logits stay (mm and view live, the function type unchanged).
// CHECK-LABEL: func.func @returned_logits
// CHECK-SAME:    -> (!torch.vtensor<[2,?,512],f32>, !torch.vtensor<[],f32>)
// CHECK-NOT:   autosp.dropped_results
// CHECK:       %[[L:.*]] = torch.aten.mm %arg0, %arg1
// CHECK:       %[[L3:.*]] = torch.aten.view %[[L]]
// CHECK:       "autosp.vocab_logprob"
// CHECK:       return %[[L3]], %{{.*}} : !torch.vtensor<[2,?,512],f32>, !torch.vtensor<[],f32>
// DCE-LABEL:   func.func @returned_logits
// DCE:         torch.aten.mm
// With drop-logits the returned logits (result 0) are removed from the return and the
// function type, and recorded in autosp.dropped_results; the chain is then dead and
// autosp-dce removes it: no [N, V] tensor is left.
// DROP-LABEL:  func.func @returned_logits
// DROP-SAME:     -> !torch.vtensor<[],f32> attributes {autosp.dropped_results = [0]}
// DROP-NOT:    torch.aten.mm
// DROP:        %[[P:.*]] = "autosp.vocab_logprob"(%{{.*}}, %arg1, %arg2) {chunk = 128 : i64
// DROP-NEXT:   %[[N:.*]] = torch.aten.neg %[[P]]
// DROP-NEXT:   %[[LOSS:.*]] = torch.aten.mean %[[N]]
// DROP-NEXT:   return %[[LOSS]] : !torch.vtensor<[],f32>
func.func @returned_logits(%h: !torch.vtensor<[?,64],f32>, %wt: !torch.vtensor<[64,512],f32>, %idx: !torch.vtensor<[?,1],si64>) -> (!torch.vtensor<[2,?,512],f32>, !torch.vtensor<[],f32>) {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int-1 = torch.constant.int -1
  %int512 = torch.constant.int 512
  %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
  %s3 = torch.prim.ListConstruct %int2, %int-1, %int512 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %l3 = torch.aten.view %l, %s3 : !torch.vtensor<[?,512],f32>, !torch.list<int> -> !torch.vtensor<[2,?,512],f32>
  %s2 = torch.prim.ListConstruct %int-1, %int512 : (!torch.int, !torch.int) -> !torch.list<int>
  %l2 = torch.aten.view %l3, %s2 : !torch.vtensor<[2,?,512],f32>, !torch.list<int> -> !torch.vtensor<[?,512],f32>
  %lp = torch.aten.log_softmax.int %l2, %int1, %none : !torch.vtensor<[?,512],f32>, !torch.int, !torch.none -> !torch.vtensor<[?,512],f32>
  %p = torch.aten.gather %lp, %int1, %idx, %false : !torch.vtensor<[?,512],f32>, !torch.int, !torch.vtensor<[?,1],si64>, !torch.bool -> !torch.vtensor<[?,1],f32>
  %n = torch.aten.neg %p : !torch.vtensor<[?,1],f32> -> !torch.vtensor<[?,1],f32>
  %loss = torch.aten.mean %n, %none : !torch.vtensor<[?,1],f32>, !torch.none -> !torch.vtensor<[],f32>
  return %l3, %loss : !torch.vtensor<[2,?,512],f32>, !torch.vtensor<[],f32>
}
