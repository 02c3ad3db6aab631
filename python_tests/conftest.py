import os
import shutil
import sys
import tempfile
import warnings

import pytest
import torch

# The tests import each other and their helpers by module name (unit/, e2e/, and the helpers
# here: battery.py, train_verify.py); spawned ranks inherit the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _folder in (_HERE, os.path.join(_HERE, "e2e"), os.path.join(_HERE, "unit")):
    sys.path.insert(0, _folder)
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


# The longest tests (seconds in CI on 2 cores; `--durations` lists them), started first:
# with two workers a long test that starts last is the run's tail. A scheduling hint only:
# a name that no longer matches changes the order of nothing.
_LONGEST_FIRST = (
    "test_titan_deltanet.py::test_torchtitan_qwen3_5_with_packed_documents[2]",  # 4 cases, fresh ranks
    "test_families_as_users.py::test_new_runtime_ops_under_torch_compile",  # 70 s
    "test_ring.py::test_ring_and_hybrid_match_single_device[4]",  # 70 s
    "test_memory_budget.py::test_planner_from_shallow_copies_matches_the_whole_model",  # 47 s
    "test_titan.py::test_torchtitan_qwen3_moe_in_train_mode",  # 2 or 3 cases
    "test_titan_trainer.py::test_torchtitan_trainer_with_autosp_as_context_parallelism",  # 3 trainer runs
    "test_fsdp_compile_memory.py::test_compiling_an_8b",  # 43 s
    "test_plan_cli.py::test_drop_logits_flag_is_named_in_the_error_and_drops_the_logits",
    "test_trainer_calls.py::test_trainer_calls_match_single_device_with_linear_memory[2]",  # 41 s
    "test_titan.py::test_torchtitan_models_with_a_length_the_ranks_do_not_divide[muse_glimmer",  # 36 s
    "test_titan_deltanet.py::test_torchtitan_qwen3_5_with_packed_documents[4]",
    "test_plan_cli.py::test_composed_report_matches_the_whole_model",  # 31 s
    "test_sequence_parallel.py::test_torch_compile_after_sequence_parallelism",  # 30 s
    "test_gpt_oss.py::test_gpt_oss_matches_single_device[2]",  # 30 s
    "test_train_example.py::test_pack_verify_run_of_a_hugging_face_directory",
    "test_train_example.py::test_hugging_face_directory_each_rank_reads_its_rows",
    "test_train_example.py::test_fsdp_init_from_save_and_resume",  # 24 s
    "test_vlm.py::test_the_share_holds_under_torch_compile",
    "test_ring.py::test_ring_and_hybrid_match_single_device[2]",
    "test_program_key.py::test_peft_switches_after_compile_match_eager",
    "test_task_heads.py::test_task_heads_match_single_device[4-19]",  # 4 ranks, 4 models
)


def pytest_collection_modifyitems(session, config, items):
    """Move the longest tests to the front (see _LONGEST_FIRST), in that order."""
    def rank(item):
        return next((i for i, name in enumerate(_LONGEST_FIRST) if name in item.nodeid), len(_LONGEST_FIRST))
    items.sort(key=rank)  # stable: everything else keeps its order
