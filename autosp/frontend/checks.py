"""``autosp::check``: a model's runtime check on tensor data, kept through the import.

transformers checks some inputs against the model's own numbers on tensors
(``torch_compilable_check``: LLaVA's image-token count against its image features).
torch.export writes such a check as ``sym_ite`` and ``_assert_scalar``, which torch-mlir
cannot import, and its importer drops ``_assert_async``. :func:`rewrite_tensor_checks
<autosp.frontend.symbolic.rewrite_tensor_checks>` turns the check into this op, whose
zero is added to one output: it stays in the data flow, and on bad input the compiled
program raises as the model would have, instead of training on it.
"""
from __future__ import annotations

import torch


@torch.library.custom_op("autosp::check", mutates_args=())
def check(cond: torch.Tensor, message: str, dtype: torch.dtype) -> torch.Tensor:
    """A zero of ``dtype``; raises RuntimeError(``message``) unless ``cond`` is true (not
    checked on the meta device, where there is no data: the memory model)."""
    if cond.device.type != "meta" and not bool(cond):
        raise RuntimeError(message)
    return torch.zeros((), dtype=dtype, device=cond.device)


@check.register_fake
def _(cond, message, dtype):
    return torch.empty((), dtype=dtype, device=cond.device)
