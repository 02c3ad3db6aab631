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

// Positions from the end up to a fixed position ([S - 5, 850)): which positions it keeps
// depends on the length (a fixed-length truncation, x[:, :850], is a selection: shard_sequence.mlir).
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
  %int-5 = torch.constant.int -5
  // expected-error@+1 {{'torch.aten.slice.Tensor' op slices the sequence from -5 from the end to 850 from the start, positions that depend on its length}}
  %t = torch.aten.slice.Tensor %e, %int1, %int-5, %int850, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,850,32],f32>
  return %t : !torch.vtensor<[2,850,32],f32>
}

// -----

// The last N positions with a step: autosp selects fixed positions with step 1 only.
func.func @keep_last_positions(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                               %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,3,32],f32> {
  %int-1 = torch.constant.int -1
  %int-5 = torch.constant.int -5
  %int1 = torch.constant.int 1
  %none = torch.constant.none
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 8, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %int2 = torch.constant.int 2
  // expected-error@+1 {{'torch.aten.slice.Tensor' op slices the sequence with a step; autosp supports step 1}}
  %t = torch.aten.slice.Tensor %e, %int1, %int-5, %none, %int2 : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.none, !torch.int -> !torch.vtensor<[2,3,32],f32>
  return %t : !torch.vtensor<[2,3,32],f32>
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

// A position at the end of the sequence (x[:, S]) is past it (x[:, -1] is a selection).
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
  %n = torch.aten.size.int %ids, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  // expected-error@+1 {{'torch.aten.select.int' op selects a position at or past the end of the sequence}}
  %t = torch.aten.select.int %e, %int1, %n : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,32],f32>
  return %t : !torch.vtensor<[2,32],f32>
}

// -----

// Indexing the sequence with a sequence-long tensor (a permutation) needs the whole sequence.
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

// -----

// torch.flip's dims are a list: the sequence dim in it is found, not skipped (issue 22).
func.func @flip_dim_list(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                        %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  // expected-error@+1 {{'torch.aten.flip' op works along the sequence dimension (1); each rank holds only part of it, so autosp cannot shard this op}}
  %x = torch.aten.flip %e, %dims : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %x : !torch.vtensor<[2,?,32],f32>
}

// -----

// roll(self, shifts, dims): the dims are operand 2 (read from the schema), not operand 1.
func.func @roll_dims(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                    %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %shifts = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %dims = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  // expected-error@+1 {{'torch.aten.roll' op works along the sequence dimension (1)}}
  %x = torch.aten.roll %e, %shifts, %dims : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.list<int> -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %x : !torch.vtensor<[2,?,32],f32>
}

// -----

// A negative dim counts from the end: -2 of [2, S, 32] is the sequence.
func.func @negative_dim(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                       %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.aten.cumsum' op works along the sequence dimension (-2)}}
  %x = torch.aten.cumsum %e, %int-2, %none : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %x : !torch.vtensor<[2,?,32],f32>
}

// -----

// A dim list with a negative entry, in a list that also names a feature dim.
func.func @flip_negative_in_list(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct %int-1, %int-2 : (!torch.int, !torch.int) -> !torch.list<int>
  // expected-error@+1 {{'torch.aten.flip' op works along the sequence dimension (-2)}}
  %x = torch.aten.flip %e, %dims : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %x : !torch.vtensor<[2,?,32],f32>
}

// -----

// A dim that is not a constant could be the sequence: autosp cannot prove it is not.
func.func @dim_not_constant(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                           %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %d = torch.aten.sub.int %int2, %int1 : !torch.int, !torch.int -> !torch.int
  // expected-error@+1 {{'torch.aten.cumsum' op works along a dimension ('dim', operand 1) that is not a constant; autosp cannot prove it is not the sequence dimension}}
  %x = torch.aten.cumsum %e, %d, %none : !torch.vtensor<[2,?,32],f32>, !torch.int, !torch.none -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %x : !torch.vtensor<[2,?,32],f32>
}

// -----

// A max over the sequence and the features together: autosp splits amax over the sequence alone.
func.func @amax_over_sequence(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                             %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,1,1],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct %int1, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  // expected-error@+1 {{'torch.aten.amax' op is 'torch.aten.amax' over dims [1, 2], the sequence dim (1) among others; autosp splits it over the sequence dim alone}}
  %x = torch.aten.amax %e, %dims, %true : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,1,1],f32>
  return %x : !torch.vtensor<[2,1,1],f32>
}

// -----

// A mean over the sequence that reaches the IR as torch.aten.mean.dim (torch.export decomposes
// x.mean(1) into sum / S, which autosp splits) is refused, not averaged per rank.
func.func @mean_over_sequence(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                             %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,32],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %dims = torch.prim.ListConstruct %int-2 : (!torch.int) -> !torch.list<int>
  // expected-error@+1 {{'torch.aten.mean.dim' op reduces over the sequence dimension (-2) with 'torch.aten.mean.dim', which autosp cannot split}}
  %x = torch.aten.mean.dim %e, %dims, %false, %none : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[2,32],f32>
  return %x : !torch.vtensor<[2,32],f32>
}

// -----

// A dim of None means every dim, the sequence included (argmax of the flattened tensor).
func.func @dim_none(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                   %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[],si64> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.aten.argmax' op is 'torch.aten.argmax' over every dim (the flattened tensor); autosp splits it over the sequence dim alone}}
  %x = torch.aten.argmax %e, %none, %false : !torch.vtensor<[2,?,32],f32>, !torch.none, !torch.bool -> !torch.vtensor<[],si64>
  return %x : !torch.vtensor<[],si64>
}

// -----

// A cat along the sequence changes its length: each rank would put its own shards side by side.
func.func @cat_along_sequence(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                             %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %l = torch.prim.ListConstruct %e, %e : (!torch.vtensor<[2,?,32],f32>, !torch.vtensor<[2,?,32],f32>) -> !torch.list<vtensor>
  // expected-error@+1 {{'torch.aten.cat' op works along the sequence dimension (1)}}
  %x = torch.aten.cat %l, %int1 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0 * 2, 32)> : !torch.vtensor<[2,?,32],f32>
  return %x : !torch.vtensor<[2,?,32],f32>
}

// -----

// A pad along the sequence has no dim argument: the length it changes (S -> S + 1) gives it away.
func.func @pad_sequence(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                       %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-2 = torch.constant.int -2
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %int0 = torch.constant.int 0
  %float0 = torch.constant.float 0.000000e+00
  %pad = torch.prim.ListConstruct %int0, %int0, %int1, %int0 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  // expected-error@+1 {{'torch.aten.constant_pad_nd' op changes the length of the sequence (S -> S + 1)}}
  %x = torch.aten.constant_pad_nd %e, %pad, %float0 : !torch.vtensor<[2,?,32],f32>, !torch.list<int>, !torch.float -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0 + 1, 32)> : !torch.vtensor<[2,?,32],f32>
  return %x : !torch.vtensor<[2,?,32],f32>
}

// -----

// An op torch-mlir keeps opaque (a torch.operator) whose semantics autosp does not state:
// it could mix positions, so it is not taken for token-wise.
func.func @opaque_op_on_shard(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                              %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.operator "torch.mylib.scan"' op is 'torch.mylib.scan', an op torch-mlir keeps opaque; autosp does not know what it does along the sequence}}
  %y = torch.operator "torch.mylib.scan"(%e) : (!torch.vtensor<[2,?,32],f32>) -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %y : !torch.vtensor<[2,?,32],f32>
}

// -----

// histc with min == max takes its range from the data: each rank's range would be its
// own, so the counts of the parts do not add up to the whole's.
func.func @histc_range_from_data(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                 %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[4],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{counts sequence-sharded values (histc) over a range that is not fixed}}
  %c = torch.operator "torch.aten.histc"(%e, %int4, %int0, %int0) : (!torch.vtensor<[2,?,32],f32>, !torch.int, !torch.int, !torch.int) -> !torch.vtensor<[4],f32>
  return %c : !torch.vtensor<[4],f32>
}

// -----

// Noise drawn in the shape of a sharded value (rand_like, as a router's jitter): each rank
// would draw its own numbers, not its part of one device's draw.
func.func @random_like_a_shard(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                               %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  %none = torch.constant.none
  %f0 = torch.constant.float 0.000000e+00
  %f1 = torch.constant.float 1.000000e+00
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{'torch.aten.uniform' op draws random numbers shaped like a sequence-sharded value}}
  %u = torch.aten.uniform %e, %f0, %f1, %none : !torch.vtensor<[2,?,32],f32>, !torch.float, !torch.float, !torch.none -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %u, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %u : !torch.vtensor<[2,?,32],f32>
}

// -----

// scatter_add into a target that is not proven zero (a parameter): each rank would add it
// once more after the all-reduce.
func.func @scatter_add_into_a_parameter(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                        %t: !torch.vtensor<[4],f32> {autosp.parameter = "t"},
                                        %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[4],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %lr = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %src = torch.aten.view %e, %lr : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %src, [%s], affine_map<()[s0] -> (s0 * 64)> : !torch.vtensor<[?],f32>
  %idx = torch.aten.view %ids, %lr : !torch.vtensor<[2,?],si64>, !torch.list<int> -> !torch.vtensor<[?],si64>
  torch.bind_symbolic_shape %idx, [%s], affine_map<()[s0] -> (s0 * 2)> : !torch.vtensor<[?],si64>
  // expected-error@+1 {{scatter-adds sequence-sharded values into a target autosp cannot prove zero}}
  %c = torch.aten.scatter_add %t, %int0, %idx, %src : !torch.vtensor<[4],f32>, !torch.int, !torch.vtensor<[?],si64>, !torch.vtensor<[?],f32> -> !torch.vtensor<[4],f32>
  return %c : !torch.vtensor<[4],f32>
}

// -----

// A replicated mask whose flattened rows fold the sequence outside the batch
// ([S, B] -> [S*B]: a transposed mask) against sharded rows folded [B, S]: each rank's
// slice of the mask would hold other rows than its own, so it is refused.
func.func @fold_in_another_order(%w: !torch.vtensor<[64,1],f32> {autosp.parameter = "w"},
                                 %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                                 %mask: !torch.vtensor<[2,?],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[?],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  torch.bind_symbolic_shape %mask, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,1],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,1],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 1)> : !torch.vtensor<[2,?,1],f32>
  %lr = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %flat = torch.aten.view %e, %lr : !torch.vtensor<[2,?,1],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %flat, [%s], affine_map<()[s0] -> (s0 * 2)> : !torch.vtensor<[?],f32>
  %t = torch.aten.transpose.int %mask, %int0, %int1 : !torch.vtensor<[2,?],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,2],f32>
  torch.bind_symbolic_shape %t, [%s], affine_map<()[s0] -> (s0, 2)> : !torch.vtensor<[?,2],f32>
  %r = torch.aten.view %t, %lr : !torch.vtensor<[?,2],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %r, [%s], affine_map<()[s0] -> (s0 * 2)> : !torch.vtensor<[?],f32>
  // expected-error@+1 {{whose rows fold the sequence with other dims as [None, 2] (None: the sequence), but its sequence-sharded operands' rows fold as [2, None, 1]}}
  %y = torch.aten.mul.Tensor %flat, %r : !torch.vtensor<[?],f32>, !torch.vtensor<[?],f32> -> !torch.vtensor<[?],f32>
  return %y : !torch.vtensor<[?],f32>
}

// -----

// The same [2 * S, 4] operand built from positions (not uniform) with no view recording
// how its rows fold the batch and the sequence: refused, each rank's slice would take
// other rows than its own.
func.func @fold_not_readable(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                             %r: !torch.vtensor<[32,4],f32> {autosp.parameter = "router"},
                             %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[?,4],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int4 = torch.constant.int 4
  %int6 = torch.constant.int 6
  %int32 = torch.constant.int 32
  %false = torch.constant.bool false
  %none = torch.constant.none
  %cpu = torch.constant.device "cpu"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %l = torch.prim.ListConstruct %int-1, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
  %x = torch.aten.view %e, %l : !torch.vtensor<[2,?,32],f32>, !torch.list<int> -> !torch.vtensor<[?,32],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (s0 * 2, 32)> : !torch.vtensor<[?,32],f32>
  %y = torch.aten.mm %x, %r : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,4],f32> -> !torch.vtensor<[?,4],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (s0 * 2, 4)> : !torch.vtensor<[?,4],f32>
  %n = torch.aten.size.int %y, %int0 : !torch.vtensor<[?,4],f32>, !torch.int -> !torch.int
  %pos = torch.aten.arange.start_step %int0, %n, %int1, %int6, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],f32>
  torch.bind_symbolic_shape %pos, [%s], affine_map<()[s0] -> (s0 * 2)> : !torch.vtensor<[?],f32>
  %u = torch.aten.unsqueeze %pos, %int1 : !torch.vtensor<[?],f32>, !torch.int -> !torch.vtensor<[?,1],f32>
  torch.bind_symbolic_shape %u, [%s], affine_map<()[s0] -> (s0 * 2, 1)> : !torch.vtensor<[?,1],f32>
  // expected-error@+1 {{in an order autosp cannot read from the IR}}
  %z = torch.aten.mul.Tensor %y, %u : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,1],f32> -> !torch.vtensor<[?,4],f32>
  torch.bind_symbolic_shape %z, [%s], affine_map<()[s0] -> (s0 * 2, 4)> : !torch.vtensor<[?,4],f32>
  return %z : !torch.vtensor<[?,4],f32>
}

// -----

// A centred convolution (kernel 4, padding 1) reads positions after t too: no halo on the
// left alone makes it local, so it is refused, naming the padding.
func.func @centred_conv_refused(%w: !torch.vtensor<[64,8],f32> {autosp.parameter = "w"},
                      %cw: !torch.vtensor<[8,1,4],f32> {autosp.parameter = "conv.weight"},
                      %cb: !torch.vtensor<[8],f32> {autosp.parameter = "conv.bias"},
                      %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,8,?],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int8 = torch.constant.int 8
  %intP = torch.constant.int 1
  %false = torch.constant.bool false
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,8],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,8],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 8)> : !torch.vtensor<[2,?,8],f32>
  %x = torch.aten.transpose.int %e, %int1, %int2 : !torch.vtensor<[2,?,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,8,?],f32>
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, 8, s0)> : !torch.vtensor<[2,8,?],f32>
  %n = torch.aten.size.int %x, %int2 : !torch.vtensor<[2,8,?],f32>, !torch.int -> !torch.int
  %stride = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %intP : (!torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %opad = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  // expected-error@+1 {{'torch.aten.convolution' op convolves along the sequence dimension (2) but is not a causal convolution autosp can split with a halo: padding [1] is not kernel - 1 = 3}}
  %y = torch.aten.convolution %x, %cw, %cb, %stride, %pad, %dil, %false, %opad, %int8 : !torch.vtensor<[2,8,?],f32>, !torch.vtensor<[8,1,4],f32>, !torch.vtensor<[8],f32>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,8,?],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (2, 8, s0 - 1)> : !torch.vtensor<[2,8,?],f32>
  %z = torch.aten.slice.Tensor %y, %int2, %none, %n, %int1 : !torch.vtensor<[2,8,?],f32>, !torch.int, !torch.none, !torch.int, !torch.int -> !torch.vtensor<[2,8,?],f32>
  torch.bind_symbolic_shape %z, [%s], affine_map<()[s0] -> (2, 8, s0)> : !torch.vtensor<[2,8,?],f32>
  return %z : !torch.vtensor<[2,8,?],f32>
}

// -----

// masked_scatter of a source that is itself sequence-sharded: each rank would need other
// ranks' source elements; refused.
func.func @masked_scatter_sharded_source(%w: !torch.vtensor<[64,8],f32> {autosp.parameter = "w"},
                                         %ids: !torch.vtensor<[1,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[1,?,8],f32> {
  %int-1 = torch.constant.int -1
  %int60 = torch.constant.int 60
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (1, s0)> : !torch.vtensor<[1,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,8],f32>, !torch.vtensor<[1,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[1,?,8],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (1, s0, 8)> : !torch.vtensor<[1,?,8],f32>
  %is = torch.aten.eq.Scalar %ids, %int60 : !torch.vtensor<[1,?],si64>, !torch.int -> !torch.vtensor<[1,?],i1>
  torch.bind_symbolic_shape %is, [%s], affine_map<()[s0] -> (1, s0)> : !torch.vtensor<[1,?],i1>
  %u = torch.aten.unsqueeze %is, %int-1 : !torch.vtensor<[1,?],i1>, !torch.int -> !torch.vtensor<[1,?,1],i1>
  torch.bind_symbolic_shape %u, [%s], affine_map<()[s0] -> (1, s0, 1)> : !torch.vtensor<[1,?,1],i1>
  // expected-error@+1 {{'torch.aten.masked_scatter' op scatters a source that is itself sequence-sharded}}
  %m = torch.aten.masked_scatter %e, %u, %e : !torch.vtensor<[1,?,8],f32>, !torch.vtensor<[1,?,1],i1>, !torch.vtensor<[1,?,8],f32> -> !torch.vtensor<[1,?,8],f32>
  torch.bind_symbolic_shape %m, [%s], affine_map<()[s0] -> (1, s0, 8)> : !torch.vtensor<[1,?,8],f32>
  return %m : !torch.vtensor<[1,?,8],f32>
}

// -----

// A boolean mask at the sequence dim selects a number of positions that depends on the data.
func.func @select_by_mask(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                          %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                          %keep: !torch.vtensor<[4],i1> {autosp.input = "args[1]"})
    -> !torch.vtensor<[2,32],f32> {
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %none = torch.constant.none
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %idx = torch.prim.ListConstruct %none, %keep : (!torch.none, !torch.vtensor<[4],i1>) -> !torch.list<optional<vtensor>>
  // expected-error@+1 {{'torch.aten.index.Tensor' op selects positions of the sequence by positions !torch.vtensor<[4],i1> that are not an integer tensor}}
  %x = torch.aten.index.Tensor %e, %idx : !torch.vtensor<[2,?,32],f32>, !torch.list<optional<vtensor>> -> !torch.vtensor<[2,32],f32>
  return %x : !torch.vtensor<[2,32],f32>
}

// -----

// A buffer written with this rank's positions (autosp.buffer_writes: the leading result is a
// buffer's new value; the pass reads how many, not which argument): each rank would keep a
// different value.
func.func @buffer_write_sharded(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> attributes {autosp.buffer_writes = [2]} {
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  // expected-error@+1 {{writes a buffer (result 0) with a value that is}}
  return %e : !torch.vtensor<[2,?,32],f32>
}

// -----

// A size from max(S, 4) (torch.sym_max, imported as prim.max.int) has no affine binding:
// a tensor of that length added to the sequence cannot be cut to each rank's part.
func.func @unbound_size_meets_the_sequence(%w: !torch.vtensor<[64,32],f32> {autosp.parameter = "w"},
                                           %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,32],f32> {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int4 = torch.constant.int 4
  %int6 = torch.constant.int 6
  %false = torch.constant.bool false
  %none = torch.constant.none
  %cpu = torch.constant.device "cpu"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %ids, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  %e = torch.aten.embedding %w, %ids, %int-1, %false, %false : !torch.vtensor<[64,32],f32>, !torch.vtensor<[2,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %e, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  %n = torch.aten.size.int %ids, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  %m = torch.prim.max.int %n, %int4 : !torch.int, !torch.int -> !torch.int
  %r = torch.aten.arange.start_step %int0, %m, %int1, %int6, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[?],f32>
  %c = torch.aten.unsqueeze %r, %int1 : !torch.vtensor<[?],f32>, !torch.int -> !torch.vtensor<[?,1],f32>
  // expected-error@+1 {{'torch.aten.add.Tensor' op pairs the sequence (dim 1 of its result) with dim 0 of an operand !torch.vtensor<[?,1],f32> whose dynamic size autosp cannot relate to the sequence length}}
  %y = torch.aten.add.Tensor %e, %c, %int1 : !torch.vtensor<[2,?,32],f32>, !torch.vtensor<[?,1],f32>, !torch.int -> !torch.vtensor<[2,?,32],f32>
  torch.bind_symbolic_shape %y, [%s], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>
  return %y : !torch.vtensor<[2,?,32],f32>
}
