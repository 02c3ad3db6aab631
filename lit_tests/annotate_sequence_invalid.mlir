// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-annotate-sequence

// No symbolic size at all: the model was imported with static shapes.
// expected-error@+1 {{has no sequence axis: no input has a symbolic sequence dimension}}
func.func @static_shapes(%x: !torch.vtensor<[2,8],f32>) -> !torch.vtensor<[2,8],f32> {
  %0 = torch.aten.neg %x : !torch.vtensor<[2,8],f32> -> !torch.vtensor<[2,8],f32>
  return %0 : !torch.vtensor<[2,8],f32>
}

// -----

// Two symbolic sizes and no input marked as the sequence: ambiguous.
// expected-error@+1 {{has 2 symbolic sizes and no input marked with autosp.seq_dim}}
func.func @ambiguous(%x: !torch.vtensor<[?,?],f32>) -> !torch.vtensor<[?,?],f32> {
  %s0 = torch.symbolic_int "s0" {min_val = 2, max_val = 100} : !torch.int
  %s1 = torch.symbolic_int "s1" {min_val = 2, max_val = 100} : !torch.int
  torch.bind_symbolic_shape %x, [%s0, %s1], affine_map<()[s0, s1] -> (s0, s1)> : !torch.vtensor<[?,?],f32>
  return %x : !torch.vtensor<[?,?],f32>
}

// -----

// A sequence but no attention: nothing mixes the sequence, nothing to partition.
// expected-error@+1 {{has no attention or recurrence to partition}}
func.func @no_attention(%x: !torch.vtensor<[2,?],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}) -> !torch.vtensor<[2,?],f32> {
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 100} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  %0 = torch.aten.neg %x : !torch.vtensor<[2,?],f32> -> !torch.vtensor<[2,?],f32>
  return %0 : !torch.vtensor<[2,?],f32>
}
