// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-partition-attention=sp-size=4

// 6 query heads cannot be split over 4 ranks.
func.func @heads_not_divisible(%q: !torch.vtensor<[2,6,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,6,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 6, s0, 8)> : !torch.vtensor<[2,6,?,8],f32>
  // expected-error@+1 {{'torch.aten.scaled_dot_product_attention' op query heads (6) are not divisible by sp-size 4}}
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %none, %float0, %true, %none, %false : !torch.vtensor<[2,6,?,8],f32>, !torch.vtensor<[2,6,?,8],f32>, !torch.vtensor<[2,6,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,6,?,8],f32>
  return %0 : !torch.vtensor<[2,6,?,8],f32>
}

// -----

// 8 query heads over 4 ranks are fine, but 3 KV heads neither divide nor are divided by 4.
func.func @kv_heads(%q: !torch.vtensor<[2,12,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                    %k: !torch.vtensor<[2,3,?,8],f32> {autosp.input = "args[1]", autosp.seq_dim = 2 : i64})
    -> !torch.vtensor<[2,12,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 12, s0, 8)> : !torch.vtensor<[2,12,?,8],f32>
  torch.bind_symbolic_shape %k, [%s], affine_map<()[s0] -> (2, 3, s0, 8)> : !torch.vtensor<[2,3,?,8],f32>
  // expected-error@+1 {{key/value heads (3) neither divide nor are divisible by sp-size 4}}
  %0 = torch.aten.scaled_dot_product_attention %q, %k, %k, %none, %float0, %true, %none, %true : !torch.vtensor<[2,12,?,8],f32>, !torch.vtensor<[2,3,?,8],f32>, !torch.vtensor<[2,3,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,12,?,8],f32>
  return %0 : !torch.vtensor<[2,12,?,8],f32>
}

// -----

// No attention: nothing to partition.
// expected-error@+1 {{has no attention or recurrence to partition}}
func.func @no_attention(%x: !torch.vtensor<[2,?],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}) -> !torch.vtensor<[2,?],f32> {
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 100} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  return %x : !torch.vtensor<[2,?],f32>
}

// -----

// An attn_mask whose head dim (3) neither holds the 8 query heads nor broadcasts over them.
func.func @mask_heads(%q: !torch.vtensor<[2,8,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 2 : i64},
                      %m: !torch.vtensor<[2,3,?,?],f32> {autosp.input = "args[1]"})
    -> !torch.vtensor<[2,8,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, 8, s0, 8)> : !torch.vtensor<[2,8,?,8],f32>
  torch.bind_symbolic_shape %m, [%s], affine_map<()[s0] -> (2, 3, s0, s0)> : !torch.vtensor<[2,3,?,?],f32>
  // expected-error@+1 {{has an attn_mask !torch.vtensor<[2,3,?,?],f32> whose head dim neither holds the 8 query heads nor broadcasts over them}}
  %0 = torch.aten.scaled_dot_product_attention %q, %q, %q, %m, %float0, %false, %none, %false : !torch.vtensor<[2,8,?,8],f32>, !torch.vtensor<[2,8,?,8],f32>, !torch.vtensor<[2,8,?,8],f32>, !torch.vtensor<[2,3,?,?],f32>, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,8,?,8],f32>
  return %0 : !torch.vtensor<[2,8,?,8],f32>
}
