"""examples/train.py's job from start to exit: the process group, errors, exit status, hooks.

Under torchrun (``RANK`` set) every rank joins one process group (nccl on CUDA, gloo on
CPU); without it the job is a world of one. How a run ends, on every rank alike:

* the loop returns None: exit 0; it returns a reason (a check it was given failed, e.g.
  --verify's): exit 1, each rank printing ``rank N: exit status 1: <reason>``;
* :class:`UsageError`, a bad option found after the group exists (every rank finds it
  alike): one ``train.py: error:`` line, from rank 0, exit 2;
* any other exception: that rank's traceback, exit 1; a rank whose collective only failed
  because a peer went away says so in one line (the peer's log has the cause);
* SIGTERM (torchrun's, when another rank failed) and Ctrl-C unwind, so that each rank
  leaves the process group instead of dying inside a collective.

:class:`Hooks` is the loop's seam: what a harness (python_tests/train_verify.py) adds to it.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


class UsageError(Exception):
    """A bad option found after the process group exists (every rank finds it alike)."""


@dataclass(frozen=True)
class Ranks:
    """Where this process stands in the job: its device, rank, the world size, and the
    sequence-parallel size ``sp`` (consecutive ranks form a group; the groups are
    data-parallel replicas)."""

    device: torch.device
    distributed: bool
    rank: int
    world: int
    sp: int

    @property
    def dp(self) -> int:
        """The number of data-parallel replicas."""
        return self.world // self.sp

    @property
    def replica(self) -> int:
        """This rank's replica (its sequence-parallel group's index)."""
        return self.rank // self.sp

    def gather(self, value: float) -> list[float]:
        """Every rank's ``value``, in rank order (a collective: every rank calls it)."""
        local = torch.tensor([value], dtype=torch.float64, device=self.device)
        if not self.distributed:
            return local.tolist()
        gathered = [torch.zeros_like(local) for _ in range(self.world)]
        dist.all_gather(gathered, local)
        return torch.cat(gathered).tolist()


class Hooks:
    """The training loop's seam for a harness, e.g. python_tests/train_verify.py's
    (--verify's single-device references, the tests' negative controls): examples/train.py's
    ``train`` calls each method on every rank, at the point its name says (so they may run
    collectives). Here they do nothing."""

    def built(self, model: torch.nn.Module, ranks: Ranks) -> None:
        """The model is built, its parameters on the meta device (shapes only); FSDP has not
        sharded it, its weights are not loaded, autosp has not compiled it."""

    def started(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        """The starting weights and optimizer state (--init-from, --resume) are in place."""

    def step(self, step: int, model: torch.nn.Module) -> None:
        """Step ``step`` (from 0) is about to run."""

    def stepped(self, step: int, loss: float, batches) -> tuple[float, str]:
        """Step ``step`` ran and its global loss is ``loss``; ``batches(replica)`` is any
        replica's batch of it (see train_data.Batches). Returns the loss to log and more
        text for the step's line."""
        return loss, ""

    def finished(self, losses: list[float]) -> tuple[list[tuple[str, str]], list[str], str | None]:
        """The last step ran: (rows for the summary table, lines printed after it, why the run
        failed: None when it did not; the same on every rank)."""
        return [], [], None


def launch(sp: int | None, body: Callable[[Ranks], str | None]) -> int:
    """Run ``body`` on this rank (``sp``: the --sp option, None for all ranks) and return the
    exit status (see the module docstring). The group is set up before and left after it."""
    distributed = "RANK" in os.environ
    world = int(os.environ.get("WORLD_SIZE", 1)) if distributed else 1
    sp = sp or world
    # Checked before the process group exists: every rank fails alike, nothing to clean up.
    if world % sp:
        raise SystemExit(f"--sp {sp} must divide the number of ranks ({world})")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # FSDP2's default mesh uses the current device
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=5))
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminate)
    rank = dist.get_rank() if distributed else 0
    clean, status = False, 1
    try:
        failure = body(Ranks(device, distributed, rank, world, sp))
        clean = True  # body() returned on every rank: the verdict was shared
        status = 0 if failure is None else 1
        if failure is not None:
            print(f"rank {rank}: exit status {status}: {failure}", file=sys.stderr, flush=True)
    except UsageError as e:  # found alike on every rank (e.g. the checkpoint's step): one line, from rank 0
        clean, status = True, 2
        if rank == 0:
            print(f"train.py: error: {e}", file=sys.stderr, flush=True)
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


def _peer_lost(e: Exception) -> bool:
    """Whether ``e`` is a collective failing because another rank went away.

    NCCL raises DistBackendError; gloo raises a plain RuntimeError naming its transport.
    """
    text = str(e)
    return isinstance(e, dist.DistBackendError) or (
        isinstance(e, RuntimeError) and "gloo" in text and ("Connection closed" in text or "Connection reset" in text))
