"""The import cache: torch-dialect imports by exported program.

A compilation is mostly tracing: torch.export, then the decomposition's retrace (about
1.5 s + 2.6 s for a tiny 2-layer Llama on one core, against 0.1 s of passes). The same
exported program is often imported again: a policy and a reference model of one
architecture, another ``sp_size`` or checkpointing mode, a memory estimate, the next run
of a job. So imports are kept by :func:`program_key`, a digest of everything the
decomposition and the import read, in memory (the last ``MEMORY_ENTRIES``) and, when the
``AUTOSP_CACHE_DIR`` environment variable names a folder, on disk as MLIR bytecode (source
locations kept), shared by every process that uses that folder.

Example::

    >>> key = program_key(exported, table)
    >>> module = lookup(key, context)          # a fresh copy, or None
    >>> store(key, module)                      # after a real import
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import tempfile
from collections import OrderedDict
from pathlib import Path

import torch
from torch_mlir import ir

from autosp.ir.core import make_context

CACHE_DIR_ENV = "AUTOSP_CACHE_DIR"
MEMORY_ENTRIES = 8
_MEMORY: OrderedDict[str, ir.Operation] = OrderedDict()
_TOOLCHAIN: str | None = None


def _toolchain() -> str:
    """torch's and torch-mlir's versions and the frontend's own source: what else decides
    an import (a new version or an edited importer never reads an old entry)."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        h = hashlib.sha256()
        h.update(torch.__version__.encode())
        try:
            h.update(importlib.metadata.version("torch-mlir").encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(b"torch-mlir ?")
        for source in sorted(Path(__file__).parent.glob("*.py")):
            h.update(source.read_bytes())
        _TOOLCHAIN = h.hexdigest()
    return _TOOLCHAIN


def program_key(program: torch.export.ExportedProgram, table: dict, legal_ops: tuple[str, ...]) -> str:
    """A digest of everything the decomposition and the import read: the toolchain, the
    decomposition table's ops and the ops kept legal, and from ``program`` the graph's code,
    each node's source location (it becomes the op's MLIR location), each placeholder's
    shape, strides, dtype and device (symbolic sizes by name), the symbols' ranges, the
    signature, the output structure and the lifted constants (values, or shape and dtype
    for meta tensors). Two programs with one key import to the same MLIR."""
    h = hashlib.sha256()

    def put(x: object) -> None:
        h.update(str(x).encode())
        h.update(b"\0")

    put(_toolchain())
    put(sorted(map(str, table)))
    put(legal_ops)
    put(program.graph_module.code)
    for node in program.graph.nodes:
        put(node.meta.get("stack_trace"))
        val = node.meta.get("val")
        if node.op == "placeholder":
            if isinstance(val, torch.Tensor):
                put((tuple(map(str, val.shape)), tuple(map(str, val.stride())), val.dtype, val.device))
            else:
                put(repr(val))
    put(sorted((str(k), str(v)) for k, v in program.range_constraints.items()))
    put(program.graph_signature)
    put(program.call_spec)
    for name, const in sorted(program.constants.items()):
        put(name)
        if isinstance(const, torch.Tensor):
            put((const.dtype, tuple(const.shape), const.device))
            if const.device.type != "meta":
                h.update(const.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        else:
            put(repr(const))
    return h.hexdigest()


def cache_dir() -> Path | None:
    """The on-disk cache folder (``$AUTOSP_CACHE_DIR``), or None."""
    folder = os.environ.get(CACHE_DIR_ENV)
    return Path(folder) if folder else None


def _bytecode(module: ir.Operation) -> bytes:
    buffer = io.BytesIO()
    module.write_bytecode(buffer)  # keeps the source locations
    return buffer.getvalue()


def _parse(data: bytes, context: ir.Context | None) -> ir.Operation:
    with context or make_context():
        return ir.Module.parse(data).operation


def _remember(key: str, module: ir.Operation) -> None:
    _MEMORY[key] = module
    _MEMORY.move_to_end(key)
    while len(_MEMORY) > MEMORY_ENTRIES:
        _MEMORY.popitem(last=False)


def lookup(key: str, context: ir.Context | None = None) -> tuple[ir.Operation, str] | None:
    """``(module, where)``: a fresh copy of the import under ``key`` in ``context`` (a new
    context if None) and where it came from, ``"memory"`` or ``"disk"``; None on a miss.
    An unreadable disk entry is a miss."""
    cached = _MEMORY.get(key)
    if cached is not None:
        _MEMORY.move_to_end(key)
        if context is None or context is cached.context:
            return cached.clone(), "memory"
        return _parse(_bytecode(cached), context), "memory"
    folder = cache_dir()
    path = folder / f"{key}.mlirbc" if folder else None
    if path is None or not path.is_file():
        return None
    try:
        module = _parse(path.read_bytes(), context)
    except (OSError, ir.MLIRError):
        return None
    _remember(key, module.clone())
    return module, "disk"


def store(key: str, module: ir.Operation) -> None:
    """Keep a copy of ``module`` (as imported, before any pass) under ``key``; on disk too
    when a cache folder is set (written whole, then renamed: readers never see half)."""
    _remember(key, module.clone())
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(_bytecode(module))
        os.replace(tmp, folder / f"{key}.mlirbc")
    except OSError:
        pass  # a read-only or full disk costs the next process an import, nothing more


def clear_memory() -> None:
    """Forget the in-memory entries (the disk folder is the user's)."""
    _MEMORY.clear()
