"""The main job, examples/train.py, as a user runs it: torchrun with 2 gloo ranks.

Its negative controls run python_tests/train_verify.py: examples/train.py with the
controls' options (a moved SP loss must fail --verify; a rank that raises must stop both).
"""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # examples/train.py and its helpers
import train  # noqa: E402
import train_data  # noqa: E402
import train_plan  # noqa: E402
import train_state  # noqa: E402
import train_verify  # noqa: E402  python_tests/train_verify.py
from train_launch import UsageError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train.py"
VERIFY = ROOT / "python_tests" / "train_verify.py"  # TRAIN with the negative controls' options


def _torchrun(*args, ranks=2, timeout=300, script=TRAIN):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           str(script), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_bad_sp_size():
    # What torchrun gives each of 2 ranks; the check runs before any process group exists
    # (so every rank fails alike), and one process sees it as a torchrun rank would.
    cmd = [sys.executable, str(TRAIN), "--steps", "1", "--sp", "3"]
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert bad.returncode != 0 and "--sp 3 must divide the number of ranks (2)" in bad.stderr + bad.stdout


def test_bf16_check_allows_one_bf16_step_beyond_single_device_and_no_more():
    assert train_verify.bf16_spacing(7.0) == 2**-5 and train_verify.bf16_spacing(1.0) == 2**-7
    assert train_verify.bf16_spacing(0.75) == 2**-8 and train_verify.bf16_spacing(-5.0) == 2**-5
    # fp32 loss 7.0: one bf16 step is 1/32. SP as close as one device, or within one step more: passes.
    assert train_verify.check_bf16([7.01, 6.9], [7.02, 6.9], [7.0, 6.9]).ok
    assert train_verify.check_bf16([7.0 + 2**-5], [7.0], [7.0]).ok
    # Negative controls: two bf16 steps off while one device is exact (the symptom's 0.06), a
    # single bad step among good ones, a NaN, a missing step.
    assert not train_verify.check_bf16([7.0625], [7.0], [7.0]).ok
    assert not train_verify.check_bf16([7.0, 7.1, 7.0], [7.0, 7.0, 7.0], [7.0, 7.0, 7.0]).ok
    assert not train_verify.check_bf16([math.nan], [7.0], [7.0]).ok
    assert not train_verify.check_bf16([7.0], [7.0, 7.0], [7.0, 7.0]).ok
    rows = train_verify.check_bf16([7.0, 7.1], [7.0, 7.0], [7.0, 7.0]).lines
    assert rows[-2].split()[-1] == "yes" and rows[-1].split()[-1] == "NO", rows
    # fp32 keeps its tolerance: 1e-3 x max(1, |first loss|).
    assert train_verify.check_fp32([5.0, 4.0], [5.0, 4.004]).ok
    assert not train_verify.check_fp32([5.0, 4.0], [5.0, 4.006]).ok


def test_bf16_verify_passes_against_an_fp32_reference():
    run = _torchrun("--steps", "3", "--seq", "32", "--dtype", "bf16", "--verify")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-4000:]
    out = run.stdout
    assert "VERIFY PASSED" in out and "single-device fp32" in out
    table = re.findall(r"^ +(\d+) +(\S+) +(\S+) +(\S+) +(\S+) +(yes|NO)$", out, flags=re.M)
    assert [int(row[0]) for row in table] == [1, 2, 3], out
    for _, d_sp, d_single, ulp, _, ok in table:  # the printed distances satisfy the printed rule
        assert ok == "yes" and float(d_sp) <= float(d_single) + float(ulp) + 1e-6
    # On CPU the memory column is the process's peak RSS (getrusage), labelled so: a Python
    # process with torch loaded holds hundreds of MiB, a tiny model's tensors a few.
    steps = re.findall(r"^step +\d+/3 \| .*\| peak RSS +(\d+\.\d) MiB$", out, flags=re.M)
    assert len(steps) == 3 and all(float(m) > 100 for m in steps), out
    per_rank = re.search(r"^  peak RSS per rank \(getrusage\) +(\d+), (\d+) MiB$", out, flags=re.M)
    assert per_rank and all(float(m) > 100 for m in per_rank.groups()), out
    assert "peak alloc" not in out and "peak memory" not in out


def test_failed_verify_exits_non_zero_on_both_ranks_cleanly():
    # Negative control: the harness shifts the SP loss the check sees by 0.1 (3 bf16 steps at 5.5).
    run = _torchrun("--steps", "2", "--seq", "32", "--dtype", "bf16", "--verify", "--debug-sp-loss-offset", "0.1",
                    script=VERIFY)
    assert run.returncode != 0, run.stdout[-3000:]
    assert "VERIFY FAILED" in run.stdout and re.search(r"^ +1 .* NO$", run.stdout, flags=re.M), run.stdout
    for rank in (0, 1):
        assert f"rank {rank}: exit status 1: the verify check failed" in run.stderr, run.stderr[-4000:]
    # No rank traceback (torch prints a rank's uncaught error as "[rankN]: ..."), no gloo trace.
    assert "Connection closed" not in run.stderr and "[rank" not in run.stderr, run.stderr[-4000:]
    assert "failed:" not in run.stderr.replace("VERIFY FAILED", "")


def test_verify_catches_a_wrong_shard():
    # Negative control of --verify itself, through a real SP bug: every rank computes on the
    # next rank's part of the sequence (the compiled model's autosp.shard swapped).
    run = _torchrun("--steps", "1", "--seq", "32", "--verify", "--debug-wrong-shard", script=VERIFY)
    assert run.returncode != 0, run.stdout[-3000:]
    assert "VERIFY FAILED" in run.stdout and re.search(r"^ +1 +\S+ +NO$", run.stdout, flags=re.M), run.stdout
    for rank in (0, 1):
        assert f"rank {rank}: exit status 1: the verify check failed" in run.stderr, run.stderr[-4000:]


def test_exception_on_one_rank_stops_both_without_a_hang():
    run = _torchrun("--steps", "3", "--seq", "32", "--debug-raise-on-rank", "1", timeout=240, script=VERIFY)
    assert run.returncode != 0
    assert "rank 1: failed:" in run.stderr and "a deliberate failure at step 2" in run.stderr, run.stderr[-4000:]
    assert "rank 0: stopped: another rank failed or left" in run.stderr, run.stderr[-4000:]
    assert "Connection closed" not in run.stderr


def _python(*args, timeout=300):
    """examples/train.py without torchrun: a world of one (or a --dry-run)."""
    cmd = [sys.executable, str(TRAIN), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _step_losses(out):
    """{step: SP loss} from the per-step lines."""
    return {int(k): float(v) for k, v in re.findall(r"^step +(\d+)/\d+ \| loss +(\S+)", out, flags=re.M)}


def _close(a, b, rel=1e-5):
    return abs(a - b) <= rel * abs(b)


def test_fsdp_init_from_save_and_resume_at_another_world_size_with_data_parallelism(tmp_path):
    """World 2 (SP 2, FSDP over both) starts from a plain state_dict (--init-from), verifies
    against one device, saves at step 2 and runs to step 4; world 4 (2 data-parallel
    replicas x SP 2, FSDP over four, --batch 1: the same global batch of 2) resumes from
    step 2, verifies against one device fed both replicas' batches, and must print the same
    losses at steps 3 and 4 (same weights, same optimizer state, same batches): its printed
    loss is the mean over the replicas, which world 1 computes from the checkpoint too.
    Controls: replica 0's loss alone (what rank 0 holds) differs from that mean; the
    checkpoint loaded at world 1 without the optimizer state still matches at step 3 but
    not at step 4 (with it, both match); the --init-from weights' loss differs from the
    default initialisation's."""
    import argparse

    from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike
    cfg = LlamaConfig(**LLAMA_PRESETS["tiny"])
    torch.manual_seed(1234)
    init = LlamaLike(cfg)
    with torch.no_grad():
        init.embed.weight.mul_(3)  # far from the default initialisation
    weights = tmp_path / "init.pt"
    torch.save(init.state_dict(), weights)
    ids = train_data.make_batch(0, argparse.Namespace(seed=0, batch=2, seq=63), cfg.vocab, None, 0)
    torch.manual_seed(0)
    default = LlamaLike(cfg)
    with torch.no_grad():
        expected = init(ids, labels=ids)["loss"].item()
        assert not _close(default(ids, labels=ids)["loss"].item(), expected, 1e-3), "the control needs other weights"

    ckpt = tmp_path / "ckpt"
    common = ("--seq", "63", "--steps", "4", "--fsdp")
    a = _torchrun(*common, "--verify", "--init-from", str(weights), "--save", str(ckpt), "--save-every", "2")
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-4000:]
    assert "VERIFY PASSED" in a.stdout and "FSDP on (fully_shard on 2 blocks + the root, over 2 ranks)" in a.stdout
    per_rank, full = map(float, re.search(r"parameter bytes per rank \d+ \((\S+) MiB; unsharded (\S+) MiB", a.stdout).groups())
    assert per_rank < 0.6 * full, a.stdout[:1000]
    first = _step_losses(a.stdout)
    assert sorted(first) == [1, 2, 3, 4], a.stdout
    assert _close(first[1], expected), f"--init-from: first loss {first[1]} vs that of the saved weights {expected}"
    assert (ckpt / "step-000002" / ".metadata").is_file() and (ckpt / "step-000004" / ".metadata").is_file()

    b = _torchrun(*common, "--sp", "2", "--batch", "1", "--verify", "--resume", str(ckpt / "step-000002"), ranks=4)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-4000:]
    assert "4 rank(s): 2 data-parallel x 2 sequence-parallel" in b.stdout and "over 4 ranks" in b.stdout
    assert "loss: the mean over the 2 replicas" in b.stdout and "VERIFY PASSED" in b.stdout, b.stdout
    assert "resumed from" in b.stdout and "at step 2" in b.stdout
    resumed = _step_losses(b.stdout)
    assert sorted(resumed) == [3, 4], b.stdout
    for step in (3, 4):
        assert _close(resumed[step], first[step]), f"step {step}: resumed {resumed[step]} vs {first[step]}"

    # World 1, in this process (no compilation: the single-device model): the same loader
    # with and without the optimizer state. Step 3 matches either way (the weights load);
    # step 4 only with the optimizer state.
    batches = argparse.Namespace(seed=0, batch=2, seq=63)
    for load_optimizer in (True, False):
        model = LlamaLike(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)  # train.py's optimizer
        assert train_state.load_checkpoint(str(ckpt / "step-000002"), model, opt, load_optimizer) == (2, 0)
        single = {}
        for step in (2, 3):
            ids = train_data.make_batch(step, batches, cfg.vocab, None, 0)
            if step == 2 and load_optimizer:
                # World 4's replicas each took one of these two samples: its printed loss is
                # their mean, not replica 0's (the rank-0 loss it printed before).
                with torch.no_grad():
                    replica = [model(ids[r:r + 1], labels=ids[r:r + 1])["loss"].item() for r in (0, 1)]
                assert _close((replica[0] + replica[1]) / 2, resumed[3]), (replica, resumed)
                assert not _close(replica[0], resumed[3], 1e-3), "the control needs replicas of other losses"
            opt.zero_grad()
            loss = model(ids, labels=ids)["loss"]
            loss.backward()
            opt.step()
            single[step + 1] = loss.item()
        assert _close(single[3], first[3]), (load_optimizer, single, first)
        if load_optimizer:
            assert _close(single[4], first[4]), f"world 1 resume: step 4 {single[4]} vs {first[4]}"
        else:
            assert not _close(single[4], first[4], 1e-4), f"step 4 without the optimizer state: {single[4]}"


def test_memory_budget_that_cannot_fit_is_one_line_and_a_failed_exit():
    """--memory-budget below the planner's smallest feasible budget: one "train.py: error:"
    line (rank 0's) with autosp's reason, no traceback from any rank, a non-zero exit."""
    run = _torchrun("--memory-budget", "64KiB", "--steps", "1", "--seq", "16", "--layers", "1")
    assert run.returncode != 0, run.stdout[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1, run.stderr[-4000:]
    assert re.fullmatch(r"train\.py: error: the memory budget 64KiB cannot fit a step of seq 16, batch 2 over 2 "
                        r"sequence-parallel rank\(s\): memory_budget \S+ KiB is below the smallest feasible "
                        r"budget \S+ \S+ for this call \(S=16, sp_size=2\).*", errors[0]), errors[0]
    # No rank's traceback (train.py's "rank N: failed:", torch's "[rankN]: ..."), no second copy.
    assert "failed:" not in run.stderr and "[rank" not in run.stderr, run.stderr[-4000:]
    assert run.stderr.count("smallest feasible budget") == 1 and "AutospError" not in run.stderr


def test_dry_run_that_does_not_fit_names_the_flag_to_try():
    # The tiny model's activations at --seq 1024 dwarf its model state: the next
    # --checkpointing rung is the flag to try (next_flag's rules are tested on their own).
    run = _python("--layers", "1", "--dry-run", "--world", "2", "--seq", "1024", "--gpu-gib", "0.001", timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-4000:]
    assert re.search(r"^  budget --gpu-gib 0.001 +does not fit", run.stdout, flags=re.M), run.stdout
    assert re.search(r"^does not fit 0.001 GiB: try --checkpointing sac$", run.stdout, flags=re.M), run.stdout


def test_dry_run_plans_an_8b_shape_on_the_meta_device():
    # Llama-3-8B's shapes with 1 of its 32 layers: the whole model plans in ~80-100 s on a
    # 2-core machine (compilation grows with the layers), too slow for the suite.
    run = _python("--size", "8b", "--layers", "1", "--dry-run", "--world", "8", "--seq", "131072",
                  "--checkpointing", "sac", timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-4000:]
    out = run.stdout
    assert "8 rank(s): 1 data-parallel x 8 sequence-parallel" in out and "FSDP on over 8 ranks" in out, out
    gib = {k.strip(): float(v) for k, v in re.findall(r"^  (\S.*?\S) +(\d+\.\d+) GiB$", out, flags=re.M)}
    n_params = float(re.search(r"(\d+\.\d+)B params", out).group(1)) * 1e9
    # fp32: 4 bytes per parameter, 4 per gradient, 8 of AdamW moments; each split over 8 ranks.
    assert abs(gib["parameters (/ 8)"] - n_params * 4 / 8 / 2**30) < 0.01, gib
    assert abs(gib["optimizer state (AdamW) (/ 8)"] - n_params * 8 / 8 / 2**30) < 0.01, gib
    parts = sum(v for k, v in gib.items() if k != "total")
    assert abs(gib["total"] - parts) < 0.05 and gib["activation peak"] > 1, gib
    verdict = re.search(r"budget --gpu-gib 80 +(fits|does not fit)", out).group(1)
    assert verdict == ("fits" if gib["total"] <= 80 else "does not fit"), out
    assert ("does not fit 80 GiB: try --" in out) == (verdict == "does not fit"), out
    host = float(re.search(r"peak host memory: (\d+) MiB", out).group(1)) * 2**20
    assert host < n_params * 4 / 2, f"{host / 2**30:.1f} GiB of host memory: were the parameters allocated?"


def test_plan_table_checkpoint_lookup_batches_and_option_errors(tmp_path):
    import argparse

    import pytest

    from autosp.planning.estimate import MemoryEstimate
    gib = 2**30
    est = MemoryEstimate(1024, 8, torch.float32, "sac", 0, 0, activation_peak_bytes=10 * gib,
                         param_bytes=32 * gib, grad_bytes=32 * gib, optimizer_bytes=64 * gib)
    rows, fits = train_plan.plan_rows(est, 8, True, 80 * gib)  # (32 + 32 + 64) / 8 + 10 = 26 GiB
    assert fits and dict(rows)["total"].strip() == "26.00 GiB" and "fits" in rows[-1][1]
    rows, fits = train_plan.plan_rows(est, 8, False, 80 * gib)  # unsharded: 138 GiB
    assert not fits and dict(rows)["total"].strip() == "138.00 GiB" and rows[-1][1].startswith("does not fit")
    # The flag to try when a plan does not fit, from what dominates it.
    def plan(act, state, checkpointing="off"):  # GiB of activation peak and of unsharded model state
        return MemoryEstimate(1024, 8, torch.float32, checkpointing, 0, 0, activation_peak_bytes=act * gib,
                              param_bytes=state * gib // 4, grad_bytes=state * gib // 4,
                              optimizer_bytes=state * gib // 2)

    def flag(est, world=8, fsdp=False, budget=80, sp=None):
        return train_plan.next_flag(est, world, sp or world, fsdp, est.checkpointing, budget * gib, sp_given=sp is not None)
    assert flag(est, fsdp=True) is None  # 26 GiB fits
    assert flag(est) == "--fsdp"  # the state (128 GiB unsharded) dominates the activations (10 GiB)
    assert flag(plan(100, 40)) == "--checkpointing sac"  # activations dominate: keep less for backward
    assert flag(plan(100, 40, "sac")) == "--checkpointing sac-min"
    assert flag(plan(100, 40, "sac-min")) == "--checkpointing full"
    assert flag(plan(100, 40, "full")) == "--fsdp"  # every layer recomputed: the state is what is left to split
    assert flag(plan(40, 400), world=1) == "--world 16 --fsdp"  # 400 / 16 + 40 fits 80; 400 / 8 + 40 does not
    assert flag(plan(40, 400), fsdp=True) == "--world 16"  # FSDP on over 8 ranks: more ranks to shard over
    assert flag(plan(100, 160)) == "--fsdp"  # unsharded, the state dominates ...
    assert flag(plan(100, 160), fsdp=True) == "--checkpointing sac"  # ... sharded (20), the activations do
    fallback = flag(plan(100, 40, "full"), fsdp=True)  # activations, every layer recomputed, state sharded
    assert fallback.startswith("--memory-budget 80GiB (a real run"), fallback
    assert fallback.endswith("or --world 16 (twice the sequence-parallel ranks)"), fallback
    assert flag(plan(100, 40, "full"), fsdp=True, sp=4).endswith("or --world 16 --sp 8 (twice the "
                                                                 "sequence-parallel ranks)")
    assert train_state.memory_label(torch.device("cuda", 0)) == "peak alloc" and train_state.memory_label(torch.device("cpu")) \
        == "peak RSS"
    # FSDP by default: on for 1b and 8b at world > 1, off for tiny, small and one rank.
    for size, world, on in (("tiny", 8, False), ("small", 8, False), ("1b", 2, True), ("8b", 8, True),
                            ("8b", 1, False)):
        cfg = train_state.LlamaConfig(**train_state.SIZES[size])
        with torch.device("meta"):
            n = train_state.count_params(train_state.LlamaLike(cfg))
        assert train_state.auto_fsdp(n, world, 80 * gib) == on, (size, world)
    # The batch of a step is the same however the global batch is split over replicas.
    ns = argparse.Namespace(seed=3, batch=4, seq=9)
    whole = train_data.make_batch(5, ns, 256, None, 0)
    halves = torch.cat([train_data.make_batch(5, argparse.Namespace(seed=3, batch=2, seq=9), 256, None, r) for r in (0, 1)])
    assert torch.equal(whole, halves)
    assert not torch.equal(whole, train_data.make_batch(6, ns, 256, None, 0))
    # --resume DIR: DIR itself when it is a checkpoint, else its latest step folder.
    for step in (2, 10):
        (tmp_path / f"step-{step:06d}").mkdir()
        (tmp_path / f"step-{step:06d}" / ".metadata").write_bytes(b"")
    assert train_state.resolve_checkpoint(str(tmp_path)) == str(tmp_path / "step-000010")
    assert train_state.resolve_checkpoint(str(tmp_path / "step-000002")) == str(tmp_path / "step-000002")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text("{}")
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    errors = [
        (["--model", str(tmp_path / "bin")], "no model.safetensors or model.safetensors.index.json there"),
        (["--model", str(tmp_path / "model"), "--dry-run", "--save-hf", str(tmp_path)],
         "--dry-run trains nothing: --save-hf does not apply"),
        (["--save-hf", str(tmp_path / "model" / "config.json")], "a file is there, not a directory"),
        (["--resume", str(tmp_path / "nope")], f"--resume {tmp_path / 'nope'}: no such directory"),
        (["--resume", str(tmp_path / "model")], "not a checkpoint"),
        (["--model", str(tmp_path / "model"), "--size", "tiny"], "drop --size/--layers, or drop --model"),
        (["--model", str(tmp_path)], "no config.json"),
        (["--save-every", "2"], "--save-every needs --save DIR"),
        (["--resume", str(tmp_path), "--init-from", str(tmp_path / "model" / "config.json")], "pass one"),
        (["--init-from", str(tmp_path / "missing.pt")], "no such file"),
        (["--world", "8"], "--world simulates ranks for --dry-run only"),
        (["--fsdp"], "--fsdp shards over the ranks of a torchrun job"),
        (["--dry-run", "--verify"], "--dry-run trains nothing: --verify does not apply"),
        (["--dry-run", "--memory-budget", "70GiB"], "--memory-budget is planned by the compiler at a real run's"),
        (["--memory-budget", "lots"], "--memory-budget lots: memory_budget: cannot read 'lots' as bytes"),
    ]
    for argv, message in errors:
        with pytest.raises(SystemExit) as exc:
            train.parse_args(argv)
        text = str(exc.value.code)
        assert message in text and "\n" not in text, (argv, text)


# ---------------------------------------------------------------- --pack
def _tiny_hf_llama(transformers, initializer_range=0.02):
    """A 2-layer transformers LlamaForCausalLM over 256 tokens (bytes), SDPA, fp32."""
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      initializer_range=initializer_range, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config).float()


def _paragraphs(n, seed=0):
    """``n`` paragraphs of 1-20 words, a few longer than 63 bytes, separated by blank lines."""
    import random
    rng = random.Random(seed)
    words = "the quick brown fox jumps over a lazy dog while packed documents restart their positions".split()
    return "\n\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 20))) for _ in range(n)) + "\n"


def test_packed_loss_and_gradients_equal_the_token_weighted_per_document_ones():
    """One device, eager: the loss of rows packed by train.py (position_ids restarting at each
    document, each document's first label -100, no attention_mask) is the token-weighted mean
    of each document's own loss run alone (positions from 0), and its gradient the same
    weighted sum of theirs. Negative controls: keeping each document's first label (a
    prediction from the previous document), or positions that do not restart (one causal
    row: attention and RoPE cross documents), must break both."""
    import argparse

    transformers = __import__("pytest").importorskip("transformers")
    torch.manual_seed(0)
    # Weights larger than the default 0.02: the logits depend on the context enough that
    # the controls move the loss well beyond the tolerance, not only the gradients.
    model = _tiny_hf_llama(transformers, initializer_range=0.2)
    ids, position_ids, labels, n_docs = train_data.make_packed_batch(0, argparse.Namespace(seed=3, batch=2, seq=63),
                                                                256, None, 0)
    assert ids.shape == position_ids.shape == labels.shape == (2, 63)
    assert n_docs == int((position_ids == 0).sum()) and n_docs >= 4, position_ids
    assert torch.equal(labels == -100, position_ids == 0), "exactly each document's first label is ignored"

    def loss_and_grads(input_ids, **kwargs):
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=input_ids, use_cache=False, **kwargs).loss
        loss.backward()
        return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]

    # Each document of the packed rows on its own: a batch of one, positions from 0.
    weighted_loss, weighted_grads, n_tokens, seen = 0.0, [torch.zeros_like(p) for p in model.parameters()], 0, 0
    for row, pos in zip(ids, position_ids):
        starts = (pos == 0).nonzero().flatten().tolist()
        for start, end in zip(starts, starts[1:] + [len(row)]):
            seen += 1
            doc = row[start:end][None]
            assert torch.equal(pos[start:end], torch.arange(end - start)), "positions count from each start"
            n = end - start - 1  # tokens the document's own loss averages over
            if n == 0:
                continue  # a one-token document predicts nothing
            loss, grads = loss_and_grads(doc, labels=train_data.packed_labels(doc, torch.arange(end - start)[None]))
            weighted_loss += n * loss.double()
            for acc, g in zip(weighted_grads, grads):
                acc += n * g
            n_tokens += n
    assert seen == n_docs and n_tokens == int((labels[:, 1:] != -100).sum())
    expected = float(weighted_loss / n_tokens)
    expected_grads = [g / n_tokens for g in weighted_grads]
    scale = max(float(g.abs().max()) for g in expected_grads)

    def errors(loss, grads):
        return (abs(float(loss) - expected),
                max(float((g - e).abs().max()) for g, e in zip(grads, expected_grads)) / scale)

    loss_err, grad_err = errors(*loss_and_grads(ids, position_ids=position_ids, labels=labels))
    assert loss_err <= 1e-5 * abs(expected) and grad_err <= 1e-5, (loss_err, grad_err)
    # Negative controls: each must be far outside the tolerance.
    for name, kwargs in (("first labels kept", dict(position_ids=position_ids, labels=ids)),
                         ("positions not restarting", dict(position_ids=torch.arange(63).expand(2, 63),
                                                           labels=labels))):
        bad_loss, bad_grad = errors(*loss_and_grads(ids, **kwargs))
        assert bad_loss > 1e-3 * abs(expected) and bad_grad > 1e-2, (name, bad_loss, bad_grad)


def test_pack_documents_of_text_and_tokenised_files_and_its_option_errors(tmp_path):
    """--pack's document rules: a text file's paragraphs (blank lines), else its lines; a
    tokenised file split after each --doc-sep (kept, a lone one dropped); documents longer
    than --seq split into pieces of --seq. Rows are consecutive documents in file order,
    the last one cut; a step's rows do not depend on how replicas split the global batch."""
    import argparse

    import numpy as np
    import pytest

    def texts(docs):
        return [bytes(docs[i].tolist()).decode() for i in range(len(docs))]

    (tmp_path / "paragraphs.txt").write_text("first one\nstill first\n\n \t\nsecond\r\n\r\n\n  third  \n")
    docs = train_data.load_documents(str(tmp_path / "paragraphs.txt"), 256, 8)
    assert texts(docs) == ["first on", "e\nstill ", "first", "second", "third"], texts(docs)
    assert "3 documents" in docs.summary and "blank lines" in docs.summary and "5 to pack" in docs.summary
    (tmp_path / "lines.txt").write_text("alpha\nbeta gamma\ndelta\n")
    docs = train_data.load_documents(str(tmp_path / "lines.txt"), 256, 16)
    assert texts(docs) == ["alpha", "beta gamma", "delta"] and "one per line" in docs.summary, docs.summary
    np.save(tmp_path / "tokens.npy", np.array([7, 1, 2, 0, 0, 3, 0, 5, 6, 7, 8, 9, 300], dtype=np.uint16))
    docs = train_data.load_documents(str(tmp_path / "tokens.npy"), 256, 4, doc_sep=0)
    assert [docs[i].tolist() for i in range(len(docs))] == [[7, 1, 2, 0], [3, 0], [5, 6, 7, 8], [9, 300 % 256]]
    with pytest.raises(UsageError, match="holds no such token"):
        train_data.load_documents(str(tmp_path / "tokens.npy"), 256, 4, doc_sep=11)
    with pytest.raises(UsageError, match="fewer than one row"):
        train_data.load_documents(str(tmp_path / "lines.txt"), 256, 64)

    # Rows from a file: consecutive documents (wrapping around), the last cut at the row's end.
    (tmp_path / "corpus.txt").write_text(_paragraphs(30))
    docs = train_data.load_documents(str(tmp_path / "corpus.txt"), 256, 63)
    ns = argparse.Namespace(seed=1, batch=4, seq=63)
    ids, pos, labels, n = train_data.make_packed_batch(2, ns, 256, docs, 0)
    all_docs = [docs[i] for i in range(len(docs))]
    for row, p in zip(ids, pos):
        starts = (p == 0).nonzero().flatten().tolist()
        pieces = [row[a:b] for a, b in zip(starts, starts[1:] + [63])]
        first = next(i for i, d in enumerate(all_docs) if torch.equal(d, pieces[0][:len(d)]))
        for k, piece in enumerate(pieces):
            whole = all_docs[(first + k) % len(all_docs)]
            assert torch.equal(piece, whole if k < len(pieces) - 1 else whole[:len(piece)])
    halves = [train_data.make_packed_batch(2, argparse.Namespace(seed=1, batch=2, seq=63), 256, docs, r) for r in (0, 1)]
    assert torch.equal(ids, torch.cat([h[0] for h in halves])) and torch.equal(pos, torch.cat([h[1] for h in halves]))
    assert n == halves[0][3] + halves[1][3]
    assert not torch.equal(ids, train_data.make_packed_batch(3, ns, 256, docs, 0)[0])
    # Synthetic documents: a function of (seed, step, sample) too.
    synthetic = train_data.make_packed_batch(0, ns, 256, None, 0)
    assert all(torch.equal(a, b) for a, b in zip(synthetic[:3], train_data.make_packed_batch(0, ns, 256, None, 0)[:3]))

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    model = ["--model", str(tmp_path / "model")]
    errors = [
        ([*model, "--pack", "--data", str(tmp_path / "tokens.npy")], "needs --doc-sep ID"),
        ([*model, "--doc-sep", "0", "--data", str(tmp_path / "tokens.npy")], "--doc-sep splits documents for --pack"),
        ([*model, "--pack", "--doc-sep", "0", "--data", str(tmp_path / "lines.txt")], "a text file's documents"),
        ([*model, "--pack", "--dry-run"], "--dry-run trains nothing: --pack does not apply"),
    ]
    for argv, message in errors:
        with pytest.raises(SystemExit) as exc:
            train.parse_args(argv)
        assert message in str(exc.value.code), (argv, exc.value.code)
    assert train.parse_args([*model, "--pack", "--doc-sep", "0", "--data", str(tmp_path / "tokens.npy")]).pack


def test_pack_verify_run_of_a_hugging_face_directory_with_fsdp_matches_and_learns(tmp_path):
    """torchrun, 2 ranks, a local Hugging Face model directory (config + safetensors,
    nothing downloaded), FSDP2 over both ranks, --pack on a text file of paragraphs at
    --seq 63 (odd): verify passes (each step's loss matches the single-device model's), the
    loss goes down, each step reports the documents make_packed_batch packs, the packed mask
    is recognised (no S x S mask kept), and the first loss is the saved weights' packed loss
    (position_ids and labels reached the model), not the unpacked one (the control)."""
    import argparse

    transformers = __import__("pytest").importorskip("transformers")
    torch.manual_seed(0)
    model = _tiny_hf_llama(transformers)
    model.save_pretrained(tmp_path / "hf")
    data = tmp_path / "corpus.txt"
    data.write_text(_paragraphs(40))
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    run = _torchrun("--model", str(tmp_path / "hf"), "--fsdp", "--pack", "--data", str(data), "--seq", "63",
                    "--steps", "4", "--verify")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    out = run.stdout
    assert "1 data-parallel x 2 sequence-parallel" in out and "VERIFY PASSED" in out, out
    assert "Hugging Face 'llama'" in out and "FSDP on (fully_shard on 2 blocks + the root" in out, out
    first_loss, last_loss = map(float, re.search(r"loss first -> last\s+(\S+) -> (\S+)", out).groups())
    assert last_loss < first_loss, "the loss must go down"
    assert "keeps its" not in run.stderr, "the packed-documents mask is recognised, not kept S x S"
    docs = train_data.load_documents(str(data), 256, 63)
    assert f"packing: {docs.summary} | rows of 63 tokens" in out, out
    diff = float(re.search(r"max \|loss - single-device loss\|\s+(\S+)", out).group(1))
    assert diff <= 1e-4, out
    batches = [train_data.make_packed_batch(step, argparse.Namespace(seed=0, batch=2, seq=63), 256, docs, 0)
               for step in range(4)]
    printed = [int(n) for n in re.findall(r"^step +\d+/4 \| loss +\S+ \| +(\d+) docs", out, flags=re.M)]
    assert printed == [b[3] for b in batches], (printed, out)
    assert re.search(rf"^  documents packed +{sum(printed)} in 8 rows", out, flags=re.M), out
    ids, position_ids, labels, _ = batches[0]
    assert int((position_ids == 0).sum()) > 2, "the control needs rows holding several documents"
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=position_ids, labels=labels, use_cache=False).loss.item()
        unpacked = model(input_ids=ids, labels=ids, use_cache=False).loss.item()
    first = _step_losses(out)[1]
    assert _close(first, packed), (first, packed)
    assert not _close(first, unpacked, 1e-4), (first, unpacked)


# ---------------------------------------------------------------- loading by slice, --save-hf
def _safetensors_bytes(directory):
    """{name: bytes} of every tensor in a safetensors checkpoint directory (its headers only)."""
    ckpt = train_state.SafetensorsCheckpoint(str(directory))
    return {name: math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            for name, (_, dtype, shape, _) in ckpt.tensors.items()}


def test_hugging_face_directory_each_rank_reads_its_rows_verifies_and_saves_a_loadable_checkpoint(tmp_path):
    """torchrun, 2 ranks, FSDP: a sharded Hugging Face checkpoint (index + several
    safetensors files; 67 MLP rows: uneven shards) is built on the meta device and each
    rank reads only its own rows: the bytes read per rank add up to the checkpoint's, half
    each (not the whole file each, as from_pretrained on every rank would). The loss equals
    the single-device model's loaded by from_pretrained (--verify). --save-hf writes a
    checkpoint that from_pretrained loads, equal to the DCP checkpoint of the same step
    (--save), and not to the starting weights (the control: training moved them)."""
    transformers = __import__("pytest").importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=67, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf", max_shard_size="50KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) > 1
    run = _torchrun("--model", str(tmp_path / "hf"), "--fsdp", "--verify", "--steps", "2", "--seq", "32",
                    "--save", str(tmp_path / "dcp"), "--save-hf", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-4000:]
    out = run.stdout
    assert "VERIFY PASSED" in out and "FSDP on (fully_shard on 2 blocks + the root, over 2 ranks)" in out, out
    assert float(re.search(r"max \|loss - single-device loss\|\s+(\S+)", out).group(1)) <= 1e-5, out
    assert "each rank its own shards (bytes read per rank" in out, out
    read = [int(n) for n in re.search(r"bytes read per rank (\d+), (\d+)\)", out).groups()]
    total = sum(_safetensors_bytes(tmp_path / "hf").values())
    assert sum(read) == total and max(read) <= 0.52 * total, (read, total)
    assert re.search(r"^saved a Hugging Face checkpoint to \S+/out", out, flags=re.M), out

    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    start = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    trained = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    train_state.load_checkpoint(str(tmp_path / "dcp" / "step-000002"), trained, None, load_optimizer=False)
    names = dict(saved.named_parameters()).keys()
    assert names == dict(trained.named_parameters()).keys()
    for (name, a), b, c in zip(saved.named_parameters(), trained.parameters(), start.parameters()):
        assert torch.equal(a, b), name
        assert not torch.equal(a, c), f"{name}: the control needs weights that training moved"
    assert set(_safetensors_bytes(tmp_path / "out")) == set(_safetensors_bytes(tmp_path / "hf"))


def test_slices_read_from_safetensors_the_meta_built_model_and_missing_or_mismatched_tensors(tmp_path):
    """In one process: a rank's rows read from a safetensors file are the rows of the whole
    tensor (and only their bytes are read; a wrong offset gives other rows: the control); a
    model built on the meta device and filled from a checkpoint equals from_pretrained's
    (weights, rotary buffers, tied embeddings still tied); a preset filled one tensor at a
    time equals its seeded constructor, and its --save-hf checkpoint loads as a
    LlamaForCausalLM computing the same loss. A tensor missing, of another shape, or left
    over is an error naming it."""
    import argparse

    import pytest
    from safetensors.torch import load_file, save_file
    transformers = pytest.importorskip("transformers")

    full = torch.randn(67, 5)
    save_file({"w": full, "b": torch.randn(3)}, str(tmp_path / "model.safetensors"))
    ckpt = train_state.SafetensorsCheckpoint(str(tmp_path))
    for part in torch.arange(67).chunk(2):  # FSDP2's split over 2 ranks: rows 0-33, 34-66
        rows = slice(int(part[0]), int(part[-1]) + 1)
        out = torch.empty(len(part), 5)
        before = ckpt.bytes_read
        ckpt.read("w", out, (rows.start, 0))
        assert torch.equal(out, full[rows]) and ckpt.bytes_read - before == out.numel() * 4
        as_bf16 = torch.empty(out.shape, dtype=torch.bfloat16)  # another dtype: read, then converted
        ckpt.read("w", as_bf16, (rows.start, 0))
        assert torch.equal(as_bf16, full[rows].bfloat16())
    wrong = torch.empty(33, 5)
    ckpt.read("w", wrong, (33, 0))  # the control: one row off
    assert not torch.equal(wrong, full[34:])
    ckpt.close()

    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                                 "rope_theta": 5000.0})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    args = argparse.Namespace(model=str(tmp_path / "hf"), size=None, layers=None, seq=32, seed=0, fsdp=False,
                              gpu_gib=80.0)
    model, _, _ = train_state.build_model(args, torch.float32)
    assert all(p.is_meta for p in model.parameters())
    _, n_read = train_state.place_model(model, args, torch.device("cpu"), 1)
    reference = train_state.build_plain_model(args, torch.float32)  # from_pretrained
    assert n_read == sum(_safetensors_bytes(tmp_path / "hf").values())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    for (name, a), (_, b) in zip(model.named_buffers(), reference.named_buffers()):
        assert torch.equal(a, b), name  # non-persistent: from the constructor, not the checkpoint

    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    bad = {"missing": {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"},
           "shape": {**tensors, "model.norm.weight": torch.ones(31)},
           "extra": {**tensors, "model.layers.9.mlp.up_proj.weight": torch.ones(1)}}
    expected = {"missing": "the checkpoint has no tensor 'model.layers.1.mlp.up_proj.weight'",
                "shape": "tensor 'model.norm.weight' has shape [31] in the checkpoint, the model expects [32]",
                "extra": "tensors the model does not use: model.layers.9.mlp.up_proj.weight"}
    for what, state in bad.items():
        (tmp_path / what).mkdir()
        (tmp_path / what / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
        save_file(state, str(tmp_path / what / "model.safetensors"))
        args.model = str(tmp_path / what)
        model, _, _ = train_state.build_model(args, torch.float32)
        with pytest.raises(UsageError, match=re.escape(expected[what])):
            train_state.place_model(model, args, torch.device("cpu"), 1)

    # A preset: filled one tensor at a time, as its seeded constructor; saved for Hugging Face.
    args = argparse.Namespace(model=None, size="tiny", layers=None, seq=32, seed=5, fsdp=False, gpu_gib=80.0)
    model, vocab, _ = train_state.build_model(args, torch.float32)
    train_state.place_model(model, args, torch.device("cpu"), 1)
    reference = train_state.build_plain_model(args, torch.float32)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs) and model.lm_head.weight is model.embed.weight
    train_state.save_hf_checkpoint(str(tmp_path / "preset"), model, torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "preset", local_files_only=True)
    ids = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = model(ids, labels=ids)["loss"].item()
        b = hf(input_ids=ids, labels=ids).loss.item()
    assert _close(b, a), (a, b)


def test_from_scratch_builds_the_architecture_with_fresh_weights_and_reads_nothing(tmp_path):
    """--from-scratch (the same run without the checkpoint: the baseline of a run's memory)
    builds --model's architecture on meta and fills it in place: no byte read (no weights
    file needed), matrices normal(0, 0.02), norms at one. It needs --model and refuses
    --verify (the reference would be the checkpoint's weights). Control: without it, the
    directory's missing weights are an error."""
    import argparse

    import pytest
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    config.save_pretrained(tmp_path)  # config.json only
    args = argparse.Namespace(model=str(tmp_path), size=None, layers=None, seq=32, seed=0, fsdp=False, gpu_gib=80.0,
                              from_scratch=True, verify=False, save_every=None, save=None, resume=None,
                              init_from=None, save_hf=None)
    train_state.check_options(args)
    model, _, _ = train_state.build_model(args, torch.float32)
    _, n_read = train_state.place_model(model, args, torch.device("cpu"), 1)
    assert n_read == 0 and not any(p.is_meta for p in model.parameters())
    assert torch.equal(model.model.norm.weight, torch.ones(32))
    assert abs(float(model.model.layers[0].mlp.up_proj.weight.detach().std()) - 0.02) < 0.004
    for bad, message in ((dict(verify=True), "--from-scratch with --verify"),
                         (dict(model=None, from_scratch=True), "--from-scratch needs --model")):
        with pytest.raises(train_state.UsageError, match=message):
            train_state.check_options(argparse.Namespace(**{**vars(args), **bad}))
    with pytest.raises(train_state.UsageError, match="no model.safetensors"):  # the control
        train_state.check_options(argparse.Namespace(**{**vars(args), "from_scratch": False}))
