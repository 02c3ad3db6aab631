"""``autosp.compile``: the user-facing entry point.

Example::

    >>> model = autosp.compile(model)                 # under torchrun, or alone (sp_size=1)
    >>> loss = model(input_ids=ids, labels=labels)["loss"]
    >>> loss.backward()                               # .grad lands on the user's Parameters

Compilation happens at the first call: export and import (frontend), the pass pipeline
(``autosp-sp-pipeline`` when ``sp_size > 1``), and emission to a GraphModule (backend).
Calls whose inputs have another structure, dtype or non-sequence shape compile again;
another sequence length does not (the sequence dimension is symbolic).
"""
from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from autosp.backend.fx_emitter import emit_graph_module
from autosp.backend.checkpointing import checkpointed_module, has_plan
from autosp.backend.module import CompiledProgram
from autosp.frontend.importer import import_model
from autosp.ir.diagnostics import AutospError
from autosp.pipeline import PipelineOptions, run_pipeline
from autosp.runtime import collectives
from autosp.runtime.grad_sync import GradientSync

ROUND_TRIP_PIPELINE = "builtin.module(autosp-dce)"
CHECKPOINTING = ("off", "sac", "sac-min", "full")


def _sequence_parallel_group(sp_size: int, group):
    """``(sp_group, mesh)``: the process group of this rank's sequence-parallel ranks, and
    the (dp, sp) ``DeviceMesh`` when the world is larger than one group (``None`` else).
    With an explicit ``group`` that group is used and no mesh is built."""
    if group is not None:
        return group, None
    world = dist.get_world_size()
    if world == sp_size:
        return None, None
    from torch.distributed.device_mesh import init_device_mesh
    device = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device, (world // sp_size, sp_size), mesh_dim_names=("dp", "sp"))
    return mesh["sp"].get_group(), mesh


def _resolve_sp_size(sp_size: int | None, group) -> int:
    world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    if sp_size is None:
        return world
    if sp_size < 1:
        raise AutospError(f"sp_size must be >= 1, got {sp_size}")
    if sp_size > 1 and world % sp_size:
        raise AutospError(f"sp_size={sp_size} does not divide the number of ranks ({world})")
    return sp_size


def build_program(model: torch.nn.Module, args, kwargs, *, sp_size: int, seq_dim: int = 1,
                  gather_outputs: bool = False, pipeline: str | None = None, dump_dir: str | None = None,
                  verbose: bool = False, backend: str | None = None, checkpointing: str = "off") -> CompiledProgram:
    """Export ``model`` on these example inputs, run the pass pipeline for ``sp_size`` ranks
    (plus ``autosp-checkpoint`` unless ``checkpointing="off"``) and emit the program.
    Needs no process group: the program looks its group up when it runs."""
    start = time.perf_counter()
    imported = import_model(model, *args, seq_dim=seq_dim, **kwargs)
    mlir = {"imported": str(imported.module)}
    t0 = time.perf_counter()
    pipeline = pipeline or (ROUND_TRIP_PIPELINE if sp_size == 1 else
                            f"builtin.module(autosp-sp-pipeline{{sp-size={sp_size} "
                            f"gather-outputs={str(gather_outputs).lower()}}})")
    run_pipeline(imported.module, pipeline, PipelineOptions(dump_dir=dump_dir))
    if checkpointing != "off":
        run_pipeline(imported.module, f"builtin.module(autosp-checkpoint{{mode={checkpointing}}})",
                     PipelineOptions(dump_dir=dump_dir))
    t_pipeline = time.perf_counter() - t0
    mlir["transformed"] = str(imported.module)
    t0 = time.perf_counter()
    gm = emit_graph_module(imported.module)
    t_emit = time.perf_counter() - t0
    timings = dict(imported.timings, pipeline_s=t_pipeline, emit_s=t_emit,
                   total_s=time.perf_counter() - start)
    if verbose:
        print(f"[autosp] compiled in {timings['total_s']:.2f}s (export {timings['export_s']:.2f}s, "
              f"import {timings['import_s']:.2f}s, passes {t_pipeline:.2f}s, emit {t_emit:.3f}s)",
              file=sys.stderr)
    program = CompiledProgram(gm, imported.args, imported.out_spec, imported.tensor_leaves, mlir, timings,
                              checkpointing=checkpointing)
    compile_ = None
    if backend is not None:
        # torch.compile the emitted module (e.g. Inductor); sizes stay symbolic.
        def compile_(g):
            return torch.compile(g, backend=backend, dynamic=True, fullgraph=True)
    if has_plan(gm):
        # Checkpointed: segments recomputed in backward (compiled one by one with a backend).
        program.runner = checkpointed_module(gm, compile_segment=compile_)
    elif compile_ is not None:
        program.runner = compile_(gm)
    return program


class AutospModule(torch.nn.Module):
    """Wraps the user's model; compiles it per input signature at the first call.

    ``self.module`` is the user's model, so ``parameters()``/``state_dict()`` are the
    user's own tensors (prefixed ``module.``).
    """

    def __init__(self, model: torch.nn.Module, sp_size: int | None = None, group=None, seq_dim: int = 1,
                 gather_outputs: bool = False, pipeline: str | None = None, dump_dir: str | None = None,
                 verbose: bool = False, backend: str | None = None, sync_data_parallel: bool = True,
                 checkpointing: str = "off"):
        super().__init__()
        self.module = model
        self.sp_size = _resolve_sp_size(sp_size, group)
        self.group = group
        self.seq_dim = seq_dim
        self.gather_outputs = gather_outputs
        self.pipeline = pipeline
        self.dump_dir = dump_dir
        self.verbose = verbose
        self.backend = backend
        if checkpointing not in CHECKPOINTING:
            raise AutospError(f"checkpointing must be one of {', '.join(map(repr, CHECKPOINTING))}, "
                              f"got {checkpointing!r}")
        self.checkpointing = checkpointing
        self._programs: dict[object, CompiledProgram] = {}
        self.group_name = "sp"
        self.grad_sync = None
        self.mesh = None
        if self.sp_size > 1:
            sp_group, self.mesh = _sequence_parallel_group(self.sp_size, group)
            collectives.register_group(self.group_name, sp_group)
            if self.mesh is None or not sync_data_parallel:
                # Sum over the sequence-parallel ranks only (data parallelism, if any, is
                # the caller's: e.g. DDP over self.mesh["dp"]).
                self.grad_sync = GradientSync(model.parameters(), self.group_name)
            else:
                # DP x SP: sum over the sequence-parallel ranks, average over the replicas,
                # in one all-reduce over the whole mesh.
                collectives.register_group("dp_sp", None)
                dp = self.mesh["dp"].size()
                self.grad_sync = GradientSync(model.parameters(), "dp_sp", scale=1.0 / dp)

    # ------------------------------------------------------------------ compilation
    def _signature(self, leaves, spec):
        parts = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                shape = tuple(None if (d == self.seq_dim and leaf.dim() > self.seq_dim) else s
                              for d, s in enumerate(leaf.shape))
                parts.append(("T", leaf.dtype, leaf.device, shape))
            else:
                parts.append(("C", repr(leaf)))
        return spec, tuple(parts)

    def compile_for(self, *args, **kwargs) -> CompiledProgram:
        """Compile (or fetch from the cache) the program for this call's signature."""
        leaves, spec = pytree.tree_flatten((args, kwargs))
        key = self._signature(leaves, spec)
        program = self._programs.get(key)
        if program is None:
            program = self._compile(args, kwargs)
            self._programs[key] = program
        return program

    def _compile(self, args, kwargs) -> CompiledProgram:
        return build_program(self.module, args, kwargs, sp_size=self.sp_size, seq_dim=self.seq_dim,
                             gather_outputs=self.gather_outputs, pipeline=self.pipeline, dump_dir=self.dump_dir,
                             verbose=self.verbose, backend=self.backend, checkpointing=self.checkpointing)

    # ------------------------------------------------------------------ calling
    def forward(self, *args, **kwargs):
        program = self.compile_for(*args, **kwargs)
        leaves, _ = pytree.tree_flatten((args, kwargs))
        return program(self.module, leaves)

    @property
    def programs(self) -> list[CompiledProgram]:
        """The programs compiled so far (one per input signature)."""
        return list(self._programs.values())


def compile(model: torch.nn.Module, sp_size: int | None = None, group=None, seq_dim: int = 1,
            gather_outputs: bool = False, **options) -> AutospModule:
    """Make ``model`` sequence-parallel over ``sp_size`` ranks (see docs/DESIGN.md §2).

    Call it on every rank of an initialised torch.distributed job; every rank then calls
    the returned module with the same full-sequence inputs. ``sp_size`` defaults to the
    size of ``group`` (or the world; 1 without torch.distributed); a world larger than
    ``sp_size`` is split into consecutive sequence-parallel groups (data-parallel
    replicas). ``seq_dim`` is the inputs' sequence dimension. A scalar loss computed in the
    model is the global loss on every rank; sequence-aligned outputs are this rank's shard,
    or the full tensor with ``gather_outputs=True``. After ``backward()`` every parameter's
    ``.grad`` is the single-device gradient (summed over the group, bucketed). Collectives
    use the process group's timeout. Options: ``pipeline`` (a custom pass pipeline),
    ``dump_dir`` (IR after every pass), ``verbose`` (compile timings), ``backend`` (a
    ``torch.compile`` backend such as ``"inductor"`` for the emitted module, compiled as one
    graph), ``sync_data_parallel`` (default True: with a world larger than ``sp_size``,
    autosp also averages gradients over the data-parallel replicas; pass False when wrapping
    the module in ``DistributedDataParallel(module, process_group=module.mesh["dp"].get_group())``,
    which then does it), ``checkpointing`` (``"off"``; ``"sac"``: sequence-aware, keep attention and its
    collectives, recompute the rest of each layer in backward; ``"sac-min"``: keep only
    each layer's input and attention's output, recompute the rest including q/k/v and their
    all-to-alls, never attention itself; ``"full"``: keep only each layer's input and
    recompute the whole layer; see docs/user_guide.md). ``sp_size=1`` is an exact round trip.

    Example::

        dist.init_process_group("gloo")
        model = autosp.compile(model)
        loss = model(ids, labels=labels)["loss"]
        loss.backward()
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"autosp.compile expects an nn.Module, got {type(model).__name__}")
    return AutospModule(model, sp_size=sp_size, group=group, seq_dim=seq_dim, gather_outputs=gather_outputs,
                        **options)
