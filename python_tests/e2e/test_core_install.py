"""A core install (torch, torch-mlir, numpy: the declared dependencies) compiles and trains.

transformers is a test and benchmark extra; a hand-written or torchtitan model has no
reason to need it. Before, the first ``autosp.compile`` call imported it through
``autosp.hf`` (the Trainer integration) and failed with ``No module named
'transformers'``. The child process below runs with a ``transformers`` package first on
its path whose import fails as an absent package's does (its ranks inherit the path), and
checks a 2-rank compiled training step against the same model eagerly on one process.
Control: the same blocker makes ``import autosp.hf.trainer`` fail, so the blocker works.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TOL = 1e-5
_BLOCKED = ("transformers", "trl", "peft", "torchtitan", "datasets", "accelerate")


def _body(rank, world, queue, seed):
    import copy
    import sys

    import torch

    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2))
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(seed))
    reference(input_ids=ids, labels=ids)["loss"].backward()
    sp = autosp.compile(model)
    sp(input_ids=ids, labels=ids)["loss"].backward()
    worst = max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    queue.put((rank, dict(worst=worst, imported=sorted(m for m in _BLOCKED if m in sys.modules))))


def _child(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    for name in _BLOCKED:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}' (a core install)\", name='{name}')\n")
    here = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(here), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=600)


def test_compile_and_train_without_transformers(tmp_path, _fresh_seed):
    run = _child(tmp_path, f"""
        if __name__ == "__main__":
            from autosp.testing.distributed import run_ranks
            from test_core_install import _body
            import json; print(json.dumps(run_ranks(_body, 2, args=({_fresh_seed % 10000},), fresh=True)))
        """)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])  # {rank: {...}}, printed by the child
    for rank, r in results.items():
        assert r["worst"] <= TOL, f"rank {rank}: gradients {r['worst']:.2e} from one device's"
        assert r["imported"] == [], f"rank {rank} imported {r['imported']}"


def test_the_blocker_blocks(tmp_path):
    run = _child(tmp_path, "import autosp.hf.trainer")
    assert run.returncode != 0 and "No module named 'transformers'" in run.stderr, run.stderr[-2000:]
