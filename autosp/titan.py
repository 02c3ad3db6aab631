"""autosp as torchtitan's context parallelism.

torchtitan's trainer builds the model on the meta device, calls ``ModelSpec.parallelize_fn``
(FSDP2, activation checkpointing), then ``to_empty`` and ``init_weights`` on what it
returned; with its ``ChunkedLossWrapper`` (every LM config's default) it sets
``_skip_lm_head`` and applies ``lm_head`` itself, chunk by chunk, on the hidden states.
Each step it builds the attention masks from ``positions`` (``get_attention_masks``) and
calls ``model(tokens, positions=..., attention_masks=...)``.

:func:`compile` makes such a model sequence-parallel *in place*: the model object stays
what the trainer holds (its parameters, ``state_dict`` keys, ``init_weights``,
``lm_head``, ``_skip_lm_head``, ``get_attention_masks``, ``to_empty``, FSDP2 wrapping all
pass through untouched), and only its ``forward`` becomes an autosp compiled call. The
compiled program builds the attention masks itself, inside ``forward`` from
``positions`` (a ``BlockMask`` built outside holds one batch's length; see
:mod:`autosp.frontend.flex`), so ``attention_masks`` the trainer passes are not read: they
are the masks of the same ``positions``. torchtitan's packed-document mask (its
hand-tuned ``get_efficient_causal_mask_mod_for_packed_document``, a bound read from
scatter/gather tables) is stated, while autosp exports, as the document-id mask it equals
with the causal mask (``get_document_mask_mod``: same-document causal, its docstring's
contract), which autosp's mask algebra proves; left as written it would stay an [S, S]
mask. The hidden states are this rank's sequence shard: the chunked loss applies
``lm_head`` to them, and its gradient is summed over the group
(:mod:`autosp.runtime.outside_grads`).

torchtitan's Qwen3.5 GatedDeltaNet (fla's per-document varlen kernels, CUDA-only) is
stated while exporting too (:func:`_deltanet_stated`): per-row document starts, the
convolution as ops autosp proves causal, the kernel as ``autosp::gated_delta_rule``
restarting where documents start.

The data contract is autosp's: every rank of a group passes the same full batch and
``labels`` are sharded with ``model.autosp.shard_sequence(labels)``; the loss is the local
sum over the global token count (torchtitan's ``global_valid_tokens``).

Example (torchtitan's Trainer; its own parallelize, then autosp)::

    import autosp.titan
    config.parallelism.context_parallel_degree = 4
    autosp.titan.Trainer(config).train()                                  # or:
    spec.parallelize_fn = autosp.titan.parallelize(spec.parallelize_fn)   # or:
    model = autosp.titan.compile(parallelize_llama(model, ...))
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator

import torch

_ATTENTION = "torchtitan.models.common.attention"


class _MasksInside(torch.nn.Module):
    """What autosp traces: the model's class ``forward`` with the masks built from ``positions``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, positions=None, **kwargs):
        m = self.model
        masks = None
        with _deltanet_stated():
            if positions is not None and _needs_masks(m):
                with _document_masks():
                    masks = m.get_attention_masks(positions)
            return type(m).forward(m, tokens, positions=positions, attention_masks=masks, **kwargs)


def _needs_masks(model) -> bool:
    """torchtitan builds masks for its Flex and Varlen attention configs only."""
    attention = sys.modules.get(_ATTENTION)
    first = getattr(getattr(model, "config", None), "first_attention", None)
    inner = getattr(first, "inner_attention", None)
    return attention is not None and isinstance(
        inner, (attention.FlexAttention.Config, attention.VarlenAttention.Config))


@contextlib.contextmanager
def _document_masks() -> Iterator[None]:
    """torchtitan's packed-document mask stated as the document-id mask it equals (module
    docstring), in every torchtitan module that imported it."""
    attention = sys.modules.get(_ATTENTION)
    name = "get_efficient_causal_mask_mod_for_packed_document"
    original = getattr(attention, name, None)
    if attention is None or original is None:
        yield
        return
    holders = [m for key, m in list(sys.modules.items())
               if key.startswith("torchtitan.") and getattr(m, name, None) is original]
    try:
        for m in holders:
            setattr(m, name, attention.get_document_mask_mod)
        yield
    finally:
        for m in holders:
            setattr(m, name, original)


_QWEN35 = "torchtitan.models.qwen3_5.model"
_GDN_KERNEL = f"{_QWEN35}:_fla_chunk_gated_delta_rule"


def _document_starts(positions: torch.Tensor, *, include_host_offsets: bool = False):
    """torchtitan's ``create_varlen_metadata_for_document`` for Qwen3.5's GatedDeltaNet,
    stated: where each document starts (``positions == 0``, [B, S]) in place of the packed
    offsets, which are data (``tolist``) and fold the rows into one."""
    starts = positions == 0
    return sys.modules[_ATTENTION].VarlenMetadata(cu_seq_q=starts, cu_seq_k=starts, max_q=0, max_k=0,
                                                  cu_seq_q_host=())


def _document_conv(x_BLD: torch.Tensor, weight: torch.Tensor, starts: torch.Tensor, _host=None) -> torch.Tensor:
    """fla's per-document causal depthwise convolution with SiLU (torchtitan's
    ``_causal_conv1d_varlen``, CUDA-only), written as ops: the k shifts of ``x`` by one
    padded convolution cut to S (a causal convolution, which autosp proves and splits with
    a halo), each kept where the shifted position is in the same document
    (``cumsum(starts)``, shifted the same way), weighted and summed."""
    B, L, D = x_BLD.shape
    k = weight.shape[-1]
    one_hot = torch.eye(k, dtype=x_BLD.dtype, device=x_BLD.device).flip(-1)  # row d picks x[t - d]
    shifted = torch.nn.functional.conv1d(x_BLD.transpose(1, 2), one_hot.repeat(D, 1).unsqueeze(1), padding=k - 1,
                                         groups=D)[..., :L].reshape(B, D, k, L)
    doc = starts.to(torch.float32).cumsum(1).unsqueeze(1)  # [B, 1, L]: 1, 2, ... (0 is the padding)
    doc_shifted = torch.nn.functional.conv1d(doc, one_hot.to(torch.float32).unsqueeze(1), padding=k - 1)[..., :L]
    same = (doc_shifted == doc).to(x_BLD.dtype)  # [B, k, L]
    taps = weight.reshape(D, k).flip(-1).to(x_BLD.dtype)  # [D, k]: the weight of x[t - d]
    y = (shifted * taps[None, :, :, None] * same[:, None]).sum(2)
    return torch.nn.functional.silu(y).transpose(1, 2)


def _deltanet_kernel(self, q, k, v, g, beta, *, cu_seqlens=None, cu_seqlens_cpu=None):
    """torchtitan's ``GatedDeltaKernel.forward`` stated as ``autosp::gated_delta_rule``:
    the kernel the model module names (fla's chunked kernel on CUDA; whatever the user put
    there, e.g. transformers' torch kernel, on CPU), restarted where documents start."""
    import autosp
    if self.backend != "fla_chunked":
        raise autosp.AutospError(f"autosp.titan: Qwen3.5's GatedDeltaNet backend {self.backend!r} is inference-only; "
                                 "autosp states 'fla_chunked' (its initial-state/final-state contract)")
    if q.shape[2] != v.shape[2]:  # (grouped heads, as torchtitan expands them)
        q = q.repeat_interleave(v.shape[2] // q.shape[2], dim=2)
        k = k.repeat_interleave(v.shape[2] // k.shape[2], dim=2)
    return torch.ops.autosp.gated_delta_rule(q, k, v, g, beta, True, 64, _GDN_KERNEL, cu_seqlens)


@contextlib.contextmanager
def _deltanet_stated() -> Iterator[None]:
    """While exporting, Qwen3.5's GatedDeltaNet (torchtitan's) as autosp states it: the rows
    stay rows (torchtitan folds the batch into one packed row, its documents then the rows
    and the packed documents); the document offsets become document starts
    (:func:`_document_starts`); fla's varlen convolution becomes :func:`_document_conv`
    and its kernel ``autosp::gated_delta_rule`` (:func:`_deltanet_kernel`). The same
    model, row by row: each row starts a document where ``positions`` is 0 at its start."""
    qwen = sys.modules.get(_QWEN35)
    if qwen is None:
        yield
        return
    from autosp.runtime import recurrences  # noqa: F401  (registers autosp::gated_delta_rule)
    stated = {"create_varlen_metadata_for_document": _document_starts, "_causal_conv1d_varlen": _document_conv,
              "_fold_bl_dim": lambda t, batch, seq: t,
              "_unflatten_to_bld": lambda t, batch, seq: t.reshape(batch, seq, -1)}
    originals = {name: getattr(qwen, name) for name in stated}
    kernel = qwen.GatedDeltaKernel.forward
    try:
        for name, fn in stated.items():
            setattr(qwen, name, fn)
        qwen.GatedDeltaKernel.forward = _deltanet_kernel
        yield
    finally:
        for name, fn in originals.items():
            setattr(qwen, name, fn)
        qwen.GatedDeltaKernel.forward = kernel


def compile(model: torch.nn.Module, **options) -> torch.nn.Module:
    """Make a torchtitan model sequence-parallel in place and return it (module docstring).

    ``options`` are :func:`autosp.compile`'s (``sp_size``, ``group``, ...). The compiled
    module is ``model.autosp`` (``shard_sequence`` for the labels, ``programs``). Calling
    the model compiles at the first call, after ``to_empty`` and ``init_weights``.
    """
    import autosp
    if "autosp" in model.__dict__:
        raise autosp.AutospError("autosp.titan.compile: this model is compiled already (model.autosp)")
    sp = autosp.compile(_MasksInside(model), **options)

    @functools.wraps(type(model).forward)
    def forward(tokens, positions=None, attention_masks=None, **kwargs):
        # (attention_masks: the trainer's, of the same positions; the program builds its own)
        return sp(tokens, positions, **kwargs) if positions is not None else sp(tokens, **kwargs)

    object.__setattr__(model, "forward", forward)  # an instance attribute: nn.Module's __call__ finds it
    object.__setattr__(model, "autosp", sp)  # not a submodule: the model's state stays the model's
    return model


class _WithoutCP:
    """torchtitan's ``ParallelDims`` as its ``parallelize_fn`` sees them under autosp:
    context parallelism off (autosp is the CP: torchtitan's own would split the attention
    a second time), every mesh the real one's, so FSDP2 still shards over ``fsdp``
    (data-parallel shards times the CP ranks)."""

    cp = 1
    cp_enabled = False

    def __init__(self, dims):
        self._dims = dims

    def __getattr__(self, name):
        return getattr(self._dims, name)

    @property
    def dp_cp_enabled(self) -> bool:
        return self._dims.dp_enabled


def _checkpointing(ac_config) -> str:
    """torchtitan's activation checkpointing as autosp's ``checkpointing`` option."""
    from torchtitan.distributed import activation_checkpoint as ac

    import autosp
    if isinstance(ac_config, ac.FullAC.Config):
        return "full"
    if isinstance(ac_config, ac.SelectiveAC.Config):
        return "sac"
    raise autosp.AutospError(f"autosp.titan: activation checkpointing {type(ac_config).__qualname__} has no autosp "
                             "equivalent; use FullAC or SelectiveAC (autosp's 'full' / 'sac'), or none")


def parallelize(parallelize_fn: Callable | None = None, **options) -> Callable:
    """A ``ModelSpec.parallelize_fn`` that applies ``parallelize_fn`` (torchtitan's: FSDP2)
    with torchtitan's context parallelism off, then :func:`compile` over the CP mesh's
    group (``parallel_dims.get_mesh("cp")``) where ``context_parallel_degree > 1``, else
    over ``options``' group (default: the world). torchtitan's activation checkpointing
    (``ac_config``) becomes autosp's (``FullAC``: ``checkpointing="full"``, ``SelectiveAC``:
    ``"sac"``): a wrapped block is never called by the compiled program."""
    def fn(model, *args, **kwargs):
        dims = kwargs.get("parallel_dims")
        opts = dict(options)
        if dims is not None and dims.cp_enabled:
            kwargs["parallel_dims"] = _WithoutCP(dims)
            opts.setdefault("group", dims.get_mesh("cp").get_group())
        if kwargs.get("ac_config") is not None:  # a compiled program never calls a wrapped block: autosp's
            opts.setdefault("checkpointing", _checkpointing(kwargs["ac_config"]))
            kwargs["ac_config"] = None
        if parallelize_fn is not None:
            model = parallelize_fn(model, *args, **kwargs)
        return compile(model, **opts)
    return fn


class _ShardedLabels:
    """The trainer's loss on this rank's part: ``labels`` (and ``positions``, where the loss
    is given them) become this rank's sequence shard, as the hidden states are. The model
    has been called by then, so the compiled module knows its sequence layout."""

    def __init__(self, loss_fn, model, trainer):
        self._loss_fn, self._model, self._trainer = loss_fn, model, trainer

    def __getattr__(self, name):  # (set_lm_head, num_chunks, ...: the loss's own)
        return getattr(self._loss_fn, name)

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
        sp = self._model.autosp
        labels = sp.shard_sequence(labels)
        if isinstance(kwargs.get("positions"), torch.Tensor):
            kwargs["positions"] = sp.shard_sequence(kwargs["positions"])
        self._trainer.ntokens_seen += labels.numel()  # (torchtitan counts this rank's tokens)
        return self._loss_fn(pred, labels, global_valid_tokens, **kwargs)


def _trainer_class() -> type:
    """``autosp.titan.Trainer``: torchtitan's ``Trainer`` with autosp as its context
    parallelism (built on first use: torchtitan is optional)."""
    import dataclasses

    from torchtitan.trainer import Trainer as _Trainer

    import autosp

    class Trainer(_Trainer):
        """torchtitan's ``Trainer`` with autosp as its context parallelism.

        Set ``parallelism.context_parallel_degree`` to the SP size, as for torchtitan's
        own CP: its loader then gives the CP ranks the same batch (autosp's contract),
        FSDP2 shards over data-parallel shards times CP ranks, and the loss is summed
        over them. This class wraps ``model_spec.parallelize_fn`` with :func:`parallelize`
        (torchtitan's CP off, autosp over the CP group, its activation checkpointing as
        autosp's), replaces ``post_dataloading_process`` (no masks built outside: the
        program builds its own from ``positions``; no inputs split: the program splits)
        and gives the loss this rank's shard of the labels (:class:`_ShardedLabels`). The
        rest is torchtitan's: its step, its chunked loss over the global token count,
        clipping, optimizer, logging, checkpoints. ``parallelism.spmd_backend`` becomes
        ``"partial_dtensor"`` (DTensor for FSDP2 only; ``spmd_types`` and ``full_dtensor``
        type the activations over the meshes, and autosp traces the local model).
        Pipeline and tensor parallelism, and the validator, are refused."""

        def __init__(self, config):
            par = config.parallelism
            self._autosp_cp = par.context_parallel_degree > 1
            if self._autosp_cp:
                if par.pipeline_parallel_degree > 1 or par.tensor_parallel_degree > 1:
                    raise autosp.AutospError(
                        "autosp.titan.Trainer: autosp as context parallelism with pipeline or tensor parallelism "
                        f"(pipeline_parallel_degree={par.pipeline_parallel_degree}, "
                        f"tensor_parallel_degree={par.tensor_parallel_degree}) is not supported; set both to 1")
                if config.validator.enable:
                    raise autosp.AutospError("autosp.titan.Trainer: validation with autosp as context parallelism is "
                                             "not supported yet; set validator.enable = False")
                spec = config.model_spec
                config.model_spec = dataclasses.replace(spec, parallelize_fn=parallelize(spec.parallelize_fn))
                par.spmd_backend = "partial_dtensor"
            super().__init__(config)
            if self._autosp_cp:
                self.loss_fn = _ShardedLabels(self.loss_fn, self.model_parts[0], self)  # type: ignore[has-type]

        def post_dataloading_process(self, input_dict, labels):
            if not self._autosp_cp:
                return super().post_dataloading_process(input_dict, labels)
            return input_dict["input"], labels, {k: v for k, v in input_dict.items() if k != "input"}

    Trainer.__module__ = __name__
    return Trainer


def __getattr__(name: str):
    if name == "Trainer":
        cls = _trainer_class()
        globals()["Trainer"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
