"""Train a Llama-style decoder with autosp sequence parallelism: the main job.

    torchrun --nproc-per-node 2 examples/train.py --size tiny --seq 256 --steps 20 --verify

Every rank of a sequence-parallel group feeds the same full batch, exactly as it would
call the single-device model; autosp shards the sequence, and with more ranks than
--sp the groups are data-parallel replicas (each its own batch, gradients averaged).
Synthetic tokens by default; --data takes a text file (bytes as tokens) or a tokenised
.npy / .bin (uint16) array. --verify also trains the single-device model on rank 0 with
the same batches and prints both losses each step (needs one data-parallel replica); with
--dtype bf16 it trains an fp32 single-device model too, and asks that SP be as close to fp32
as one device in bf16 is (one bf16 step of slack). The exit code is non-zero on every rank
when the check fails.
Runs on CPU (gloo) or CUDA (nccl); without torchrun it runs as a world of one.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import resource
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import autosp  # noqa: E402
from autosp.api import CHECKPOINTING  # noqa: E402
from autosp.testing.models import LLAMA_PRESETS, LlamaConfig, LlamaLike  # noqa: E402

SIZES = LLAMA_PRESETS  # tiny, small, 1b, 8b (Llama-3-8B's shape)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--seq", type=int, default=256, help="sequence length (need not divide by --sp)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--sp", type=int, help="sequence-parallel size (default: all ranks)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--compile", action="store_true", help="compile the emitted module with Inductor")
    p.add_argument("--checkpointing", choices=CHECKPOINTING, default="off",
                   help="sac: keep attention, recompute the rest of each layer in backward; "
                        "sac-min: keep attention's output only, recompute q/k/v and their all-to-alls; "
                        "full: keep only each layer's input")
    p.add_argument("--verify", action="store_true", help="train the single-device model alongside on rank 0")
    p.add_argument("--data", help="text file, or tokenised .npy/.bin (uint16) file")
    p.add_argument("--seed", type=int, default=0)
    # Hidden debug knobs for the tests' negative controls.
    p.add_argument("--debug-sp-loss-offset", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--debug-raise-on-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def load_tokens(path: str | None, vocab: int) -> torch.Tensor | None:
    """All tokens of a dataset as one 1-D tensor (None: synthetic data)."""
    if path is None:
        return None
    import numpy as np
    if path.endswith(".npy"):
        data = np.load(path)
    elif path.endswith(".bin"):
        data = np.fromfile(path, dtype=np.uint16)
    else:
        data = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)
    tokens = torch.from_numpy(data.astype(np.int64)) % vocab
    return tokens


def make_batch(step: int, args, vocab: int, tokens, replica: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + replica)
    if tokens is None:
        # A learnable synthetic language: each sequence counts up from a random start.
        start = torch.randint(0, vocab, (args.batch, 1), generator=gen)
        return (start + torch.arange(args.seq)) % vocab
    starts = torch.randint(0, len(tokens) - args.seq - 1, (args.batch,), generator=gen)
    return torch.stack([tokens[s:s + args.seq] for s in starts.tolist()])


def peak_memory_mib(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def bf16_spacing(x: float) -> float:
    """The gap between adjacent bfloat16 numbers at |x|'s magnitude (8 significant bits).

    >>> bf16_spacing(7.0)  # 7 lies in [4, 8): 2**(2 - 7)
    0.03125
    """
    if x == 0 or not math.isfinite(x):
        return 0.0
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


@dataclass
class LossCheck:
    """The verdict of --verify: ``ok``, and the summary lines that say why."""

    ok: bool
    lines: list[str]


def check_fp32(sp: list[float], single: list[float]) -> LossCheck:
    """fp32: every step's SP loss is within 1e-3 x max(1, |first loss|) of the single-device loss.

    >>> check_fp32([5.0, 4.0], [5.0, 4.00001]).ok, check_fp32([5.0, 4.0], [5.0, 4.1]).ok
    (True, False)
    """
    tol = 1e-3 * max(1.0, abs(single[0])) if single else 0.0
    lines = [f"  verify (fp32): every step |SP loss - single-device loss| <= {tol:.1e}",
             f"  {'step':>6}  {'|SP - single|':>13}  ok"]
    ok = len(sp) == len(single)
    for i, (a, b) in enumerate(zip(sp, single)):
        d = abs(a - b)
        good = math.isfinite(a) and math.isfinite(b) and d <= tol
        ok &= good
        lines.append(f"  {i + 1:>6}  {d:13.2e}  {'yes' if good else 'NO'}")
    return LossCheck(ok, lines)


def check_bf16(sp: list[float], single: list[float], fp32: list[float]) -> LossCheck:
    """bf16: SP must be as accurate as one device in bf16, measured against an fp32 reference.

    Every step needs |SP - fp32| <= |single-device bf16 - fp32| + one bf16 step at the
    fp32 loss's magnitude (:func:`bf16_spacing`): SP may round differently (sums split
    across ranks) but must not be further from fp32 than one device is. The three losses are
    taken at the same weights (the references are reset to the SP model's weights before
    each step): bf16 weights round every update, so free-running bf16 runs wander off the
    fp32 trajectory by 0.1-0.6 after ~10 steps, each its own way, and a rule comparing them
    would judge that noise, not SP.

    >>> check_bf16([7.01], [7.02], [7.0]).ok   # SP closer to fp32 than one device
    True
    >>> check_bf16([7.10], [7.02], [7.0]).ok   # 0.10 > 0.02 + 0.03125
    False
    """
    lines = ["  verify (bf16): every step |SP - fp32| <= |single-device bf16 - fp32| + one bf16 step",
             f"  {'step':>6}  {'|SP - fp32|':>11}  {'|1-dev bf16 - fp32|':>19}  {'bf16 step':>9}  {'margin':>9}  ok"]
    ok = len(sp) == len(single) == len(fp32)
    for i, (a, b, r) in enumerate(zip(sp, single, fp32)):
        d_sp, d_single, ulp = abs(a - r), abs(b - r), bf16_spacing(r)
        margin = d_single + ulp - d_sp
        good = all(map(math.isfinite, (a, b, r))) and margin >= 0
        ok &= good
        lines.append(f"  {i + 1:>6}  {d_sp:11.2e}  {d_single:19.2e}  {ulp:9.2e}  {margin:9.2e}  "
                     f"{'yes' if good else 'NO'}")
    return LossCheck(ok, lines)


def _shutdown(device, clean: bool) -> None:
    """Leave the process group: after a barrier when every rank is known to be here.

    ``clean`` means all ranks reached the same point (the shared verdict), so a barrier is
    safe; it has a timeout, so a vanished peer cannot hang the exit. After an exception or
    an interrupt the peers may sit inside another collective: no barrier then, only destroy.
    """
    if not dist.is_available() or not dist.is_initialized():
        return
    if clean:
        try:
            kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
            dist.barrier(async_op=True, **kwargs).wait(timedelta(seconds=60))
        except Exception:  # noqa: BLE001 - a peer left; there is nothing left to wait for
            pass
    dist.destroy_process_group()


def _terminate(signum, frame):
    # torchrun sends SIGTERM to the other ranks when one fails: unwind so the finally
    # block leaves the process group instead of dying mid-collective.
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    distributed = "RANK" in os.environ
    world = int(os.environ.get("WORLD_SIZE", 1)) if distributed else 1
    sp = args.sp or world
    # Checked before the process group exists: every rank fails alike, nothing to clean up.
    if world % sp:
        raise SystemExit(f"--sp {sp} must divide the number of ranks ({world})")
    if args.verify and world // sp > 1:
        raise SystemExit("--verify compares against one single-device model: use one data-parallel replica")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() \
        else torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=5))
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminate)
    rank = dist.get_rank() if distributed else 0
    clean, status = False, 1
    try:
        status = 0 if train(args, device, distributed, rank, world, sp) else 1
        clean = True  # train() returned on every rank: the verdict was shared
        if status:
            print(f"rank {rank}: exit status {status}: the verify check failed", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"rank {rank}: interrupted", file=sys.stderr, flush=True)
        status = 130
    except Exception as e:  # noqa: BLE001 - report, leave the group, exit non-zero
        if _peer_lost(e):
            # This rank only waited on a peer that failed or left; the peer's log has the cause.
            print(f"rank {rank}: stopped: another rank failed or left ({type(e).__name__})",
                  file=sys.stderr, flush=True)
        else:
            print(f"rank {rank}: failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    finally:
        if distributed:
            _shutdown(device, clean)
    return status


def _peer_lost(e: Exception) -> bool:
    """Whether ``e`` is a collective failing because another rank went away.

    NCCL raises DistBackendError; gloo raises a plain RuntimeError naming its transport.
    """
    text = str(e)
    return isinstance(e, dist.DistBackendError) or (
        isinstance(e, RuntimeError) and "gloo" in text and ("Connection closed" in text or "Connection reset" in text))


def train(args, device, distributed: bool, rank: int, world: int, sp: int) -> bool:
    """The training loop; returns the verdict (True: passed or not verifying), shared by all ranks."""
    dp, replica = world // sp, rank // sp
    if device.type == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", max(1, (os.cpu_count() or 1) // world))))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    cfg_kwargs = dict(SIZES[args.size])
    if args.layers:
        cfg_kwargs["layers"] = args.layers
    cfg = LlamaConfig(max_positions=max(2048, args.seq), **cfg_kwargs)

    torch.manual_seed(args.seed)
    model = LlamaLike(cfg).to(device=device, dtype=dtype)
    # --verify: the single-device model in the same dtype and, in bf16, an fp32 one too; all
    # three start from the same (bf16-representable) weights and see the same batches.
    refs: dict[str, torch.nn.Module] = {}
    if args.verify and rank == 0:
        refs["single"] = copy.deepcopy(model)
        if dtype != torch.float32:
            refs["fp32"] = copy.deepcopy(model).float()
    n_params = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    sp_model = autosp.compile(model, sp_size=sp, backend="inductor" if args.compile else None,
                              checkpointing=args.checkpointing)
    opt = torch.optim.AdamW(sp_model.parameters(), lr=args.lr, weight_decay=0.0)
    ref_opts = {k: torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.0) for k, m in refs.items()}
    tokens = load_tokens(args.data, cfg.vocab)
    if rank == 0:
        print(f"autosp {autosp.__version__} | {world} rank(s): {dp} data-parallel x {sp} sequence-parallel | "
              f"Llama-style '{args.size}' {cfg.layers} layers, {n_params / 1e6:.2f}M params | "
              f"seq {args.seq}, batch {args.batch}, {args.dtype}, {device.type}", flush=True)

    step_times, losses = [], []
    ref_losses: dict[str, list[float]] = {k: [] for k in refs}
    for step in range(args.steps):
        if args.debug_raise_on_rank == rank and step == 1:
            raise RuntimeError(f"--debug-raise-on-rank {rank}: a deliberate failure at step 2")
        ids = make_batch(step, args, cfg.vocab, tokens, replica).to(device)
        if "fp32" in refs:  # bf16: each step's losses at the SP model's own weights (see check_bf16)
            with torch.no_grad():
                for ref in refs.values():
                    for p_ref, p in zip(ref.parameters(), model.parameters()):
                        p_ref.copy_(p)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = sp_model(ids, labels=ids)["loss"]
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step == 0 and rank == 0:
            print(f"step 0 includes compilation: {time.perf_counter() - t0:.1f}s", flush=True)
        step_times.append(elapsed)
        # The debug offset moves the reported SP loss only: a negative control for --verify.
        losses.append(loss.item() + args.debug_sp_loss_offset)
        line = f"step {step + 1:>4}/{args.steps} | loss {losses[-1]:8.4f}"
        for name, ref in refs.items():
            ref_opts[name].zero_grad(set_to_none=True)
            ref_loss = ref(ids, labels=ids)["loss"]
            ref_loss.backward()
            ref_opts[name].step()
            ref_losses[name].append(ref_loss.item())
            label = "single-device" if name == "single" else "single-device fp32"
            line += f" | {label} {ref_losses[name][-1]:8.4f} | diff {abs(losses[-1] - ref_losses[name][-1]):.1e}"
        tok_s = args.batch * args.seq * dp / elapsed
        line += f" | {tok_s:9.0f} tok/s | {elapsed:6.2f} s/step | peak {peak_memory_mib(device):7.1f} MiB"
        if rank == 0:
            print(line, flush=True)

    memory = torch.tensor([peak_memory_mib(device)], dtype=torch.float64, device=device)
    if distributed:
        gathered = [torch.zeros_like(memory) for _ in range(world)]
        dist.all_gather(gathered, memory)
        memory = torch.cat(gathered)
    check = None
    if rank == 0:
        if "fp32" in refs:
            check = check_bf16(losses, ref_losses["single"], ref_losses["fp32"])
        elif refs:
            check = check_fp32(losses, ref_losses["single"])
    # Every rank learns the verdict (rank 0 holds the references), so all exit alike.
    bad = args.verify and not (all(map(math.isfinite, losses)) and (check is None or check.ok))
    failed = torch.tensor([int(bad)], device=device)
    if distributed:
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if rank == 0:
        steady = step_times[1:] or step_times
        mean = sum(steady) / len(steady)
        rows = [("steps", f"{args.steps}"), ("tokens per step", f"{args.batch * args.seq * dp}"),
                ("mean step time (after step 1)", f"{mean:.3f} s"),
                ("throughput", f"{args.batch * args.seq * dp / mean:.0f} tok/s"),
                ("loss first -> last", f"{losses[0]:.4f} -> {losses[-1]:.4f}"),
                ("peak memory per rank", ", ".join(f"{m:.0f}" for m in memory.tolist()) + " MiB")]
        if "single" in ref_losses:
            diffs = [abs(a - b) for a, b in zip(losses, ref_losses["single"])]
            rows.append(("max |loss - single-device loss|", f"{max(diffs):.2e}"))
        if "fp32" in ref_losses:
            rows.append(("max |loss - fp32 loss|",
                         f"{max(abs(a - b) for a, b in zip(losses, ref_losses['fp32'])):.2e}"))
        width = max(len(k) for k, _ in rows)
        print("\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows))
        if check is not None:
            print("\n".join(check.lines))
        if check is not None:
            print("VERIFY FAILED: the sequence-parallel loss is off (the rows marked NO, or a non-finite loss)"
                  if failed.item() else "VERIFY PASSED", flush=True)
    return not failed.item()


if __name__ == "__main__":
    sys.exit(main())
