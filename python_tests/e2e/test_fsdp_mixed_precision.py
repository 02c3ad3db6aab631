"""FSDP2's ``MixedPrecisionPolicy`` under ``autosp.compile``: honoured, or refused by name.

World 2, SP 2, FSDP over both ranks, ``fully_shard(mp_policy=MixedPrecisionPolicy(
param_dtype=bf16, reduce_dtype=fp32))`` on each block and the root of a 3-layer Llama.
Reference: the same model sharded the same way, run as eager FSDP2 with the whole sequence
on each rank (both ranks compute the same thing, FSDP2 averages identical gradients): one
device's FSDP2 mixed precision, bf16 unsharded parameters, fp32 reduction, fp32 masters.

Tolerances (bf16: 8 significant bits, one rounding 2^-9 relative). bf16 results depend on
the shapes the kernels see: eager bf16 on the first half of a sequence already differs
from the whole sequence's first half in about 3/4 of the logits, by one rounding, so
sequence parallelism can be no closer than that noise (which at this depth is as large as
bf16's distance to fp32 itself). Criteria: loss within 2^-8 relative, every fp32 gradient
(``grad.full_tensor()``) within 2^-5 relative L2 over the model (measured about 0.008), each
of 3 AdamW steps; parameters after them within 2^-8 relative L2.

That it is the bf16 program, not the fp32 one: the logits are bf16 (as eager FSDP2's), every
all-gather moves bf16 (exactly half the bytes of the fp32 program's), every reduce-scatter
fp32, the gradients land fp32 on the fp32 shards, and the gradients are at bf16's distance
(>= 2^-12 relative L2) from those of the fp32 program. Negative control: the same model
compiled with the policy ignored (what autosp did before: shards gathered and reduced in
fp32, no casts at the modules' boundaries) must fail these checks.

Mixed policies: bf16 blocks with ``output_dtype=fp32`` under an fp32 root. The blocks' input
cast (``cast_forward_inputs``) and output cast (``output_dtype``) are needed for the model to
run at all (an fp32 activation into a bf16 linear is an error); the compiled program must
match eager FSDP2 the same way; without those casts it fails (negative control). With
``backend=`` (a whole-graph ``torch.compile``: every parameter gathered at the call by
``GatherShard``) the gradients equal the per-layer unsharding's. Refused by name:
``CPUOffloadPolicy``.
"""
import copy

import pytest
import torch

from autosp.testing.distributed import run_ranks
from autosp.testing.parity import ADAM_EPS

LOSS_TOL = 2 ** -8
GRAD_TOL = 2 ** -5
PARAM_TOL = 2 ** -8
FROM_FP32 = 2 ** -12  # bf16 programs' gradients are at least this far from the fp32 program's


def _l2(actual: list, expected: list) -> float:
    """Relative L2 distance over all the tensors together."""
    diff = torch.cat([(a.detach().double() - b.detach().double()).flatten() for a, b in zip(actual, expected)])
    ref = torch.cat([b.detach().double().flatten() for b in expected])
    return (diff.norm() / ref.norm()).item()


def _models(seed, policies):
    """Copies of one LlamaLike, each sharded with ``policies(i)`` -> (blocks' policy, root's)."""
    from torch.distributed.fsdp import fully_shard

    from autosp.models import LlamaConfig, LlamaLike
    torch.manual_seed(seed)
    base = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=3, heads=4, kv_heads=2))
    models = []
    for blocks_policy, root_policy in policies:
        model = copy.deepcopy(base)
        for block in model.blocks:
            fully_shard(block, mp_policy=blocks_policy)
        fully_shard(model, mp_policy=root_policy)
        models.append(model)
    return models


def _ignoring_policies():
    """A context in which autosp compiles as it did before honouring the policies."""
    import contextlib

    from autosp.runtime import fsdp

    @contextlib.contextmanager
    def ctx():
        saved = fsdp.precisions, fsdp._cast_floating
        fsdp.precisions = lambda model: {}
        fsdp._cast_floating = lambda dtype, tree: tree
        try:
            yield
        finally:
            fsdp.precisions, fsdp._cast_floating = saved
    return ctx()


def _train(sp, model, reference, seed, steps=3):
    """``steps`` AdamW steps of the compiled ``sp`` (on ``model``) and of eager ``reference``."""
    from torch.distributed.tensor import DTensor
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=ADAM_EPS)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, eps=ADAM_EPS)
    gen = torch.Generator().manual_seed(seed + 1)
    out = {"loss": [], "grad": [], "grads": None}
    for step in range(steps):
        ids = torch.randint(0, 64, (2, 16), generator=gen)
        labels = torch.randint(0, 64, (2, 16), generator=gen)
        result = sp(ids, labels=labels)
        result["loss"].backward()
        expected = reference(ids, labels=labels)
        expected["loss"].backward()
        grads = [p.grad.full_tensor() for p in model.parameters()]
        out["loss"].append(abs(result["loss"].item() - expected["loss"].item()) / abs(expected["loss"].item()))
        out["grad"].append(_l2(grads, [p.grad.full_tensor() for p in reference.parameters()]))
        if step == 0:
            out["grads"] = grads
            out["logits_dtype"] = (result["logits"].dtype, expected["logits"].dtype)
            out["grad_dtypes"] = sorted({str(p.grad.dtype) for p in model.parameters()})
            out["grad_is_dtensor"] = all(isinstance(p.grad, DTensor) for p in model.parameters())
            unsharder = sp.programs[0].last_unsharder
            out["traffic"] = [t[:2] + (str(t[3]), t[4]) for t in unsharder.traffic] if unsharder else []
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    out["params"] = _l2([p.full_tensor() for p in model.parameters()],
                        [p.full_tensor() for p in reference.parameters()])
    return out


def _body(rank, world, queue, seed):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    import autosp
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model, control_model, reference, control_reference, whole, whole_reference = _models(seed, [(mp, mp)] * 6)
    result = {"bf16": _train(autosp.compile(model), model, reference, seed)}
    # Under a whole-graph torch.compile the call gathers every parameter (GatherShard): the same.
    gathered = _train(autosp.compile(whole, backend="eager"), whole, whole_reference, seed, steps=1)
    result["gather_path"] = (_l2(gathered["grads"], result["bf16"]["grads"]), gathered["logits_dtype"],
                             gathered["grad_dtypes"])
    with _ignoring_policies():
        sp = autosp.compile(control_model)
        sp.compile_for(torch.zeros(2, 16, dtype=torch.long), labels=torch.zeros(2, 16, dtype=torch.long))
    result["ignored"] = _train(sp, control_model, control_reference, seed)
    fp32 = result["ignored"].pop("grads")  # the fp32 program's gradients (same weights, same batch)
    for r in (result["bf16"], result["ignored"]):
        grads = r.pop("grads", None)
        r["from_fp32"] = _l2(grads, fp32) if grads is not None else 0.0
    queue.put((rank, result))


def failures(r: dict) -> list[str]:
    """The checks of the module docstring ``r`` fails."""
    bad = []
    if max(r["loss"]) > LOSS_TOL or max(r["grad"]) > GRAD_TOL or r["params"] > PARAM_TOL:
        bad.append(f"distance to eager FSDP2: loss {max(r['loss']):.2e} grads {max(r['grad']):.2e} "
                   f"params {r['params']:.2e}")
    if r["logits_dtype"] != (torch.bfloat16, torch.bfloat16):
        bad.append(f"logits dtype {r['logits_dtype']}")
    gathers = [t for t in r["traffic"] if t[0] == "all_gather"]
    if not gathers or {t[2] for t in gathers} != {"torch.bfloat16"}:
        bad.append(f"all-gathers in {sorted({t[2] for t in gathers})}")
    if {t[2] for t in r["traffic"] if t[0] == "reduce_scatter"} != {"torch.float32"}:
        bad.append("reduce-scatters not in fp32")
    if r["grad_dtypes"] != ["torch.float32"] or not r["grad_is_dtensor"]:
        bad.append(f"gradients {r['grad_dtypes']}")
    if r["from_fp32"] < FROM_FP32:
        bad.append(f"gradients at {r['from_fp32']:.2e} from the fp32 program's")
    return bad


def test_fsdp2_mixed_precision_param_bf16_reduce_fp32(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000,), timeout=300)
    for rank, r in results.items():
        bf16, ignored = r["bf16"], r["ignored"]
        assert failures(bf16) == [], f"rank {rank}: {failures(bf16)}\n{bf16}"
        distance, logits_dtype, grad_dtypes = r["gather_path"]
        assert distance <= 1e-6 and logits_dtype[0] == torch.bfloat16 and grad_dtypes == ["torch.float32"], \
            r["gather_path"]
        # Negative control: with the policy ignored, the checks fail (and on what they should).
        bad = failures(ignored)
        assert any("logits dtype" in b for b in bad) and any("all-gathers in" in b for b in bad) and \
            any("from the fp32 program" in b for b in bad), bad
        # The all-gathers move bf16: exactly half the bytes of the fp32 program's, collective by collective.
        gathered = [t[3] for t in bf16["traffic"] if t[0] == "all_gather"]
        assert gathered and [2 * b for b in gathered] == [t[3] for t in ignored["traffic"] if t[0] == "all_gather"]
        reduced = [t[3] for t in bf16["traffic"] if t[0] == "reduce_scatter"]
        assert reduced == [t[3] for t in ignored["traffic"] if t[0] == "reduce_scatter"]  # fp32 both


def _mixed_body(rank, world, queue, seed):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    import autosp
    blocks = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32)
    model, reference, control = _models(seed, [(blocks, MixedPrecisionPolicy())] * 3)
    r = _train(autosp.compile(model), model, reference, seed, steps=1)
    r.pop("grads")
    # Negative control: without the casts at the blocks' boundaries the program is not FSDP2's
    # (an fp32 activation meets a bf16 weight when it runs).
    from autosp.runtime import fsdp
    saved, fsdp._cast_floating = fsdp._cast_floating, lambda dtype, tree: tree
    ids = torch.zeros(2, 16, dtype=torch.long)
    try:
        autosp.compile(control)(ids, labels=ids)
        r["without_casts"] = "ran"
    except Exception as e:  # noqa: BLE001 (the error's text is the check)
        r["without_casts"] = f"{type(e).__name__}: {e}"
    finally:
        fsdp._cast_floating = saved
    queue.put((rank, r))


def test_fsdp2_policies_that_differ_between_modules(_fresh_seed):
    """bf16 blocks (inputs cast to bf16, outputs to fp32) under an fp32 root."""
    results = run_ranks(_mixed_body, 2, args=(_fresh_seed % 10000,), timeout=300)
    for rank, r in results.items():
        assert max(r["loss"]) <= LOSS_TOL and max(r["grad"]) <= GRAD_TOL, f"rank {rank}: {r}"
        assert r["logits_dtype"] == (torch.float32, torch.float32), r["logits_dtype"]  # the root's: fp32
        assert r["grad_dtypes"] == ["torch.float32"], r
        dtypes = [t[2] for t in r["traffic"] if t[0] == "all_gather"]
        # The root's group in fp32, the blocks' in bf16 (forward and backward gathers).
        assert dtypes.count("torch.float32") == 2 and dtypes.count("torch.bfloat16") == 6, r["traffic"]
        assert "dtype" in r["without_casts"] and "BFloat16" in r["without_casts"], r["without_casts"]


def _refused_body(rank, world, queue, kind):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    import autosp
    from autosp.ir.diagnostics import AutospError
    from autosp.models import LlamaConfig, LlamaLike
    model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2))
    assert kind == "offload"
    for block in model.blocks:
        fully_shard(block, offload_policy=CPUOffloadPolicy(pin_memory=False))
    fully_shard(model)
    try:
        autosp.compile(model)
        queue.put((rank, "no error"))
    except AutospError as e:
        queue.put((rank, str(e)))


@pytest.mark.parametrize("kind", ["offload"])
def test_fsdp2_policies_refused_by_name(kind):
    for rank, message in run_ranks(_refused_body, 2, args=(kind,), timeout=120).items():
        assert "CPUOffloadPolicy" in message and "blocks.0" in message, f"rank {rank}: {message}"
