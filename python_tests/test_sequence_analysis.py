"""The sequence-axis analysis on imported reference models."""
import re

import pytest

import autosp
from autosp.ir.core import body_ops, main_func
from autosp.ir.sequence import NOT_SEQ, analyze_sequence
from autosp.testing.models import reference_model


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
            if dyn and (entries is None or any(entries[i] == NOT_SEQ for i in dyn)):
                missing.append(op.operation.name)
    assert not missing, f"dynamic dims without a sequence description: {missing}"
    # The token input's seq dim and the one scalar S are known.
    assert "S" in info.scalars.values()


def test_expressions_follow_the_loss_shift():
    model, args, kwargs, seq_dim = reference_model("llama", layers=1, seq=12)
    info = analyze_sequence(autosp.import_model(model, *args, **kwargs).module)
    exprs = {e for entries in info.dims.values() for e in entries if e != NOT_SEQ}
    assert {"S", "S - 1", "S * 2 - 2"} <= exprs
