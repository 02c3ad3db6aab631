// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-sp-pipeline=sp-size=4

// No attention: nothing mixes the sequence, there is nothing to partition.
// expected-error@+1 {{has no attention or recurrence to partition}}
func.func @no_attention(%x: !torch.vtensor<[2,?],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}) -> !torch.vtensor<[2,?],f32> {
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 100} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  return %x : !torch.vtensor<[2,?],f32>
}

// -----

// 6 query heads cannot be split over 4 ranks.
func.func @heads_not_divisible(%q: !torch.vtensor<[2,6,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,6,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 6, s0, 8)> : !torch.vtensor<[2,6,?,8],f32>
  // expected-error@+1 {{query heads (6) are not divisible by sp-size 4}}
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %none, %float0, %true, %none, %false : !torch.vtensor<[2,6,?,8],f32>, !torch.vtensor<[2,6,?,8],f32>, !torch.vtensor<[2,6,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,6,?,8],f32>
  return %0 : !torch.vtensor<[2,6,?,8],f32>
}
