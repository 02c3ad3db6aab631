// The Llama-style reference model (RMSNorm, RoPE from a non-persistent buffer, GQA,
// SwiGLU, tied embeddings, loss inside) as the frontend imports it.
// RUN: %python -m autosp.frontend llama --layers 1 | FileCheck %s

// Parameters, the buffer and the inputs are arguments, each recorded by name; the tied
// lm_head weight appears once (as embed.weight).
// CHECK-LABEL: func.func @main(
// CHECK-SAME: %arg0: !torch.vtensor<[64,32],f32> {autosp.parameter = "embed.weight"}
// CHECK-SAME: {autosp.parameter = "blocks.0.attn.k_proj.weight"}
// CHECK-SAME: {autosp.buffer = "rope.inv_freq"}
// CHECK-SAME: %[[IDS:.*]]: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}
// CHECK-SAME: %[[LABELS:.*]]: !torch.vtensor<[2,?],si64> {autosp.input = "kwargs['labels']", autosp.seq_dim = 1 : i64}
// CHECK-NOT: lm_head

// One symbol for the sequence length, bound on both inputs.
// CHECK: %[[S:.*]] = torch.symbolic_int "{{s[0-9]+}}" {min_val = {{[0-9]+}}, max_val = {{[0-9]+}}} : !torch.int
// CHECK: torch.bind_symbolic_shape %[[IDS]], [%[[S]]], affine_map<()[s0] -> (2, s0)>
// CHECK: torch.bind_symbolic_shape %[[LABELS]], [%[[S]]], affine_map<()[s0] -> (2, s0)>

// Positions are made in-graph from the one size.int of an input (export picks which).
// CHECK: %[[LEN:.*]] = torch.aten.size.int %{{.*}}, %{{.*}} : !torch.vtensor<[2,?],si64>
// CHECK: torch.aten.arange.start_step %{{.*}}, %[[LEN]]

// Attention stays one op on [batch, heads, seq, head_dim].
// CHECK: torch.aten.scaled_dot_product_attention {{.*}} -> !torch.vtensor<[2,4,?,8],f32>
// CHECK-NOT: torch.aten.scaled_dot_product_attention
// The loss is a mean over the shifted, valid labels (S - 1 per row).
// CHECK: affine_map<()[s0] -> (s0 * 2 - 2, 64)>
// CHECK: return {{.*}} : !torch.vtensor<[2,?,64],f32>, !torch.vtensor<[],f32>
