"""The mask algebra (autosp/ir/mask_algebra.py) and the one reader of affine shape bindings."""
from torch_mlir import ir

from autosp.ir.mask_algebra import FALSE, TRUE, And, Ge, Lin, eq, f_and, f_not, f_or, format_formula, ge
from autosp.ir.sequence import Linear, seq_expr_of_affine
from autosp.ir.sizes import lin_of_affine


def test_formulas_simplify_as_they_are_built():
    q, k = Lin.var(2), Lin.var(3)
    causal = ge(q - k)
    assert causal == Ge(Lin.of({2: 1, 3: -1}))
    assert f_and(causal, f_not(causal)) == FALSE and f_or(causal, f_not(causal)) == TRUE
    assert ge(Lin.var(0) + Lin((), 1)) == TRUE  # indices are >= 0
    assert eq(Lin.var(0).scale(2) - Lin((), 1)) == FALSE  # 2 i = 1 has no integer solution
    window = f_and(causal, f_not(ge(q - k - Lin((), 8))))
    assert isinstance(window, And) and format_formula(window) == "and(i2 - i3 >= 0, - i2 + i3 + 7 >= 0)"


def test_one_walker_reads_affine_bindings_for_both_readers():
    with ir.Context():
        text = "affine_map<()[s0, s1] -> (s0 * 2 - 1, s0 floordiv 2, s0 * s1, s0 + s1, 7)>"
        exprs = list(ir.AffineMapAttr(ir.Attribute.parse(text)).value.results)
        lins = [lin_of_affine(e, ["seq", None]) for e in exprs]
        seq = [seq_expr_of_affine(e, [True, False]) for e in exprs[:2]]
    assert lins[0] == Lin.of({"seq": 2}, -1)
    assert lins[1] is None and lins[2] is None  # not linear
    assert lins[3] is None  # s1 is no torch.symbolic_int
    assert lins[4] == Lin((), 7)
    assert seq[0] == Linear(2, -1) and str(seq[1]) == "S floordiv 2"
