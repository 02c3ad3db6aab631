// RUN: autosp-opt %s --split-input-file --verify-diagnostics

func.func @split_dim_not_integer(%arg0: !torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32> {
  // expected-error@+1 {{expected base attribute 'builtin.integer' but got 'builtin.string'}}
  %0 = "autosp.all_to_all"(%arg0) {split_dim = "x", concat_dim = 2 : i64, seq_dim = -1 : i64, group = "sp"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
  return %0 : !torch.vtensor<[2,1,?,8],f32>
}

// -----

func.func @group_not_string(%arg0: !torch.vtensor<[2,4],f32>, %s: !torch.int) -> !torch.vtensor<[2,1],f32> {
  // expected-error@+1 {{expected base attribute 'builtin.string' but got 'builtin.integer'}}
  %0 = "autosp.shard"(%arg0, %s) {dim = 1 : i64, lo = 0 : i64, trim = 0 : i64, group = 0 : i64} : (!torch.vtensor<[2,4],f32>, !torch.int) -> !torch.vtensor<[2,1],f32>
  return %0 : !torch.vtensor<[2,1],f32>
}

// -----

func.func @reduce_op_prod(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // expected-error@+1 {{'"prod"' does not satisfy the constraint}}
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "prod", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

func.func @reduce_scatter_reduce_op(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[1],f32> {
  // expected-error@+1 {{'"avg"' does not satisfy the constraint}}
  %0 = "autosp.reduce_scatter"(%arg0) {dim = 0 : i64, reduce_op = "avg", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[1],f32>
  return %0 : !torch.vtensor<[1],f32>
}

// -----

func.func @missing_group(%arg0: !torch.vtensor<[2,1],f32>) -> !torch.vtensor<[2,4],f32> {
  // expected-error@+1 {{'autosp.all_gather' op attribute "group" is expected but not provided}}
  %0 = "autosp.all_gather"(%arg0) {dim = 1 : i64, lo = 0 : i64, trim = 0 : i64} : (!torch.vtensor<[2,1],f32>) -> !torch.vtensor<[2,4],f32>
  return %0 : !torch.vtensor<[2,4],f32>
}

// -----

func.func @operand_not_vtensor() -> !torch.vtensor<[2],f32> {
  %int1 = torch.constant.int 1
  // expected-error@+1 {{expected base type 'torch.vtensor' but got 'torch.int'}}
  %0 = "autosp.shard"(%int1, %int1) {dim = 0 : i64, lo = 0 : i64, trim = 0 : i64, group = "sp"} : (!torch.int, !torch.int) -> !torch.vtensor<[2],f32>
  return %0 : !torch.vtensor<[2],f32>
}

// -----

func.func @result_not_vtensor(%arg0: !torch.vtensor<[2,4],f32>, %s: !torch.int) -> !torch.tensor<[2,1],f32> {
  // expected-error@+1 {{expected base type 'torch.vtensor' but got 'torch.tensor'}}
  %0 = "autosp.shard"(%arg0, %s) {dim = 1 : i64, lo = 0 : i64, trim = 0 : i64, group = "sp"} : (!torch.vtensor<[2,4],f32>, !torch.int) -> !torch.tensor<[2,1],f32>
  return %0 : !torch.tensor<[2,1],f32>
}

// -----

// all_reduce keeps the type: the result must equal the operand.
func.func @all_reduce_type_change(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[2],f32> {
  // expected-error@+1 {{expected '!torch.vtensor<[4],f32>' but got '!torch.vtensor<[2],f32>'}}
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "sum", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[2],f32>
  return %0 : !torch.vtensor<[2],f32>
}

// -----

func.func @two_operands(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // expected-error@+1 {{expects exactly 1 operands, but got 2}}
  %0 = "autosp.all_reduce"(%arg0, %arg0) {reduce_op = "sum", group = "sp"} : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

func.func @local_len_of_a_tensor(%arg0: !torch.vtensor<[4],f32>) -> !torch.int {
  // expected-error@+1 {{expected base type 'torch.int' but got 'torch.vtensor'}}
  %0 = "autosp.local_len"(%arg0) {lo = 0 : i64, trim = 0 : i64, group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.int
  return %0 : !torch.int
}

// -----

func.func @shard_needs_the_sequence_length(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[2],f32> {
  // expected-error@+1 {{op expects exactly 2 operands, but got 1}}
  %0 = "autosp.shard"(%arg0) {dim = 0 : i64, lo = 0 : i64, trim = 0 : i64, group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[2],f32>
  return %0 : !torch.vtensor<[2],f32>
}
