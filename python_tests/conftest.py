import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
warnings.filterwarnings("ignore", category=FutureWarning)
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_seed():
    """Fresh random inputs per test (the seed is printed on failure via the test id)."""
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    yield seed
