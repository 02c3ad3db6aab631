"""``autosp-causal-mask``: SDPA masks that are causal by construction become ``is_causal``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.ir.causal import fold_causal_masks
from autosp.ir.pass_base import ModulePass


@dataclass(frozen=True)
class CausalMask(ModulePass):
    """Replace an SDPA mask computed from the sequence length alone, and causal, by is_causal.

    Traced Hugging Face models materialise a [1, 1, S, S] mask that eager execution skips;
    SDPA keeps it for backward (O(S^2) bytes per layer). A mask whose computation reads no
    input data (only sizes) is evaluated at several lengths; when it is the causal mask at
    each, it is dropped and ``is_causal`` set. Masks computed from inputs stay.

    Input::

        %m = torch.aten.le.Tensor %cols, %rows : ... -> !torch.vtensor<[1,1,?,?],i1>
        %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %m, %float0, %false, %none, %false

    Output::

        %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %none, %float0, %true, %none, %false
    """

    name: ClassVar[str] = "autosp-causal-mask"

    def apply(self, module) -> None:
        fold_causal_masks(module)
