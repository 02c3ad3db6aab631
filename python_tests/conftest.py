import os
import shutil
import sys
import tempfile
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
warnings.filterwarnings("ignore", category=FutureWarning)
torch.set_num_threads(1)
# run_ranks keeps its rank processes between tests (AUTOSP_RANK_POOL=0 spawns per call).
os.environ.setdefault("AUTOSP_RANK_POOL", "1")
# One import cache on disk for the whole run: ranks, xdist workers and torchrun jobs read
# each other's imports (autosp/frontend/cache.py). Set here, before any of them starts, so
# they inherit it; removed at the end of the run unless the caller chose the folder.
_OWN_CACHE = "AUTOSP_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["AUTOSP_CACHE_DIR"] = tempfile.mkdtemp(prefix="autosp-test-cache-")


@pytest.fixture(autouse=True)
def _fresh_seed():
    """Fresh random inputs per test (the seed is printed on failure via the test id)."""
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    yield seed


def pytest_sessionfinish(session, exitstatus):
    """Stop the rank processes that autosp.testing.distributed.run_ranks keeps between tests."""
    dist_testing = sys.modules.get("autosp.testing.distributed")
    if dist_testing is not None:
        dist_testing.shutdown_pools()
    if _OWN_CACHE and not hasattr(session.config, "workerinput"):  # the xdist controller, or plain pytest
        shutil.rmtree(os.environ["AUTOSP_CACHE_DIR"], ignore_errors=True)
