"""Spawn gloo ranks for tests, with a hard timeout (a failing rank never hangs the suite).

Example::

    def body(rank, world, queue):
        ...                          # torch.distributed is initialised here
        queue.put((rank, result))

    results = run_ranks(body, world_size=2)   # {rank: result}
"""
from __future__ import annotations

import os
import socket
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, queue, args, collective_timeout):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=collective_timeout))
        fn(rank, world, queue, *args)
        dist.barrier()
    except BaseException:
        queue.put((rank, RuntimeError(f"rank {rank} failed:\n{traceback.format_exc()}")))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Skip interpreter teardown: gloo's threads occasionally abort there (SIGABRT after all
    # work is done), which would turn a passing rank into a failure. Results are already sent.
    import sys
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)


def run_ranks(fn, world_size: int = 2, args: tuple = (), timeout: float = 180.0,
              collective_timeout: float = 60.0) -> dict:
    """Run ``fn(rank, world, queue, *args)`` on ``world_size`` gloo ranks; collect queue items.

    ``fn`` must be picklable (module level). Each rank may ``queue.put((rank, value))``.
    Raises RuntimeError with the failing rank's traceback, or on timeout.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = mp.start_processes(_entry, args=(world_size, _free_port(), fn, queue, args, collective_timeout),
                               nprocs=world_size, join=False, start_method="spawn")
    import time
    deadline = time.monotonic() + timeout
    try:
        while not procs.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks did not finish within {timeout:.0f}s")
    except mp.ProcessRaisedException as e:
        results = _drain(queue)
        errors = [v for v in results.values() if isinstance(v, Exception)]
        raise RuntimeError(str(errors[0]) if errors else str(e)) from None
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.terminate()
    results = _drain(queue)
    errors = [v for v in results.values() if isinstance(v, Exception)]
    if errors:
        raise errors[0]
    return results


def _drain(queue) -> dict:
    out = {}
    while not queue.empty():
        rank, value = queue.get()
        out.setdefault(rank, value) if isinstance(value, Exception) else out.__setitem__(rank, value)
    return out
