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
  // Sequence-sharded <-> head-sharded exchange (Ulysses): split `split_dim` into P parts,
  // send part i to rank i, concatenate what arrives along `concat_dim`. `seq_dim` says
  // which of the two is the sequence (-1: neither); that side is cut in the uneven
  // sequence chunks of the full length `seq_len` (needed when it is the concat side).
  irdl.operation @all_to_all {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %split = irdl.base "#builtin.integer"
    %concat = irdl.base "#builtin.integer"
    %seq = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor, seq_len: optional %int)
    irdl.results(output: %result)
    irdl.attributes { "split_dim" = %split, "concat_dim" = %concat, "seq_dim" = %seq, "group" = %group }
  }
  // Concatenate every rank's part along `dim`. With `seq_len`, the parts are the uneven
  // pieces of the window [lo, seq_len - trim) of the sequence. Result: replicated.
  irdl.operation @all_gather {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %dim = irdl.base "#builtin.integer"
    %lo = irdl.base "#builtin.integer"
    %trim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor, seq_len: optional %int)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "lo" = %lo, "trim" = %trim, "group" = %group }
  }
  // Element-wise reduction over the group; every rank gets the (replicated) result.
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
  // Reduce over the group, then keep this rank's equal chunk along `dim`.
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
  // Replicated -> sharded without communication. The input holds the window
  // [lo, seq_len - trim) of the sequence along `dim`; keep this rank's part of it.
  irdl.operation @shard {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %dim = irdl.base "#builtin.integer"
    %lo = irdl.base "#builtin.integer"
    %trim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor, seq_len: %int)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "lo" = %lo, "trim" = %trim, "group" = %group }
  }
  // A replicated value every rank computes whole from the parameters (a vision tower's
  // output), where it meets the objective: identity forward, 1/P of the gradient
  // backward, so the ranks' parameter gradients sum to one device's.
  irdl.operation @grad_share {
    %tensor = irdl.base "!torch.vtensor"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %tensor)
    irdl.attributes { "group" = %group }
  }
  // masked_scatter(input, mask, source) with input and mask sharded on the window
  // (lo, trim) along `dim` and the source replicated: each rank fills its true positions
  // with the source elements their places in the whole mask's order take.
  irdl.operation @masked_scatter {
    %tensor = irdl.base "!torch.vtensor"
    %bools = irdl.base "!torch.vtensor"
    %values = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %dim = irdl.base "#builtin.integer"
    %lo = irdl.base "#builtin.integer"
    %trim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor, mask: %bools, source: %values, seq_len: %int)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "lo" = %lo, "trim" = %trim, "group" = %group }
  }
  // A sharded value on the window (lo, trim) along `dim` with the `width` positions
  // before this rank's part prepended (zeros before the window): the input of a causal
  // convolution of kernel width + 1, run without padding (autosp-shard-sequence).
  // local_heads(input): this rank's block of `heads` heads along `dim` (or batch x heads
  // folded there) of a replicated per-head tensor mixed into Ulysses attention (a position
  // bias); no communication.
  irdl.operation @local_heads {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %dim = irdl.base "#builtin.integer"
    %heads = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "heads" = %heads, "group" = %group }
  }
  irdl.operation @halo {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %dim = irdl.base "#builtin.integer"
    %width = irdl.base "#builtin.integer"
    %lo = irdl.base "#builtin.integer"
    %trim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor, seq_len: %int)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "width" = %width, "lo" = %lo, "trim" = %trim, "group" = %group }
  }
  // A sharded value on the window (lo, trim), narrowed to the window (new_lo, new_trim)
  // inside it: a sequence slice (labels[:, 1:], logits[:, :-1]) without communication.
  irdl.operation @rewindow {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %dim = irdl.base "#builtin.integer"
    %lo = irdl.base "#builtin.integer"
    %trim = irdl.base "#builtin.integer"
    %new_lo = irdl.base "#builtin.integer"
    %new_trim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor, seq_len: %int)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "lo" = %lo, "trim" = %trim, "new_lo" = %new_lo, "new_trim" = %new_trim,
                      "group" = %group }
  }
  // The LM head's log-probability of each row's label, computed in chunks of `chunk`
  // rows (0: chosen at run time): log_softmax(steps(hidden @ weight))[row, index[row]].
  // `steps`: the element-wise ops between the head and the log-softmax ("cast(f32)",
  // "div(30.0) tanh mul(30.0)"); `softmax_dtype`: log_softmax's dtype ("" for none).
  // hidden: [N, H], weight: [H, V], index: [N, 1] -> [N, 1]. No [N, V] tensor lives whole.
  irdl.operation @vocab_logprob {
    %tensor = irdl.base "!torch.vtensor"
    %weight = irdl.base "!torch.vtensor"
    %index = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %chunk = irdl.base "#builtin.integer"
    %steps = irdl.base "#builtin.string"
    %dtype = irdl.base "#builtin.string"
    irdl.operands(hidden: %tensor, weight: %weight, index: %index)
    irdl.results(output: %result)
    irdl.attributes { "chunk" = %chunk, "steps" = %steps, "softmax_dtype" = %dtype }
  }
  // Ring attention (``autosp-partition-attention`` with ring degree > 1): softmax
  // attention over the whole sequence while q, k and v stay sequence-sharded on `group`
  // (a ring of R ranks, each holding its pieces of the sequence in the layout of the
  // module's `autosp.sp_layout`). K/V blocks travel the ring (R - 1 send/recv hops,
  // overlapped with the attention of the block at hand); the per-block results are merged
  // with their log-sum-exp, exactly; the backward runs the ring again and the dK/dV
  // accumulators travel home with their blocks. Keys and values keep their own (KV)
  // head count: GQA/MQA heads are never repeated. Masks, in absolute positions i (query)
  // and j (key): `is_causal` (j <= i), `window` (i - j < window; 0: none), and with the
  // optional `mask` ([B, 1, 1, S], replicated): document ids, doc[i] == doc[j], or with
  // `key_padding` = 1 a boolean key padding, mask[j] (a query that sees no key gets
  // zeros). `scale` 0.0: 1/sqrt(D). The optional `sink_logits` are the [H] sinks
  // (gpt-oss): exp(sinks[h]) joins every row's softmax denominator once, after the
  // blocks are merged (the op's `autosp.sink_heads`, inside Ulysses: the group whose rank
  // picks this rank's chunk of them).
  irdl.operation @ring_attention {
    %query = irdl.base "!torch.vtensor"
    %kv = irdl.base "!torch.vtensor"
    %value = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %ids = irdl.base "!torch.vtensor"
    %causal = irdl.base "#builtin.integer"
    %window = irdl.base "#builtin.integer"
    %scale = irdl.base "#builtin.float"
    %group = irdl.base "#builtin.string"
    %padding = irdl.base "#builtin.integer"
    %logits = irdl.base "!torch.vtensor"
    %bias = irdl.base "!torch.vtensor"
    irdl.operands(query: %query, key: %kv, value: %value, seq_len: %int, mask: optional %ids,
                  sink_logits: optional %logits, key_bias: optional %bias)
    irdl.results(output: %result)
    irdl.attributes { "is_causal" = %causal, "window" = %window, "scale" = %scale, "group" = %group,
                      "key_padding" = %padding }
  }
  // How many positions of the window [lo, seq_len - trim) this rank holds.
  irdl.operation @local_len {
    %int = irdl.base "!torch.int"
    %lo = irdl.base "#builtin.integer"
    %trim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(seq_len: %int)
    irdl.results(output: %int)
    irdl.attributes { "lo" = %lo, "trim" = %trim, "group" = %group }
  }
  // Positions of the window [lo, seq_len - trim) of the sequence (index j: frame position
  // lo + j; negative j from the window's end), replicated, -> this rank's local row of
  // each, or its local length (one past its rows) where another rank holds it. With the
  // sharded value padded by one zero row along the sequence, an index/gather/select by
  // these positions gives this rank's rows and zeros elsewhere: summed over the group
  // (autosp.all_reduce), the rows one device selects. Out-of-window positions raise.
  irdl.operation @local_positions {
    %tensor = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %lo = irdl.base "#builtin.integer"
    %trim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(positions: %tensor, seq_len: %int)
    irdl.results(output: %tensor)
    irdl.attributes { "lo" = %lo, "trim" = %trim, "group" = %group }
  }
  // softmax (log = 0) or log_softmax (log = 1) along the sharded sequence dim `dim`, over
  // the whole sequence of the group: a max all-reduce, then a sum of exponentials; the
  // backward all-reduces its one sum over the sequence. Sharded -> sharded, same window.
  // `dtype`: the op's dtype argument as an element type ("f32"), "" for none.
  irdl.operation @softmax {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %dim = irdl.base "#builtin.integer"
    %log = irdl.base "#builtin.integer"
    %dtype = irdl.base "#builtin.string"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "log" = %log, "dtype" = %dtype, "group" = %group }
  }
  // logsumexp / amax (keepdim) of a sharded value along its sequence dim `dim`, over the
  // group: replicated. Backward local: each rank's positions take their share of the
  // replicated gradient (amax splits a tie over the tied positions of every rank).
  irdl.operation @logsumexp {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %dim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "group" = %group }
  }
  irdl.operation @amax {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %dim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "group" = %group }
  }
  // argmax (keepdim) of a sharded value along its sequence dim `dim` over the group: the
  // first position (index j of the window [lo, seq_len - trim)) of the largest value,
  // replicated, int64. The ranks' (value, position) pairs are gathered.
  irdl.operation @argmax {
    %tensor = irdl.base "!torch.vtensor"
    %result = irdl.base "!torch.vtensor"
    %int = irdl.base "!torch.int"
    %dim = irdl.base "#builtin.integer"
    %lo = irdl.base "#builtin.integer"
    %trim = irdl.base "#builtin.integer"
    %group = irdl.base "#builtin.string"
    irdl.operands(input: %tensor, seq_len: %int)
    irdl.results(output: %result)
    irdl.attributes { "dim" = %dim, "lo" = %lo, "trim" = %trim, "group" = %group }
  }
}
}
