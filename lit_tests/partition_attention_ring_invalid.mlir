// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-partition-attention='sp-size=4 strategy=ring'

// Ring attention takes the masks autosp-causal-mask proved (causal, documents, a window);
// a mask it kept would need every rank's [S/P, S] rows: diagnosed, not run wrong.
func.func @kept_mask(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                     %m: !torch.vtensor<[1,1,?,?],f32> {autosp.input = "args[1]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %m, [%s], affine_map<()[s0] -> (1, 1, s0, s0)> : !torch.vtensor<[1,1,?,?],f32>
  // expected-error@+1 {{'torch.aten.scaled_dot_product_attention' op cannot run as ring attention: its mask is not one autosp-causal-mask proved causal, documents, key padding or a window}}
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %m, %float0, %false, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[1,1,?,?],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Two attention ops with different head counts: the sequence is laid out once per module.
func.func @mixed_heads(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                       %p: !torch.vtensor<[2,2,?,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,2,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %p, [%s], affine_map<()[s0] -> (2, 2, s0, 8)> : !torch.vtensor<[2,2,?,8],f32>
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  // expected-error@+1 {{'torch.aten.scaled_dot_product_attention' op has other head counts than the first attention op}}
  %1 = torch.aten.scaled_dot_product_attention %p, %p, %p, %none, %float0, %true, %none, %false : !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.vtensor<[2,2,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,2,?,8],f32>
  return %1 : !torch.vtensor<[2,2,?,8],f32>
}

// -----

// is_causal must be a constant to lay out the ring's masks (auto would keep Ulysses).
func.func @dynamic_causal(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                          %c: !torch.bool {autosp.input = "args[1]"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  // expected-error@+1 {{'torch.aten.scaled_dot_product_attention' op cannot run as ring attention: its is_causal is not a constant}}
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %none, %float0, %c, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}

// -----

// Key padding whose fully masked rows follow eager attention's rule (the mean of every
// rank's values): the ring gives such rows zeros, so it refuses rather than differ.
func.func @padding_empty_rows(%q: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                              %pad: !torch.vtensor<[2,1,1,?],i1> {autosp.input = "args[1]"})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  torch.bind_symbolic_shape %pad, [%s], affine_map<()[s0] -> (2, 1, 1, s0)> : !torch.vtensor<[2,1,1,?],i1>
  // expected-error@+1 {{'torch.aten.scaled_dot_product_attention' op cannot run as ring attention: its queries whose keys are all masked attend as eager attention's 'uniform' rule says}}
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %pad, %float0, %true, %none, %false {autosp.key_padding, autosp.empty_rows = "uniform"} : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,1,1,?],i1>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}


// -----

// MLA's values are narrower than its queries and keys (v 8 against q/k 12): the ring's
// K/V blocks travel as one tensor, so a forced ring is diagnosed (auto keeps Ulysses).
func.func @narrower_values(%q: !torch.vtensor<[2,4,?,12],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                           %v: !torch.vtensor<[2,4,?,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 4, s0, 12)> : !torch.vtensor<[2,4,?,12],f32>
  torch.bind_symbolic_shape %v, [%s], affine_map<()[s0] -> (2, 4, s0, 8)> : !torch.vtensor<[2,4,?,8],f32>
  // expected-error@+1 {{'torch.aten.scaled_dot_product_attention' op cannot run as ring attention: its values' head dim (8) is not its keys' (12): the ring's K/V blocks travel as one (MLA's narrower v runs on Ulysses)}}
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %v, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,12],f32>, !torch.vtensor<[2,4,?,12],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %0 : !torch.vtensor<[2,4,?,8],f32>
}
