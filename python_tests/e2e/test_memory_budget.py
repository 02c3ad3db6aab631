"""``memory_budget`` and its mechanisms: the tiled LM head + loss (``autosp-tile-loss``),
tiled token-wise blocks (``autosp-tile-tokens``), checkpoint offload, per-layer plans, and
the planner (parity against single-device eager; the budget measured)."""
import copy
import time
import warnings

import pytest
import torch

from autosp.testing.distributed import run_ranks

transformers = pytest.importorskip("transformers")

# Every mechanism at once: per-layer choices (offload on the first), 3 tiles, a 5-row loss chunk.
PLANS = {
    "llamalike": dict(layers=("full+offload", "sac"), tiles=3, loss_chunk=5, drop_logits=True),
    "hf_tied": dict(layers=("sac-min", "full+offload"), tiles=3, loss_chunk=5, drop_logits=True),
    "outside": dict(layers=("full", "sac"), tiles=4, loss_chunk=5),
}


def _model(which: str, seed: int):
    torch.manual_seed(seed)
    if which in ("llamalike", "outside"):
        from autosp.models import LlamaConfig, LlamaLike
        return LlamaLike(LlamaConfig(vocab=96, hidden=32, layers=2, heads=4, kv_heads=2, ffn=88)), 96
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=88, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).float(), 96


def _loss(which, model, ids, world_compiled: bool):
    if which == "outside":  # the user's own loss on returned (gathered) logits
        logits = model(ids)["logits"]
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                 ids[:, 1:].reshape(-1))
    if which == "hf_tied":
        return model(input_ids=ids, labels=ids, use_cache=False).loss
    return model(ids, labels=ids)["loss"]


def _parity(rank, world, queue, which, seed, seq, drop_chunk):
    import autosp
    from autosp.cost.plan import MemoryPlan
    from autosp.runtime import tiling
    from autosp.testing.parity import align_parameters, parameter_distance, relative_error
    model, vocab = _model(which, seed)
    ref = copy.deepcopy(model)
    original = tiling.vocab_logprob
    if drop_chunk:  # negative control: the loss's last chunk of rows never counts
        def dropped(h, weight_t, index, **kw):
            out = original(h, weight_t, index, **kw)
            keep = torch.ones_like(out)
            keep[-(kw.get("chunk") or 1):] = 0
            return out * keep
        tiling.vocab_logprob = dropped
    try:
        compiled = autosp.compile(model, memory_plan=MemoryPlan(**PLANS[which]),
                                  gather_outputs=which == "outside")
        opt, opt_ref = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.optim.AdamW(ref.parameters(), lr=1e-3)
        torch.manual_seed(seed + 1)
        losses, grads, params = [], [], []
        for _ in range(3):
            ids = torch.randint(0, vocab, (2, seq))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loss, loss_ref = _loss(which, compiled, ids, True), _loss(which, ref, ids, False)
            loss.backward()
            loss_ref.backward()
            mine = dict(model.named_parameters())
            grads.append(max(relative_error(mine[n].grad, p.grad) for n, p in ref.named_parameters()))
            losses.append(relative_error(loss.detach(), loss_ref.detach()))
            for o in (opt, opt_ref):
                o.step()
                o.zero_grad()
            params.append(parameter_distance(ref, model))
            align_parameters(model, ref)  # the next step's gradients at the same point (see its docstring)
        ir = compiled.programs[0].mlir["transformed"]
        queue.put((rank, dict(loss=max(losses), grad=max(grads), params=max(params),
                              fused=ir.count("autosp.vocab_logprob"), tiled="autosp.tiles" in ir,
                              offload="autosp.offload" in ir)))
    finally:
        tiling.vocab_logprob = original


@pytest.mark.parametrize("which,world,seq", [("llamalike", 2, 37), ("outside", 2, 36), ("hf_tied", 4, 38)])
def test_tiled_loss_and_blocks_match_single_device(which, world, seq, _fresh_seed):
    """3 AdamW steps of a plan using every mechanism, against eager on the full sequence
    (S not divisible by P; loss inside, tied embeddings, loss outside from returned logits):
    every loss, every step's gradients and parameters within 1e-5 (each step starts from the
    reference's parameters: ``align_parameters``)."""
    results = run_ranks(_parity, world, args=(which, _fresh_seed, seq, False), timeout=300)
    for rank, r in results.items():
        assert r["loss"] <= 1e-5 and r["grad"] <= 1e-5 and r["params"] <= 1e-5, (which, rank, r)
        assert r["tiled"], "no token-wise block was tiled"
        assert r["fused"] == (0 if which == "outside" else 1), r  # a loss outside has no gather to tile
        assert r["offload"] == ("offload" in "".join(PLANS[which]["layers"]))


def test_a_dropped_loss_chunk_breaks_parity(_fresh_seed):
    results = run_ranks(_parity, 2, args=("llamalike", _fresh_seed, 37, True), timeout=300)
    assert all(r["loss"] > 1e-4 for r in results.values()), results


def _budget(rank, world, queue, seq):
    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.planning.memory import measure_step
    from autosp.testing.parity import relative_error
    torch.manual_seed(0)
    base = LlamaLike(LlamaConfig(vocab=8192, hidden=64, layers=2, heads=4, kv_heads=2, ffn=172))
    ids = torch.randint(0, 8192, (1, seq))
    params = sum(p.numel() * p.element_size() for p in base.parameters())

    def measure(model, compiled):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        report = measure_step(lambda: compiled(ids, labels=ids)["loss"], exclude=list(model.parameters()))
        return report.peak_bytes, time.perf_counter() - t0

    found = {}
    for name, options in [("off", {})]:
        model = copy.deepcopy(base)
        compiled = autosp.compile(model, **options)
        compiled(ids, labels=ids)["loss"].backward()  # compile first
        found[name] = measure(model, compiled)
    peak = torch.tensor([found["off"][0]], dtype=torch.float64)
    torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)  # one budget for the group
    budget = params + int(0.35 * peak.item())
    model, ref = copy.deepcopy(base), copy.deepcopy(base)
    compiled = autosp.compile(model, memory_budget=budget, optimizer="none", drop_logits=True)
    loss, loss_ref = compiled(ids, labels=ids)["loss"], ref(ids, labels=ids)["loss"]
    loss.backward()
    loss_ref.backward()
    mine = dict(model.named_parameters())
    grad = max(relative_error(mine[n].grad, p.grad) for n, p in ref.named_parameters())
    planned = measure(model, compiled)
    queue.put((rank, dict(budget=budget, measured=params + planned[0], loss=relative_error(loss.detach(), loss_ref),
                          grad=grad)))


def test_memory_budget_holds_when_measured():
    """V=8192, hidden 64, S=2048 at P=2: budget = parameter bytes + 0.35 x the unbudgeted
    measured peak; the measured peak stays within it, at parity (step times against SAC
    and no checkpointing: bench/memory_budget.py)."""
    results = run_ranks(_budget, 2, args=(2048,), timeout=300)
    for rank, r in results.items():
        assert r["measured"] <= r["budget"], (rank, r)
        assert r["loss"] <= 1e-5 and r["grad"] <= 1e-5, (rank, r)


def test_infeasible_budget_names_the_smallest_feasible_one():
    from autosp.ir.diagnostics import AutospError
    from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike
    from autosp.planning.planner import plan_memory
    model = LlamaLike(LlamaConfig(**LLAMA_PRESETS["tiny"]))
    ids = torch.randint(0, 256, (1, 64))
    with pytest.raises(AutospError, match=r"below the smallest feasible budget [0-9.]+ (KiB|MiB)"):
        plan_memory(model, (ids,), {"labels": ids}, 1000, sp_size=2)


def test_plans_are_deterministic_and_climb_the_ladder():
    from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike
    from autosp.planning.planner import Planner
    model = LlamaLike(LlamaConfig(**LLAMA_PRESETS["tiny"]))
    ids = torch.randint(0, 256, (1, 256))
    planner = Planner(model, (ids,), {"labels": ids}, sp_size=2, drop_logits=True)
    loose = planner.predict(planner.most_aggressive().with_layers(("keep",) * planner.regions))
    tight = planner.predict(planner.most_aggressive())
    assert tight.total_bytes < loose.total_bytes
    budget = (tight.total_bytes + loose.total_bytes) // 2
    first, second = planner.plan(budget), planner.plan(budget)
    assert first[0] == second[0] and first[1].total_bytes <= budget
    assert first[0].layers != ("keep",) * planner.regions  # it had to climb


def test_memory_budget_strings():
    from autosp.ir.diagnostics import AutospError
    from autosp.units import parse_bytes
    assert parse_bytes("70GiB") == 70 << 30 and parse_bytes("512 MiB") == 512 << 20 and parse_bytes(4096) == 4096
    with pytest.raises(AutospError, match="cannot read"):
        parse_bytes("lots")


@pytest.mark.parametrize("family", ["llamalike", "qwen2"])
def test_plan_on_one_device_matches_eager(family, _fresh_seed):
    """sp_size=1 (no sequence parallelism) with every mechanism, as a stranger calls it: a
    model family autosp's tests did not write it for (Qwen2), ids passed as views
    (tokens[:, :-1]), two compiled models with different plans in one process, and the
    plain model used after compile. The IR keeps its torch.bind_symbolic_shape annotations
    at sp_size=1 (the tiled loss must erase them with the log-softmax)."""
    import autosp
    from autosp.cost.plan import MemoryPlan
    from autosp.testing.parity import relative_error
    if family == "qwen2":
        cfg = transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        model = transformers.Qwen2ForCausalLM(cfg).float()

        def loss_of(m, ids):
            return m(input_ids=ids, labels=ids, use_cache=False).loss
    else:
        from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike
        model = LlamaLike(LlamaConfig(**LLAMA_PRESETS["tiny"]))

        def loss_of(m, ids):
            return m(ids, labels=ids)["loss"]
    ref = copy.deepcopy(model)
    tokens = torch.randint(0, 256, (2, 46))
    ids = tokens[:, :-1]  # a view, S = 45
    # The region count comes from the IR (at sp_size=1 transformers' [S, S] mask ops count
    # as attention ops and add regions), as the planner reads it.
    from autosp.planning.planner import Planner
    call = ((ids,), {"labels": ids}) if family == "llamalike" else ((), dict(input_ids=ids, labels=ids,
                                                                              use_cache=False))
    n = Planner(model, *call, sp_size=1).regions
    plans = [MemoryPlan(layers=("full+offload",) + ("sac-min",) * (n - 1), tiles=3, loss_chunk=7, drop_logits=True),
             MemoryPlan(layers=("sac",) * (n - 1) + ("full",), tiles=2, loss_chunk=16)]
    compiled = [autosp.compile(model, sp_size=1, memory_plan=plan) for plan in plans]
    for c in compiled:
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        loss, loss_ref = loss_of(c, ids), loss_of(ref, ids)
        loss.backward()
        loss_ref.backward()
        assert relative_error(loss.detach(), loss_ref.detach()) <= 1e-6
        mine = dict(model.named_parameters())
        assert max(relative_error(mine[n].grad, p.grad) for n, p in ref.named_parameters()) <= 1e-5
        ir = c.programs[0].mlir["transformed"]
        assert "autosp.vocab_logprob" in ir and "autosp.tiles" in ir
    out = compiled[0](ids, labels=ids) if family == "llamalike" else compiled[0](input_ids=ids, labels=ids,
                                                                                 use_cache=False)
    assert out["logits"] is None if family == "llamalike" else out.logits is None  # drop_logits
    # The plain model after compile: untouched, the same function as its copy.
    with torch.no_grad():
        assert relative_error(loss_of(model, ids), loss_of(ref, ids)) <= 1e-6


def _tiled_runs(sp: int, layers: int) -> int:
    """How many token-wise runs autosp-tile-tokens tiles in a Llama's program at ``sp``."""
    from autosp.cost.plan import MemoryPlan
    from autosp.driver import transform
    from autosp.ir.core import body_ops, main_func
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.runtime import collectives
    with torch.device("meta"):
        model = LlamaLike(LlamaConfig(vocab=256, hidden=64, layers=layers, heads=4, kv_heads=2, ffn=128))
    ids = torch.zeros(1, 32, dtype=torch.long, device="meta")
    with collectives.simulate(sp, 0):
        t = transform(model, (ids,), {"labels": ids}, sp_size=sp,
                      plan=MemoryPlan(layers=("full",) * layers, tiles=4, loss_chunk=8))
    return len({op.attributes["autosp.tile"].value for op in body_ops(main_func(t.module))
                if "autosp.tile" in op.attributes})


def test_one_device_tiles_what_a_shard_tiles():
    """On one device (no shard, no all-to-all) each layer's MLP is tiled as on a shard: the
    rotary tables from arange and attention's output are proven the whole sequence where
    a row-wise op meets them (stop 29 tiled nothing there: 2x the 8B one-GPU peak). The
    control: tiles=1 tiles nothing, and on meta the tiled one-device peak is lower."""
    from autosp.cost.plan import MemoryPlan
    from autosp.models import LlamaConfig
    from autosp.planning.estimate import MemoryModel
    assert _tiled_runs(1, 2) == _tiled_runs(2, 2) >= 2
    cfg = LlamaConfig(vocab=512, hidden=256, layers=2, heads=4, kv_heads=2, ffn=1024)
    peaks = []
    for tiles in (1, 16):
        plan = MemoryPlan(layers=("full",) * 2, tiles=tiles, loss_chunk=1024, drop_logits=True)
        peaks.append(MemoryModel(cfg, 1, torch.bfloat16, plan=plan).estimate(16384).activation_peak_bytes)
    assert peaks[1] < 0.75 * peaks[0], peaks


def test_planner_from_shallow_copies_matches_the_whole_model(monkeypatch):
    """The planner's estimate put together from shallow copies of a 6-layer Llama
    (autosp.planning.depth) is within 2% of the whole model's (exact on these), for
    uniform and mixed plans, with tiles, offload and a simulated FSDP2, and both choose
    the same plan. The control: a composition that leaves out the runs' extra layers is
    off by more than 2%."""
    from autosp.cost.plan import MemoryPlan
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.planning.depth import shallow_plan
    from autosp.planning.planner import Planner
    layers = 6
    with torch.device("meta"):
        model = LlamaLike(LlamaConfig(vocab=512, hidden=128, layers=layers, heads=4, kv_heads=2,
                                      ffn=512)).to(torch.bfloat16)
    ids = torch.zeros(1, 4096, dtype=torch.long, device="meta")
    options = dict(sp_size=2, fsdp=2, offload=True, drop_logits=True)
    fast, whole = (Planner(model, (ids,), {"labels": ids}, whole=w, **options) for w in (False, True))
    assert fast.layers_path == "blocks" and whole.layers_path is None and fast.regions == whole.regions == layers
    plans = [MemoryPlan(layers=(c,) * layers, tiles=t, loss_chunk=256, drop_logits=True)
             for c, t in (("keep", 1), ("sac", 4), ("full+offload", 8))]
    plans += [MemoryPlan(layers=(a,) * k + (b,) * (layers - k), tiles=4, loss_chunk=256, drop_logits=True)
              for a, b, k in (("full+offload", "full", 1), ("full+offload", "full", 5))]
    errors = [abs(fast.predict(p).total_bytes / whole.predict(p).total_bytes - 1) for p in plans]
    assert max(errors) < 0.02, errors
    budget = (whole.predict(plans[0]).total_bytes + whole.predict(plans[1]).total_bytes) // 2
    assert fast.plan(budget)[0] == whole.plan(budget)[0]
    monkeypatch.setattr("autosp.planning.planner.compose", lambda layers, peak: peak(shallow_plan(layers)[0]))
    fast._peaks.clear()
    assert max(abs(fast.predict(p).peak_bytes / whole.predict(p).peak_bytes - 1) for p in plans) > 0.02


def test_repeated_layers_says_why_a_model_is_estimated_whole():
    """Only layers of one signature are composed from shallow copies: fewer than 4, a
    layer that differs (another width), or mixed config.layer_types are estimated whole;
    the shallow copy shares the model's modules and keeps its first layers."""
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.planning.depth import repeated_layers, with_depth
    with torch.device("meta"):
        model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=5, heads=4, ffn=64))
        short = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=3, heads=4, ffn=64))
        other = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=5, heads=4, ffn=128)).blocks[0]
    assert repeated_layers(model) == ("blocks", 5)
    assert "3 layers" in repeated_layers(short)
    shallow = with_depth(model, "blocks", 2)
    assert len(shallow.blocks) == 2 and len(model.blocks) == 5 and shallow.blocks[1] is model.blocks[1]
    assert shallow.embed is model.embed
    model.blocks[3] = other
    assert "layer 3 differs" in repeated_layers(model)
    model.blocks[3] = shallow.blocks[0]
    model.config = type("Config", (), {"layer_types": ["full_attention", "sliding_attention"] * 2})()
    assert "layer_types" in repeated_layers(model)
