// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-partition-attention='sp-size=2 recurrence=prefix'

// recurrence=prefix needs a recurrence linear in its state; xLSTM's mLSTM keeps a max
// stabilizer in its state (C, n, m), so it runs as a chain only.
func.func @mlstm_prefix(%q: !torch.vtensor<[2,?,2,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                        %g: !torch.vtensor<[2,?,2],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,2,8],f32> {
  %str = torch.constant.str "{\22cls\22: \22transformers.models.xlstm.modeling_xlstm:xLSTMBackend\22}"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %g, [%s], affine_map<()[s0] -> (2, s0, 2)> : !torch.vtensor<[2,?,2],f32>
  // expected-error@+1 {{cannot run as a prefix (recurrence=prefix): xLSTM's mLSTM is not linear in its state (its max stabilizer); it runs as a chain}}
  %o = torch.operator "torch.autosp.mlstm"(%q, %q, %q, %g, %g, %str) : (!torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2],f32>, !torch.vtensor<[2,?,2],f32>, !torch.str) -> !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  return %o : !torch.vtensor<[2,?,2,8],f32>
}
