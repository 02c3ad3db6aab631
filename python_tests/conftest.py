import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
warnings.filterwarnings("ignore", category=FutureWarning)
torch.set_num_threads(1)
# run_ranks keeps its rank processes between tests (AUTOSP_RANK_POOL=0 spawns per call).
os.environ.setdefault("AUTOSP_RANK_POOL", "1")


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
