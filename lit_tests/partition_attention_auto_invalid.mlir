// RUN: autosp-opt %s --verify-diagnostics --autosp-partition-attention='sp-size=4 strategy=auto'

// auto: 2 query heads do not split over 4 ranks by heads, and the kept mask rules the ring
// out; the diagnostic says both.
func.func @no_mesh(%q: !torch.vtensor<[2,2,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                   %m: !torch.vtensor<[1,1,?,?],f32> {autosp.input = "args[1]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 2, s0, 8)> : !torch.vtensor<[2,2,?,8],f32>
  torch.bind_symbolic_shape %m, [%s], affine_map<()[s0] -> (1, 1, s0, s0)> : !torch.vtensor<[1,1,?,?],f32>
  // expected-error@+1 {{no ulysses mesh of 4 ranks fits 2 query / 2 KV heads (ulysses=any, ring=any): 4x1: 2 query heads do not divide by 4; ring attention is ruled out: an attention op: its mask is not one autosp-causal-mask proved causal, documents, key padding or a window}}
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %m, %float0, %false, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[1,1,?,?],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %0 : !torch.vtensor<[2,2,?,8],f32>
}
