// An SDPA block whose inputs are [seq, batch, hidden]: the sequence dim is 0.
// RUN: %python -m autosp.frontend attention-seq-first | FileCheck %s

// CHECK-LABEL: func.func @main(
// CHECK-SAME: %[[X:[^:]*]]: !torch.vtensor<[?,2,32],f32> {autosp.input = "args[0]", autosp.seq_dim = 0 : i64}
// CHECK: torch.bind_symbolic_shape %[[X]], [%{{.*}}], affine_map<()[s0] -> (s0, 2, 32)>
// CHECK: torch.aten.scaled_dot_product_attention
// CHECK: return {{.*}} : !torch.vtensor<[?,2,32],f32>
