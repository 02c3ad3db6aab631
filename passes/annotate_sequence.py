"""``autosp-annotate-sequence``: mark the sequence dimension of every value."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.ir.pass_base import ModulePass
from autosp.ir.sequence import analyze_sequence, annotate


@dataclass(frozen=True)
class AnnotateSequence(ModulePass):
    """Mark every dimension that is the sequence (or an expression of it), and the attention ops.

    Reads the ``torch.bind_symbolic_shape`` bindings of the symbolic sequence length S and
    writes ``autosp.seq`` on each op: one entry per result dimension, ``"_"`` where the
    size does not depend on S, else its size in terms of S. Integer sizes derived from S
    get one expression. Attention ops (SDPA, or softmax over an [S, S] score tensor) get
    ``autosp.attention``. Fails, located at the function, when there is no sequence axis or
    (with ``require-attention``) no attention.

    Input::

        %2 = torch.symbolic_int "s41" {min_val = 3, max_val = 4096} : !torch.int
        %3 = torch.aten.size.int %ids, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
        %4 = torch.aten.sub.int %3, %int1 : !torch.int, !torch.int -> !torch.int
        %5 = torch.aten.embedding %w, %ids, ... -> !torch.vtensor<[2,?,32],f32>
        torch.bind_symbolic_shape %5, [%2], affine_map<()[s0] -> (2, s0, 32)> : !torch.vtensor<[2,?,32],f32>

    Output::

        %3 = torch.aten.size.int %ids, %int1 {autosp.seq = "S"} : ...
        %4 = torch.aten.sub.int %3, %int1 {autosp.seq = "S - 1"} : ...
        %5 = torch.aten.embedding %w, %ids, ... {autosp.seq = ["_", "S", "_"]} : ...
    """

    name: ClassVar[str] = "autosp-annotate-sequence"
    require_attention: bool = True

    def apply(self, module) -> None:
        annotate(module, analyze_sequence(module, require_attention=self.require_attention))
