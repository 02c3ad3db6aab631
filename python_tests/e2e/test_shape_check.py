"""The emitted program's shapes are checked before its first run (autosp.backend.shape_check).

A wrong split is planted in the transformed IR (the rotary positions left whole while the
queries are sharded: what a partition bug looks like); the compiled call must raise an
AutospError naming the op and the model's source line on every rank, before any collective.
Control: the same program with the check switched off fails at run time with a RuntimeError
on rank 0 while rank 1 waits in its next collective (the failure the check exists for)."""
import torch

from autosp.testing.distributed import run_ranks

SEQ = 32


def _plant_missing_shard(transformed):
    """The first ``autosp.shard`` of a computed value (the rotary positions, not an input)
    is dropped: its users get the whole sequence while the queries hold a share."""
    from torch_mlir import ir

    from autosp.ir.core import body_ops, main_func, op_name
    module = transformed.module
    with module.context:
        for op in body_ops(main_func(module)):
            if op_name(op) == "autosp.shard" and not isinstance(op.operands[0].owner, ir.Block):
                op.results[0].replace_all_uses_with(op.operands[0])
                op.erase()
                return transformed
    raise AssertionError("no shard of a computed value to plant the bug in")


def _body(rank, world, queue, seed, check):
    import autosp
    import autosp.api
    from autosp.ir.diagnostics import AutospError
    from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike
    original = autosp.api.transform
    autosp.api.transform = lambda *a, **k: _plant_missing_shard(original(*a, **k))
    if not check:
        from autosp.backend.shape_check import ShapeCheck
        autosp.api.check_shapes = lambda *a, **k: ShapeCheck()
    try:
        torch.manual_seed(seed)
        model = LlamaLike(LlamaConfig(**LLAMA_PRESETS["tiny"]))
        compiled = autosp.compile(model)
        ids = torch.randint(0, 128, (2, SEQ))
        try:
            compiled(ids, labels=ids)
            queue.put((rank, ("ran", "")))
        except AutospError as e:
            queue.put((rank, ("AutospError", str(e))))
        except RuntimeError as e:
            queue.put((rank, ("RuntimeError", str(e))))
    finally:
        autosp.api.transform = original


def test_a_planted_wrong_split_is_an_error_before_the_first_run(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, True), fresh=True, timeout=300)
    for rank, (kind, message) in results.items():
        assert kind == "AutospError", (rank, kind, message)
        assert "shapes do not agree" in message and "rank 0 of 2" in message, message
        assert "autosp/models.py:" in message, message  # the model's source line
        assert "aten.mul" in message or "aten.add" in message, message  # the op


def test_negative_control_without_the_check_it_fails_at_run_time(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, False), fresh=True, timeout=300, collective_timeout=5)
    kind, message = results[0]
    assert kind == "RuntimeError" and "size of tensor" in message, (kind, message)
    assert results[1][0] == "RuntimeError", results[1]  # rank 1 waited for rank 0 in a collective
