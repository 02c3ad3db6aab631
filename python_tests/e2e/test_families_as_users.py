"""The 2026 families (issue 26) as users call them, not only as the parity tests do.

One job of 2 ranks holds four compiled models at once: a Qwen3-Next (Gated DeltaNet, conv,
attention, MoE), a Granite-4 hybrid (Mamba2, conv, attention, MoE), a MiniMax (lightning
attention, attention, MoE) and an MPT (ALiBi cut to each rank's heads), each called in
turn, with input ids as users pass them (int32, a transposed view: not contiguous), in
train mode, then in eval mode (another program), then in train mode again; and the plain
model used after compile. Each call is checked against single-device eager on the full
sequence (loss, gathered logits, every gradient; 1e-5 relative, fp32). Negative control:
the same calls with the recurrence's incoming state dropped must fail. And under
``backend="aot_eager"`` (torch.compile) Granite-4 and LLaVA, whose conv halo, recurrence
and image merge run as opaque ops there.
"""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3NextConfig"):  # pragma: no cover
    pytest.skip("transformers without Qwen3-Next", allow_module_level=True)

from test_position_biases import _model as _bias_model  # noqa: E402
from test_recurrences import VOCAB, _granite, _minimax, _model  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5


def _ids(gen, seq):
    """int32 ids, a transposed view (not contiguous), as a data pipeline may hand them."""
    return torch.randint(0, VOCAB, (seq, 2), generator=gen, dtype=torch.int32).t()


def _errors(compiled, model, reference, ids) -> dict:
    from autosp.testing.parity import relative_error
    model.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)
    out = compiled(input_ids=ids, labels=ids.long())
    want = reference(input_ids=ids, labels=ids.long())
    errors = {"loss": relative_error(out.loss, want.loss), "logits": relative_error(out.logits, want.logits)}
    if compiled.training:
        out.loss.backward()
        want.loss.backward()
        errors["grads"] = max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                                              reference.parameters())
                              if q.grad is not None)
    return errors


def _body(rank, world, queue, seed, control):
    import autosp
    from autosp.runtime import recurrences
    if control:  # every rank's incoming state zeros: the prefix without its summaries
        recurrences._prefix = lambda combine, Ts, ss: [torch.zeros_like(ss[0])] * len(ss)
    gen = torch.Generator().manual_seed(seed)
    jobs = {}
    models = (("qwen3_next", lambda: _model(False)), ("granite", _granite), ("minimax", _minimax),
              ("mpt", lambda: _bias_model("mpt")))
    for name, make in models[:2] if control else models:  # (the control judges the first two)
        torch.manual_seed(seed)
        model = make()
        reference = copy.deepcopy(model)
        jobs[name] = (autosp.compile(model, gather_outputs=True, sp_recurrence="prefix"), model, reference)
    out: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for phase, seq in (("train", 15), ("eval", 15), ("train again", 16)):
            for name, (compiled, model, reference) in jobs.items():  # the two models in turn
                for m in (compiled, reference):
                    m.train(phase != "eval")
                out[(name, phase)] = _errors(compiled, model, reference, _ids(gen, seq))
        for name, (compiled, model, reference) in jobs.items():  # the plain model, after compile
            ids = _ids(gen, 15)
            with torch.no_grad():
                plain, want = model(input_ids=ids).logits, reference(input_ids=ids).logits
            out[(name, "plain")] = {"logits": float((plain - want).abs().max())}
            out[(name, "programs")] = len(compiled.programs)
    queue.put((rank, out))


def test_two_hybrids_in_one_job_as_users_call_them(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, False), timeout=600)
    for rank, out in results.items():
        for key, errors in out.items():
            if key[1] == "programs":
                assert errors == 2, (rank, key, errors)  # train (S = 15 and 16: one program) and eval
            elif key[1] == "plain":
                assert errors["logits"] == 0.0, (rank, key, errors)  # the user's model is untouched
            else:
                assert max(errors.values()) <= TOL, (rank, key, errors)


def test_negative_control_without_the_state_fails(_fresh_seed):
    """The check the test above makes must fail for each model (the state's share of the
    outputs is small on these tiny random models, so the margin is 10x the tolerance)."""
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, True), timeout=600)
    for name in ("qwen3_next", "granite"):
        worst = max(max(errors.values()) for key, errors in results[1].items()
                    if key[0] == name and key[1] in ("train", "eval", "train again"))
        assert worst > 10 * TOL, (name, results[1])


def _compiled_body(rank, world, queue, seed):
    from test_vlm import _batch as _llava_batch
    from test_vlm import _grad_errors as _llava_grad_errors  # (a key bias's gradient is 0: judged by scale)
    from test_vlm import _model as _llava

    import autosp
    from autosp.runtime import opaque
    from autosp.testing.parity import parity
    calls: dict = {}

    def counted(name, fn):
        def run(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)
        return run
    for name, (fn, fake) in list(opaque._FUNCTIONS.items()):  # count the opaque ops' runs
        opaque.register(name, counted(name, fn), fake)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    cases = (("granite", _granite, "prefix"), ("llava", _llava, "auto"))  # (Gated DeltaNet: the same opaque path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, make, method in cases:
            torch.manual_seed(seed)
            model = make()
            reference = copy.deepcopy(model)
            compiled = autosp.compile(model, gather_outputs=True, backend="aot_eager", sp_recurrence=method)
            if name == "llava":
                kwargs = _llava_batch(30, gen)
            else:
                ids = torch.randint(0, VOCAB, (2, 15), generator=gen)
                kwargs = {"input_ids": ids, "labels": ids}
            report = parity(reference, compiled, **kwargs)
            grads = _llava_grad_errors(model, reference) if name == "llava" else max(report.grads.values())
            out[name] = {"outputs": max(report.outputs.values()), "grads": grads}
    out["calls"] = calls
    queue.put((rank, out))


def test_new_runtime_ops_under_torch_compile(_fresh_seed):
    """``backend="aot_eager"``: the conv halo, a recurrence (the prefix) and the image merge
    run as opaque ops inside the compiled graph (forward, and recomputed in backward), and
    LLaVA's returned vision states keep their gradient share: exact against eager."""
    results = run_ranks(_compiled_body, 2, args=(_fresh_seed % 10000,), timeout=600)
    for rank, out in results.items():
        calls = out.pop("calls")
        for name, r in out.items():
            assert r["outputs"] <= TOL and r["grads"] <= TOL, (rank, name, r)
        # Granite's halo and scan, LLaVA's merge: each once forward, once recomputed in backward
        assert calls == {"halo": 2, "torch.autosp.mamba2_chunk_scan": 2, "masked_scatter": 2}, calls
