// The GPT-2-style reference model: learned positions and manual attention with the
// causal mask sliced from a registered (non-persistent) buffer.
// RUN: %python -m autosp.frontend gpt2 --layers 1 | FileCheck %s

// CHECK-LABEL: func.func @main(
// CHECK-SAME: {autosp.parameter = "wpe.weight"}
// CHECK-SAME: %[[MASK:[^:]*]]: !torch.vtensor<[1,1,256,256],i1> {autosp.buffer = "blocks.0.attn.bias"}
// CHECK-SAME: %[[IDS:[^:]*]]: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}

// The sequence is bounded by the position table.
// CHECK: torch.symbolic_int "{{s[0-9]+}}" {min_val = {{[0-9]+}}, max_val = 256}

// Manual attention: matmul, scale, mask from the buffer, softmax (kept whole), matmul.
// CHECK: torch.aten.bmm {{.*}} -> !torch.vtensor<[8,?,?],f32>
// CHECK: torch.aten.slice.Tensor %[[MASK]]
// CHECK: torch.aten.softmax.int {{.*}} -> !torch.vtensor<[2,4,?,?],f32>
// CHECK: torch.aten.bmm {{.*}} -> !torch.vtensor<[8,?,8],f32>
// CHECK-NOT: torch.aten.exp
