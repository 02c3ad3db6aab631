// The autosp dialect: collectives and layout changes on !torch.vtensor values.
//
// Every op names its process group by a string attribute (`group = "sp"`): the
// runtime maps names to process groups. Ops are written in MLIR's generic form,
// e.g.
//   %1 = "autosp.all_to_all"(%0) {split_dim = 1 : i64, concat_dim = 2 : i64, group = "sp"}
//          : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
//
// IRDL binds a constraint variable to one type per op, so ops whose result shape can
// differ from the input's use a separate `%result` variable; all_reduce shares one, so
// its result type must equal its operand type.
//
// Mentioning a torch type below makes torch-mlir-opt load the torch dialect before the
// IRDL verifier looks `!torch.vtensor` up by name (dialects are loaded lazily there).
module attributes {autosp.loads_torch = !torch.int} {
irdl.dialect @autosp {
  // Sequence-sharded <-> head-sharded exchange (Ulysses): split `split_dim` into P
  // chunks, send chunk i to rank i, concatenate what arrives along `concat_dim`.
  irdl.operation @all_to_all {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %split = irdl.base "#builtin.integer"
    %concat = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %result)
    irdl.attributes { "split_dim" = %split, "concat_dim" = %concat, "group" = %group }
  }
  // Concatenate every rank's tensor along `dim`.
  irdl.operation @all_gather {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %dim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "group" = %group }
  }
  // Element-wise reduction over the group; every rank gets the result.
  irdl.operation @all_reduce {
    %tensor = irdl.base "!torch.vtensor"
    %sum = irdl.is "sum"
    %max = irdl.is "max"
    %min = irdl.is "min"
    %reduce = irdl.any_of(%sum, %max, %min)
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %tensor)
    irdl.attributes { "reduce_op" = %reduce, "group" = %group }
  }
  // Reduce over the group, then keep this rank's chunk along `dim`.
  irdl.operation @reduce_scatter {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %dim = irdl.base "#builtin.integer"
    %sum = irdl.is "sum"
    %max = irdl.is "max"
    %min = irdl.is "min"
    %reduce = irdl.any_of(%sum, %max, %min)
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "reduce_op" = %reduce, "group" = %group }
  }
  // Replicated -> sharded without communication: keep this rank's chunk along `dim`.
  irdl.operation @shard {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %dim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "group" = %group }
  }
}
}
