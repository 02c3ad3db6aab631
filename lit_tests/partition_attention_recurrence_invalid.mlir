// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-partition-attention='sp-size=4 recurrence=heads'

// recurrence=heads asks each rank to run its heads over the whole sequence; 2 key heads do
// not divide over 4 ranks, so the op cannot (the chain or the prefix can: not forced).
func.func @heads_do_not_divide(%x: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
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
  // expected-error@+1 {{cannot run on each rank's heads (recurrence=heads): it needs a Gated DeltaNet op whose key and value heads are static and divide by 4}}
  %o = torch.operator "torch.autosp.gated_delta_rule"(%gq, %gk, %gv, %gg, %gb, %true, %int64, %str) : (!torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,4,8],f32>, !torch.vtensor<[2,?,4],f32>, !torch.vtensor<[2,?,4],f32>, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  return %a, %o : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,?,4,8],f32>
}
