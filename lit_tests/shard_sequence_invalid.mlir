// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-shard-sequence

// A running sum along the sequence needs every earlier position: not shardable.
func.func @cumsum_over_sequence(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.aten.cumsum' op works along the sequence dimension (1)}}
  %c = torch.aten.cumsum %e, %int1, %none : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %c, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %c : !torch.vtensor<[2,?,32],f32>
}

// -----

// A matmul over positions (x^T x) outside attention.
func.func @contract_sequence(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                             %ids: !torch.vtensor<[?],si64> {autosp.input = "args[0]", autosp.seq_dim = 0 : i64})
    -> !torch.vtensor<[32,32],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (s0)> : !torch.vtensor<[?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (s0, 32)> : !torch.vtensor<[?,32],f32>
  %t = torch.aten.transpose.int %e, %int0, %int1 : !torch.vtensor<[?,32],f32>, !torch.int, !torch.int -> !torch.vtensor<[32,?],f32>
  torch.bind_symbolic_shape %t, [%s], affine_map<()[s0] -> (32, s0)> : !torch.vtensor<[32,?],f32>
  // expected-error@+1 {{'torch.aten.mm' op contracts the sequence dimension (a matmul over positions) outside recognised attention}}
  %g = torch.aten.mm %t, %e : !torch.vtensor<[32,?],f32>, !torch.vtensor<[?,32],f32> -> !torch.vtensor<[32,32],f32>
  return %g : !torch.vtensor<[32,32],f32>
}
