// RUN: autosp-opt %s --split-input-file --autosp-partition-attention=sp-size=2 | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention=sp-size=4 | FileCheck %s --check-prefix=P4
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention='sp-size=4 strategy=ring' | FileCheck %s --check-prefix=RING
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention='sp-size=4 strategy=hybrid ulysses-degree=2' \
// RUN:   | FileCheck %s --check-prefix=HYB
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention='sp-size=4 strategy=auto seq-len=1048576' \
// RUN:   | FileCheck %s --check-prefix=AUTO
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention='sp-size=2 recurrence=heads' \
// RUN:   | FileCheck %s --check-prefix=HEADS
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention='sp-size=4 recurrence=chain' \
// RUN:   | FileCheck %s --check-prefix=CHAIN

// q, k, v go from [B, H, S, D] to [B, H/P, S, D]; attention runs on H/P heads; the output
// comes back: exactly 4 all-to-alls, nothing else crosses ranks.
// The full sequence length S is read once from the input; the gathering side of the
// exchange needs it, because shards may differ in length by one when P does not divide S.
// CHECK-LABEL: func.func @sdpa
// CHECK-SAME: (%[[QIN:[^:]*]]: !torch.vtensor<[2,4,?,8],f32>
// CHECK: %[[DIM:.*]] = torch.constant.int 2
// CHECK: %[[S:.*]] = torch.aten.size.int %[[QIN]], %[[DIM]]
// CHECK: %[[Q:.*]] = "autosp.all_to_all"(%[[QIN]], %[[S]]) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: %[[K:.*]] = "autosp.all_to_all"(%{{.*}}, %[[S]]) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64}
// CHECK: %[[V:.*]] = "autosp.all_to_all"(%{{.*}}, %[[S]]) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64}
// CHECK: %[[O:.*]] = torch.aten.scaled_dot_product_attention %[[Q]], %[[K]], %[[V]], {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: %[[BACK:.*]] = "autosp.all_to_all"(%[[O]]) {concat_dim = 1 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 2 : i64} : (!torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>
// CHECK: torch.bind_symbolic_shape %[[BACK]]
// CHECK: return %[[BACK]]
// CHECK-NOT: autosp.all_to_all
// P4-LABEL: func.func @sdpa
// P4-COUNT-3: -> !torch.vtensor<[2,1,?,8],f32>
// P4: torch.aten.scaled_dot_product_attention {{.*}} -> !torch.vtensor<[2,1,?,8],f32>
// Ring (sp-size=4 strategy=ring): q, k, v stay sequence-sharded; attention becomes one
// autosp.ring_attention on the ring group, which moves K/V blocks itself. The module
// records the layout (zigzag: rank i holds chunks i and 7 - i) and why it was chosen.
// RING: module attributes {autosp.sp_choice = "requested: ring 1x4: {{.*}}", autosp.sp_layout = "ulysses=1 ring=4 zigzag"}
// RING-LABEL: func.func @sdpa
// RING-SAME: (%[[QIN:[^:]*]]: !torch.vtensor<[2,4,?,8],f32> {{.*}}, %[[KIN:[^:]*]]: {{.*}}, %[[VIN:[^:]*]]:
// RING: %[[S:.*]] = torch.aten.size.int %[[QIN]]
// RING-NOT: autosp.all_to_all
// RING: %[[O:.*]] = "autosp.ring_attention"(%[[QIN]], %[[KIN]], %[[VIN]], %[[S]]) {group = "sp:ring", is_causal = 1 : i64, key_padding = 0 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 0>, scale = 0.000000e+00 : f64, window = 0 : i64} : ({{.*}}) -> !torch.vtensor<[2,4,?,8],f32>
// RING-NOT: autosp.all_to_all
// RING: return %[[O]]
// Hybrid 2 x 2: Ulysses all-to-alls on the ":ulysses" sub-group around a ring on ":ring".
// HYB: autosp.sp_layout = "ulysses=2 ring=2 zigzag"
// HYB-LABEL: func.func @sdpa
// HYB-COUNT-3: "autosp.all_to_all"({{.*}}) {concat_dim = 2 : i64, group = "sp:ulysses", seq_dim = 2 : i64, split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,2,?,8],f32>
// HYB: %[[O:.*]] = "autosp.ring_attention"({{.*}}) {group = "sp:ring", {{.*}}} : ({{.*}}) -> !torch.vtensor<[2,2,?,8],f32>
// HYB: "autosp.all_to_all"(%[[O]]) {concat_dim = 1 : i64, group = "sp:ulysses", seq_dim = 2 : i64, split_dim = 2 : i64}
// At 1M tokens on one node every mesh's exposed cost is under 1% of the attention's own
// time, a tie, which goes to Ulysses; the reason lists the other meshes it priced.
// AUTO: autosp.sp_choice = "chosen: ulysses 4x1: {{.*}}; also priced: {{.*}}", autosp.sp_layout = "ulysses=4 ring=1"
// AUTO-LABEL: func.func @sdpa
// AUTO-NOT: autosp.ring_attention
func.func @sdpa(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                %k: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 2 : i64},
                %v: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[2]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %k, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %v, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %0 = torch.aten.scaled_dot_product_attention %q, %k, %v, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %0, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// GQA with one KV head (MQA): at P=2 the KV head is repeated to 2 heads first, so each
// rank's query heads find their KV head; the query side is split as usual.
// CHECK-LABEL: func.func @mqa
// CHECK: "autosp.all_to_all"(%{{.*}}) {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: %[[REP:.*]] = torch.constant.int 2{{$}}
// CHECK: %[[KR:.*]] = torch.aten.repeat_interleave.self_int %{{.*}}, %[[REP]], %{{.*}}, %{{.*}} : {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: "autosp.all_to_all"(%[[KR]], %{{.*}}) {{.*}} -> !torch.vtensor<[2,1,?,8],f32>
// CHECK: torch.aten.repeat_interleave.self_int
// CHECK: torch.aten.scaled_dot_product_attention {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// P4-LABEL: func.func @mqa
// P4: torch.constant.int 4
// P4: torch.aten.repeat_interleave.self_int {{.*}} -> !torch.vtensor<[2,4,?,8],f32>
// Ring: the one KV head travels as it is (no repeat), attention reads it for 4 heads.
// RING-LABEL: func.func @mqa
// RING-NOT: repeat_interleave
// RING: "autosp.ring_attention"({{.*}}) {{.*}} : (!torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,1,?,8],f32>, !torch.vtensor<[2,1,?,8],f32>, !torch.int) -> !torch.vtensor<[2,4,?,8],f32>
// Hybrid 2 x 2: the KV head is repeated to 2 for the Ulysses split, then each rank's one KV head rings.
// HYB-LABEL: func.func @mqa
// HYB: torch.aten.repeat_interleave.self_int {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// HYB: "autosp.ring_attention"({{.*}}) {{.*}} : (!torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,1,?,8],f32>, !torch.vtensor<[2,1,?,8],f32>, !torch.int) -> !torch.vtensor<[2,2,?,8],f32>
// AUTO-LABEL: func.func @mqa
// AUTO: "autosp.all_to_all"
func.func @mqa(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
               %k: !torch.vtensor<[2,1,?,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 2 : i64},
               %v: !torch.vtensor<[2,1,?,8],f32> {autosp.input = "args[2]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %k, [%s], affine_map<()[s0] -> (2, 1, s0, 8)> : !torch.vtensor<[2,1,?,8],f32>
  torch.bind_symbolic_shape %v, [%s], affine_map<()[s0] -> (2, 1, s0, 8)> : !torch.vtensor<[2,1,?,8],f32>
  %0 = torch.aten.scaled_dot_product_attention %q, %k, %v, %none, %float0, %true, %none, %true : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,1,?,8],f32>, !torch.vtensor<[2,1,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}

// Manual attention (GPT-2 style: matmul, scale, causal mask sliced from a buffer,
// softmax, matmul, in the batched-matmul form [B*H, S, D]): q, k, v and the output are
// found around the two matmuls; between them, B*H and H shrink by P while the mask,
// replicated, keeps the whole sequence.
// RUN: %python -m autosp.frontend gpt2 | autosp-opt --autosp-partition-attention=sp-size=2 | FileCheck %s --check-prefix=MANUAL
// MANUAL-LABEL: func.func @main(
// MANUAL-SAME: %[[MASK:[^:]*]]: !torch.vtensor<[1,1,256,256],i1> {autosp.buffer = "blocks.0.attn.bias"}
// MANUAL-COUNT-2: "autosp.all_to_all"({{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,2,?,8],f32>
// MANUAL: %[[SCORES:.*]] = torch.aten.bmm {{.*}} : !torch.vtensor<[4,?,8],f32>, !torch.vtensor<[4,8,?],f32> -> !torch.vtensor<[4,?,?],f32>
// MANUAL: torch.aten.slice.Tensor %[[MASK]]
// MANUAL: torch.aten.where.self {{.*}} : !torch.vtensor<[1,1,?,?],i1>, !torch.vtensor<[],f32>, !torch.vtensor<[2,2,?,?],f32> -> !torch.vtensor<[2,2,?,?],f32>
// MANUAL: torch.aten.softmax.int {{.*}} -> !torch.vtensor<[2,2,?,?],f32>
// MANUAL: "autosp.all_to_all"({{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64}
// MANUAL: torch.aten.bmm {{.*}} -> !torch.vtensor<[4,?,8],f32>
// MANUAL: %[[O:.*]] = torch.aten.view {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// MANUAL: "autosp.all_to_all"(%[[O]]) {concat_dim = 1 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 2 : i64} : (!torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>
// MANUAL-NOT: autosp.all_to_all

// A per-head bias from outside attention (ALiBi as MPT writes it: slopes x key position,
// [H, 1, S], added to the [B, H, S, S] scores): each rank holds its heads over the whole
// sequence in there, so the bias, computed whole on every rank, is cut to the same heads.
// RUN: %python -m autosp.frontend alibi | autosp-opt --autosp-partition-attention=sp-size=2 | FileCheck %s --check-prefix=ALIBI
// ALIBI-LABEL: func.func @main(
// ALIBI-COUNT-2: "autosp.all_to_all"({{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64}
// ALIBI: %[[BIAS:.*]] = "autosp.local_heads"(%{{.*}}) {dim = 0 : i64, group = "sp", heads = 4 : i64} : (!torch.vtensor<[4,1,?],f32>) -> !torch.vtensor<[2,1,?],f32>
// ALIBI: torch.aten.add.Tensor %{{.*}}, %[[BIAS]], %{{.*}} : !torch.vtensor<[2,2,?,?],f32>, !torch.vtensor<[2,1,?],f32>, !torch.int -> !torch.vtensor<[2,2,?,?],f32>
// ALIBI: torch.aten.softmax.int {{.*}} -> !torch.vtensor<[2,2,?,?],f32>
// ALIBI: "autosp.all_to_all"({{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64}
// ALIBI: "autosp.all_to_all"({{.*}}) {concat_dim = 1 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 2 : i64}
// ALIBI-NOT: autosp.local_heads

// SDPA whose attn_mask is a per-head bias (T5's bucketed relative positions: a learned
// table of key - query distances, [1, H, S, S]): cut to the rank's heads like the query.
// RUN: %python -m autosp.frontend relative-bias | autosp-opt --autosp-partition-attention=sp-size=2 | FileCheck %s --check-prefix=RELBIAS
// RELBIAS-LABEL: func.func @main(
// RELBIAS-COUNT-3: "autosp.all_to_all"({{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64}
// RELBIAS: %[[BIAS:.*]] = "autosp.local_heads"(%{{.*}}) {dim = 1 : i64, group = "sp", heads = 4 : i64} : (!torch.vtensor<[1,4,?,?],f32>) -> !torch.vtensor<[1,2,?,?],f32>
// RELBIAS: torch.aten.scaled_dot_product_attention %{{.*}}, %{{.*}}, %{{.*}}, %[[BIAS]], {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// RELBIAS: "autosp.all_to_all"({{.*}}) {concat_dim = 1 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 2 : i64}

// -----

// GQA repeated by the model (repeat_kv: unsqueeze -> broadcast -> view) with KV heads
// divisible by P: the all-to-all moves the 2 KV heads and each rank repeats its own one
// afterwards, so k and v cost half the bytes of repeated heads.
// CHECK-LABEL: func.func @repeat_kv
// CHECK-SAME: %[[K:[^:]*]]: !torch.vtensor<[2,2,?,8],f32>
// CHECK: %[[KA:.*]] = "autosp.all_to_all"(%[[K]], %{{.*}}) {{.*}} : (!torch.vtensor<[2,2,?,8],f32>, !torch.int) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK: %[[KR:.*]] = torch.aten.repeat_interleave.self_int %[[KA]], {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// CHECK: torch.aten.scaled_dot_product_attention %{{.*}}, %[[KR]], %{{.*}}
func.func @repeat_kv(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                     %k: !torch.vtensor<[2,2,?,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %int8 = torch.constant.int 8
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %k, [%s], affine_map<()[s0] -> (2, 2, s0, 8)> : !torch.vtensor<[2,2,?,8],f32>
  %len = torch.aten.size.int %k, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.int
  %u = torch.aten.unsqueeze %k, %int2 : !torch.vtensor<[2,2,?,8],f32>, !torch.int -> !torch.vtensor<[2,2,1,?,8],f32>
  torch.bind_symbolic_shape %u, [%s], affine_map<()[s0] -> (2, 2, 1, s0, 8)> : !torch.vtensor<[2,2,1,?,8],f32>
  %wide_shape = torch.prim.ListConstruct %int2, %int2, %int2, %len, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %w = torch.aten.broadcast_to %u, %wide_shape : !torch.vtensor<[2,2,1,?,8],f32>, !torch.list<int> -> !torch.vtensor<[2,2,2,?,8],f32>
  torch.bind_symbolic_shape %w, [%s], affine_map<()[s0] -> (2, 2, 2, s0, 8)> : !torch.vtensor<[2,2,2,?,8],f32>
  %flat_shape = torch.prim.ListConstruct %int2, %int4, %len, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %kr = torch.aten.view %w, %flat_shape : !torch.vtensor<[2,2,2,?,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %kr, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %0 = torch.aten.scaled_dot_product_attention %q, %kr, %kr, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %0, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Proven key padding (autosp-causal-mask: `autosp.key_padding`, the [B, 1, 1, S] padding
// replicated): Ulysses keeps it on the SDPA op (whole keys per head); a ring takes it as
// the op's `mask` operand with key_padding = 1 and masks each K/V block by position.
// CHECK-LABEL: func.func @key_padding
// CHECK: torch.aten.scaled_dot_product_attention {{.*}} {autosp.key_padding} : {{.*}}, !torch.vtensor<[2,1,1,?],i1>, {{.*}} -> !torch.vtensor<[2,2,?,8],f32>
// RING-LABEL: func.func @key_padding
// RING-SAME: %[[PAD:[^:]*]]: !torch.vtensor<[2,1,1,?],i1>
// RING: "autosp.ring_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[PAD]]) {group = "sp:ring", is_causal = 0 : i64, key_padding = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 0, 0>, scale = 0.000000e+00 : f64, window = 0 : i64} : ({{.*}}, !torch.int, !torch.vtensor<[2,1,1,?],i1>) -> !torch.vtensor<[2,4,?,8],f32>
// HYB-LABEL: func.func @key_padding
// HYB: "autosp.ring_attention"({{.*}}) {group = "sp:ring", is_causal = 0 : i64, key_padding = 1 : i64, {{.*}}} : ({{.*}}) -> !torch.vtensor<[2,2,?,8],f32>
func.func @key_padding(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                       %pad: !torch.vtensor<[2,1,1,?],i1> {autosp.input = "args[1]"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %pad, [%s], affine_map<()[s0] -> (2, 1, 1, s0)> : !torch.vtensor<[2,1,1,?],i1>
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %pad, %float0, %false, %none, %false {autosp.key_padding} : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,1,1,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Attention with sinks (autosp-fuse-attention's `torch.autosp.sink_attention`, gpt-oss):
// partitioned as SDPA. Ulysses keeps the full [H] sinks on the op and names the group
// whose rank picks this rank's heads' chunk (`autosp.sink_heads`); a ring takes them as
// its `sink_logits` operand (entering the log-sum-exp merge once).
// CHECK-LABEL: func.func @attention_sinks
// CHECK-SAME: %[[SINKS:[^:]*]]: !torch.vtensor<[4],f32>
// CHECK: %[[Q:.*]] = "autosp.all_to_all"
// CHECK: torch.operator "torch.autosp.sink_attention"(%[[Q]], {{.*}}, %[[SINKS]]) {autosp.sink_heads = "sp"{{.*}}} : ({{.*}}) -> !torch.vtensor<[2,2,?,8],f32>
// RING-LABEL: func.func @attention_sinks
// RING-SAME: %[[SINKS:[^:]*]]: !torch.vtensor<[4],f32>
// RING: "autosp.ring_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[SINKS]]) {group = "sp:ring", is_causal = 1 : i64, key_padding = 0 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 1, 0>, {{.*}}} : ({{.*}}, !torch.int, !torch.vtensor<[4],f32>) -> !torch.vtensor<[2,4,?,8],f32>
// HYB-LABEL: func.func @attention_sinks
// HYB: "autosp.ring_attention"({{.*}}) {autosp.sink_heads = "sp:ulysses", group = "sp:ring", {{.*}}operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 1, 0>{{.*}}} : ({{.*}}) -> !torch.vtensor<[2,2,?,8],f32>
func.func @attention_sinks(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                           %sinks: !torch.vtensor<[4],f32> {autosp.parameter = "sinks"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %0 = torch.operator "torch.autosp.sink_attention"(%q, %q, %q, %none, %float0, %true, %none, %false, %sinks) : (!torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool, !torch.vtensor<[4],f32>) -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// A Gated DeltaNet op (a stated recurrence along dim 1) runs one of three exact ways, priced
// (autosp.cost.recurrence; recurrence= forces one). heads, where its heads divide over
// the ranks (2 key, 4 value heads at sp-size 2): an all-to-all to heads for each input, the
// op on this rank's heads over the whole sequence, an all-to-all back (no state passed).
// Otherwise the op is left to autosp-shard-sequence with its method: at the priced length
// (8192) the heads' all-to-alls cost more than the prefix's widened part (d_k = d_v = 8:
// 1.75x the FLOPs), so auto takes the prefix at both sizes; at sp-size 4 the 2 key heads do
// not divide and heads is not priced at all.
// CHECK-LABEL: func.func @gated_delta_rule_heads
// CHECK-NOT: "autosp.all_to_all"(%arg1
// CHECK: torch.operator "torch.autosp.gated_delta_rule"(%arg1, %arg2, %arg3, %arg4, %arg5, {{.*}} {autosp.scan_method = "prefix"}
// HEADS-LABEL: func.func @gated_delta_rule_heads
// HEADS: %[[Q:.*]] = "autosp.all_to_all"(%arg1, %{{.*}}) {concat_dim = 1 : i64, group = "sp", seq_dim = 1 : i64, split_dim = 2 : i64} : {{.*}} -> !torch.vtensor<[2,?,1,8],f32>
// HEADS: %[[K:.*]] = "autosp.all_to_all"(%arg2, {{.*}} -> !torch.vtensor<[2,?,1,8],f32>
// HEADS: %[[V:.*]] = "autosp.all_to_all"(%arg3, {{.*}} -> !torch.vtensor<[2,?,2,8],f32>
// HEADS: %[[G:.*]] = "autosp.all_to_all"(%arg4, {{.*}} -> !torch.vtensor<[2,?,2],f32>
// HEADS: %[[B:.*]] = "autosp.all_to_all"(%arg5, {{.*}} -> !torch.vtensor<[2,?,2],f32>
// HEADS: %[[O:.*]] = torch.operator "torch.autosp.gated_delta_rule"(%[[Q]], %[[K]], %[[V]], %[[G]], %[[B]],
// HEADS-NOT: autosp.scan_method
// HEADS: %[[BACK:.*]] = "autosp.all_to_all"(%[[O]], %{{.*}}) {concat_dim = 2 : i64, group = "sp", seq_dim = 1 : i64, split_dim = 1 : i64} : {{.*}} -> !torch.vtensor<[2,?,4,8],f32>
// HEADS: return %{{.*}}, %[[BACK]]
// P4-LABEL: func.func @gated_delta_rule_heads
// P4: torch.operator "torch.autosp.gated_delta_rule"(%arg1, %arg2, %arg3, %arg4, %arg5, {{.*}} {autosp.scan_method = "prefix"}
// CHAIN-LABEL: func.func @gated_delta_rule_heads
// CHAIN: torch.operator "torch.autosp.gated_delta_rule"(%arg1, %arg2, %arg3, %arg4, %arg5, {{.*}} {autosp.scan_method = "chain"}
func.func @gated_delta_rule_heads(%x: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                                  %gq: !torch.vtensor<[2,?,2,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64},
                                  %gk: !torch.vtensor<[2,?,2,8],f32> {autosp.input = "args[2]", autosp.seq_dim = 1 : i64},
                                  %gv: !torch.vtensor<[2,?,4,8],f32> {autosp.input = "args[3]", autosp.seq_dim = 1 : i64},
                                  %gg: !torch.vtensor<[2,?,4],f32> {autosp.input = "args[4]", autosp.seq_dim = 1 : i64},
                                  %gb: !torch.vtensor<[2,?,4],f32> {autosp.input = "args[5]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,?,4,8],f32>) {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %float0 = torch.constant.float 0.000000e+00
  %int64 = torch.constant.int 64
  %str = torch.constant.str "transformers.models.qwen3_next.modeling_qwen3_next:torch_chunk_gated_delta_rule"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %gq, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %gk, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %gv, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %gg, [%s], affine_map<()[s0] -> (2, s0, 4)> : !torch.vtensor<[2,?,4],f32>
  torch.bind_symbolic_shape %gb, [%s], affine_map<()[s0] -> (2, s0, 4)> : !torch.vtensor<[2,?,4],f32>
  %a = torch.aten.scaled_dot_product_attention %x, %x, %x, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %a, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %o = torch.operator "torch.autosp.gated_delta_rule"(%gq, %gk, %gv, %gg, %gb, %true, %int64, %str) : (!torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,4,8],f32>, !torch.vtensor<[2,?,4],f32>, !torch.vtensor<[2,?,4],f32>, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  return %a, %o : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,?,4,8],f32>
}

// -----

// A Gated DeltaNet op that restarts at packed documents (operand 8, true where a document
// starts: torchtitan's Qwen3.5) runs as a chain, whatever was priced or asked: each rank's
// part restarts where its documents start; the prefix's summaries and the heads' whole
// sequences assume no restart.
// CHECK-LABEL: func.func @gated_delta_rule_documents
// CHECK: torch.operator "torch.autosp.gated_delta_rule"(%arg1, %arg2, %arg3, %arg4, %arg5, %true, %int64, %str, %arg6) {autosp.scan_method = "chain"}
// HEADS-LABEL: func.func @gated_delta_rule_documents
// HEADS-NOT: "autosp.all_to_all"(%arg{{[1-6]}}
// HEADS: torch.operator "torch.autosp.gated_delta_rule"({{.*}}, %arg6) {autosp.scan_method = "chain"}
// P4-LABEL: func.func @gated_delta_rule_documents
// P4: torch.operator "torch.autosp.gated_delta_rule"({{.*}}, %arg6) {autosp.scan_method = "chain"}
// CHAIN-LABEL: func.func @gated_delta_rule_documents
// CHAIN: torch.operator "torch.autosp.gated_delta_rule"({{.*}}, %arg6) {autosp.scan_method = "chain"}
func.func @gated_delta_rule_documents(%x: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                                  %gq: !torch.vtensor<[2,?,2,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64},
                                  %gk: !torch.vtensor<[2,?,2,8],f32> {autosp.input = "args[2]", autosp.seq_dim = 1 : i64},
                                  %gv: !torch.vtensor<[2,?,4,8],f32> {autosp.input = "args[3]", autosp.seq_dim = 1 : i64},
                                  %gg: !torch.vtensor<[2,?,4],f32> {autosp.input = "args[4]", autosp.seq_dim = 1 : i64},
                                  %gb: !torch.vtensor<[2,?,4],f32> {autosp.input = "args[5]", autosp.seq_dim = 1 : i64},
                                  %starts: !torch.vtensor<[2,?],i1> {autosp.input = "args[6]", autosp.seq_dim = 1 : i64})
    -> (!torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,?,4,8],f32>) {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %float0 = torch.constant.float 0.000000e+00
  %int64 = torch.constant.int 64
  %str = torch.constant.str "torchtitan.models.qwen3_5.model:_fla_chunk_gated_delta_rule"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %gq, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %gk, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %gv, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %gg, [%s], affine_map<()[s0] -> (2, s0, 4)> : !torch.vtensor<[2,?,4],f32>
  torch.bind_symbolic_shape %gb, [%s], affine_map<()[s0] -> (2, s0, 4)> : !torch.vtensor<[2,?,4],f32>
  torch.bind_symbolic_shape %starts, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],i1>
  %a = torch.aten.scaled_dot_product_attention %x, %x, %x, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %a, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  %o = torch.operator "torch.autosp.gated_delta_rule"(%gq, %gk, %gv, %gg, %gb, %true, %int64, %str, %starts) : (!torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,4,8],f32>, !torch.vtensor<[2,?,4],f32>, !torch.vtensor<[2,?,4],f32>, !torch.bool, !torch.int, !torch.str, !torch.vtensor<[2,?],i1>) -> !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  return %a, %o : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,?,4,8],f32>
}

// -----

// A model whose only sequence mixing is a stated recurrence (a pure SSM): no attention to
// partition, the recurrence partitioned and priced as in a hybrid, the mesh's reason says so.
// (the module's attributes print before its function's label)
// CHECK: autosp.sp_choice = "no attention: recurrences only; recurrences: gated_delta_rule (4 heads, {{.*}}) on 2 ranks: prefix; priced
// CHECK-LABEL: func.func @recurrence_only
// CHECK: torch.operator "torch.autosp.gated_delta_rule"{{.*}}{autosp.scan_method = "prefix"}
// RING: autosp.sp_choice = "no attention: recurrences only (strategy 'ring' has no attention to apply to)
// RING-LABEL: func.func @recurrence_only
// HEADS-LABEL: func.func @recurrence_only
// HEADS: "autosp.all_to_all"(%arg0
// HEADS: torch.operator "torch.autosp.gated_delta_rule"
// CHAIN-LABEL: func.func @recurrence_only
// CHAIN: torch.operator "torch.autosp.gated_delta_rule"{{.*}}{autosp.scan_method = "chain"}
func.func @recurrence_only(%gq: !torch.vtensor<[2,?,2,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                           %gk: !torch.vtensor<[2,?,2,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64},
                           %gv: !torch.vtensor<[2,?,4,8],f32> {autosp.input = "args[2]", autosp.seq_dim = 1 : i64},
                           %gg: !torch.vtensor<[2,?,4],f32> {autosp.input = "args[3]", autosp.seq_dim = 1 : i64},
                           %gb: !torch.vtensor<[2,?,4],f32> {autosp.input = "args[4]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,4,8],f32> {
  %true = torch.constant.bool true
  %int64 = torch.constant.int 64
  %str = torch.constant.str "transformers.models.qwen3_next.modeling_qwen3_next:torch_chunk_gated_delta_rule"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %gq, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %gk, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %gv, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %gg, [%s], affine_map<()[s0] -> (2, s0, 4)> : !torch.vtensor<[2,?,4],f32>
  torch.bind_symbolic_shape %gb, [%s], affine_map<()[s0] -> (2, s0, 4)> : !torch.vtensor<[2,?,4],f32>
  %o = torch.operator "torch.autosp.gated_delta_rule"(%gq, %gk, %gv, %gg, %gb, %true, %int64, %str) : (!torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,4,8],f32>, !torch.vtensor<[2,?,4],f32>, !torch.vtensor<[2,?,4],f32>, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  return %o : !torch.vtensor<[2,?,4,8],f32>
}
