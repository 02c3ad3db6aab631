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

// -----

// A truncation to a fixed length is not a window of a sequence of any length.
func.func @truncate_to_fixed_length(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                    %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,850,32],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int850 = torch.constant.int 850
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 1000, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.aten.slice.Tensor' op truncates the sequence to a fixed length 850 (positions [0, 850)); autosp supports slices that trim a constant number of positions from either end}}
  %t = torch.aten.slice.Tensor %e, %int1, %int0, %int850, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,850,32],f32>
  return %t : !torch.vtensor<[2,850,32],f32>
}

// -----

// The last N positions: a fixed length too.
func.func @keep_last_positions(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                               %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,5,32],f32> {
  %int-1 = torch.constant.int -1
  %int-5 = torch.constant.int -5
  %int1 = torch.constant.int 1
  %none = torch.constant.none
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 8, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.aten.slice.Tensor' op keeps a fixed number (5) of the last positions of the sequence}}
  %t = torch.aten.slice.Tensor %e, %int1, %int-5, %none, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.none, !torch.int -> !torch.vtensor<[2,5,32],f32>
  return %t : !torch.vtensor<[2,5,32],f32>
}

// -----

// A bound that is not S plus a constant (half the sequence) is named, not evaluated.
func.func @bound_not_linear(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                            %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %n = torch.aten.size.int %ids, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  %half = torch.aten.floordiv.int %n, %int2 : !torch.int, !torch.int -> !torch.int
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.aten.slice.Tensor' op slices the sequence with a bound 'S floordiv 2', which is not S plus a constant}}
  %t = torch.aten.slice.Tensor %e, %int1, %int0, %half, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %t, [%s], affine_map<()[s0] -> (2, s0 floordiv 2, 32)> : !torch.vtensor<[2,?,32],f32>
  return %t : !torch.vtensor<[2,?,32],f32>
}

// -----

// One position of the sequence (x[:, -1]) lives on one rank only.
func.func @select_position(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                           %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,32],f32> {
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.aten.select.int' op selects one position of the sequence}}
  %t = torch.aten.select.int %e, %int1, %int-1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,32],f32>
  return %t : !torch.vtensor<[2,32],f32>
}

// -----

// Indexing the sequence with data (a gather over positions) needs the whole sequence.
func.func @gather_positions(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                            %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                            %pos: !torch.vtensor<[?],si64> {autosp.input = "args[1]", autosp.seq_dim = 0 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  torch.bind_symbolic_shape %pos, [%s], affine_map<()[s0] -> (s0)> : !torch.vtensor<[?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %idx = torch.prim.ListConstruct %none, %pos : (!torch.none, !torch.vtensor<[?],si64>) -> !torch.list<optional<vtensor>>
  // expected-error@+1 {{'torch.aten.index.Tensor' op indexes the sequence dimension (1) with a tensor that is not the range 0..S-1}}
  %x = torch.aten.index.Tensor %e, %idx : !torch.vtensor<[2,?,32],f32>, !torch.list<optional<vtensor>> -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %x : !torch.vtensor<[2,?,32],f32>
}
