"""The main job, examples/train.py, as a user runs it: torchrun with 2 gloo ranks."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _torchrun(*args, ranks=2, timeout=300):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           str(ROOT / "examples" / "train.py"), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_verify_run_matches_single_device_and_learns():
    run = _torchrun("--steps", "6", "--seq", "63", "--verify")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    out = run.stdout
    assert "1 data-parallel x 2 sequence-parallel" in out
    diff = float(re.search(r"max \|loss - single-device loss\|\s+(\S+)", out).group(1))
    assert diff <= 1e-4
    first, last = map(float, re.search(r"loss first -> last\s+(\S+) -> (\S+)", out).groups())
    assert last < first, "the loss must go down"
    assert len(re.findall(r"^step +\d+/6", out, flags=re.M)) == 6


def test_text_dataset_and_bad_sp_size(tmp_path):
    data = tmp_path / "corpus.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    run = _torchrun("--steps", "2", "--seq", "32", "--data", str(data))
    assert run.returncode == 0, run.stderr[-4000:]
    bad = _torchrun("--steps", "1", "--sp", "3")
    assert bad.returncode != 0 and "--sp 3 must divide the number of ranks (2)" in bad.stderr + bad.stdout
