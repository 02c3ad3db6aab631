"""The stated ops: one record per op whose semantics autosp states instead of reading them.

A library function the export cannot give as a symbolic-S program (a loop over chunks, a
data-dependent dispatch) is replaced while exporting by one op whose meaning autosp knows.
Each record says, in one place, what the op is to every floor:

- ``op``: its name as torch-mlir imports it (``torch.operator "torch.autosp.<name>"``);
- ``layout``: how ``autosp-shard-sequence`` places it (:data:`TOKEN_WISE`: row-wise over
  the tokens of its tensor inputs' leading dim, so a sequence shard runs as it is;
  :data:`RECURRENCE`: a linear recurrence along dim 1, each rank's part from the previous
  part's state);
- ``runtime``: the function (``module:name``) the emitted program calls, and where its
  torch op and fake are defined (importing the module registers them);
- ``replaces``: the library function it stands for, and how the export finds it;
- ``substitution``: the context manager (``module:name``, called with the model) inside
  which the export calls the op in place of that function; the importer enters every
  record's (:func:`substitutions`), so a new op needs no line outside its record and its
  runtime module;
- ``priced_by``: the cost model that chooses how it runs over the ranks, if any.

The pass rules and the emitter read this table; ``docs/adding_a_model_family.md`` walks
one record end to end, and ``test_registry`` checks every record against the code.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the IR layer imports no torch: autosp-opt starts without it)
    import torch

TOKEN_WISE = "token-wise"
RECURRENCE = "recurrence"


@dataclasses.dataclass(frozen=True)
class StatedOp:
    """One stated op (module docstring)."""

    op: str
    layout: str
    runtime: str
    replaces: str
    substitution: str
    priced_by: str | None = None

    def runtime_function(self) -> Callable:
        """The function the emitted program calls (its module imported: the op registered)."""
        return _resolve(self.runtime)

    def substitution_context(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The export substitution's context for ``model`` (its module imported)."""
        return _resolve(self.substitution)(model)


def _resolve(path: str) -> Callable:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


STATED_OPS: tuple[StatedOp, ...] = (
    StatedOp("torch.autosp.token_experts", TOKEN_WISE, "autosp.runtime.experts:token_experts",
             "a mixture-of-experts experts module (transformers' experts classes, torchtitan's RoutedExperts "
             "with a local dispatcher), matched by class while exporting: each token's output from its own "
             "row and its routing",
             "autosp.runtime.experts:experts_as_token_ops"),
    StatedOp("torch.autosp.autograd_function", TOKEN_WISE, "autosp.runtime.functions:autograd_function",
             "a model's own torch.autograd.Function (PhiMoE's straight-through router, BLOOM's GeLU), applied "
             "whole with its own backward, where its statement holds: row-wise over every dim but the last of "
             "its first input, checked on random inputs at export",
             "autosp.runtime.functions:functions_as_ops"),
    StatedOp("torch.autosp.gated_delta_rule", RECURRENCE, "autosp.runtime.recurrences:gated_delta_rule",
             "transformers' torch_chunk_gated_delta_rule (Qwen3-Next, Qwen3.5), by name in the modeling modules "
             "of the model's layers; torchtitan's Qwen3.5 GatedDeltaKernel (autosp.titan), with packed "
             "documents as its starts",
             "autosp.runtime.recurrences:gated_delta_rule_as_op",
             priced_by="autosp.cost.recurrence:choose_recurrence"),
    StatedOp("torch.autosp.mamba2_chunk_scan", RECURRENCE, "autosp.runtime.recurrences:mamba2_chunk_scan",
             "transformers' mamba2_chunk_scan (Granite-4 hybrid, Nemotron-H, Mamba2), by name in the modeling "
             "modules of the model's layers",
             "autosp.runtime.recurrences:mamba2_chunk_scan_as_op",
             priced_by="autosp.cost.recurrence:choose_recurrence"),
    StatedOp("torch.autosp.selective_scan", RECURRENCE, "autosp.runtime.recurrences:selective_scan",
             "transformers' mamba_selective_scan (Mamba-1's selective scan: Mamba, Falcon-Mamba, Jamba, Zamba; its "
             "torch path loops over the positions), by name in the modeling modules of the model's layers",
             "autosp.runtime.recurrences:selective_scan_as_op"),
    StatedOp("torch.autosp.lightning_attention", RECURRENCE, "autosp.runtime.recurrences:lightning_attention",
             "MiniMax's lightning attention (a linear attention whose state decays per head), its layer's forward "
             "stated per class (*LightningAttention with MiniMax's parts) where it equals the layer's own on random "
             "inputs; the layer's loop over blocks is never exported",
             "autosp.runtime.recurrences:lightning_attention_as_op"),
    StatedOp("torch.autosp.mlstm", RECURRENCE, "autosp.runtime.recurrences:mlstm",
             "xLSTM's mLSTM, its backend module (transformers' xLSTMBackend, by class and configuration) for calls "
             "without initial states, where it equals the backend's own on random inputs; a chain only (its max "
             "stabilizer is not linear in the state)",
             "autosp.runtime.recurrences:mlstm_as_op"),
)
_BY_NAME = {s.op: s for s in STATED_OPS}


def stated(name: str) -> StatedOp | None:
    """The record of the op named ``name`` (``torch.autosp.<name>``), if it is a stated op."""
    return _BY_NAME.get(name)


def names(layout: str) -> tuple[str, ...]:
    """The stated ops placed as ``layout``."""
    return tuple(s.op for s in STATED_OPS if s.layout == layout)


@contextlib.contextmanager
def substitutions(model: torch.nn.Module) -> Iterator[None]:
    """While exporting ``model``: every stated op's substitution entered (restored on exit)."""
    with contextlib.ExitStack() as stack:
        for record in STATED_OPS:
            stack.enter_context(record.substitution_context(model))
        yield
