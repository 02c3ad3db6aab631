"""The sequence-axis analysis on imported reference models."""
import re

import pytest

import autosp
from autosp.ir.core import body_ops, main_func
from autosp.ir.sequence import Linear, NonLinear, analyze_sequence, combine, seq_expr_of_affine
from autosp.models import reference_model


@pytest.mark.parametrize("name, layers, kind", [("llama", 2, "sdpa"), ("gpt2", 2, "manual"),
                                                ("attention-seq-first", 1, "sdpa"), ("attention", 1, "sdpa")])
def test_every_dynamic_dim_is_described_and_attention_found(name, layers, kind):
    model, args, kwargs, seq_dim = reference_model(name, layers=layers, seq=12)
    module = autosp.import_model(model, *args, seq_dim=seq_dim, **kwargs).module
    info = analyze_sequence(module)
    assert [k for _, k in info.attention] == [kind] * layers
    missing = []
    for op in body_ops(main_func(module)):
        for r in op.results:
            m = re.match(r"!torch\.vtensor<\[([^\]]*)\]", str(r.type))
            if not m:
                continue
            dyn = [i for i, d in enumerate(m.group(1).split(",")) if d.strip() == "?"]
            entries = info.dims.get(r)
            if dyn and (entries is None or any(entries[i] is None for i in dyn)):
                missing.append(op.operation.name)
    assert not missing, f"dynamic dims without a sequence description: {missing}"
    # The token input's seq dim and the one scalar S are known.
    assert Linear(1, 0) in info.scalars.values()


def test_expressions_follow_the_loss_shift():
    model, args, kwargs, seq_dim = reference_model("llama", layers=1, seq=12)
    info = analyze_sequence(autosp.import_model(model, *args, **kwargs).module)
    exprs = {e for entries in info.dims.values() for e in entries if e is not None}
    assert {Linear(1), Linear(1, -1), Linear(2, -2)} <= exprs
    assert {str(e) for e in exprs} >= {"S", "S - 1", "2 * S - 2"}


def _affine(text):
    from torch_mlir import ir
    with ir.Context():
        return [seq_expr_of_affine(e, [True, False])
                for e in ir.AffineMapAttr(ir.Attribute.parse(f"affine_map<()[s0, s1] -> ({text})>")).value.results]


def test_affine_expressions_are_read_exactly():
    const, s, s1, two_s, near_s, ceil, other, mixed, exact = _affine(
        "7, s0, s0 - 1, s0 * 2 - 2, (s0 + 7) floordiv 8 * 8, s0 ceildiv 4, s1, s0 + s1, (s0 * 4 + 6) floordiv 2")
    assert (const, s, s1, two_s) == (Linear(0, 7), Linear(1), Linear(1, -1), Linear(2, -2))
    # Equal to S at every multiple of 8 (the old sampling at 1000/2000/3000 took it for S).
    assert isinstance(near_s, NonLinear) and str(near_s) == "((S + 7) floordiv 8) * 8"
    assert isinstance(ceil, NonLinear) and str(ceil) == "S ceildiv 4"
    assert not isinstance(other, (Linear, NonLinear))  # another symbol: not a sequence size
    assert isinstance(mixed, NonLinear)
    assert exact == Linear(2, 3)  # 2 divides the S part: exact


def test_integer_ops_combine_exactly():
    s = Linear(1)
    assert combine("-", combine("*", s, Linear(0, 2)), Linear(0, 2)) == Linear(2, -2)
    assert combine("floordiv", Linear(2, -2), Linear(0, 2)) == Linear(1, -1)
    assert combine("floordiv", Linear(2, -1), Linear(0, 2)) == Linear(1, -1)  # floor((2S - 1) / 2)
    assert combine("ceildiv", Linear(2, -1), Linear(0, 2)) == Linear(1, 0)
    assert isinstance(combine("floordiv", s, Linear(0, 8)), NonLinear)
    assert isinstance(combine("*", s, s), NonLinear)
    assert combine("-", s, s) == Linear(0, 0)
    for a, b_ in ((2, -1), (4, 6), (6, -7)):  # the exact forms agree with Python's // at every S tried
        for n in range(1, 40):
            f = combine("floordiv", Linear(a, b_), Linear(0, 2))
            assert f.a * n + f.b == (a * n + b_) // 2
