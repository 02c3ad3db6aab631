"""examples/train.py --dry-run: a rank's memory plan on the meta device, nothing trained.

--dry-run compiles the model on the meta device and prints a rank's memory plan
(parameters, gradients, optimizer state, activation peak, total) against --gpu-gib, for
--world N simulated ranks (no torchrun needed; --sp defaults to N). A plan that does not
fit names the flag to try next, from what dominates it: a further --checkpointing rung
for activations, --fsdp (and ranks to shard over) for model state, else more ranks or a
real run with --memory-budget.
"""
from __future__ import annotations

import os
import time

import torch
from train_launch import UsageError
from train_state import GiB, auto_fsdp, count_params, model_config, peak_memory_mib

import autosp
from autosp import AutospError
from autosp.units import parse_bytes


def check_options(args) -> None:
    """Raise :class:`UsageError` for a bad --world or --memory-budget, an option --dry-run
    has no use for, or --fsdp outside torchrun (a dry run simulates its ranks)."""
    if args.world is not None and not args.dry_run:
        raise UsageError("--world simulates ranks for --dry-run only; under torchrun the world is --nproc-per-node")
    if args.memory_budget is not None:
        try:
            parse_bytes(args.memory_budget)
        except AutospError as e:
            raise UsageError(f"--memory-budget {args.memory_budget}: {e}") from None
    if args.dry_run:
        if args.memory_budget is not None:
            raise UsageError("--dry-run plans the --checkpointing you give; --memory-budget is planned by the "
                             "compiler at a real run's first step: drop --dry-run (or --memory-budget)")
        for flag in ("verify", "save", "save_hf", "resume", "init_from", "data", "pack"):
            if getattr(args, flag, None):
                raise UsageError(f"--dry-run trains nothing: --{flag.replace('_', '-')} does not apply")
        if args.world is not None and args.world < 1:
            raise UsageError(f"--world must be >= 1, got {args.world}")
    elif args.fsdp and "RANK" not in os.environ:
        raise UsageError("--fsdp shards over the ranks of a torchrun job: run under torchrun")


def plan_rows(est, world: int, fsdp: bool, budget_bytes: float) -> tuple[list[tuple[str, str]], bool]:
    """The memory plan of one rank as table rows, and whether it fits ``budget_bytes``.
    With FSDP, parameters, gradients and optimizer state are divided by the world (ZeRO-3)."""
    zero_stage, shards = (3, world) if fsdp else (0, 1)
    share = f" (/ {shards})" if shards > 1 else ""
    total = est.total_bytes(zero_stage, shards)
    fits = total <= budget_bytes

    def gib(n: float) -> str:
        return f"{n / GiB:10.2f} GiB"

    rows = [("parameters" + share, gib(est.param_bytes // shards)),
            ("gradients" + share, gib(est.grad_bytes // shards)),
            ("optimizer state (AdamW)" + share, gib(est.optimizer_bytes // shards)),
            ("activation peak", gib(est.activation_peak_bytes)),
            ("total", gib(total)),
            (f"budget --gpu-gib {budget_bytes / GiB:g}",
             f"{'fits' if fits else 'does not fit'} ({100 * total / budget_bytes:.0f}% of the budget)")]
    return rows, fits


def next_flag(est, world: int, sp: int, fsdp: bool, checkpointing: str, budget_bytes: float,
              sp_given: bool = False) -> str | None:
    """What to try when a --dry-run plan does not fit (None when it fits), from the part of
    the plan that dominates it:

    * the activation peak at least the model state, and a --checkpointing rung left
      (off -> sac -> sac-min -> full, each keeping less for backward): the next rung;
    * else, FSDP off: --fsdp, which divides the model state by the ranks (on one rank with
      the smallest power-of-two --world whose share fits next to the activations);
    * else the model state dominating (FSDP on): more ranks to shard it over, the smallest
      power-of-two multiple of --world whose share fits next to the activations;
    * else (activations, every layer already recomputed): a real run with
      --memory-budget (the compiler tiles the loss and MLP and offloads), or twice the
      sequence-parallel ranks, which share each sequence.

    >>> from autosp.planning.estimate import MemoryEstimate
    >>> est = MemoryEstimate(1024, 8, torch.float32, "off", 0, 0, activation_peak_bytes=100 * GiB,
    ...                      param_bytes=4 * GiB, grad_bytes=4 * GiB, optimizer_bytes=8 * GiB)
    >>> next_flag(est, 8, 8, False, "off", 80 * GiB)
    '--checkpointing sac'
    """
    state = est.state_bytes(3, world) if fsdp else est.state_bytes(0, 1)
    act = est.activation_peak_bytes
    if state + act <= budget_bytes:
        return None
    rungs = ("off", "sac", "sac-min", "full")
    rung = rungs.index(checkpointing) if checkpointing in rungs else len(rungs) - 1
    if act >= state and rung + 1 < len(rungs):
        return f"--checkpointing {rungs[rung + 1]}"
    whole_state = est.state_bytes(0, 1)

    def ranks_for_state(start: int) -> int | None:
        """The smallest power-of-two multiple of ``start`` (up to 2**16 ranks) whose FSDP
        share of the model state fits next to the activation peak."""
        n = start
        while n <= 1 << 16:
            if whole_state / n + act <= budget_bytes:
                return n
            n *= 2
        return None

    if not fsdp:
        if world > 1:
            return "--fsdp"
        n = ranks_for_state(2)
        return f"--world {n} --fsdp" if n else f"--world {2 * world} --fsdp"
    if state > act:
        n = ranks_for_state(2 * world)
        if n:
            return f"--world {n}"
    more_sp = f"--world {2 * world} --sp {2 * sp}" if sp_given else f"--world {2 * world}"
    return f"--memory-budget {budget_bytes / GiB:g}GiB (a real run, not --dry-run: the compiler tiles the loss " \
           f"and MLP and offloads to fit) or {more_sp} (twice the sequence-parallel ranks)"


def dry_run(args, world: int | None = None) -> int:
    """--dry-run: compile on the meta device and print a rank's memory plan for ``world``
    ranks (default: --world, else torchrun's world size, else 1); no training, no real
    parameters: an 8B model is shapes only. One process plans for all the ranks: under
    torchrun only rank 0 does, the others return at once. Returns the exit status."""
    from autosp.planning.estimate import MemoryModel, meta_model
    if int(os.environ.get("RANK", 0)) != 0:
        return 0
    world = world or args.world or int(os.environ.get("WORLD_SIZE", 1))
    sp = args.sp or world
    if world % sp:
        raise SystemExit(f"--sp {sp} must divide the number of ranks ({world})")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.model:
        from transformers import AutoConfig
        what: object = AutoConfig.from_pretrained(args.model, local_files_only=True)
        what.use_cache = False  # type: ignore[attr-defined]  # MemoryModel calls the model without use_cache=False
        name = f"Hugging Face '{getattr(what, 'model_type', '?')}' from {args.model}"
    else:
        cfg = model_config(args)
        what, name = cfg, f"Llama-style '{args.size}' {cfg.layers} layers"
    print(f"dry run: compiling {name} on the meta device for SP {sp} ...", flush=True)
    t0 = time.perf_counter()
    model_on_meta = meta_model(what, dtype)
    n_params = count_params(model_on_meta)
    budget = args.gpu_gib * GiB
    fsdp = args.fsdp if args.fsdp is not None else auto_fsdp(n_params, world, budget)
    # With FSDP the plan is the step the runtime executes: FSDP2 over all ranks, one layer
    # unsharded at a time (plus the prefetch), each layer's whole gradient until its reduce-scatter.
    memory_model = MemoryModel(model_on_meta, sp, dtype, args.checkpointing, batch=args.batch,
                               fsdp=world if fsdp and world > 1 else 1)
    est = memory_model.estimate(args.seq)
    rows, fits = plan_rows(est, world, fsdp, budget)
    params_text = f"{n_params / 1e9:.2f}B" if n_params >= 1e8 else f"{n_params / 1e6:.2f}M"
    print(f"autosp {autosp.__version__} | dry run (meta device, nothing trained) | {name}, "
          f"{params_text} params | {world} rank(s): {world // sp} data-parallel x {sp} sequence-parallel | "
          f"FSDP {'on over ' + str(world) + ' ranks' if fsdp else 'off'} | seq {args.seq}, batch {args.batch}, "
          f"{args.dtype}, checkpointing {args.checkpointing} | planned in {time.perf_counter() - t0:.1f}s")
    width = max(len(k) for k, _ in rows)
    print("memory per rank:\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows), flush=True)
    if not fits:
        flag = next_flag(est, world, sp, fsdp, args.checkpointing, budget, sp_given=args.sp is not None)
        print(f"does not fit {args.gpu_gib:g} GiB: try {flag}", flush=True)
    print(f"this process's peak host memory: {peak_memory_mib(torch.device('cpu')):.0f} MiB "
          "(the model is shapes only)", flush=True)
    return 0
