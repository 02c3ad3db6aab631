"""Runtime state belongs to its owner: a compiled module's process-group names go with it.

Before, every ``AutospModule`` registered ``autosp<N>`` (and ``:ulysses`` / ``:ring``) in
module-level tables that nothing ever emptied, and the test harness restored the tables
between tests. Now each module's :class:`~autosp.runtime.context.RuntimeContext` removes
its entries when the module is garbage-collected: checked here on 2 gloo ranks with a
ring mesh (sub-groups), with a negative control (a module still referenced keeps its
entries and still matches single device) and two modules that never share an entry.
Also the public queries that replaced the private globals: ``collectives.simulating()``,
``ring.force_math()`` and ``ring.stats()``.
"""
import copy
import gc

import pytest
import torch

from autosp.runtime import collectives, ring
from autosp.runtime.collectives import SeqLayout
from autosp.runtime.context import RuntimeContext
from autosp.testing.distributed import run_ranks

TOL = 1e-5


def _owned(prefix: str) -> set[str]:
    return {n for n in collectives.registered_groups() if n == prefix or n.startswith(prefix + ":")}


# ------------------------------------------------------------------ without process groups
def test_context_entries_go_with_the_context():
    rt, kept = RuntimeContext("t_state_a"), RuntimeContext("t_state_b")
    assert rt.bind(None, layout=SeqLayout(ulysses=1, ring=2)) == "t_state_a"
    assert rt.bind(None, axis="ring") == "t_state_a:ring"
    kept.bind(None)
    assert rt.names == ("t_state_a", "t_state_a:ring") and kept.names == ("t_state_b",)
    assert _owned("t_state_a") == {"t_state_a", "t_state_a:ring"}
    assert collectives.layout("t_state_a:ring") == SeqLayout(ulysses=1, ring=2)
    del rt
    gc.collect()
    assert _owned("t_state_a") == set()
    assert collectives.layout("t_state_a") == SeqLayout(ulysses=1)  # the default again
    assert _owned("t_state_b") == {"t_state_b"}, "negative control: a live context keeps its entries"
    kept.close()
    kept.close()  # idempotent
    assert kept.closed and _owned("t_state_b") == set()
    with pytest.raises(RuntimeError, match="closed"):
        kept.bind(None)


def test_one_live_context_per_name():
    with RuntimeContext("t_state_c") as rt:
        rt.bind(None)
        with pytest.raises(ValueError, match="already has a live context"):
            RuntimeContext("t_state_c")
        assert copy.deepcopy(rt) is rt
        with pytest.raises(ValueError, match="base group name"):
            RuntimeContext("t_state_c:ring")
        with pytest.raises(ValueError, match="layout belongs to the base name"):
            rt.bind(None, layout=SeqLayout(), axis="ring")
    assert _owned("t_state_c") == set()
    RuntimeContext("t_state_c").close()  # the name is free again


def test_register_from_outside_until_unregistered():
    collectives.register_group("t_state_outside", None, layout=SeqLayout(ulysses=1, ring=3))
    try:
        gc.collect()
        assert "t_state_outside" in collectives.registered_groups()
        assert collectives.layout("t_state_outside") == SeqLayout(ulysses=1, ring=3)
    finally:
        collectives.unregister_group("t_state_outside")
    assert "t_state_outside" not in collectives.registered_groups()
    collectives.unregister_group("t_state_outside")  # absent: nothing happens


def test_public_queries():
    assert not collectives.simulating()
    with collectives.simulate(4, rank=1):
        assert collectives.simulating() and collectives.group_size("any") == 4
        with collectives.simulate(2):
            assert collectives.group_rank("any") == 0
        assert collectives.group_rank("any") == 1
    assert not collectives.simulating()

    assert not ring.math_forced()
    with ring.force_math():
        assert ring.math_forced()
        with ring.force_math(False):
            assert not ring.math_forced()
        assert ring.math_forced()
    assert not ring.math_forced()

    ring.reset_stats()
    q = torch.randn(1, 2, 5, 4)
    with ring.force_math():
        ring.ring_attention(q, q, q, pieces=[[(0, 5)]], group="t_state_r1", is_causal=True)
    assert ring.stats() == {"sends": 0, "bytes": 0}  # one rank sends nothing
    counts = ring.stats()
    counts["sends"] = 7  # a copy
    assert ring.stats()["sends"] == 0


# ------------------------------------------------------------------ compiled modules, 2 ranks
def _model():
    from autosp.models import LlamaConfig, LlamaLike
    return LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=1, heads=4, kv_heads=2))


def _compiled_modules_body(rank, world, queue, seed):
    import autosp
    from autosp.testing.parity import parity
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    ids, labels = torch.randint(0, 64, (2, 15), generator=gen), torch.randint(0, 64, (2, 15), generator=gen)
    model = _model()
    reference = copy.deepcopy(model)
    dropped = autosp.compile(_model(), sp_strategy="ring")
    kept = autosp.compile(model, sp_strategy="ring", gather_outputs=True)
    dropped(ids, labels=labels)["loss"].backward()
    first = parity(reference, kept, ids, labels=labels).max_error
    result = {
        "dropped": _owned(dropped.group_name), "kept": _owned(kept.group_name),
        "dropped_names": set(dropped.runtime.names), "layout": kept.layout,
    }
    groups = collectives.registered_groups()
    result["same_pg"] = groups[f"{dropped.group_name}:ring"] is groups[f"{kept.group_name}:ring"]
    name = dropped.group_name
    del dropped
    gc.collect()
    result["dropped_after"] = _owned(name)
    result["kept_after"] = _owned(kept.group_name)
    result["errors"] = [first, parity(reference, kept, ids, labels=labels).max_error]  # kept still runs
    name = kept.group_name
    del kept
    gc.collect()
    result["kept_released"] = _owned(name)
    queue.put((rank, result))


def test_compiled_module_entries_go_with_the_module(_fresh_seed):
    results = run_ranks(_compiled_modules_body, 2, args=(_fresh_seed % 10000,), timeout=300, collective_timeout=60)
    for rank, r in results.items():
        assert r["layout"] == SeqLayout(ulysses=1, ring=2, zigzag=r["layout"].zigzag), (rank, r)
        # Registered while alive: the base name and both mesh sub-groups, each module its own.
        for key in ("dropped", "kept"):
            base = min(r[key], key=len)
            assert r[key] == {base, f"{base}:ulysses", f"{base}:ring"}, (rank, r)
        assert r["dropped_names"] == r["dropped"] and not r["dropped"] & r["kept"], (rank, r)
        assert not r["same_pg"], f"rank {rank}: two modules resolved one ring process group"
        assert r["dropped_after"] == set(), f"rank {rank}: a collected module left {r['dropped_after']}"
        assert r["kept_after"] == r["kept"], f"rank {rank}: a live module lost entries ({r['kept_after']})"
        assert max(r["errors"]) <= TOL, (rank, r["errors"])
        assert r["kept_released"] == set(), (rank, r)
