"""Per-token log-probabilities of the labels on each rank's own positions, without the
full-vocabulary logits: what ``SequenceParallelModel`` answers TRL's
``model(..., labels=labels, fused_lm_head=True)`` with.

How one call runs on each rank of an SP group:

1. **Backbone, sequence-sharded.** The causal LM's backbone (``model.base_model``, the
   module TRL's own fused head calls) is compiled by ``autosp.compile`` inside a small
   wrapper (:class:`_BackboneAndHead`) that returns its last hidden state and the LM head's
   weight (and bias). The hidden state is a sequence-aligned output, so each rank gets its
   own positions, ``[B, S/P, H]``; the weight is returned whole (``autosp.grad_share``:
   the program takes 1/P of its gradient, assuming every rank holds the whole gradient of
   the objective; see :func:`_own_share`). Parameters then get their gradients through
   the program, so autosp's gradient sum (SP) and mean (DP), FSDP2's reduce-scatter and
   tied embeddings stay the program's business, as for every other parameter.
2. **Tiled LM head, local rows.** The labels are shifted over the full sequence (position
   ``i`` scores ``labels[i + 1]``; the last position scores nothing, ``-100``) and sharded
   like the hidden state (``AutospModule.shard_sequence``), so every target meets its
   hidden row on the rank that holds it, zigzag layouts included. The rows with a label are
   projected through the LM head ``chunk`` rows at a time (:func:`token_stats`): each chunk's
   ``[rows, V]`` logits give the label's log-probability, the entropy, ``log sum p^2``, the
   mean logit and whether the label is the argmax, and are dropped; backward recomputes one
   chunk at a time. No rank holds ``[S, V]``, nor ``[S/P, V]``: at most one chunk's
   logits (about :data:`LOGITS_CHUNK_BYTES` in fp32) and its softmax.
3. **Gather the vectors.** The five per-token vectors (``[B, S/P]`` each, stacked) are
   gathered along the sequence in sequence order (``AutospModule.gather_sequence``; its
   backward hands each rank its own positions), so TRL's loss code sees the full ``[B, S]``
   values one process computes, on every rank.

The values are those of :meth:`SequenceParallelModel._fused_lm_head` over the gathered
logits (and of TRL's own fused head on one process): ``logits[:, :-1]`` against
``labels[:, 1:]`` (or ``shift_labels`` unshifted), divided by ``temperature`` in fp32, every
per-token field zero where the label is ``-100``, ``is_top1`` the first argmax. The model's
own logit transforms (``logit_scale``, ``final_logit_softcapping``, ...) are read from its
config by TRL's rules (:func:`logit_transform`).

Example::

    head = LogProbHead.for_model(model, sp_size=2, options={})
    fields = head(args=(), kwargs={"input_ids": ids}, labels=labels, shift_labels=None, temperature=1.0)
    fields["log_probs"]            # [B, S - 1], the same on every rank
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autosp.ir.diagnostics import AutospError

# A chunk: the rows whose fp32 [rows, V] logits take about this many bytes (at least one row).
LOGITS_CHUNK_BYTES = 64 << 20
# The per-token fields, in the order of token_stats' results (and of the gathered stack).
FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


# ----------------------------------------------------------------------------- the tiled head
def logit_transform(config) -> tuple[float, float | None]:
    """``(scale, softcap)`` of a causal LM's logits after its LM head, by TRL's rules
    (``trl.trainer.utils.add_fused_lm_head``): ``logit_scale``, else ``output_multiplier``,
    else ``lm_head_multiplier``, else ``1 / logits_scaling`` (HyperCLOVA X: ``logits_scaling``),
    else 1; ``final_logit_softcapping`` (None: none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    scale = getattr(text, "logit_scale", None)
    if scale is None:
        scale = getattr(text, "output_multiplier", None)
    if scale is None:
        scale = getattr(text, "lm_head_multiplier", None)
    if scale is None and getattr(text, "logits_scaling", None) is not None:
        scale = text.logits_scaling if getattr(text, "model_type", "") == "hyperclovax" else 1 / text.logits_scaling
    return (1.0 if scale is None else float(scale)), getattr(text, "final_logit_softcapping", None)


def _project(h, weight, bias):
    """The LM head on rows ``h`` (under the caller's autocast, as the model runs it)."""
    return F.linear(h, weight, bias)


def _transform(y, scale, softcap, temperature):
    """The model's scale and soft-capping of the head's output, then fp32 over the temperature."""
    if scale != 1.0:
        y = y * scale
    if softcap is not None:
        y = torch.tanh(y / softcap) * softcap
    return y.float() / temperature


def _stats(logits, targets):
    """Per row of fp32 ``logits`` [n, V] (differentiable: log-prob of ``targets``, entropy;
    not: ``log sum p^2``, mean logit, label == first argmax, as 0/1)."""
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    with torch.no_grad():
        log_sum_sq = torch.logsumexp(2 * log_softmax, dim=-1)
        mean_logits = logits.mean(-1)
        is_top1 = (logits.argmax(-1) == targets).to(logits.dtype)
    return log_probs, entropy, log_sum_sq, mean_logits, is_top1


def _spans(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(chunk, n - s)) for s in range(0, n, chunk)]


def _autocast_state(device_type: str) -> tuple:
    enabled = torch.is_autocast_enabled(device_type)
    return device_type, (torch.get_autocast_dtype(device_type) if enabled else None), enabled


class _TokenStats(torch.autograd.Function):
    """Forward chunk by chunk without a graph, keeping only ``h``, the head and the targets;
    backward recomputes each chunk (under the forward's autocast) and differentiates it."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, scale, softcap, temperature, chunk):
        ctx.set_materialize_grads(False)  # entropy is often a metric only: no zeros for it
        ctx.args = (scale, softcap, temperature, chunk)
        ctx.autocast = _autocast_state(h.device.type)
        ctx.save_for_backward(h, weight, bias, targets)
        outs = _forward(h, weight, bias, targets, scale, softcap, temperature, chunk)
        ctx.mark_non_differentiable(*outs[2:])
        return outs

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, *_):
        h, weight, bias, targets = ctx.saved_tensors
        scale, softcap, temperature, chunk = ctx.args
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and bias is not None
        # fp32 accumulators (as TRL's chunked head): the weight's gradient is summed over chunks
        grad_h = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        device_type, dtype, enabled = ctx.autocast
        for s, n in _spans(h.shape[0] if grad_log_probs is not None or grad_entropy is not None else 0, chunk):
            hc = h.narrow(0, s, n)
            with torch.no_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled):
                y = _project(hc, weight, bias)  # [n, V], recomputed
            y = y.detach().requires_grad_(True)
            with torch.enable_grad():
                log_probs, entropy, *_ = _stats(_transform(y, scale, softcap, temperature), targets.narrow(0, s, n))
            pairs = [(o, g.narrow(0, s, n)) for o, g in ((log_probs, grad_log_probs), (entropy, grad_entropy))
                     if g is not None]
            (grad_y,) = torch.autograd.grad([o for o, _ in pairs], [y], [g for _, g in pairs])
            del log_probs, entropy, pairs
            # the head's own backward, by hand: no [V, H] gradient per chunk, one fp32 sum
            if grad_h is not None:
                grad_h.narrow(0, s, n).copy_(grad_y @ weight.to(grad_y.dtype))
            if grad_w is not None:
                grad_w.addmm_(grad_y.t().float(), hc.float())
            if grad_b is not None:
                grad_b.add_(grad_y.sum(0, dtype=torch.float32))
            del y, grad_y  # this chunk's logits go before the next is recomputed
        return (None if grad_h is None else grad_h.to(h.dtype), None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None, None)


def _forward(h, weight, bias, targets, scale, softcap, temperature, chunk):
    parts = []
    with torch.no_grad():
        for s, n in _spans(h.shape[0], chunk):
            y = _project(h.narrow(0, s, n), weight, bias)
            parts.append(_stats(_transform(y, scale, softcap, temperature), targets.narrow(0, s, n)))
    if not parts:  # no rows: empty results (still connected to the graph by the Function)
        empty = h.new_zeros((0,), dtype=torch.float32)
        return tuple(empty.clone() for _ in FIELDS)
    return tuple(torch.cat([p[k] for p in parts]) for k in range(len(FIELDS)))


def chunk_rows(vocab: int, chunk_bytes: int | None = None) -> int:
    """Rows per chunk: those whose fp32 ``[rows, vocab]`` logits take about ``chunk_bytes``
    (default :data:`LOGITS_CHUNK_BYTES`), at least one."""
    return max(1, (chunk_bytes or LOGITS_CHUNK_BYTES) // (4 * max(vocab, 1)))


def token_stats(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, *,
                temperature: float = 1.0, scale: float = 1.0, softcap: float | None = None,
                chunk: int | None = None) -> tuple[torch.Tensor, ...]:
    """Per row of ``h`` [N, H] through the LM head ``weight`` [V, H] (``bias`` [V] or None),
    against ``targets`` [N] (valid vocabulary ids): the label's log-probability and the
    entropy (both differentiable), ``log sum p^2``, the mean logit and whether the label is
    the first argmax (1.0/0.0), each [N] fp32, of ``scale``/``softcap``-transformed logits
    divided by ``temperature``. ``chunk`` rows at a time (default :func:`chunk_rows`), in
    forward and in backward: no [N, V] tensor exists whole.

    Example::

        >>> lp, ent, lss, mean, top1 = token_stats(h, lm_head.weight, None, labels, chunk=256)
    """
    if h.dim() != 2 or targets.shape != h.shape[:1]:
        raise ValueError(f"token_stats: h [N, H] and targets [N]; got {tuple(h.shape)}, {tuple(targets.shape)}")
    chunk = chunk or chunk_rows(weight.shape[0])
    args = (scale, softcap, float(temperature), int(chunk))
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return _TokenStats.apply(h, weight, bias, targets, *args)
    return _forward(h, weight, bias, targets, *args)


# ----------------------------------------------------------------------------- the backbone
class _OwnShare(torch.autograd.Function):
    """Identity forward; backward: the gradient times ``size``."""

    @staticmethod
    def forward(ctx, x, size):
        ctx.size = size
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.size, None


def _own_share(x: torch.Tensor, size: int) -> torch.Tensor:
    """A parameter the program returned whole: the program's backward takes 1/P of its
    gradient (``autosp.grad_share``: it assumes every rank holds the whole gradient), then
    the gradient sync sums the ranks. Here each rank holds only its own rows' share, so the
    share is multiplied by P first: sum_r (P g_r) / P = sum_r g_r, the one-process gradient."""
    if size == 1 or not (x.requires_grad and torch.is_grad_enabled()):
        return x
    return _OwnShare.apply(x, size)


def _grad_shares(program) -> int:
    """How many ``autosp.grad_share`` calls the program's graph makes (checkpointed segments included)."""
    from autosp.runtime.collectives import grad_share
    return sum(1 for module in program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes if node.op == "call_function" and node.target is grad_share)


class _BackboneAndHead(torch.nn.Module):
    """The causal LM's backbone (its last hidden state, sequence-aligned) and its LM head's
    parameters, returned whole. ``lm`` is registered as a submodule, so the compiled
    module's parameters are the model's own."""

    def __init__(self, lm: torch.nn.Module, backbone: str):
        super().__init__()
        self.lm = lm
        self._backbone = backbone

    def forward(self, *args, **kwargs):
        out = getattr(self.lm, self._backbone)(*args, **kwargs)
        hidden = out["last_hidden_state"] if isinstance(out, dict) else getattr(out, "last_hidden_state", out[0])
        head = self.lm.get_output_embeddings()
        if head.bias is None:
            return hidden, head.weight
        return hidden, head.weight, head.bias


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM under a PEFT wrapper (TRL patches that one), else ``model``."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base) and type(model).__name__.startswith("Peft"):
        return get_base()
    return model


def _shift_targets(labels: torch.Tensor | None, shift_labels: torch.Tensor | None) -> torch.Tensor:
    """The target of every position of the sequence: ``labels[:, i + 1]`` (the last position
    scores nothing: -100), or ``shift_labels`` as given."""
    if shift_labels is not None:
        return shift_labels
    assert labels is not None  # the caller refuses a call with neither
    return torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), -100)], dim=1)


def _gather_positions(compiled, x: torch.Tensor) -> torch.Tensor:
    """This rank's positions of ``x`` [B, S_local, ...] -> [B, S, ...] in sequence order on
    every rank (backward: this rank's positions of the gradient)."""
    return compiled.gather_sequence(x, dim=1)


class LogProbHead:
    """TRL's fused LM head on each rank's positions (see the module docstring): one per
    :class:`~autosp.hf.trainer.SequenceParallelModel`, compiled on every rank together at
    its first call. Not an ``nn.Module``: the parameters stay the model's."""

    def __init__(self, lm: torch.nn.Module, backbone: str, sp_size: int, options: dict):
        import autosp
        self.lm = lm
        self.sp_size = sp_size
        self.scale, self.softcap = logit_transform(lm.config)
        self.compiled = autosp.compile(_BackboneAndHead(lm, backbone), sp_size=sp_size, **options)
        self._checked: set[int] = set()  # programs whose grad_share was found

    @classmethod
    def for_model(cls, model: torch.nn.Module, sp_size: int, options: dict) -> LogProbHead | None:
        """The head for ``model`` (a causal LM with ``base_model`` and a linear LM head, under
        PEFT or not), or None where the model is not one (the caller then gathers logits)."""
        lm = _causal_lm(model)
        config = getattr(lm, "config", None)
        get_head = getattr(lm, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        if config is None or not isinstance(head, torch.nn.Linear):
            return None
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        backbone = "base_model"
        if text is not config and not hasattr(lm, "base_model"):
            backbone = "model"
        body = getattr(lm, backbone, None)
        if not isinstance(body, torch.nn.Module) or body is lm:
            return None
        return cls(lm, backbone, sp_size, options)

    def _check_shares(self, returned: int) -> None:
        """Every program returns the head's parameters through ``autosp.grad_share`` (what
        :func:`_own_share` relies on); else an error, never a wrong gradient."""
        if self.sp_size == 1:
            return
        for program in self.compiled.programs:
            if id(program) not in self._checked:
                if _grad_shares(program) < returned:
                    raise AutospError("fused_lm_head=True: the compiled backbone returns the LM head's parameters "
                                      "without autosp.grad_share, so their gradients could not be summed over the "
                                      "SP ranks")
                self._checked.add(id(program))

    def __call__(self, args: tuple, kwargs: dict, labels: torch.Tensor | None, shift_labels: torch.Tensor | None,
                 temperature: float, chunk: int | None = None) -> dict:
        """The per-token fields (``FIELDS``, ``[B, S - 1]``, or ``[B, S]`` with ``shift_labels``)
        and ``label_mask``, the same on every rank of the group."""
        kwargs = dict(kwargs, use_cache=False)
        kwargs.pop("logits_to_keep", None)
        out = self.compiled(*args, **kwargs)
        self._check_shares(len(out) - 1)
        hidden, weight = out[0], _own_share(out[1], self.sp_size)
        bias = _own_share(out[2], self.sp_size) if len(out) > 2 else None
        targets = _shift_targets(labels, shift_labels).to(hidden.device)
        seq = targets.shape[1]
        local = self.compiled.shard_sequence(targets, dim=1)  # this rank's positions, as the hidden state's
        if local.shape[:2] != hidden.shape[:2]:
            raise AutospError(f"fused_lm_head=True: labels of {seq} positions against a hidden state of "
                              f"{tuple(hidden.shape[:2])} on this rank; labels must cover the model's sequence")
        mask = local != -100
        rows = mask.reshape(-1).nonzero().squeeze(-1)  # only positions with a label are projected
        stats = token_stats(hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows), weight, bias,
                            local.reshape(-1).index_select(0, rows), temperature=temperature, scale=self.scale,
                            softcap=self.softcap, chunk=chunk)
        flat = torch.stack(stats, dim=-1)  # [n, 5]
        placed = flat.new_zeros((mask.numel(), len(FIELDS))).index_copy(0, rows, flat)
        whole = _gather_positions(self.compiled, placed.view(*mask.shape, len(FIELDS)))  # [B, S, 5]
        if whole.shape[1] != seq:
            raise AutospError(f"fused_lm_head=True: gathered {whole.shape[1]} positions, expected {seq}")
        if shift_labels is None:
            whole, targets = whole[:, :-1], targets[:, :-1]
        fields = dict(zip(FIELDS, whole.unbind(-1)))
        fields["is_top1"] = fields["is_top1"] > 0.5
        fields["label_mask"] = targets != -100
        return fields
