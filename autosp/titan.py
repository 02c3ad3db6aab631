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

The data contract is autosp's: every rank of a group passes the same full batch and
``labels`` are sharded with ``model.autosp.shard_sequence(labels)``; the loss is the local
sum over the global token count (torchtitan's ``global_valid_tokens``).

Example (torchtitan's own parallelize, then autosp)::

    import autosp.titan
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


def parallelize(parallelize_fn: Callable | None = None, **options) -> Callable:
    """A ``ModelSpec.parallelize_fn`` that applies ``parallelize_fn`` (torchtitan's: FSDP2,
    activation checkpointing; context parallelism off) and then :func:`compile`."""
    def fn(model, *args, **kwargs):
        if parallelize_fn is not None:
            model = parallelize_fn(model, *args, **kwargs)
        return compile(model, **options)
    return fn
