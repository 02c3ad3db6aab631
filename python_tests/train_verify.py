"""examples/train.py's --verify, and the tests' negative controls of it.

    torchrun --nproc-per-node 2 python_tests/train_verify.py --steps 2 --seq 32 --verify --debug-sp-loss-offset 0.1

:class:`Verify` joins the training loop through its seam (train_launch.Hooks):
``examples/train.py --verify`` loads it from here. It trains the single-device model on
rank 0 with the same batches as the sequence-parallel run (with several replicas, every
replica's batch: it steps on the mean of their losses), prints both losses each step and
fails the run (exit status 1 on every rank) unless each step's agree. In fp32 each step
must agree within 1e-3 x max(1, |first loss|). With --dtype bf16 an fp32 single-device
model runs alongside too; before each step both references take the SP model's weights,
and each step needs |SP - fp32| <= |single-device bf16 - fp32| + one bf16 step
(:func:`check_bf16`).

Run as a script, this file is examples/train.py with the negative controls' options added
(:class:`Controls`; hidden from --help, absent from the example a user copies):
--debug-wrong-shard makes every rank compute on the next rank's part of the sequence (a
real sharding bug, which --verify must catch), --debug-sp-loss-offset X moves the SP loss
the check sees by X, and --debug-raise-on-rank R raises on rank R at step 2 (the job must
stop on every rank, without a hang).
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
from dataclasses import dataclass

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [p for p in (os.path.join(_ROOT, "examples"), _ROOT) if p not in sys.path]
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from train_launch import Hooks, Ranks  # noqa: E402
from train_state import build_plain_model, is_hf, model_loss  # noqa: E402


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


def full_params(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter whole (a collective under FSDP: call it on every rank)."""
    from torch.distributed.tensor import DTensor
    return [p.full_tensor() if isinstance(p, DTensor) else p.detach() for p in model.parameters()]


def copy_state_to_references(model, opt, refs, ref_opts, rank: int) -> None:
    """After --resume: the rank-0 references take the loaded weights and optimizer state
    (gathered whole from the shards: a collective, every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return
    for name, ref in refs.items():
        # A copy: without FSDP the state dict holds the optimizer's own tensors, which the
        # reference's optimizer would otherwise share (and step twice).
        set_state_dict(ref, ref_opts[name], model_state_dict=model_sd, optim_state_dict=copy.deepcopy(optim_sd),
                       options=StateDictOptions(full_state_dict=True))


class Verify(Hooks):
    """--verify (see the module docstring); with ``args.verify`` false it does nothing. The
    references ("single": the single-device model in the run's dtype; "fp32" with bf16) live
    on rank 0 and start from the same (bf16-representable) weights, built whole the ordinary
    way (from_pretrained, or the seeded preset constructor)."""

    def __init__(self, args):
        self.args, self.on = args, bool(args.verify)
        self.refs: dict[str, torch.nn.Module] = {}
        self.ref_opts: dict[str, torch.optim.Optimizer] = {}
        self.ref_losses: dict[str, list[float]] = {}

    def built(self, model, ranks: Ranks) -> None:
        """Build the references (rank 0) the ordinary way, whole: ``from_pretrained`` for
        --model, the seeded constructor for a preset (train_state.build_plain_model); the
        SP model (on the meta device here) gets its weights by its own path, each rank its
        slices, so that path is checked too."""
        self.ranks, self.hf = ranks, is_hf(model)
        self.reset = self.on and self.args.dtype != "fp32"  # bf16: each step's losses at the SP weights
        if self.on and ranks.rank == 0:
            dtype = torch.bfloat16 if self.args.dtype == "bf16" else torch.float32
            self.refs["single"] = build_plain_model(self.args, dtype).to(ranks.device)
            if self.args.dtype != "fp32":
                self.refs["fp32"] = copy.deepcopy(self.refs["single"]).float().to(ranks.device)
        self.ref_losses = {name: [] for name in self.refs}

    def started(self, model, opt) -> None:
        """The references take --init-from's weights, or --resume's weights and optimizer state."""
        if self.args.init_from and self.refs:
            state = torch.load(self.args.init_from, map_location="cpu", weights_only=True)
            for ref in self.refs.values():
                ref.load_state_dict(state)
        lr = self.args.lr
        self.ref_opts = {k: torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0) for k, m in self.refs.items()}
        if self.on and self.args.resume:
            copy_state_to_references(model, opt, self.refs, self.ref_opts, self.ranks.rank)

    def step(self, step: int, model) -> None:
        """bf16: the references take the SP model's weights (every rank: a collective under FSDP)."""
        if self.reset:
            with torch.no_grad():
                weights = full_params(model)
                for ref in self.refs.values():
                    for p_ref, p in zip(ref.parameters(), weights):
                        p_ref.copy_(p)
                del weights

    def stepped(self, step: int, loss: float, batches) -> tuple[float, str]:
        """Step each reference on the data-parallel objective: the mean of the replicas'
        losses (one backward per replica's batch, each scaled by 1/dp, accumulating)."""
        text, dp = "", self.ranks.dp
        for name, ref in self.refs.items():
            self.ref_opts[name].zero_grad(set_to_none=True)
            ref_loss = 0.0
            for replica in range(dp):
                ids, inputs, _ = batches(replica)
                part = model_loss(ref, ids, self.hf, **inputs)
                (part / dp).backward()
                ref_loss += part.item() / dp
            self.ref_opts[name].step()
            self.ref_losses[name].append(ref_loss)
            label = "single-device" if name == "single" else "single-device fp32"
            text += f" | {label} {ref_loss:9.6f} | diff {abs(loss - ref_loss):.1e}"
        return loss, text

    def finished(self, losses: list[float]) -> tuple[list[tuple[str, str]], list[str], str | None]:
        """Judge the losses on rank 0 and share the verdict, so that every rank exits alike."""
        if not self.on:
            return [], [], None
        single, fp32 = self.ref_losses.get("single"), self.ref_losses.get("fp32")
        check = None
        if fp32 is not None:
            check = check_bf16(losses, single, fp32)
        elif single is not None:
            check = check_fp32(losses, single)
        bad = not (all(map(math.isfinite, losses)) and (check is None or check.ok))
        failed = torch.tensor([int(bad)], device=self.ranks.device)
        if self.ranks.distributed:
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        rows, lines = [], []
        if single is not None:
            rows.append(("max |loss - single-device loss|", f"{max(abs(a - b) for a, b in zip(losses, single)):.2e}"))
        if fp32 is not None:
            rows.append(("max |loss - fp32 loss|", f"{max(abs(a - b) for a, b in zip(losses, fp32)):.2e}"))
        if check is not None:
            lines = check.lines + ["VERIFY FAILED: the sequence-parallel loss is off (the rows marked NO, or a "
                                   "non-finite loss)" if failed.item() else "VERIFY PASSED"]
        return rows, lines, "the verify check failed" if failed.item() else None


def _wrong_shard(x, seq_len, dim, lo, trim, group):
    """``autosp.shard`` gone wrong: every rank takes the next rank's part of a replicated
    value (as python_tests/e2e/test_hf_neox.py's control does)."""
    from autosp.runtime import collectives
    p, r = collectives.group_size(group), collectives.group_rank(group)
    a, b = collectives.span(seq_len, lo, trim, p, (r + 1) % p)
    a2, b2 = collectives.span(seq_len, lo, trim, p, r)
    return x.narrow(dim % x.dim(), a - lo, min(b - a, b2 - a2))


class Controls(Verify):
    """:class:`Verify` with the tests' negative controls: ``wrong_shard`` makes the compiled
    model shard the sequence wrongly (:func:`_wrong_shard`, in this process for good: it
    runs one job), ``sp_loss_offset`` moves the SP loss that is logged and judged (the run
    itself is untouched), and ``raise_on_rank`` makes that rank raise at step 2."""

    def __init__(self, args, sp_loss_offset: float = 0.0, raise_on_rank: int | None = None,
                 wrong_shard: bool = False):
        super().__init__(args)
        self.sp_loss_offset, self.raise_on_rank, self.wrong_shard = sp_loss_offset, raise_on_rank, wrong_shard

    def built(self, model, ranks: Ranks) -> None:
        """:meth:`Verify.built`; with ``wrong_shard``, swap the runtime op the compiler emits
        for ``autosp.shard`` before the model compiles."""
        super().built(model, ranks)
        if self.wrong_shard:
            from autosp.backend import fx_emitter
            fx_emitter._AUTOSP_OPS["autosp.shard"] = (_wrong_shard, ("x", "seq_len"))

    def step(self, step: int, model) -> None:
        """Raise on ``raise_on_rank`` at step 2, else :meth:`Verify.step`."""
        if self.raise_on_rank == self.ranks.rank and step == 1:
            raise RuntimeError(f"--debug-raise-on-rank {self.ranks.rank}: a deliberate failure at step 2")
        super().step(step, model)

    def stepped(self, step: int, loss: float, batches) -> tuple[float, str]:
        """:meth:`Verify.stepped` of the loss moved by ``sp_loss_offset``."""
        return super().stepped(step, loss + self.sp_loss_offset, batches)


def main(argv=None) -> int:
    """examples/train.py's main job with :class:`Controls` and their options; the exit status."""
    import train
    parser = train.build_parser()
    parser.add_argument("--debug-sp-loss-offset", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--debug-raise-on-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--debug-wrong-shard", action="store_true", help=argparse.SUPPRESS)
    return train.main(argv, parser, lambda args: Controls(args, args.debug_sp_loss_offset, args.debug_raise_on_rank,
                                                          args.debug_wrong_shard))


if __name__ == "__main__":
    sys.exit(main())
