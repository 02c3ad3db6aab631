"""Run a function on gloo ranks for tests, with a hard timeout (never a hang).

Example::

    def body(rank, world, queue):
        ...                          # torch.distributed is initialised here
        queue.put((rank, result))

    results = run_ranks(body, world_size=2)   # {rank: result}

Starting ranks is the slow part of a parity test (each spawned process imports torch,
torch-mlir and autosp, and joins a gloo group), so with ``AUTOSP_RANK_POOL=1`` (the test
suite's conftest sets it) ``run_ranks`` keeps a pool of rank processes per
``(world_size, collective_timeout)`` and runs each body there:

- the default process group is initialised once per pool; a body may create sub-groups
  and device meshes as usual (they stay, as they would for a long-running job);
- the globals of ``autosp.*`` modules are restored after each body: names a body
  rebinds (negative controls patch collectives) and the contents of module-level
  dicts, lists and sets (a pass a body adds to a registry), so the next body starts
  from the same state (autosp's modules are imported when the ranks start, so the
  snapshot covers them). Runtime state needs none of it: a compiled module's group
  names go with the module (:mod:`autosp.runtime.context`), and a body that registers a
  name itself unregisters it;
- a body that fails on any rank, a rank that dies, or a call that runs past ``timeout``
  tears the whole pool down (other ranks may be blocked in a collective): the error is
  raised and the next call starts a fresh pool;
- pooled ranks are forked from a server process that imported torch, autosp and
  transformers once, so a new pool starts in a fraction of a second;
- ``fresh=True`` runs the body on ranks spawned for this call only: for bodies that
  patch code other modules have already bound (negative controls), or measure a cold
  start. Without ``AUTOSP_RANK_POOL=1`` every call is fresh, so benchmark scripts
  (compile times, memory peaks, process-wide patches) measure new processes.

Results travel over one pipe per rank that the caller reads while the ranks run, so a
large result never blocks a rank, and tensors in results are received before the rank
that sent them exits.
"""
from __future__ import annotations

import atexit
import importlib
import os
import pkgutil
import socket
import sys
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp

POOL_ENV = "AUTOSP_RANK_POOL"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _RankQueue:
    """What a body sees as ``queue``: ``put`` sends the item to the caller at once."""

    def __init__(self, conn):
        self._conn = conn

    def put(self, item) -> None:
        self._conn.send(("put", item))


def _import_autosp() -> None:
    """Import autosp's modules (not its scripts or autosp.testing) before the first body.

    A module first imported inside a body could not be put back as it was before that
    body; imported here, every module's state is in the first snapshot. Bodies import
    these anyway (``autosp.compile``), so this moves the cost, it does not add to it.
    """
    import autosp
    for info in pkgutil.walk_packages(autosp.__path__, "autosp.", onerror=lambda name: None):
        if info.name.endswith("__main__") or info.name.startswith("autosp.testing"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - a module that cannot import fails in the body, with its error
            pass


def _autosp_modules() -> dict:
    return {name: mod for name, mod in list(sys.modules.items())
            if mod is not None and (name == "autosp" or name.startswith("autosp."))}


def _snapshot() -> dict:
    """Each autosp module's globals, with a copy of the contents of its dicts, lists and sets."""
    snap = {}
    for name, mod in _autosp_modules().items():
        snap[name] = {key: (value, _contents(value)) for key, value in vars(mod).items()
                      if not key.startswith("__")}
    return snap


def _contents(value):
    if type(value) in (dict, list, set):
        return value.copy()
    return None


def _same(value, contents) -> bool:
    """Same items, by identity (values may be tensors, whose ``==`` is elementwise)."""
    if len(value) != len(contents):
        return False
    if isinstance(value, dict):
        return all(k in contents and contents[k] is v for k, v in value.items())
    if isinstance(value, list):
        return all(a is b for a, b in zip(value, contents))
    return value == contents  # a set: its items are hashable, compared by hash first


def _restore(snapshot: dict) -> None:
    """Put every module global back as it was before the body.

    Rebound names (``collectives.shard = ...``) get their old object; module-level
    registries filled by the body (a pass added to ``PASSES``) get their old contents, so
    nothing a body registered is seen by the next body.
    """
    for name, saved in snapshot.items():
        mod = sys.modules.get(name)
        if mod is None:
            continue
        current = vars(mod)
        for key, (value, contents) in saved.items():
            if current.get(key, _MISSING) is not value:
                current[key] = value
            if contents is not None and not _same(value, contents):
                value.clear()
                value.update(contents) if isinstance(value, (dict, set)) else value.extend(contents)


_MISSING = object()


def _reset_process_state() -> None:
    """Settings a body may change that the next body should not inherit."""
    torch.set_num_threads(1)
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)


def _rank_main(rank: int, world: int, port: int, conn, collective_timeout: float, pooled: bool) -> None:
    """A rank process: join the gloo group, then run bodies sent by the caller until told to stop."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _reset_process_state()
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=collective_timeout))
        if pooled:  # only a reused rank needs its modules' state before the first body
            _import_autosp()
        conn.send(("ready", None))
        queue = _RankQueue(conn)
        while True:
            try:
                task = conn.recv()
            except EOFError:  # the caller is gone
                break
            if task is None:
                break
            fn, args = task
            snapshot = _snapshot()
            try:
                fn(rank, world, queue, *args)
                dist.barrier()
            finally:
                _restore(snapshot)
                _reset_process_state()
            conn.send(("done", None))
    except BaseException:
        try:
            conn.send(("error", f"rank {rank} failed:\n{traceback.format_exc()}"))
            # Stay alive until the caller tears the pool down: exiting now could make the
            # other ranks fail first (peer closed) and hide this, the original error.
            conn.recv()
        except (EOFError, OSError):
            pass
    # Skip interpreter teardown: gloo's threads occasionally abort there (SIGABRT after all
    # work is done), which would turn a passing rank into a failure. Results are already sent.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)


# Imported once by the fork server; each rank is a fork of it, so a rank starts without
# importing torch, torch-mlir, autosp and transformers again (seconds per rank otherwise).
_PRELOAD = ["torch", "torch.distributed", "autosp.api", "autosp.testing.parity", "transformers"]


def _context(pooled: bool):
    """Pooled ranks are forked from a server process that preloaded ``_PRELOAD`` (a fresh
    interpreter's state: no process group, no threads; unlike forking the caller). Ranks
    for one call (``fresh=True``) are spawned: a new interpreter, where a body can patch a
    module before anything imports it (negative controls rely on that). Spawned too where
    there is no fork server, or with ``AUTOSP_RANK_START=spawn``."""
    method = os.environ.get("AUTOSP_RANK_START", "forkserver")
    if pooled and method == "forkserver" and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return mp.get_context("spawn")


class _Pool:
    """``world`` rank processes in one gloo group, each with a duplex pipe to the caller."""

    def __init__(self, world: int, collective_timeout: float, deadline: float, pooled: bool = True):
        self.world = world
        ctx = _context(pooled)
        port = _free_port()
        self.procs: list = []
        self.conns: list = []
        for rank in range(world):
            parent, child = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_rank_main, args=(rank, world, port, child, collective_timeout, pooled),
                            name=f"autosp-rank-{rank}")
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        try:
            self._collect("ready", deadline, results=None)
        except BaseException:
            self.close()
            raise

    def run(self, fn, args: tuple, deadline: float) -> dict:
        for conn in self.conns:
            conn.send((fn, args))
        results: dict = {}
        self._collect("done", deadline, results)
        return results

    def _collect(self, kind: str, deadline: float, results: dict | None) -> None:
        """Read every rank's messages until each has sent ``kind``; raise on error or timeout."""
        pending = set(range(self.world))
        by_conn = {conn: rank for rank, conn in enumerate(self.conns)}
        by_sentinel = {p.sentinel: rank for rank, p in enumerate(self.procs)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                what = "start" if kind == "ready" else "finish"
                raise RuntimeError(f"ranks {sorted(pending)} did not {what} within the timeout")
            ready = wait([self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending],
                         timeout=min(left, 5.0))
            # Messages first: a rank that sent its error and then died is reported by its error.
            for obj in sorted(ready, key=lambda o: o not in by_conn):
                if obj in by_conn:
                    rank = by_conn[obj]
                    try:
                        msg, value = self.conns[rank].recv()
                    except (EOFError, OSError):
                        raise RuntimeError(f"rank {rank} exited without a result "
                                           f"(exit code {self.procs[rank].exitcode})") from None
                    if msg == "error":
                        dead = self._died_silently(rank, pending)
                        if dead is not None:  # the cause: the others' errors follow from it
                            raise RuntimeError(f"rank {dead} died (exit code {self.procs[dead].exitcode}); "
                                               f"then {value}")
                        raise RuntimeError(value)
                    if msg == "put":
                        r, item = value
                        if isinstance(item, BaseException):
                            raise item
                        if results is not None:
                            results[r] = item
                    elif msg == kind:
                        pending.discard(rank)
                elif by_sentinel[obj] in pending and not self.conns[by_sentinel[obj]].poll():
                    rank = by_sentinel[obj]
                    raise RuntimeError(f"rank {rank} died (exit code {self.procs[rank].exitcode})")

    def _died_silently(self, failed: int, pending: set, grace: float = 1.0) -> int | None:
        """A rank other than ``failed`` that exited without a message (within ``grace``
        seconds): when one rank dies, the others' collectives fail with connection errors
        that say nothing about why, and may arrive first."""
        end = time.monotonic() + grace
        while True:
            for r in sorted(pending - {failed}):
                if not self.procs[r].is_alive() and not self.conns[r].poll():
                    return r
            if time.monotonic() >= end:
                return None
            time.sleep(0.05)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self) -> None:
        """Stop every rank: ask politely, then terminate, then kill (never waits long)."""
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        end = time.monotonic() + 1.0
        for p in self.procs:
            p.join(timeout=max(0.0, end - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        for conn in self.conns:
            conn.close()


_POOLS: dict[tuple[int, float], _Pool] = {}


def shutdown_pools() -> None:
    """Stop every pooled rank process (also run at interpreter exit)."""
    while _POOLS:
        _POOLS.popitem()[1].close()


atexit.register(shutdown_pools)


def run_ranks(fn, world_size: int = 2, args: tuple = (), timeout: float = 180.0,
              collective_timeout: float = 60.0, fresh: bool | None = None) -> dict:
    """Run ``fn(rank, world, queue, *args)`` on ``world_size`` gloo ranks; collect queue items.

    ``fn`` must be picklable (module level). Each rank may ``queue.put((rank, value))``;
    the result is ``{rank: value}``. Raises RuntimeError with the failing rank's
    traceback, or when the ranks do not finish within ``timeout`` seconds (including
    start-up). Ranks are reused across calls when ``$AUTOSP_RANK_POOL`` is 1 (see the
    module docstring), unless ``fresh=True``.
    """
    if fresh is None:
        fresh = os.environ.get(POOL_ENV, "0") in ("", "0")
    deadline = time.monotonic() + timeout
    key = (world_size, float(collective_timeout))
    pool = None if fresh else _POOLS.pop(key, None)
    if pool is not None and not pool.alive():
        pool.close()
        pool = None
    if pool is None:
        pool = _Pool(world_size, collective_timeout, deadline, pooled=not fresh)
    try:
        results = pool.run(fn, tuple(args), deadline)
    except BaseException:
        pool.close()  # ranks may be blocked in a collective: never reuse them
        raise
    try:
        results = dict(sorted(results.items()))  # rank order, not arrival order
    except TypeError:  # keys that are not all ranks
        pass
    if fresh:
        pool.close()
    else:
        _POOLS[key] = pool
    return results
