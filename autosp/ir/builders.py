"""Small builders for torch-dialect and autosp ops (used by the transformation passes).

Example::

    >>> with ir.InsertionPoint(op):                       # insert before ``op``
    ...     two = constant_int(2)
    ...     y = autosp_op(ALL_TO_ALL, [x, seq_len], t, split_dim=1, concat_dim=2, seq_dim=1, group="sp")
"""
from __future__ import annotations

import re

from torch_mlir import ir

from autosp.ir.contract import OPS


def vtensor_shape(type_) -> tuple[list[int | None], str] | None:
    """``!torch.vtensor<[2,?,8],f32>`` -> ``([2, None, 8], "f32")``; None for other types."""
    m = re.fullmatch(r"!torch\.vtensor<\[([^\]]*)\],([^>]+)>", str(type_))
    if not m:
        return None
    dims = [None if d.strip() == "?" else int(d) for d in m.group(1).split(",") if d.strip()]
    return dims, m.group(2)


def vtensor_type(shape: list[int | None], dtype: str) -> ir.Type:
    """The ``!torch.vtensor`` type of ``shape`` (None = dynamic) and ``dtype``."""
    dims = ",".join("?" if d is None else str(d) for d in shape)
    return ir.Type.parse(f"!torch.vtensor<[{dims}],{dtype}>")


def constant_int(value: int) -> ir.Value:
    """``torch.constant.int value`` at the current insertion point."""
    return ir.Operation.create("torch.constant.int", results=[ir.Type.parse("!torch.int")],
                               attributes={"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)}
                               ).result


def literal_ints(values: list[int]) -> ir.Value:
    """A ``torch.vtensor.literal`` of the int64 ``values`` (a 1-d tensor)."""
    n = len(values)
    attr = ir.Attribute.parse(f"dense<[{', '.join(map(str, values))}]> : tensor<{n}xsi64>")
    return ir.Operation.create("torch.vtensor.literal", results=[vtensor_type([n], "si64")],
                               attributes={"value": attr}).result


def constant_none() -> ir.Value:
    return ir.Operation.create("torch.constant.none", results=[ir.Type.parse("!torch.none")]).result


def i64(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def autosp_op(name: str, operands, result_type: ir.Type, **attrs) -> ir.Value:
    """The autosp op ``name`` (one of :data:`autosp.ir.contract.OPS`) on ``operands`` (a
    value or a list); int attributes become i64, floats f64, strings StringAttr."""
    assert name in OPS, f"{name} is not an op of the autosp dialect"
    operands = list(operands) if isinstance(operands, (list, tuple)) else [operands]
    attributes = {k: (i64(v) if isinstance(v, int) else
                      ir.FloatAttr.get(ir.F64Type.get(), v) if isinstance(v, float) else ir.StringAttr.get(v))
                  for k, v in attrs.items()}
    return ir.Operation.create(name, results=[result_type], operands=operands,
                               attributes=attributes).result


def torch_op(name: str, operands, result_type: ir.Type) -> ir.Value:
    """A ``torch.*`` op with one result."""
    return ir.Operation.create(name, results=[result_type], operands=list(operands)).result


INT = "!torch.int"


def int_type() -> ir.Type:
    return ir.Type.parse(INT)
