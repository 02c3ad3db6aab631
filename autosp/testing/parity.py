"""Parity checks: a compiled model against single-device eager PyTorch.

Both sides run forward and backward on the same inputs; the backward objective is the
loss where the model returns a scalar, plus a fixed random projection of every other
floating-point output, so every output and every parameter gets a gradient signal.

Example::

    >>> report = parity(reference_model, compiled_model, ids, labels=ids)
    >>> report.max_error <= 1e-5
    True
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

ADAM_EPS = 1e-5
"""AdamW's epsilon in parity tests that train several steps: Llama's recipe's (1e-5). With
torch's default (1e-8) the first step moves every parameter by ``lr * sign(g)``, also where
``|g|`` is at fp32-rounding level and the two runs' rounding picks different signs: such a
parameter then differs by ``2 * lr`` however exact the gradients are."""


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (absolute when expected is all zeros)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    if actual.shape != expected.shape:
        return float("inf")
    scale = expected.abs().max().item() if expected.numel() else 0.0
    diff = (actual - expected).abs().max().item() if expected.numel() else 0.0
    return diff / scale if scale > 0 else diff


def parameter_distance(reference: torch.nn.Module, candidate: torch.nn.Module) -> float:
    """Relative L2 distance ``|candidate - reference| / |reference|`` over all parameters (in
    order), e.g. after a few optimizer steps side by side. Adam normalises each element, so an
    element whose gradient sits at the fp32 rounding floor (~1e-8) takes a +-lr step either
    way; an element-wise max would measure those coin flips, not the training."""
    pairs = list(zip(reference.parameters(), candidate.parameters()))
    num = sum(float((q.detach() - p.detach()).double().pow(2).sum()) for p, q in pairs)
    den = sum(float(p.detach().double().pow(2).sum()) for p, _ in pairs)
    return (num / den) ** 0.5


def align_parameters(candidate: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Copy ``reference``'s parameter values into ``candidate``'s (in order, in place).

    Multi-step parity tests call it after each optimizer step, once that step's gradients and
    parameters were compared: the next step's gradients are then taken at the same point on
    both sides. Without it, step k's gradients are taken at parameters that already differ by
    the previous steps' rounding, amplified by Adam's normalisation (``g / (|g| + eps)`` turns a
    1e-10 difference in a small gradient into a 1e-7 one in the parameter), so later steps
    measure that chaos rather than the compiled program. Each side keeps its own optimizer
    state, and the candidate's module its own buffers and caches, so state carried wrongly
    across steps still shows."""
    with torch.no_grad():
        for mine, theirs in zip(candidate.parameters(), reference.parameters(), strict=True):
            mine.copy_(theirs)


@dataclass
class ParityReport:
    outputs: dict[str, float] = field(default_factory=dict)
    grads: dict[str, float] = field(default_factory=dict)

    @property
    def max_output_error(self) -> float:
        return max(self.outputs.values(), default=0.0)

    @property
    def max_grad_error(self) -> float:
        return max(self.grads.values(), default=0.0)

    @property
    def max_error(self) -> float:
        return max(self.max_output_error, self.max_grad_error)

    def __str__(self) -> str:
        return (f"outputs max rel err {self.max_output_error:.2e} ({len(self.outputs)} tensors), "
                f"grads max rel err {self.max_grad_error:.2e} ({len(self.grads)} parameters)")


def _objective(outputs, seed: int = 1234) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for leaf in pytree.tree_leaves(outputs):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            if leaf.dim() == 0:
                total = total + leaf
            else:
                w = torch.randn(leaf.shape, generator=gen, dtype=leaf.dtype).to(leaf.device)
                total = total + (leaf * w).sum() / leaf.numel()
    return total


def run_step(module: torch.nn.Module, *args, **kwargs):
    """Forward + backward of the fixed objective; returns the outputs (detached)."""
    out = module(*args, **kwargs)
    obj = _objective(out)
    if isinstance(obj, torch.Tensor):
        obj.backward()
    return pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)


def parity(reference: torch.nn.Module, candidate: torch.nn.Module, *args, params=None, **kwargs) -> ParityReport:
    """Compare ``candidate`` with ``reference`` on one forward+backward.

    ``params``: the parameters whose gradients are compared, as ``{name: Parameter}`` of
    the candidate; default: the candidate's ``named_parameters()`` with a leading
    ``module.`` removed, matched by name against the reference's.
    """
    reference.zero_grad(set_to_none=True)
    candidate.zero_grad(set_to_none=True)
    expected = run_step(reference, *args, **kwargs)
    actual = run_step(candidate, *args, **kwargs)
    report = ParityReport()
    exp_leaves = pytree.tree_flatten_with_path(expected)[0]
    act_leaves = pytree.tree_leaves(actual)
    if len(exp_leaves) != len(act_leaves):
        report.outputs["<structure>"] = float("inf")
    for (path, e), a in zip(exp_leaves, act_leaves):
        if isinstance(e, torch.Tensor):
            report.outputs[pytree.keystr(path)] = relative_error(a, e)
    if params is None:
        params = {n.removeprefix("module."): p for n, p in candidate.named_parameters()}
    for name, ref_param in reference.named_parameters():
        cand = params.get(name)
        if ref_param.grad is None:
            continue
        if cand is None or cand.grad is None:
            report.grads[name] = float("inf")
        else:
            report.grads[name] = relative_error(cand.grad, ref_param.grad)
    return report


def padded_parity(reference: torch.nn.Module, compiled: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                  labels: torch.Tensor, *, control: bool = False) -> dict | float:
    """One padded call (``input_ids``, ``attention_mask``, ``labels`` with padding at -100)
    of ``compiled`` against ``reference``: ``{"outputs", "grads"}``, the worst relative
    errors of :func:`parity`. ``control``: the compiled model called without the mask,
    against the reference with it; returns the logits' relative error (the padding must
    show)."""
    if control:
        expected = reference(input_ids=ids, attention_mask=mask, labels=labels).logits
        got = compiled(input_ids=ids, labels=labels).logits
        return float((got - expected).abs().max() / expected.abs().max())
    report = parity(reference, compiled, input_ids=ids, attention_mask=mask, labels=labels)
    return {"outputs": report.max_output_error, "grads": report.max_grad_error}


def max_grad_error(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    """The largest :func:`relative_error` of ``model``'s gradients against ``reference``'s
    (in parameter order; a parameter neither side's step reaches, e.g. an unused vision
    tower, is skipped; one that only one side's reaches counts as infinite)."""
    errors = [0.0]
    for p, q in zip(model.parameters(), reference.parameters()):
        if p.grad is None and q.grad is None:
            continue
        errors.append(float("inf") if p.grad is None or q.grad is None else relative_error(p.grad, q.grad))
    return max(errors)


def adamw_steps(reference: torch.nn.Module, model: torch.nn.Module, compiled, loss_of, batches,
                grad_error=max_grad_error, lr: float = 1e-3) -> list[tuple[float, float]]:
    """Train ``reference`` and ``model`` (called through ``compiled``) side by side with
    AdamW (:data:`ADAM_EPS`), one step per item of ``batches`` (``loss_of(module, batch)``
    gives that step's loss). Returns, per step, ``(grad_error(model, reference),
    parameter_distance after the step)``; after each step the parameters are aligned
    (:func:`align_parameters`)."""
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=lr, eps=ADAM_EPS)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=ADAM_EPS)
    steps = []
    for batch in batches:
        for m, o in ((reference, opt_ref), (compiled, opt)):
            o.zero_grad()
            loss_of(m, batch).backward()
        grads = grad_error(model, reference)
        opt_ref.step()
        opt.step()
        steps.append((grads, parameter_distance(reference, model)))
        align_parameters(model, reference)
    return steps


def saved_growth(compiled, model: torch.nn.Module, call, batches) -> float:
    """How the bytes kept for backward by ``call(compiled, batch)`` grow from the first of
    ``batches`` (length S) to the second (2S): this rank's, the parameters not counted."""
    from autosp.planning.memory import SavedTensors
    saved = []
    for batch in batches:
        with SavedTensors(list(model.parameters())) as kept:
            out = call(compiled, batch)
        saved.append(kept.bytes)
        del out
    return saved[1] / saved[0]


def _next_ranks_heads(x: torch.Tensor, dim: int, heads: int, group: str) -> torch.Tensor:
    from autosp.runtime import collectives
    p = collectives.group_size(group)
    n, r = heads // p, (collectives.group_rank(group) + 1) % p
    if x.shape[dim] == heads:
        return x.narrow(dim, r * n, n)
    return x.unflatten(dim, (-1, heads)).narrow(dim + 1, r * n, n).flatten(dim, dim + 1)


class next_ranks_heads:
    """A negative control: while active, every ``autosp.local_heads`` in programs emitted
    inside it takes the *next* rank's block of heads (a position bias, a projection's rows
    cut to this rank's heads), so a parity check must fail. Restored on exit (pooled test
    ranks run the next test in the same process).

    Example::

        >>> with next_ranks_heads(control):
        ...     compiled = autosp.compile(model); report = parity(reference, compiled, ids)
    """

    def __init__(self, active: bool = True):
        self.active = active

    def __enter__(self) -> next_ranks_heads:
        from autosp.backend import fx_emitter
        from autosp.ir import contract
        self.original = fx_emitter._AUTOSP_OPS[contract.LOCAL_HEADS]
        if self.active:
            fx_emitter._AUTOSP_OPS[contract.LOCAL_HEADS] = (_next_ranks_heads, self.original[1])
        return self

    def __exit__(self, *exc) -> None:
        from autosp.backend import fx_emitter
        from autosp.ir import contract
        fx_emitter._AUTOSP_OPS[contract.LOCAL_HEADS] = self.original
