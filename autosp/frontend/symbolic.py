"""Teach torch-mlir's importer the symbolic size expressions it lacks.

torch-mlir 20261001 translates sympy Add/Mul/Pow/Mod into affine expressions but not
``FloorDiv``/``CeilDiv``, so any model that computes ``S // 2`` (halving a sequence,
chunking RoPE) fails to import with ``NotImplementedError``. Affine maps express both
(``s0 floordiv 2``, ``s0 ceildiv 2``): we add them by wrapping the module-level
translator, which the original calls recursively by name.
"""
from __future__ import annotations

from torch.utils._sympy.functions import CeilDiv, FloorDiv
from torch_mlir import ir
from torch_mlir.extras import fx_importer

_original = fx_importer.sympy_expr_to_semi_affine_expr


def _translate(expr, symbols_map):
    if isinstance(expr, FloorDiv):
        a, b = expr.args
        return ir.AffineFloorDivExpr.get(_translate(a, symbols_map), _translate(b, symbols_map))
    if isinstance(expr, CeilDiv):
        a, b = expr.args
        return ir.AffineCeilDivExpr.get(_translate(a, symbols_map), _translate(b, symbols_map))
    try:
        return _original(expr, symbols_map)
    except NotImplementedError:
        raise NotImplementedError(
            f"autosp cannot express the symbolic size '{expr}' ({type(expr).__name__}) as an affine "
            "expression of the sequence length; compute sizes with +, -, *, //, % of the sequence "
            "length") from None


def install() -> None:
    """Idempotently route torch-mlir's translator through :func:`_translate`."""
    fx_importer.sympy_expr_to_semi_affine_expr = _translate


def rewrite_sym_float(graph) -> int:
    """``torch.sym_float(n)`` of a symbolic int (``0.0 + x.shape[0]``, as Mixtral's and
    Qwen-MoE's ``load_balancing_loss_func`` count rows) becomes ``aten.Float.Scalar(n)``,
    the op torch-mlir's importer itself uses to promote a symbolic int (it has no handler
    for ``sym_float``). Returns how many nodes were rewritten."""
    import torch
    count = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.sym_float:
            node.target = torch.ops.aten.Float.Scalar
            count += 1
    return count


class DenseLiterals(fx_importer.FxImporterHooks):
    """Import constant tensors created inside ``forward`` as readable ``dense<…>`` literals.

    torch-mlir stores multi-element constants as ``dense_resource`` blobs, which the
    Python bindings cannot read back, so the FX emitter could not rebuild them. Model
    constants are small (index lists, masks); larger ones keep the default path and
    the emitter reports them.
    """

    MAX_ELEMENTS = 1 << 16

    def resolve_literal(self, gni, literal, info):
        import numpy as np
        import torch

        if not isinstance(literal, torch.Tensor) or literal.numel() <= 1 or literal.numel() > self.MAX_ELEMENTS:
            return None
        npy = fx_importer.TORCH_DTYPE_TO_NPY_TYPE.get(literal.dtype)
        if npy is None or literal.dtype not in fx_importer.TORCH_DTYPE_TO_MLIR_TYPE:
            return None
        array = np.array(literal.tolist()).astype(npy)
        element_type = fx_importer.TORCH_DTYPE_TO_MLIR_TYPE[literal.dtype]()
        attr = ir.DenseElementsAttr.get(array, type=element_type, shape=list(array.shape))
        return ir.Operation.create("torch.vtensor.literal", results=[gni._cc.tensor_to_vtensor_type(literal)],
                                   attributes={"value": attr}).result
