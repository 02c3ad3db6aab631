"""Teach torch-mlir's importer the symbolic size expressions it lacks.

torch-mlir 20261001 translates sympy Add/Mul/Pow/Mod into affine expressions but not
``FloorDiv``/``CeilDiv``, so any model that computes ``S // 2`` (halving a sequence,
chunking RoPE) fails to import with ``NotImplementedError``. Affine maps express both
(``s0 floordiv 2``, ``s0 ceildiv 2``): we add them by wrapping the module-level
translator, which the original calls recursively by name.
"""
from __future__ import annotations

import sympy
from torch.utils._sympy.functions import CeilDiv, FloorDiv, MinMaxBase
from torch_mlir import ir
from torch_mlir.extras import fx_importer

_original = fx_importer.sympy_expr_to_semi_affine_expr


class NotAffine(NotImplementedError):
    """A size expression affine maps cannot hold (``Max``/``Min`` of sizes)."""


def _translate(expr, symbols_map):
    if isinstance(expr, (sympy.Max, sympy.Min, MinMaxBase)):
        raise NotAffine(f"the symbolic size '{expr}' ({type(expr).__name__}) is not affine")
    if isinstance(expr, FloorDiv):
        a, b = expr.args
        return ir.AffineFloorDivExpr.get(_translate(a, symbols_map), _translate(b, symbols_map))
    if isinstance(expr, CeilDiv):
        a, b = expr.args
        return ir.AffineCeilDivExpr.get(_translate(a, symbols_map), _translate(b, symbols_map))
    try:
        return _original(expr, symbols_map)
    except NotAffine:
        raise
    except NotImplementedError:
        raise NotImplementedError(
            f"autosp cannot express the symbolic size '{expr}' ({type(expr).__name__}) as an affine "
            "expression of the sequence length; compute sizes with +, -, *, //, % of the sequence "
            "length") from None


_original_bind = fx_importer.GraphNodeImporter._create_bind_symbolic_shape_ops


def _bind_where_affine(self, loc, node):
    """torch-mlir's shape binding of ``node``, left out where a size is a ``Max``/``Min``
    of sizes (``torch.sym_max``, read as ``prim.max.int``): the tensor's dim stays dynamic
    and unbound, so the sequence analysis does not take it for a sequence dim."""
    try:
        _original_bind(self, loc, node)
    except NotAffine:
        pass


def install() -> None:
    """Idempotently route torch-mlir's translator through :func:`_translate` (and its
    shape bindings through :func:`_bind_where_affine`)."""
    fx_importer.sympy_expr_to_semi_affine_expr = _translate
    fx_importer.GraphNodeImporter._create_bind_symbolic_shape_ops = _bind_where_affine


def rewrite_sym_float(graph) -> int:
    """Python functions of sizes the importer has no handler for, as the ops it imports:

    - ``torch.sym_float(n)`` of a symbolic int (``0.0 + x.shape[0]``, as Mixtral's and
      Qwen-MoE's ``load_balancing_loss_func`` count rows) becomes ``aten.Float.Scalar(n)``,
      the op torch-mlir's importer itself uses to promote a symbolic int;
    - ``torch.sym_max(a, b)`` / ``torch.sym_min(a, b)`` of ints (``max(seq_len, n)`` in
      MPT's ALiBi, ``min(S, window)``) become ``prim.max.int`` / ``prim.min.int``
      (``torch.prim.max.int`` in the torch dialect).

    Returns how many nodes were rewritten."""
    import torch
    targets = {torch.sym_float: torch.ops.aten.Float.Scalar, torch.sym_max: torch.ops.prim.max.int,
               torch.sym_min: torch.ops.prim.min.int}
    count = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.target in targets and \
                (node.target is torch.sym_float or all(isinstance(_value(a), (int, torch.SymInt)) for a in node.args)):
            node.target = targets[node.target]
            count += 1
    return count


def _value(arg):
    """An FX argument's value as traced (a node's ``val``), or the constant itself."""
    return arg.meta.get("val") if hasattr(arg, "meta") else arg


def rewrite_tensor_checks(graph, signature=None) -> int:
    """A runtime check of a boolean tensor, as ``torch._check_tensor_all`` exports it
    (transformers' ``torch_compilable_check``: LLaVA's image-token count): ``u =
    sym_ite(item(t), 1, 0)`` and assertions comparing ``u`` with constants. torch-mlir has
    no ``sym_ite``. Each such ``u`` is 0 or 1, so the assertions are read at both: true at
    both, they are dropped (range facts); true at 1 only, they are exactly "t is true" and
    become one :func:`autosp.frontend.checks.check` of ``t`` (torch-mlir's importer drops
    ``_assert_async``: the check's zero is added to the program's smallest float output,
    so it stays in the data flow), which still fails at run time on bad input. Any other
    ``sym_ite`` is left (and the import names it). Returns how many ``sym_ite`` were
    rewritten."""
    import operator

    import torch
    compare = {operator.ge: operator.ge, operator.le: operator.le, operator.eq: operator.eq,
               operator.gt: operator.gt, operator.lt: operator.lt, operator.ne: operator.ne}
    items = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.sym_ite or tuple(node.args[1:]) != (1, 0):
            continue
        item = node.args[0]
        if not (isinstance(item, torch.fx.Node) and item.target in items):
            continue
        checks = list(node.users)
        if not checks or any(c.target not in compare or c.args[0] is not node or not isinstance(c.args[1], int)
                             or any(a.target is not torch.ops.aten._assert_scalar.default for a in c.users)
                             for c in checks):
            continue

        def holds(u, checks=checks):
            return all(compare[c.target](u, c.args[1]) for c in checks)
        if not holds(1):
            continue  # a check that fails whenever t is true: leave it to the import
        asserts = [a for c in checks for a in c.users]
        if not holds(0):
            where = (node.meta.get("stack_trace") or "").strip().splitlines()[-1:] or ["?"]
            _add_check(graph, item.args[0], f"autosp: the model's runtime check failed ({where[0].strip()})",
                       signature)
        for a in asserts:
            graph.erase_node(a)
        for c in checks:
            graph.erase_node(c)
        graph.erase_node(node)
        if not item.users:
            graph.erase_node(item)
        count += 1
    return count


def _add_check(graph, cond, message: str, signature=None) -> None:
    """``out + autosp::check(cond, message)`` for the graph's smallest float output (and
    the export ``signature``'s output spec renamed to it: the importer reads outputs by
    name)."""
    import torch

    from autosp.frontend import checks  # noqa: F401 - registers autosp::check
    output = next(n for n in graph.nodes if n.op == "output")
    flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    floats = [(i, n) for i, n in enumerate(flat) if isinstance(n, torch.fx.Node)
              and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point()]
    if not floats:
        raise NotImplementedError("a runtime check in a program without a float output")
    i, out = min(floats, key=lambda item: item[1].meta["val"].numel())
    val = out.meta["val"]
    with graph.inserting_before(output):
        zero = graph.call_function(torch.ops.autosp.check.default, (cond, message, val.dtype))
        zero.meta["val"] = val.new_empty(())
        total = graph.call_function(torch.ops.aten.add.Tensor, (out, zero))
        total.meta["val"] = val
    flat[i] = total
    output.args = (type(output.args[0])(flat) if isinstance(output.args[0], (list, tuple)) else flat[0],)
    if signature is not None:
        spec = signature.output_specs[i]
        if getattr(spec.arg, "name", None) == out.name:
            spec.arg.name = total.name


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
