"""Memory: checkpointing modes, the counters, and the memory model against measurements.

* ``checkpointing="sac"`` / ``"full"`` keep fewer bytes than ``"off"`` and give the same
  loss and gradients as single-device eager PyTorch (P=1 here; P=2 parity is in
  test_sequence_parallel.py).
* ``autosp.estimate_memory`` (meta tensors, simulated ranks) is within 10% of what two
  real gloo ranks measure for saved bytes in every mode and peak bytes without
  checkpointing and with SAC (full recompute: 20%, see the comment); an estimate for the
  wrong number of ranks is not (the comparison can fail). With the model state sharded
  by FSDP2 over both ranks (``fsdp=2``), model state and step peak are within 10% too,
  and the unsharded model's state is not.
"""
import copy

import pytest
import torch

from autosp.testing.distributed import run_ranks

CONFIG = dict(vocab=512, hidden=128, layers=2, heads=4, ffn=384)
SEQ = 2048  # long enough that allocator noise (~1 MiB) stays far below 10%
TOL = 0.10


def _model(seed):
    from autosp.models import LlamaConfig, LlamaLike
    torch.manual_seed(seed)
    return LlamaLike(LlamaConfig(**CONFIG))


@pytest.mark.parametrize("mode", ["sac", "sac-min", "full"])
def test_checkpointing_keeps_less_and_matches_eager(mode, _fresh_seed):
    import autosp
    from autosp.planning.memory import measure_step
    from autosp.testing.parity import relative_error
    model = _model(_fresh_seed % 10000)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, CONFIG["vocab"], (1, 256), generator=torch.Generator().manual_seed(_fresh_seed))
    eager = measure_step(lambda: reference(ids, labels=ids)["loss"], reference.parameters())
    compiled = autosp.compile(model, checkpointing=mode)
    mine = measure_step(lambda: compiled(ids, labels=ids)["loss"], model.parameters())
    assert mine.saved_bytes < {"sac": 0.35, "sac-min": 0.15, "full": 0.1}[mode] * eager.saved_bytes
    assert mine.peak_bytes < eager.peak_bytes
    grad_err = max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    assert grad_err < 1e-5
    # The compiled program really recomputes: its runner holds recompute segments.
    assert compiled.programs[0].runner.meta["autosp_segments"] >= CONFIG["layers"]


def test_saved_counter_counts_storages_once():
    from autosp.planning.memory import SavedTensors
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(8, 64)
    with SavedTensors([w]) as saved:
        y = x @ w  # saves x (and w, excluded)
        z = (x @ w).relu()  # saves x again (same storage) and the relu result
    assert saved.bytes == x.numel() * 4 + z.numel() * 4
    (y.sum() + z.sum()).backward()


def test_peak_tracker_says_what_is_live_at_the_peak():
    """``PeakTracker(contents=True)``: the storages live when the peak was set (largest
    first, with the op and shape that made them), and a storage resized in place
    (``resize_storage_bytes_``, as a released recomputed output) counts its new size."""
    from autosp.planning.memory import PeakTracker
    with PeakTracker(contents=True) as tracker:
        a = torch.empty(100, device="meta")
        b = torch.zeros(200, device="meta")
        del a
        c = torch.ones(100, device="meta")  # 300 live again: not a new peak
        d = torch.empty(10, 10, device="meta")  # 400: the peak
        torch.ops.inductor.resize_storage_bytes_(b, 0)
        now = tracker.current()
    assert tracker.peak_bytes == 400 * 4 and now == 200 * 4
    assert [(n, o.split(" ", 1)[1]) for n, o in tracker.peak_contents] == [
        (800, "zeros.default [200] float32"), (400, "empty.memory_format [10, 10] float32"),
        (400, "ones.default [100] float32")], tracker.peak_contents
    assert tracker.peak_op.endswith("empty.memory_format")
    del b, c, d


def _measure_body(rank, world, queue, seed):
    import autosp
    from autosp.planning.memory import measure_step
    model = _model(seed)
    ids = torch.randint(0, CONFIG["vocab"], (1, SEQ), generator=torch.Generator().manual_seed(seed))
    out = {}
    for mode in ("off", "sac", "full"):
        compiled = autosp.compile(model, checkpointing=mode)
        compiled(ids, labels=ids)["loss"].backward()  # compile and warm up outside the measurement
        reports = [measure_step(lambda compiled=compiled: compiled(ids, labels=ids)["loss"], model.parameters()) for _ in range(3)]
        out[mode] = (reports[0].saved_bytes, min(r.peak_bytes for r in reports))
    # The same model sharded by FSDP2 (the recipe) over both ranks: state bytes and step peak.
    from torch.distributed.fsdp import fully_shard
    sharded = _model(seed)
    for block in sharded.blocks:
        fully_shard(block)
    fully_shard(sharded)
    compiled = autosp.compile(sharded)
    opt = torch.optim.AdamW(sharded.parameters())
    compiled(ids, labels=ids)["loss"].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    local = [p.to_local() for p in sharded.parameters()]
    reports = [measure_step(lambda: compiled(ids, labels=ids)["loss"], local) for _ in range(2)]

    def nbytes(tensors):
        return sum(t.numel() * t.element_size() for t in (x.to_local() if hasattr(x, "to_local") else x for x in tensors))
    state = nbytes(local) + nbytes(p.grad for p in sharded.parameters())
    state += nbytes(t for s in opt.state.values() for t in s.values() if t.dim() > 0)
    out["fsdp"] = (state, min(r.peak_bytes for r in reports))
    queue.put((rank, out))


def test_peak_tracker_counts_a_storage_at_a_freed_inputs_address():
    """A storage that existed before the tracker (an input) is not counted; once it is freed,
    a storage created at its address is. Before the fix the key stayed "external" forever, so
    whether a storage counted depended on where the allocator put it: the 70B planner's
    4-layer step peak moved by 3 GiB from run to run (one FSDP2 buffer uncounted), and the
    composition multiplied that by 76 layers."""
    import gc

    from autosp.planning.memory import PeakTracker
    for _ in range(20):  # the allocator reuses the address in some of these (it did, before the fix)
        ext = torch.empty(1000, device="meta")
        with PeakTracker() as tracker:
            ext.add_(1)
            del ext
            gc.collect()
            ys = [torch.ones(1000, device="meta") for _ in range(8)]
        assert tracker.peak_bytes == 8 * 4000
        del ys


def test_memory_model_matches_two_ranks_within_10_percent(_fresh_seed):
    from autosp.models import LlamaConfig
    from autosp.planning.estimate import estimate_memory
    measured = run_ranks(_measure_body, 2, args=(_fresh_seed % 10000,), timeout=600)
    for mode in ("off", "sac", "full"):
        est = estimate_memory(LlamaConfig(**CONFIG), SEQ, sp_size=2, dtype=torch.float32, checkpointing=mode)
        for rank, result in measured.items():
            saved, peak = result[mode]
            assert abs(est.saved_bytes - saved) <= TOL * saved, f"{mode} rank {rank}: saved {est.saved_bytes} vs {saved}"
            # Known gap: with full recompute the collectives run again inside backward, and the
            # allocator sees ~12-15% more at the peak than the meta model (at P=1 both agree
            # exactly); bench/memory_model.py reports it. Off and SAC are held to 10%.
            tol = TOL if mode != "full" else 2 * TOL
            assert abs(est.peak_bytes - peak) <= tol * peak, f"{mode} rank {rank}: peak {est.peak_bytes} vs {peak}"
        # Negative control: the estimate for one rank is far from what each of two ranks keeps.
        wrong = estimate_memory(LlamaConfig(**CONFIG), SEQ, sp_size=1, dtype=torch.float32, checkpointing=mode)
        assert abs(wrong.saved_bytes - measured[0][mode][0]) > TOL * measured[0][mode][0]
    # FSDP2 over both ranks: parameters, gradients and AdamW state are halves; the step peak
    # holds the unsharded layers, prefetch buffers and whole layer gradients.
    est = estimate_memory(LlamaConfig(**CONFIG), SEQ, sp_size=2, dtype=torch.float32, fsdp=2)
    unsharded = estimate_memory(LlamaConfig(**CONFIG), SEQ, sp_size=2, dtype=torch.float32)
    for rank, result in measured.items():
        state, peak = result["fsdp"]
        assert abs(est.state_bytes() - state) <= TOL * state, f"FSDP rank {rank}: state {est.state_bytes()} vs {state}"
        assert abs(est.peak_bytes - peak) <= TOL * peak, f"FSDP rank {rank}: peak {est.peak_bytes} vs {peak}"
        assert abs(unsharded.state_bytes() - state) > TOL * state  # control: whole state per rank


def test_max_context_is_the_longest_that_fits():
    from autosp.models import LlamaConfig
    from autosp.planning.estimate import MemoryModel, max_context
    cfg = LlamaConfig(**CONFIG)
    model = MemoryModel(cfg, sp_size=4, dtype=torch.bfloat16, checkpointing="sac")
    at_8k = model.estimate(8192)
    budget = at_8k.total_bytes(zero_stage=3, state_shards=4)
    found = max_context(budget, cfg, sp_size=4, dtype=torch.bfloat16, checkpointing="sac", granularity=1024)
    assert found == 8192  # memory grows with S, so 8K fits and 9K does not
    assert max_context(at_8k.state_bytes(3, 4), cfg, sp_size=4, checkpointing="sac") == 0


def test_estimate_rejects_bad_arguments():
    from autosp.planning.estimate import estimate_memory
    with pytest.raises(ValueError, match="unknown model preset"):
        estimate_memory("70b", 1024)
    with pytest.raises(ValueError, match="checkpointing"):
        estimate_memory("tiny", 1024, checkpointing="some")


def test_estimate_of_a_hugging_face_config_with_its_cache_on_and_fsdp():
    """A config as ``save_pretrained`` writes it (``use_cache=True``) is estimated as
    training calls it (no cache); with ``fsdp=2`` the model state per rank is half."""
    transformers = __import__("pytest").importorskip("transformers")
    from autosp.planning.estimate import estimate_memory
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   use_cache=True)
    est = estimate_memory(cfg, 256, sp_size=2, dtype=torch.float32, fsdp=2)
    whole = est.param_bytes + est.grad_bytes + est.optimizer_bytes
    assert est.state_bytes() == sum(n // 2 for n in (est.param_bytes, est.grad_bytes, est.optimizer_bytes))
    assert est.state_bytes(zero_stage=0, state_shards=1) == whole and est.activation_peak_bytes > 0


def test_memory_model_of_trainer_calls_keeps_no_s_by_s_mask():
    """``MemoryModel(inputs=...)`` runs the program called as a trainer calls it (here
    packed documents: position_ids restarting, no mask, on the meta device). The documents
    are recognised, so the bytes kept grow linearly (x4 length: at most x4.6) and stay
    below half the [S, S] boolean mask alone; with the recognition disabled (the control)
    the mask is kept and the bytes grow quadratically."""
    transformers = pytest.importorskip("transformers")
    from autosp.passes import causal_mask

    from autosp.planning.estimate import MemoryModel

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1 << 16,
                                      use_cache=False, attn_implementation="sdpa")

    def packed(ids):
        return {"position_ids": (torch.arange(ids.shape[-1], device=ids.device) % 1024)[None]}

    def saved(model):
        return [model.estimate(n).saved_bytes for n in (4096, 16384)]

    small, large = saved(MemoryModel(config, sp_size=2, dtype=torch.float32, rank=0, inputs=packed))
    assert large <= 4.6 * small and large < 16384 * 16384 // 2, (small, large)
    original = causal_mask.prove_causal
    causal_mask.prove_causal = lambda sdpa: causal_mask.MaskProof(False, "disabled by the test")
    try:
        kept_small, kept_large = saved(MemoryModel(config, sp_size=2, dtype=torch.float32, rank=0, inputs=packed))
    finally:
        causal_mask.prove_causal = original
    assert kept_large > 6 * kept_small and kept_large > 16384 * 16384, (kept_small, kept_large)
