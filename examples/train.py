"""Train a Llama-style decoder with autosp sequence parallelism: the main job.

    torchrun --nproc-per-node 2 examples/train.py --size tiny --seq 256 --steps 20 --verify

Every rank of a sequence-parallel group feeds the same full batch, exactly as it would
call the single-device model; autosp shards the sequence, and with more ranks than
--sp the groups are data-parallel replicas (each its own batch, gradients averaged).
Synthetic tokens by default; --data takes a text file (bytes as tokens) or a tokenised
.npy / .bin (uint16) array. --verify also trains the single-device model on rank 0 with
the same batches and prints both losses each step (needs one data-parallel replica).
Runs on CPU (gloo) or CUDA (nccl); without torchrun it runs as a world of one.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import resource
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import autosp  # noqa: E402
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
    p.add_argument("--checkpointing", choices=["off", "sac", "sac-min", "full"], default="off",
                   help="sac: keep attention, recompute the rest of each layer in backward; "
                        "sac-min: keep attention's output only, recompute q/k/v and their all-to-alls; "
                        "full: keep only each layer's input")
    p.add_argument("--verify", action="store_true", help="train the single-device model alongside on rank 0")
    p.add_argument("--data", help="text file, or tokenised .npy/.bin (uint16) file")
    p.add_argument("--seed", type=int, default=0)
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


def main(argv=None) -> int:
    args = parse_args(argv)
    distributed = "RANK" in os.environ
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() \
        else torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=5))
    if device.type == "cpu":
        default = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("WORLD_SIZE", 1))))
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", default)))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    sp = args.sp or world
    if world % sp:
        raise SystemExit(f"--sp {sp} must divide the number of ranks ({world})")
    dp, replica = world // sp, rank // sp
    if args.verify and dp > 1:
        raise SystemExit("--verify compares against one single-device model: use one data-parallel replica")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    cfg_kwargs = dict(SIZES[args.size])
    if args.layers:
        cfg_kwargs["layers"] = args.layers
    cfg = LlamaConfig(max_positions=max(2048, args.seq), **cfg_kwargs)

    torch.manual_seed(args.seed)
    model = LlamaLike(cfg).to(device=device, dtype=dtype)
    reference = copy.deepcopy(model) if args.verify and rank == 0 else None
    n_params = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    sp_model = autosp.compile(model, sp_size=sp, backend="inductor" if args.compile else None,
                              checkpointing=args.checkpointing)
    opt = torch.optim.AdamW(sp_model.parameters(), lr=args.lr, weight_decay=0.0)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=args.lr, weight_decay=0.0) if reference else None
    tokens = load_tokens(args.data, cfg.vocab)
    if rank == 0:
        print(f"autosp {autosp.__version__} | {world} rank(s): {dp} data-parallel x {sp} sequence-parallel | "
              f"Llama-style '{args.size}' {cfg.layers} layers, {n_params / 1e6:.2f}M params | "
              f"seq {args.seq}, batch {args.batch}, {args.dtype}, {device.type}", flush=True)

    step_times, losses, diffs = [], [], []
    for step in range(args.steps):
        ids = make_batch(step, args, cfg.vocab, tokens, replica).to(device)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = sp_model(ids, labels=ids)["loss"]
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step == 0 and rank == 0:
            print(f"step 0 includes compilation: {time.perf_counter() - t0:.1f}s", flush=True)
        step_times.append(elapsed)
        value = loss.item()
        losses.append(value)
        line = f"step {step + 1:>4}/{args.steps} | loss {value:8.4f}"
        if reference is not None:
            ref_opt.zero_grad(set_to_none=True)
            ref_loss = reference(ids, labels=ids)["loss"]
            ref_loss.backward()
            ref_opt.step()
            diffs.append(abs(value - ref_loss.item()))
            line += f" | single-device {ref_loss.item():8.4f} | diff {diffs[-1]:.1e}"
        tok_s = args.batch * args.seq * dp / elapsed
        line += f" | {tok_s:9.0f} tok/s | {elapsed:6.2f} s/step | peak {peak_memory_mib(device):7.1f} MiB"
        if rank == 0:
            print(line, flush=True)

    memory = torch.tensor([peak_memory_mib(device)], dtype=torch.float64)
    if distributed:
        gathered = [torch.zeros_like(memory) for _ in range(world)]
        dist.all_gather(gathered, memory)
        memory = torch.cat(gathered)
    if rank == 0:
        steady = step_times[1:] or step_times
        mean = sum(steady) / len(steady)
        rows = [("steps", f"{args.steps}"), ("tokens per step", f"{args.batch * args.seq * dp}"),
                ("mean step time (after step 1)", f"{mean:.3f} s"),
                ("throughput", f"{args.batch * args.seq * dp / mean:.0f} tok/s"),
                ("loss first -> last", f"{losses[0]:.4f} -> {losses[-1]:.4f}"),
                ("peak memory per rank", ", ".join(f"{m:.0f}" for m in memory.tolist()) + " MiB")]
        if diffs:
            rows.append(("max |loss - single-device loss|", f"{max(diffs):.2e}"))
        width = max(len(k) for k, _ in rows)
        print("\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows))
        if diffs and (max(diffs) > 1e-3 * max(1.0, abs(losses[0])) or not all(map(math.isfinite, losses))):
            print("VERIFY FAILED: sequence-parallel and single-device losses diverge", flush=True)
            return 1
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
