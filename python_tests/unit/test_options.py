"""The compile options (``autosp.options``): one checked value, one place that writes the pipeline text.

In-process, seconds. Each check is one a user meets: a wrong choice names the option and
its choices; the enums name exactly the values the code that acts on them defines; a mesh
request given as a dict and as :class:`MeshOptions` give the same pipeline text.
"""
from __future__ import annotations

import pytest

from autosp.ir.diagnostics import AutospError
from autosp.options import CHECKPOINTING, Checkpointing, CompileOptions, MeshOptions, Recurrence, Strategy, sp_pipeline


def test_the_enums_name_the_values_defined_where_they_act():
    from autosp.passes.checkpoint import MODES

    from autosp.cost.recurrence import METHODS
    from autosp.cost.strategy import STRATEGIES
    assert tuple(m.value for m in Strategy) == STRATEGIES
    assert tuple(m.value for m in Recurrence) == ("auto", *METHODS)
    assert tuple(m.value for m in Checkpointing) == ("off", *MODES) == CHECKPOINTING


def test_choices_are_their_strings():
    assert Strategy.RING == "ring" and f"{Strategy.RING}" == "ring" and str(Checkpointing.SAC_MIN) == "sac-min"
    opts = CompileOptions.from_keywords(sp_strategy="hybrid", checkpointing="sac", sp_recurrence="prefix",
                                        memory_budget="2GiB")
    assert opts.mesh.strategy is Strategy.HYBRID and opts.checkpointing is Checkpointing.SAC
    assert opts.mesh.recurrence is Recurrence.PREFIX and opts.memory_budget == 2 << 30


@pytest.mark.parametrize("keywords,message", [
    (dict(sp_strategy="zigzag"), "sp_strategy must be one of 'auto', 'ulysses', 'ring', 'hybrid', got 'zigzag'"),
    (dict(checkpointing="all"), "checkpointing must be one of 'off', 'sac', 'sac-min', 'full', got 'all'"),
    (dict(sp_recurrence="scan"), "sp_recurrence must be one of 'auto', 'heads', 'chain', 'prefix', got 'scan'"),
    (dict(ring_degree=0), "ring_degree must be a positive int, got 0"),
    (dict(ranks_per_node=True), "ranks_per_node must be a positive int, got True"),
])
def test_a_wrong_option_names_itself_and_its_choices(keywords, message):
    with pytest.raises(AutospError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CompileOptions.from_keywords(**keywords)


def test_an_unknown_keyword_is_an_error_not_ignored():
    with pytest.raises(TypeError, match="sp_stategy"):
        CompileOptions.from_keywords(sp_stategy="ring")
    with pytest.raises(AutospError, match=r"no field\(s\) \['stratgy'\]"):
        MeshOptions.of({"stratgy": "ring"})


def test_options_are_frozen():
    opts = CompileOptions.from_keywords()
    with pytest.raises(AttributeError):
        opts.verbose = True  # type: ignore[misc]


def test_one_pipeline_text_from_a_dict_or_options():
    as_dict = sp_pipeline(4, "autosp0", True, {"strategy": "ring", "recurrence": "chain"}, seq_len=4096)
    as_options = sp_pipeline(4, "autosp0", True, MeshOptions(strategy=Strategy.RING, recurrence=Recurrence.CHAIN),
                             seq_len=4096)
    assert as_dict == as_options == ("builtin.module(autosp-sp-pipeline{sp-size=4 group=autosp0 gather-outputs=true "
                                     "strategy=ring ulysses-degree=0 ring-degree=0 ranks-per-node=0 seq-len=4096 "
                                     "recurrence=chain})")
    fixed = MeshOptions(strategy=Strategy.AUTO, seq_len=1 << 20).fixed_to(2, 2)
    assert fixed.strategy is Strategy.HYBRID and "seq-len=1048576" in fixed.pipeline_options(64)
    user = CompileOptions.from_keywords(pipeline="builtin.module(autosp-dce)")
    assert user.sp_pipeline(2, "autosp0", 64) == "builtin.module(autosp-dce)"
