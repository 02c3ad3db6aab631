"""autosp.backend.shape_check in one process: the emitted program's forward on meta tensors,
as each distinct rank (collectives simulated), before its first run."""
import pytest
import torch

from autosp.backend.shape_check import check_shapes, representative_ranks, source_line
from autosp.driver import emit_program, transform
from autosp.ir.diagnostics import AutospError
from autosp.ir.layout import SeqLayout
from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike


def _program(plant: bool, sp_size: int = 2, seq: int = 30):
    from test_shape_check import _plant_missing_shard  # (e2e: the same planted bug)
    model = LlamaLike(LlamaConfig(**LLAMA_PRESETS["tiny"]))
    ids = torch.randint(0, 128, (2, seq))
    transformed = transform(model, (ids,), {"labels": ids}, sp_size=sp_size)
    if plant:
        transformed = _plant_missing_shard(transformed)
    return emit_program(model, transformed), model, [ids, ids]


@pytest.mark.parametrize("seq", [30, 31, 33])
def test_a_correct_program_passes_at_every_split(seq):
    program, model, leaves = _program(False, 4, seq)
    result = check_shapes(program, model, leaves, sp_size=4, layout=None, seq_len=seq)
    assert result.stopped is None and result.ranks == representative_ranks(SeqLayout(ulysses=4), 4, seq)


def test_a_planted_missing_shard_names_the_op_and_the_model_line():
    program, model, leaves = _program(True)
    with pytest.raises(AutospError, match=r"shapes do not agree: torch\.aten\.\w+\.Tensor at \S*autosp/models\.py:\d+ "
                                          r"fails on rank 0 of 2 \(its sequence share 15 of 30"):
        check_shapes(program, model, leaves, sp_size=2, layout=None, seq_len=30)


def test_negative_control_the_planted_program_fails_when_run():
    """What the check stands in for: the same program run as rank 0 fails with a RuntimeError."""
    from autosp.runtime import collectives
    program, model, leaves = _program(True)
    with collectives.simulate(2, 0), pytest.raises(RuntimeError, match="size of tensor|broadcast"):
        program(model, leaves)


def test_an_op_that_needs_values_stops_the_check_without_an_error():
    """An op the meta run cannot judge (here every all-to-all, made to read values) stops
    the check there: the program is not blamed."""
    from autosp.runtime import collectives

    def needs_values(*args, **kwargs):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")
    program, model, leaves = _program(False)
    gm = program.graph_module
    for node in gm.graph.nodes:
        if node.target is collectives.all_to_all:
            node.target = needs_values
    gm.recompile()
    result = check_shapes(program, model, leaves, sp_size=2, layout=None, seq_len=30)
    assert result.stopped is not None and "item()" in result.stopped, result


def test_representative_ranks_one_per_distinct_share():
    assert representative_ranks(SeqLayout(ulysses=4), 4, 32) == [0]  # every rank holds 8
    ranks = representative_ranks(SeqLayout(ulysses=4), 4, 30)  # 8, 8, 8, 6
    assert ranks[0] == 0 and len(ranks) == 2
    assert representative_ranks(SeqLayout(ulysses=4), 4, 2)[:1] == [0]  # some ranks hold nothing


def test_source_line_reads_the_first_file_location():
    loc = 'loc(callsite("/a/b/autosp/models.py":89:4 at "/x/y/torch/nn/module.py":1:0))'
    assert source_line(loc) == "b/autosp/models.py:89" and source_line("loc(unknown)") == ""
