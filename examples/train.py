"""Train a Llama-style decoder with autosp sequence parallelism: the main job.

    torchrun --nproc-per-node 2 examples/train.py --size tiny --seq 256 --steps 20 --verify

Every rank of a sequence-parallel group feeds the same full batch, exactly as it would call
the single-device model; autosp shards the sequence. With more ranks than --sp the groups
are data-parallel replicas (each its own batch, gradients averaged), and the printed loss is
the global one: the mean of their losses. Each step also prints tokens/s and the peak memory
of each process: its resident set size on CPU (getrusage: everything it holds, not only
tensors), torch.cuda.max_memory_allocated on CUDA (the caching allocator's tensors); the
header gives it right after the weights are loaded too (no rank holds the whole model: it
is built on the meta device, sharded, and each rank reads only its own rows; see
train_state.py). --save-hf DIR ends with a Hugging Face checkpoint.

--verify also trains the single-device model on rank 0 with the same batches (every
replica's) and prints both losses each step; with --dtype bf16 it trains an fp32 one too
and asks that SP be as close to fp32 as one device in bf16 is. The exit status is 1 on
every rank when the check fails. The check lives with the tests, in the autosp checkout
(python_tests/train_verify.py), and joins this loop through train_launch.Hooks.

This file is the loop to copy; its helpers are its siblings: train_data.py (batches,
--data, --pack), train_state.py (model, FSDP, checkpoints), train_plan.py (--dry-run) and
train_launch.py (process group, errors, exit status). Runs on CPU (gloo) or CUDA (nccl);
without torchrun it runs as a world of one.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (HERE, os.path.dirname(HERE)) if p not in sys.path]  # the siblings, autosp
import train_data  # noqa: E402
import train_plan  # noqa: E402
import train_state  # noqa: E402
from train_launch import Hooks, Ranks, UsageError, launch  # noqa: E402

import autosp  # noqa: E402
from autosp import AutospError  # noqa: E402
from autosp.options import CHECKPOINTING  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The options; --help shows this file's docstring, then its helpers'."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(m.__doc__ for m in (train_data, train_state, train_plan)))
    p.add_argument("--size", choices=sorted(train_state.SIZES), default=None, help="model preset (default: tiny)")
    p.add_argument("--model", metavar="DIR",
                   help="a local Hugging Face model directory (config.json + safetensors): built on the meta "
                        "device, each rank reading only its own rows of the weights; not with --size/--layers")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--seq", type=int, default=256, help="sequence length (need not divide by --sp)")
    p.add_argument("--batch", type=int, default=2, help="sequences per data-parallel replica per step")
    p.add_argument("--sp", type=int, help="sequence-parallel size (default: all ranks)")
    p.add_argument("--sp-strategy", choices=["auto", "ulysses", "ring", "hybrid"], default="auto",
                   help="how attention is split over the sequence-parallel ranks (default: chosen)")
    p.add_argument("--steps", type=int, default=20, help="total steps (a resumed run continues up to this one)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--compile", action="store_true", help="compile the emitted module with Inductor")
    p.add_argument("--checkpointing", choices=CHECKPOINTING, default="off",
                   help="sac: keep attention, recompute the rest of each layer in backward; "
                        "sac-min: keep attention's output only, recompute q/k/v and their all-to-alls; "
                        "full: keep only each layer's input")
    p.add_argument("--memory-budget", default=None,
                   help="bytes per rank the step must fit (e.g. 40MiB, 70GiB): the compiler plans per-layer "
                        "checkpointing, tiled loss/MLP and offload with its memory model and prints the plan")
    p.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=None,
                   help="shard parameters, gradients and optimizer state with FSDP2 over all ranks "
                        "(fully_shard per decoder block, then the root). Default: off on one rank; on more, on "
                        f"when {train_state.STATE_BYTES_PER_PARAM} bytes per parameter exceed "
                        f"1/{round(1 / train_state.FSDP_AUTO_FRACTION)} of a GPU's memory (the CUDA device's, "
                        "else --gpu-gib): on for --size 1b and 8b")
    p.add_argument("--verify", action="store_true",
                   help="train the single-device model alongside on rank 0 and fail unless the losses agree "
                        "(python_tests/train_verify.py, in the autosp checkout)")
    p.add_argument("--data", help="text file, or tokenised .npy/.bin (uint16) file")
    p.add_argument("--pack", action="store_true",
                   help="pack whole documents into each row: position_ids restart at each document, whose first "
                        "label is ignored (documents: a text file's paragraphs, or one per line "
                        "without blank lines; a tokenised file's split at --doc-sep; else synthetic)")
    p.add_argument("--doc-sep", type=int, metavar="ID",
                   help="with --pack and a tokenised --data file: the token id that ends each document (e.g. the "
                        "tokenizer's end-of-text id), kept as the document's last token")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="DIR",
                   help="save model, optimizer and step with torch.distributed.checkpoint to DIR/step-NNNNNN "
                        "after the last step (and every --save-every steps)")
    p.add_argument("--save-every", type=int, metavar="N", help="with --save: also save every N steps")
    p.add_argument("--resume", metavar="DIR",
                   help="continue from a --save checkpoint (a step-NNNNNN folder, or the --save DIR for its "
                        "latest); any world size, --sp or --fsdp")
    p.add_argument("--save-hf", metavar="DIR",
                   help="after the last step, save a Hugging Face checkpoint to DIR (config.json + model.safetensors, "
                        "loadable by from_pretrained; a preset as a LlamaForCausalLM), gathered one tensor at a time")
    p.add_argument("--from-scratch", action="store_true",
                   help="with --model: its architecture (config.json) with fresh random weights, no checkpoint read "
                        "(normal(0, 0.02) per shard, norms at one; not with --verify)")
    p.add_argument("--init-from", metavar="FILE",
                   help="start from a torch.save'd plain state_dict() of the unsharded model (works with --fsdp)")
    p.add_argument("--dry-run", action="store_true",
                   help="train nothing: compile on the meta device and print a rank's memory plan")
    p.add_argument("--world", type=int, metavar="N",
                   help="with --dry-run: the number of ranks to plan for (default: torchrun's, else 1)")
    p.add_argument("--gpu-gib", type=float, default=80.0,
                   help="GPU memory per rank in GiB: --dry-run's budget, and the automatic --fsdp rule off CUDA "
                        "(default 80)")
    return p


def parse_args(argv=None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The options of ``argv`` (default: the command line), parsed by ``parser`` (default:
    :func:`build_parser`'s) and checked; a bad one exits with one ``train.py: error:`` line."""
    args = (parser or build_parser()).parse_args(argv)
    try:
        for helpers in (train_state, train_plan, train_data):
            helpers.check_options(args)
    except UsageError as e:
        raise SystemExit(f"train.py: error: {e}") from None
    return args


def verify_hooks(args) -> Hooks:
    """--verify's :class:`Hooks` (python_tests/train_verify.py), else ones that do nothing."""
    if not args.verify:
        return Hooks()
    sys.path.append(os.path.join(os.path.dirname(HERE), "python_tests"))
    try:
        from train_verify import Verify
    except ImportError as e:
        raise UsageError(f"--verify needs python_tests/train_verify.py of the autosp checkout ({e})") from None
    return Verify(args)


def main(argv=None, parser: argparse.ArgumentParser | None = None, make_hooks=verify_hooks) -> int:
    """Run the job (a --dry-run, or training on this rank) and return the exit status.
    ``parser`` (:func:`build_parser`'s, extended) and ``make_hooks`` (the parsed options ->
    :class:`Hooks`) let a harness add options and join the loop."""
    args = parse_args(argv, parser)
    if args.dry_run:
        return train_plan.dry_run(args)
    return launch(args.sp, lambda ranks: train(args, ranks, make_hooks(args)))


def train(args, ranks: Ranks, hooks: Hooks) -> str | None:
    """The training loop on this rank; returns None, or why a check of ``hooks`` failed."""
    device, rank, world, sp, dp = ranks.device, ranks.rank, ranks.world, ranks.sp, ranks.dp
    if device.type == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", max(1, (os.cpu_count() or 1) // world))))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model, vocab, description = train_state.build_model(args, dtype)  # parameters on the meta device
    n_params, hf = train_state.count_params(model), train_state.is_hf(model)
    hooks.built(model, ranks)
    t_load = time.perf_counter()
    # FSDP2 shards (or the whole model), allocated and filled: each rank reads only its rows.
    fsdp_text, read = train_state.place_model(model, args, device, world)
    t_load = time.perf_counter() - t_load
    loaded_memory, read = ranks.gather(train_state.peak_memory_mib(device)), ranks.gather(read)
    if args.init_from:
        train_state.load_plain_state_dict(model, args.init_from)
    t0 = time.perf_counter()
    budget = dict(memory_budget=args.memory_budget, drop_logits=True, verbose=rank == 0) if args.memory_budget else {}
    sp_model = autosp.compile(model, sp_size=sp, backend="inductor" if args.compile else None,
                              checkpointing=args.checkpointing, sp_strategy=args.sp_strategy, **budget)
    opt = torch.optim.AdamW(sp_model.parameters(), lr=args.lr, weight_decay=0.0)
    start_step, resumed = 0, ""
    if args.resume:
        start_step, seed = train_state.load_checkpoint(args.resume, model, opt)
        resumed = f"resumed from {args.resume} at step {start_step}"
        if seed != args.seed:
            resumed += f"; warning: it was trained with --seed {seed}, this run's batches follow --seed {args.seed}"
        if start_step >= args.steps:
            raise UsageError(f"--resume {args.resume} is at step {start_step}: --steps {args.steps} leaves "
                             "nothing to run (--steps counts from the start of training)")
    hooks.started(model, opt)
    param_bytes = max(ranks.gather(train_state.local_param_bytes(model)))
    batches = train_data.Batches(args, vocab, device)
    if rank == 0:
        full_bytes = n_params * torch.empty((), dtype=dtype).element_size()
        print(f"autosp {autosp.__version__} | {world} rank(s): {dp} data-parallel x {sp} sequence-parallel | "
              f"{description}, {n_params / 1e6:.2f}M params | seq {args.seq}, batch {args.batch}, {args.dtype}, "
              f"{device.type}" + (f" | loss: the mean over the {dp} replicas" if dp > 1 else ""), flush=True)
        print(f"{fsdp_text} | parameter bytes per rank {int(param_bytes)} ({param_bytes / 2**20:.2f} MiB; "
              f"unsharded {full_bytes / 2**20:.2f} MiB)", flush=True)
        part = "its own shards" if fsdp_text.startswith("FSDP on") else "the whole model (replicated)"
        source = (f"fresh random (--from-scratch, the architecture of {args.model}), each rank {part}"
                  if args.from_scratch else
                  f"read from {args.model}, each rank {part} (bytes read per rank "
                  f"{', '.join(str(int(n)) for n in read)})" if args.model
                  else f"the preset's initialisation (--seed), each rank {part}")
        print(f"weights: {source} in {t_load:.1f}s | {train_state.memory_label(device)} per rank after loading "
              f"{', '.join(f'{m:.0f}' for m in loaded_memory)} MiB", flush=True)
        if args.init_from:
            print(f"initialised from {args.init_from}", flush=True)
        if resumed:
            print(resumed, flush=True)
        if args.pack:
            print(f"packing: {batches.describe()} | rows of {args.seq} tokens, position_ids restart at each "
                  "document, its first label ignored", flush=True)

    step_times, losses, packed_docs = [], [], []
    for step in range(start_step, args.steps):
        hooks.step(step, model)
        ids, inputs, n_docs = batches(step, ranks.replica)  # inputs: --pack's position_ids and labels
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        try:
            loss = train_state.model_loss(sp_model, ids, hf, **inputs)
        except AutospError as e:  # the first call compiles (every rank): a --memory-budget too small fails here
            if step == start_step and args.memory_budget is not None and "memory_budget" in str(e):
                reason = re.sub(r"^rank \d+ could not compile the model for this group: (AutospError: )?", "", str(e))
                raise UsageError(f"the memory budget {args.memory_budget} cannot fit a step of seq {args.seq}, "
                                 f"batch {args.batch} over {sp} sequence-parallel rank(s): {reason}") from None
            raise
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step == start_step and rank == 0:
            print(f"step {step + 1} includes compilation: {time.perf_counter() - t0:.1f}s", flush=True)
        step_times.append(elapsed)
        packed_docs.append(n_docs)
        # The global loss: every rank of a replica holds its replica's loss, so the mean over
        # the world is the mean over the replicas (what their averaged gradients descend).
        global_loss = loss.detach().to(torch.float64)
        if dp > 1:
            dist.all_reduce(global_loss)
            global_loss /= world
        logged, more = hooks.stepped(step, global_loss.item(), lambda replica, step=step: batches(step, replica))
        losses.append(logged)
        line = f"step {step + 1:>4}/{args.steps} | loss {losses[-1]:9.6f}"
        line += f" | {n_docs:4d} docs" if args.pack else ""
        line += (f"{more} | {args.batch * args.seq * dp / elapsed:9.0f} tok/s | {elapsed:6.2f} s/step | "
                 f"{train_state.memory_label(device)} {train_state.peak_memory_mib(device):7.1f} MiB")
        if rank == 0:
            print(line, flush=True)
        done = step + 1
        if args.save and (done == args.steps or (args.save_every and done % args.save_every == 0)):
            t_save, path = time.perf_counter(), train_state.checkpoint_dir(args.save, done)
            train_state.save_checkpoint(path, model, opt, done, args.seed)
            if rank == 0:
                print(f"saved step {done} to {path} ({time.perf_counter() - t_save:.1f}s)", flush=True)

    if args.save_hf:
        t_save = time.perf_counter()
        written = train_state.save_hf_checkpoint(args.save_hf, model, dtype, source=args.model)
        if rank == 0:
            print(f"saved a Hugging Face checkpoint to {args.save_hf} ({written / 2**20:.1f} MiB, "
                  f"{time.perf_counter() - t_save:.1f}s)", flush=True)
    memory = ranks.gather(train_state.peak_memory_mib(device))
    more_rows, more_lines, failure = hooks.finished(losses)
    if rank == 0:
        steady = step_times[1:] or step_times
        mean = sum(steady) / len(steady)
        span = f"step {args.steps}" if start_step + 1 == args.steps else f"steps {start_step + 1}-{args.steps}"
        rows = [("steps", f"{len(losses)}" + (f" ({span}, resumed)" if start_step else "")),
                ("tokens per step", f"{args.batch * args.seq * dp}"),
                ("mean step time (after the first)", f"{mean:.3f} s"),
                ("throughput", f"{args.batch * args.seq * dp / mean:.0f} tok/s"),
                ("loss first -> last" + (f" (mean of {dp} replicas)" if dp > 1 else ""),
                 f"{losses[0]:.4f} -> {losses[-1]:.4f}"),
                (f"{train_state.memory_label(device)} per rank after loading",
                 ", ".join(f"{m:.0f}" for m in loaded_memory) + " MiB"),
                (f"{train_state.memory_label(device)} per rank "
                 f"({'torch.cuda' if device.type == 'cuda' else 'getrusage'})",
                 ", ".join(f"{m:.0f}" for m in memory) + " MiB")]
        if args.pack:
            n_rows = args.batch * len(packed_docs)
            rows.append(("documents packed" + (" (replica 0)" if dp > 1 else ""),
                         f"{sum(packed_docs)} in {n_rows} rows ({sum(packed_docs) / n_rows:.1f} per row)"))
        rows += more_rows
        width = max(len(k) for k, _ in rows)
        print("\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows))
        if more_lines:
            print("\n".join(more_lines), flush=True)
    return failure


if __name__ == "__main__":
    sys.exit(main())
