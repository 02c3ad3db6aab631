"""What the importer produces: arguments, symbolic shapes, kept ops, and clear errors."""
import re

import pytest
import torch

import autosp
from autosp.ir.diagnostics import AutospError
from autosp.models import GPT2Config, GPT2Like, LlamaConfig, LlamaLike


@pytest.fixture(scope="module")
def llama_import():
    model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2))
    ids = torch.randint(0, 64, (2, 16))
    return model, autosp.import_model(model, ids, labels=ids)


def test_parameters_and_buffers_are_arguments_tied_weight_once(llama_import):
    model, imported = llama_import
    params = [a.name for a in imported.args if a.kind == "parameter"]
    buffers = [a.name for a in imported.args if a.kind == "buffer"]
    assert params == [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in params and "embed.weight" in params  # tied: once
    assert buffers == ["rope.inv_freq"]  # non-persistent buffer
    inputs = [(a.name, a.seq_dim) for a in imported.args if a.kind == "input"]
    assert inputs == [("args[0]", 1), ("kwargs['labels']", 1)]
    text = str(imported.module)
    assert '{autosp.parameter = "embed.weight"}' in text
    assert '{autosp.buffer = "rope.inv_freq"}' in text
    assert '{autosp.input = "args[0]", autosp.seq_dim = 1 : i64}' in text
    assert "dense_resource" not in text, "weights must be arguments, not literals"


def test_sequence_is_symbolic_and_sdpa_kept(llama_import):
    _, imported = llama_import
    text = str(imported.module)
    assert len(re.findall(r"torch\.symbolic_int", text)) == 1
    assert text.count("torch.bind_symbolic_shape") > 50
    assert "!torch.vtensor<[2,?],si64>" in text
    assert text.count("torch.aten.scaled_dot_product_attention") == 2  # one per layer
    assert "torch.aten.bmm" not in text


def test_manual_attention_keeps_softmax():
    model = GPT2Like(GPT2Config(vocab=64, hidden=32, layers=1, heads=4))
    ids = torch.randint(0, 64, (2, 12))
    text = str(autosp.import_model(model, ids).module)
    assert "torch.aten._softmax" in text or "torch.aten.softmax.int" in text
    assert "torch.aten.amax" not in text  # softmax not decomposed
    assert '{autosp.buffer = "blocks.0.attn.bias"}' in text  # the causal-mask buffer is an argument


def test_floor_division_of_the_sequence_length_imports():
    class Halves(torch.nn.Module):
        def forward(self, x):
            s = x.shape[1]
            return x[:, : s // 2] * 2 + x[:, s - s // 2:]

    x = torch.randn(2, 10, 4)
    imported = autosp.import_model(Halves(), x)
    assert "floordiv 2" in str(imported.module)


def test_static_import_when_seq_dim_is_none():
    imported = autosp.import_model(torch.nn.Linear(4, 4), torch.randn(3, 4), seq_dim=None)
    assert "torch.symbolic_int" not in str(imported.module)
    assert imported.seq_len is None


def test_buffer_writes_are_results_written_back():
    """BatchNorm's running statistics in train mode: before, refused; now the new values are
    the program's leading results (``autosp.buffer_writes``) and the call writes them back."""
    import copy
    bn = torch.nn.BatchNorm1d(4).train()
    imported = autosp.import_model(bn, torch.randn(8, 4), seq_dim=None)
    assert "autosp.buffer_writes" in str(imported.module)
    reference = copy.deepcopy(bn)
    sp = autosp.compile(bn, sp_size=1, seq_dim=2)
    for _ in range(2):
        x = torch.randn(2, 4, 10)
        torch.testing.assert_close(sp(x), reference(x))
    for name, buf in reference.named_buffers():
        torch.testing.assert_close(bn.get_buffer(name), buf, msg=name)


def test_untraceable_model_gives_a_clear_error():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    with pytest.raises(AutospError, match="torch.export could not trace the model"):
        autosp.import_model(DataDependent(), torch.randn(2, 8, 4))


def test_import_timings_recorded(llama_import):
    _, imported = llama_import
    phases = {"export_s", "import_s", "import_cached"}
    # a traced import also says which decomposition ran (autosp/frontend/decompose.py): the retrace
    assert set(imported.timings) == (phases if imported.timings["import_cached"] else phases | {"import_fallback"})
    assert imported.timings.get("import_fallback", 0.0) == 0.0


def test_an_exported_program_seen_before_is_imported_from_the_cache(monkeypatch, tmp_path):
    """A second model of one architecture exports to the same program: its import comes from
    the cache (same MLIR, source locations included) and is a copy, so passes run on one
    import do not reach the next. Another batch size or another decomposition table is
    imported afresh. With AUTOSP_CACHE_DIR, a new process (here: an
    emptied memory cache) reads the import from disk; an unreadable entry is a miss."""
    from autosp.frontend import cache, importer
    from autosp.pipeline import run_pipeline
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path))
    cache.clear_memory()
    cfg = LlamaConfig(vocab=64, hidden=32, layers=1, heads=4, kv_heads=2)
    ids = torch.randint(0, 64, (2, 12))
    first = autosp.import_model(LlamaLike(cfg), ids, labels=ids)
    twin = autosp.import_model(LlamaLike(cfg), ids, labels=ids)
    assert twin.timings["import_cached"] == 1.0 and first.timings["import_cached"] == 0.0
    asm = first.module.get_asm(enable_debug_info=True)
    assert twin.module.get_asm(enable_debug_info=True) == asm and "modeling" not in asm
    assert "models.py" in asm  # source locations survive the cache
    run_pipeline(twin.module, "builtin.module(autosp-sp-pipeline{sp-size=2})")
    assert "autosp.all_to_all" in str(twin.module)
    third = autosp.import_model(LlamaLike(cfg), ids, labels=ids)
    assert third.timings["import_cached"] == 1.0 and str(third.module) == str(first.module)

    cache.clear_memory()
    from_disk = autosp.import_model(LlamaLike(cfg), ids, labels=ids)
    assert from_disk.timings["import_cached"] == 1.0
    assert from_disk.module.get_asm(enable_debug_info=True) == asm
    entries = list(tmp_path.glob("*.mlirbc"))
    assert len(entries) == 1
    entries[0].write_bytes(b"not bytecode")
    cache.clear_memory()
    assert cache.lookup(entries[0].stem) is None

    misses = {"batch": autosp.import_model(LlamaLike(cfg), ids[:1], labels=ids[:1])}
    original = importer._KEEP_WHOLE
    try:
        importer._KEEP_WHOLE = tuple(k for k in original if k != "silu")
        misses["table"] = autosp.import_model(LlamaLike(cfg), ids, labels=ids)
    finally:
        importer._KEEP_WHOLE = original
    assert {k: m.timings["import_cached"] for k, m in misses.items()} == dict.fromkeys(misses, 0.0)
    assert "torch.aten.silu" in str(first.module) and "torch.aten.silu" not in str(misses["table"].module)


class _SizeMax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        n = torch.sym_max(x.shape[1] / 2, 4.0)  # the line the error must name (a float max: no handler)
        return (x @ self.w).sum() * n


class _SizeMaxMin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        n, m = max(x.shape[1], 4), min(x.shape[1], 64)  # (torch.sym_max / torch.sym_min under export)
        return (x @ self.w).new_ones(n).sum() / m + (x @ self.w).sum()


def test_integer_max_and_min_of_sizes_import_as_prim_ops():
    """``max``/``min`` of int sizes (MPT's ALiBi, windows) import as ``torch.prim.max.int`` /
    ``torch.prim.min.int``; a tensor sized by one gets no shape binding (affine maps hold
    no max), so the sequence analysis never takes it for the sequence."""
    x = torch.randn(2, 16, 8)
    model = _SizeMaxMin()
    imported = autosp.import_model(model, x)
    text = str(imported.module)
    assert "torch.prim.max.int" in text and "torch.prim.min.int" in text, text
    assert "Max(" not in text and "max(" not in text.replace("prim.max", ""), text
    for s in (16, 3, 100):  # one program for S under 4, between, over 64: the round trip runs them
        y = torch.randn(2, s, 8)
        out = autosp.emit_graph_module(imported.module)(*model.parameters(), y)
        out = out[0] if isinstance(out, (tuple, list)) else out
        assert torch.allclose(out, model(y)), s


class _LoopOverPositions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 8)

    def forward(self, ids):
        x = self.emb(ids)
        h, outs = torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):  # the line the error must name
            h = 0.9 * h + x[:, t]
            outs.append(h)
        return torch.stack(outs, 1)


def test_a_loop_over_the_sequence_is_named_with_its_source_line():
    """A Python loop over the positions fixes S to the example's value (torch.export:
    "Constraints violated ... specialized it to be a constant"); the error names the
    model's line that did it (found by exporting once more with the specialization's
    stack recorded) and what to do."""
    import inspect
    with pytest.raises(AutospError) as caught:
        autosp.import_model(_LoopOverPositions(), torch.randint(0, 32, (2, 15)))
    text = str(caught.value)
    line = inspect.getsourcelines(_LoopOverPositions.forward)[1] + 3
    assert f"fixes the sequence length to the example's value at {__file__}:{line}: for t in range(" in text, text
    assert "Constraints violated" in text, text  # torch.export's own words follow


def test_an_import_failure_is_one_error_naming_the_op_the_line_and_what_to_do():
    """torch-mlir's importer has no handler for ``sym_max`` of floats: the failure is one
    AutospError naming the op, the model's own source line, the original message and a
    workaround, with the whole trace in a file (not "Failure while executing pass
    pipeline" with empty diagnostics)."""
    import inspect
    with pytest.raises(AutospError) as caught:
        autosp.import_model(_SizeMax(), torch.randn(2, 16, 8))
    text = str(caught.value)
    line = inspect.getsourcelines(_SizeMax.forward)[1] + 1
    assert f"torch.sym_max (a function of sizes) (at {__file__}:{line})" in text, text
    assert "Unimplemented call_function" in text and "what to do: compute that size" in text, text
    trace = re.search(r"the whole message and trace: (\S+)\)", text).group(1)
    assert "sym_max" in open(trace).read()


def test_ops_torch_mlir_has_no_op_for_stay_one_opaque_op():
    """``aten.histc`` (Mixtral's experts and aux loss) imports as one ``torch.operator``
    (outlined around torch-mlir's pipeline, which refuses every torch.operator), and the
    emitted program runs it as ATen: the round trip is exact."""
    class Counts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 4))

        def forward(self, x):
            y = (x @ self.w).softmax(-1)
            return torch.histc(y.argmax(-1).float(), bins=4, min=0, max=3) * y.sum()
    model, x = Counts(), torch.randn(2, 16, 8)
    imported = autosp.import_model(model, x)
    assert 'torch.operator "torch.aten.histc"' in str(imported.module)
    assert "autosp_opaque" not in str(imported.module)
    gm = autosp.emit_graph_module(imported.module)
    out = gm(*[p for p in model.parameters()], x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert torch.equal(out, model(x))


def test_a_length_the_decomposition_pins_is_named_with_the_config_field(monkeypatch):
    """MPT called at exactly its max_seq_len: the export keeps S symbolic, but torch's
    ``run_decompositions`` pins it to the constant (ALiBi's slice start max_seq_len - S is
    0). The import names the config field and what to do, not the pipeline's later "no
    sequence axis ... import with a dynamic sequence length". Control: one shorter imports
    with a symbolic S. (autosp's own retrace does not pin it: see the next test; this one
    takes torch's path, which autosp falls back to.)"""
    transformers = pytest.importorskip("transformers")
    from autosp.frontend.decompose import DECOMPOSE_ENV
    from autosp.frontend.importer import import_model
    from autosp.ir.diagnostics import AutospError
    monkeypatch.setenv(DECOMPOSE_ENV, "aot")
    torch.manual_seed(0)
    cfg = transformers.MptConfig(vocab_size=64, d_model=16, n_heads=2, n_layers=1, max_seq_len=24, expansion_ratio=2,
                                 use_cache=False)
    model = transformers.MptForCausalLM(cfg)
    ids = torch.randint(0, 64, (1, 24))
    with pytest.raises(AutospError, match=r"became the constant 24.*max_seq_len = 24.*another length \(e\.g\. 23\)"):
        import_model(model, input_ids=ids, labels=ids)
    ids = ids[:, :23]
    assert "torch.symbolic_int" in str(import_model(model, input_ids=ids, labels=ids).module)


def _decomposed_program(model, *args, **kwargs):
    """``import_model``'s exported program and its decomposition (:mod:`autosp.frontend.decompose`)."""
    from autosp.frontend import importer
    from autosp.frontend.decompose import decompose
    seen: dict = {}
    original = importer._decompose_and_import

    def spy(program, table, ctx, timings=None):
        seen["program"], seen["table"] = program, table
        return original(program, table, ctx, timings)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(importer, "_decompose_and_import", spy)
        m.setattr(importer.cache, "lookup", lambda key, context: None)  # (an import seen before: trace it again)
        importer.import_model(model, *args, **kwargs)
    return seen["program"], decompose(seen["program"], seen["table"])


def test_the_retrace_keeps_mpt_symbolic_at_its_max_length_and_matches_eager():
    """The case torch's ``run_decompositions`` pins (the test above): autosp's one retrace
    under the export's fake mode keeps S symbolic, and the decomposed program, traced at
    S = max_seq_len, computes eager's loss and logits at that length and two shorter ones.
    Control: the program fed another model's weights differs."""
    transformers = pytest.importorskip("transformers")
    from autosp.frontend.decompose import DECOMPOSED_BY
    from autosp.frontend.importer import model_state
    cfg = transformers.MptConfig(vocab_size=64, d_model=16, n_heads=2, n_layers=1, max_seq_len=24, expansion_ratio=2,
                                 use_cache=False)
    model = transformers.MptForCausalLM(cfg)
    ids = torch.randint(0, 64, (1, 24))
    _, decomposed = _decomposed_program(model, input_ids=ids, labels=ids)
    assert decomposed.graph_module.meta[DECOMPOSED_BY] == "retrace"
    assert [str(r) for r in decomposed.range_constraints.values()] == ["VR[2, int_oo]"]
    state = model_state(model)[2]
    other = model_state(transformers.MptForCausalLM(cfg))[2]
    for seq in (24, 23, 9):
        x = torch.randint(0, 64, (1, seq))
        loss, logits = decomposed.graph_module(*state, x, x)
        expected = model(input_ids=x, labels=x)
        assert torch.allclose(loss, expected.loss, atol=1e-6) and torch.allclose(logits, expected.logits, atol=1e-6)
        control, _ = decomposed.graph_module(*other, x, x)
        assert not torch.allclose(control, expected.loss, atol=1e-3)


def test_the_retrace_reads_sizes_from_the_inputs_and_matches_run_decompositions():
    """A tiny Llama: the retrace keeps SDPA whole, reads every size from the first input
    that has it (no size read off a computed tensor, no alias left), has the same ops as
    ``run_decompositions`` but for size arithmetic, and computes the same loss and
    logits at two lengths. Controls: a retrace that raises, or whose graph writes to a
    tensor, gives way to ``run_decompositions``."""
    import collections

    from autosp.frontend import decompose as dec
    from autosp.frontend.importer import decomposition_table, model_state
    model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2))
    ids = torch.randint(0, 64, (2, 16))
    program, fast = _decomposed_program(model, ids, labels=ids)
    assert fast.graph_module.meta[dec.DECOMPOSED_BY] == "retrace"
    slow = program.run_decompositions(decomposition_table())

    def ops(p):  # (but size arithmetic: operator.mul and the like, sym_size)
        return collections.Counter(str(n.target) for n in p.graph.nodes if n.op == "call_function"
                                   and not str(n.target).startswith(("<built-in function", "aten.sym_size")))
    assert ops(fast) == ops(slow)
    sizes = [n for n in fast.graph.nodes if n.op == "call_function" and n.target in dec._SIZE_QUERIES]
    assert len(sizes) == 1 and sizes[0].args[0].op == "placeholder", [n.format_node() for n in sizes]
    assert "aten.alias" not in str(fast.graph) and "scaled_dot_product_attention" in str(fast.graph)
    state = model_state(model)[2]
    for seq in (16, 11):
        x = torch.randint(0, 64, (2, seq))
        got, want = fast.graph_module(*state, x, x), slow.graph_module(*state, x, x)
        assert len(got) == len(want) == 2 and all(torch.equal(a, b) for a, b in zip(got, want))

    # Controls: a retrace that fails, or that writes to a tensor, gives way to torch's path.
    def failing(program, table):
        raise RuntimeError("untraceable")

    def writing(program, table):
        out = dec._retrace(program, table)
        node = next(n for n in out.graph.nodes if n.target is torch.ops.aten.mm.default)
        node.target = torch.ops.aten.add_.Tensor
        return out
    for retrace in (failing, writing):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(dec, "_retrace", retrace)
            again = dec.decompose(program, decomposition_table())
        assert again.graph_module.meta[dec.DECOMPOSED_BY].startswith("run_decompositions: the "), retrace.__name__
        assert ops(again) == ops(slow)

