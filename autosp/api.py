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

import inspect
import io
import os
import itertools
import pickle  # programs travel between the ranks of one group
import re
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree
from torch_mlir import ir

from autosp.backend.fx_emitter import _MLIR_TO_TORCH_DTYPE, emit_graph_module
from autosp.backend.checkpointing import checkpointed_module, has_plan
from autosp.backend.module import CompiledProgram
from autosp.frontend.importer import ArgInfo, import_model, input_paths, prepare_input, read_arguments
from autosp.ir.contract import PREFIX, SP_CHOICE_ATTR, SP_LAYOUT_ATTR
from autosp.ir.core import as_operation, body_ops, funcs, make_context, op_name
from autosp.inputs import check_inputs_agree
from autosp.ir.diagnostics import AutospError
from autosp.passes.checkpoint import MODES as CHECKPOINT_MODES
from autosp.pipeline import PipelineOptions, run_pipeline
from autosp.plan import MemoryPlan
from autosp.runtime import collectives, fsdp
from autosp.runtime.grad_sync import GradientSync, insert_sync_points, plan_buckets

# The shortest sequence a call may have (torch.export specialises sizes 0 and 1; a causal
# LM's shifted labels hold S - 1 positions).
MIN_SEQ_LEN = 3

# "off" plus the modes of the autosp-checkpoint pass, which defines them.
CHECKPOINTING = ("off", *CHECKPOINT_MODES)


def _accepts(model: torch.nn.Module, name: str) -> bool:
    """Does ``model``'s forward take the keyword ``name``?"""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params


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


def _check_launch(sp_size: int | None, group) -> None:
    """Launch mistakes that would otherwise run every rank alone, without a word."""
    if group is not None or (dist.is_available() and dist.is_initialized()):
        return
    world = os.environ.get("WORLD_SIZE", "1")
    if world.isdigit() and int(world) > 1:
        raise AutospError(f"WORLD_SIZE={world} is set (a torchrun job?) but torch.distributed is not initialised: "
                          "call torch.distributed.init_process_group() on every rank before autosp.compile "
                          "(or run without WORLD_SIZE for one device)")
    if sp_size is not None and sp_size > 1:
        raise AutospError(f"sp_size={sp_size} needs torch.distributed: launch {sp_size} ranks (torchrun "
                          f"--nproc-per-node {sp_size} ...) and call torch.distributed.init_process_group() "
                          "before autosp.compile")


def _resolve_sp_size(sp_size: int | None, group) -> int:
    world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    if sp_size is None:
        return world
    if sp_size < 1:
        raise AutospError(f"sp_size must be >= 1, got {sp_size}")
    if sp_size > 1 and world % sp_size:
        raise AutospError(f"sp_size={sp_size} does not divide the number of ranks ({world})")
    return sp_size


@dataclass
class Transformed:
    """A model after the frontend and the pass pipeline: everything :func:`emit_program`
    needs, and nothing that belongs to one rank (so one rank can compile for its group)."""
    module: ir.Operation  # the transformed builtin.module
    args: list[ArgInfo]
    out_spec: object
    tensor_leaves: list[int]
    mlir: dict[str, str]
    timings: dict[str, float]

    def to_bytes(self) -> bytes:
        """The program as bytes (MLIR bytecode, with source locations, plus its metadata)."""
        buffer = io.BytesIO()
        self.module.write_bytecode(buffer)
        return pickle.dumps((buffer.getvalue(), self.args, self.out_spec, self.tensor_leaves, self.mlir,
                             self.timings))

    @staticmethod
    def from_bytes(data: bytes) -> "Transformed":
        with warnings.catch_warnings():  # torch's own pytree specs, unpickled (LeafSpec's deprecation)
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            code, args, out_spec, tensor_leaves, mlir, timings = pickle.loads(data)  # sent by the group's first rank
        with make_context():
            module = ir.Module.parse(code).operation
        return Transformed(module, args, out_spec, tensor_leaves, mlir, timings)


def mesh_options(strategy: str = "ulysses", ulysses_degree: int | None = None, ring_degree: int | None = None,
                 ranks_per_node: int | None = None, seq_len: int | None = None) -> str:
    """The ``autosp-sp-pipeline`` options that choose the Ulysses x ring mesh."""
    return (f"strategy={strategy} ulysses-degree={ulysses_degree or 0} ring-degree={ring_degree or 0} "
            f"ranks-per-node={ranks_per_node or 0} seq-len={seq_len or 0}")


def _seq_len(args, kwargs, seq_dim: int) -> int | None:
    """The example call's sequence length: the first tensor input's size at ``seq_dim``."""
    return next((x.shape[seq_dim] for x in pytree.tree_leaves((args, kwargs))
                 if isinstance(x, torch.Tensor) and x.dim() > seq_dim), None)


def transform(model: torch.nn.Module, args, kwargs, *, sp_size: int, seq_dim: int = 1,
              gather_outputs: bool = False, pipeline: str | None = None, dump_dir: str | None = None,
              checkpointing: str = "off", group_name: str = "sp", plan: MemoryPlan | None = None,
              mesh: dict | None = None) -> Transformed:
    """Export ``model`` on these example inputs and run the pass pipeline for ``sp_size``
    ranks, then the memory passes: ``plan``'s (:meth:`MemoryPlan.pipeline`), or
    ``autosp-checkpoint`` unless ``checkpointing="off"``. The result is the same on every
    rank: collectives name their group ``group_name`` and find their rank at run time.
    ``mesh``: :func:`mesh_options`' arguments (default: Ulysses)."""
    start = time.perf_counter()
    imported = import_model(model, *args, seq_dim=seq_dim, **kwargs)
    mlir = {"imported": str(imported.module)}
    t0 = time.perf_counter()
    options = mesh_options(**{"seq_len": _seq_len(args, kwargs, seq_dim), **(mesh or {})})
    pipeline = pipeline or (f"builtin.module(autosp-sp-pipeline{{sp-size={sp_size} group={group_name} "
                            f"gather-outputs={str(gather_outputs).lower()} {options}}})")  # (sp-size=1: fuse-gqa, dce)
    run_pipeline(imported.module, pipeline, PipelineOptions(dump_dir=dump_dir))
    memory = plan.pipeline() if plan is not None else (
        f"builtin.module(autosp-checkpoint{{mode={checkpointing}}})" if checkpointing != "off" else None)
    if memory is not None:
        run_pipeline(imported.module, memory, PipelineOptions(dump_dir=dump_dir))
    bind_group(imported.module, group_name)
    mlir["transformed"] = str(imported.module)
    timings = dict(imported.timings, pipeline_s=time.perf_counter() - t0, transform_s=time.perf_counter() - start)
    return Transformed(imported.module, imported.args, imported.out_spec, imported.tensor_leaves, mlir, timings)


def bind_group(module: ir.Operation, group_name: str) -> int:
    """Name ``group_name`` on every ``autosp.*`` collective of ``module``: a compiled module
    has one group, whatever group a custom pipeline's passes wrote (their default is
    ``"sp"``), so no program of one module resolves another module's group. Returns how
    many ops were renamed."""
    renamed = 0
    with module.context:
        for func in funcs(module):
            for op in body_ops(func):
                if op_name(op).startswith(PREFIX) and "group" in op.attributes:
                    _, sep, axis = ir.StringAttr(op.attributes["group"]).value.partition(":")
                    name = ir.StringAttr.get(group_name + sep + axis)  # sub-groups keep their axis
                    if op.attributes["group"] != name:
                        op.attributes["group"] = name
                        renamed += 1
    return renamed


def module_layout(module) -> "collectives.SeqLayout | None":
    """The sequence layout ``autosp-partition-attention`` chose (None: none recorded)."""
    attrs = as_operation(module).attributes
    if SP_LAYOUT_ATTR not in attrs:
        return None
    return collectives.SeqLayout.parse(ir.StringAttr(attrs[SP_LAYOUT_ATTR]).value)


def module_choice(module) -> str | None:
    """Why the partition pass chose its mesh (``autosp.sp_choice``), if it recorded it."""
    attrs = as_operation(module).attributes
    return ir.StringAttr(attrs[SP_CHOICE_ATTR]).value if SP_CHOICE_ATTR in attrs else None


def emit_program(model: torch.nn.Module, transformed: Transformed, *, verbose: bool = False,
                 backend: str | None = None, checkpointing: str = "off",
                 grad_bucket_bytes: int = 25 << 20) -> CompiledProgram:
    """Emit a transformed program as a GraphModule this rank calls. The parameters are
    bucketed for gradient synchronisation (``grad_bucket_bytes``, in reverse order of first
    use) and a sync point is put before each bucket's first use."""
    t0 = time.perf_counter()
    gm = emit_graph_module(transformed.module)
    t_emit = time.perf_counter() - t0
    timings = dict(transformed.timings, emit_s=t_emit)
    timings["total_s"] = timings.get("transform_s", 0.0) + t_emit
    if verbose:
        shared = " (received from the group's first rank)" if timings.get("received") else ""
        print(f"[autosp] compiled in {timings['total_s']:.2f}s (export {timings['export_s']:.2f}s, "
              f"import {timings['import_s']:.2f}s{' cached' if timings.get('import_cached') else ''}, "
              f"passes {timings['pipeline_s']:.2f}s, emit {t_emit:.3f}s){shared}", file=sys.stderr)
    params = dict(model.named_parameters())
    # FSDP2 parameters are reduce-scattered by their gather's backward, not bucketed.
    sizes = {i: params[a.name].numel() * params[a.name].element_size() for i, a in enumerate(transformed.args)
             if a.kind == "parameter" and params[a.name].requires_grad and not fsdp.is_sharded(params[a.name])}
    buckets = plan_buckets(gm, sizes, grad_bucket_bytes)
    planned = has_plan(gm)
    # Sync points in the graph start each bucket's all-reduce as soon as backward completes
    # it. Not under a whole-graph torch.compile (fullgraph=True would have to trace the
    # collective): there the all-reduces start when the model's backward is done.
    in_graph = backend is None or planned
    if in_graph:
        insert_sync_points(gm, buckets)
    # FSDP2 parameters: one unshard point per fully_shard-ed module, before its first use
    # (not under a whole-graph torch.compile: there the call gathers them all).
    unshard_groups: list[list[int]] = []
    if in_graph and any(fsdp.is_sharded(p) for p in params.values()):
        index = {a.name: i for i, a in enumerate(transformed.args) if a.kind == "parameter"}
        groups = [[index[n] for n in names if n in index] for names in fsdp.param_groups(model)]
        unshard_groups = fsdp.insert_unshard_points(gm, [g for g in groups if g])
    program = CompiledProgram(gm, transformed.args, transformed.out_spec, transformed.tensor_leaves,
                              transformed.mlir, timings, checkpointing=checkpointing, grad_buckets=buckets,
                              sync_points_in_graph=in_graph, unshard_groups=unshard_groups,
                              dropped_outputs=dropped_results(transformed.module))
    compile_ = None
    if backend is not None:
        # torch.compile the emitted module (e.g. Inductor); sizes stay symbolic.
        def compile_(g):
            return torch.compile(g, backend=backend, dynamic=True, fullgraph=True)
    if planned:
        # Checkpointed: segments recomputed in backward (compiled one by one with a backend).
        program.runner = checkpointed_module(gm, compile_segment=compile_)
    elif compile_ is not None:
        program.runner = compile_(gm)
    if unshard_groups:
        program.unshard_order = fsdp.call_order(program.runner if program.runner is not None else gm)
    return program


def dropped_results(module) -> list[int]:
    """The results ``autosp-tile-loss{drop-logits}`` removed from ``@main`` (the logits)."""
    from autosp.ir.contract import DROPPED_ATTR
    from autosp.ir.core import main_func
    func = main_func(module)
    return [ir.IntegerAttr(a).value for a in func.attributes[DROPPED_ATTR]] if DROPPED_ATTR in func.attributes else []


def build_program(model: torch.nn.Module, args, kwargs, *, sp_size: int, seq_dim: int = 1,
                  gather_outputs: bool = False, pipeline: str | None = None, dump_dir: str | None = None,
                  verbose: bool = False, backend: str | None = None, checkpointing: str = "off",
                  group_name: str = "sp", grad_bucket_bytes: int = 25 << 20,
                  plan: MemoryPlan | None = None) -> CompiledProgram:
    """:func:`transform` then :func:`emit_program`, on this rank alone. Needs no process
    group: the program's collectives name their group ``group_name``, bound to a process
    group with ``collectives.register_group`` before the program runs."""
    transformed = transform(model, args, kwargs, sp_size=sp_size, seq_dim=seq_dim, gather_outputs=gather_outputs,
                            pipeline=pipeline, dump_dir=dump_dir, checkpointing=checkpointing,
                            group_name=group_name, plan=plan)
    return emit_program(model, transformed, verbose=verbose, backend=backend, checkpointing=checkpointing,
                        grad_bucket_bytes=grad_bucket_bytes)


def kept_masks(module, seq_len: int) -> list[str]:
    """One line per attention mask the compiler kept materialised (``autosp.mask_kept``):
    the op, where the model computes it, how many attention ops read it, why it was not
    recognised, and its bytes per rank at ``seq_len`` (every dynamic dim is the sequence;
    the mask is whole on every rank and kept for backward); and one line when hand-written
    attention was not fused into SDPA (``autosp.unfused_attention``: its scores stay)."""
    from autosp.ir.builders import vtensor_shape
    from autosp.ir.contract import KEPT_MASK_ATTR, UNFUSED_ATTR
    from autosp.ir.ops import SDPA_OP
    found: dict = {}
    unfused = []
    for func in funcs(module):
        for op in body_ops(func):
            if op_name(op) == SDPA_OP and KEPT_MASK_ATTR in op.attributes:
                found.setdefault(op.operands[3], []).append(op)
            if UNFUSED_ATTR in op.attributes:
                unfused.append(op)
    names = [f"{a.kind} {a.name}" for a in read_arguments(module)]
    lines = []
    for mask, ops in found.items():
        shape = vtensor_shape(mask.type)
        dims, dtype = shape if shape is not None else ([], "f32")
        def nbytes(n: int, dims=dims, dtype=dtype) -> int:
            total = _MLIR_TO_TORCH_DTYPE.get(dtype, torch.float32).itemsize
            for d in dims:
                total *= n if d is None else d
            return total
        reason = re.sub(r"block argument %arg(\d+)", lambda m: names[int(m.group(1))]
                        if int(m.group(1)) < len(names) else m.group(0),
                        ir.StringAttr(ops[0].attributes[KEPT_MASK_ATTR]).value)
        long = 131072
        lines.append(f"autosp: torch.aten.scaled_dot_product_attention{_source(ops[0])} ({len(ops)} op(s)) keeps its "
                     f"{_dims(dims)} {dtype} attention mask "
                     f"materialised: {_human(nbytes(seq_len))} per rank at S={seq_len}, kept for backward "
                     f"({_human(nbytes(long))} at S={long}); not recognised as causal or a sliding window: {reason}")
    if unfused:
        shape = vtensor_shape(unfused[0].results[0].type)
        lines.append(f"autosp: hand-written attention{_source(unfused[0])} ({len(unfused)} softmax op(s)) is not "
                     f"fused into scaled_dot_product_attention: its {_dims(shape[0] if shape else [])} "
                     f"scores and probabilities stay, O(S^2) per layer, kept for backward; "
                     f"{ir.StringAttr(unfused[0].attributes[UNFUSED_ATTR]).value}")
    return lines


def parse_bytes(value: int | str) -> int:
    """``"70GiB"``, ``"512 MiB"``, ``"1.5e9"``, ``"2GB"`` or an int -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise AutospError(f"memory_budget must be positive, got {value}")
        return value
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in units:
        raise AutospError(f"memory_budget: cannot read {value!r} as bytes (e.g. 80 * 2**30, \"70GiB\", \"512MiB\")")
    n = int(float(m.group(1)) * units[m.group(2).lower()])
    if n <= 0:
        raise AutospError(f"memory_budget must be positive, got {value!r}")
    return n


def _source(op) -> str:
    """`` at <last 3 path parts>:<line>`` of the model's source line an op comes from."""
    files = re.findall(r'"([^"]+)":(\d+)', str(op.location))
    return f" at {'/'.join(files[0][0].split('/')[-3:])}:{files[0][1]}" if files else ""


def _dims(dims) -> str:
    """``[2, 1, S, S]``: a shape with its dynamic (sequence) dims as S."""
    return f"[{', '.join('S' if d is None else str(d) for d in dims)}]"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _transform_once_per_group(run, group) -> Transformed:
    """``run()`` on the group's first rank; its result (or its error) broadcast to the rest,
    under the process group's timeout. Saves the other ranks' CPU time: a compilation is
    mostly tracing, and the ranks of a node share its cores."""
    first = dist.get_process_group_ranks(group)[0]
    payload: list[object] = [None]
    if dist.get_rank() == first:
        try:
            transformed = run()
            payload[0] = ("ok", transformed.to_bytes())
        except Exception as e:
            payload[0] = ("error", f"{type(e).__name__}: {e}")
            dist.broadcast_object_list(payload, src=first, group=group)
            raise
        dist.broadcast_object_list(payload, src=first, group=group)
        return transformed
    dist.broadcast_object_list(payload, src=first, group=group)
    kind, data = cast(tuple[str, Any], payload[0])
    if kind != "ok":
        raise AutospError(f"rank {first} could not compile the model for this group: {data}")
    transformed = Transformed.from_bytes(data)
    transformed.timings["received"] = 1.0
    return transformed


class AutospModule(torch.nn.Module):
    """Wraps the user's model; compiles it per input signature at the first call.

    ``self.module`` is the user's model, so ``parameters()``/``state_dict()`` are the
    user's own tensors (prefixed ``module.``).

    Process groups and gradient synchronisation belong to this wrapper: its programs'
    collectives name a group unique to it (``group_name``, bound to its own
    ``ProcessGroup``, ``sp_group``), so two compiled models on different groups never talk
    over each other. ``grad_sync`` (a :class:`GradientSync` on the same group, or on the
    whole dp x sp mesh) is armed by each compiled call: a backward through the plain model,
    or through another wrapper of the same model, is not synchronised by this one, and
    each backward adds only its own call's summed gradient to ``.grad``.
    """

    _instances = itertools.count()

    def __init__(self, model: torch.nn.Module, sp_size: int | None = None, group=None, seq_dim: int = 1,
                 gather_outputs: bool = False, pipeline: str | None = None, dump_dir: str | None = None,
                 verbose: bool = False, backend: str | None = None, sync_data_parallel: bool = True,
                 checkpointing: str = "off", grad_bucket_bytes: int = 25 << 20,
                 memory_plan: MemoryPlan | None = None, memory_budget: int | str | None = None,
                 drop_logits: bool = False, optimizer: str = "adamw", sp_strategy: str = "auto",
                 ulysses_degree: int | None = None, ring_degree: int | None = None,
                 ranks_per_node: int | None = None, check_inputs: bool = True):
        super().__init__()
        self.module = model
        from autosp.strategy import STRATEGIES
        if sp_strategy not in STRATEGIES:
            raise AutospError(f"sp_strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {sp_strategy!r}")
        for what, d in (("ulysses_degree", ulysses_degree), ("ring_degree", ring_degree),
                        ("ranks_per_node", ranks_per_node)):
            if d is not None and (not isinstance(d, int) or d < 1):
                raise AutospError(f"{what} must be a positive int, got {d!r}")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        self.mesh_request = dict(strategy=sp_strategy, ulysses_degree=ulysses_degree, ring_degree=ring_degree,
                                 ranks_per_node=ranks_per_node or local or None)
        self.layout: collectives.SeqLayout | None = None  # the compiled layout (see gather_sequence)
        self._mesh_groups: dict = {}
        self.memory_plan = memory_plan
        self.memory_budget = None if memory_budget is None else parse_bytes(memory_budget)
        self.drop_logits = drop_logits
        self.optimizer = optimizer
        _check_launch(sp_size, group)
        self.sp_size = _resolve_sp_size(sp_size, group)
        self.check_inputs = check_inputs
        config = getattr(model, "config", None)
        self._use_cache_off = bool(getattr(config, "use_cache", False)) and _accepts(model, "use_cache")
        self._said_use_cache = False
        self.group = group
        self.seq_dim = seq_dim
        self.gather_outputs = gather_outputs
        self.pipeline = pipeline
        self.dump_dir = dump_dir
        self.verbose = verbose
        self.backend = backend
        self.grad_bucket_bytes = grad_bucket_bytes
        if checkpointing not in CHECKPOINTING:
            raise AutospError(f"checkpointing must be one of {', '.join(map(repr, CHECKPOINTING))}, "
                              f"got {checkpointing!r}")
        self.checkpointing = checkpointing
        self._programs: dict[object, CompiledProgram] = {}
        # A name of its own: the IR names groups by string, and the runtime binds each name
        # to one process group, so a shared name would let a later module rebind an earlier one's.
        self.group_name = f"autosp{next(AutospModule._instances)}"
        self.sp_group = None
        self.grad_sync = None
        self.mesh = None
        sharded = [(n, p) for n, p in model.named_parameters() if fsdp.is_sharded(p)]
        for name, p in sharded:
            try:
                fsdp.check_supported(name, p)
            except ValueError as e:
                raise AutospError(str(e)) from None
        # Sharded parameters' gradients are summed over the whole FSDP mesh (every rank) by
        # a reduce-scatter: the SP sum, and the replicas' mean with this factor.
        self.shard_scale = self.sp_size / dist.get_world_size() if sharded else 1.0
        self.sharded_names = frozenset(name for name, _ in sharded)
        dense = [p for p in model.parameters() if not fsdp.is_sharded(p)]
        if self.sp_size > 1:
            sp_group, self.mesh = _sequence_parallel_group(self.sp_size, group)
            self.sp_group = sp_group if sp_group is not None else dist.group.WORLD
            collectives.register_group(self.group_name, self.sp_group)
            if self.mesh is None or not sync_data_parallel:
                # Sum over the sequence-parallel ranks only (data parallelism, if any, is
                # the caller's: e.g. DDP over self.mesh["dp"]).
                self.grad_sync = GradientSync(dense, self.sp_group, bucket_bytes=grad_bucket_bytes)
            else:
                # DP x SP: sum over the sequence-parallel ranks, average over the replicas,
                # in one all-reduce over the whole mesh.
                dp = self.mesh["dp"].size()
                self.grad_sync = GradientSync(dense, dist.group.WORLD, bucket_bytes=grad_bucket_bytes,
                                              scale=1.0 / dp)
        elif group is None and sync_data_parallel and dist.is_available() and dist.is_initialized() and \
                dist.get_world_size() > 1:
            # sp_size=1 in a larger world: every rank is a data-parallel replica of its own,
            # and sync_data_parallel's contract (average over the replicas) still holds.
            self.grad_sync = GradientSync(dense, dist.group.WORLD, bucket_bytes=grad_bucket_bytes,
                                          scale=1.0 / dist.get_world_size())

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

    def _modes(self) -> tuple:
        """The ``training`` flag of every submodule: part of a program's key (dropout, and
        anything else a module does differently in ``train()`` and ``eval()``)."""
        return tuple(m.training for m in self.module.modules())

    def compile_for(self, *args, **kwargs) -> CompiledProgram:
        """Compile (or fetch from the cache) the program for this call's signature (its
        structure, dtypes, non-sequence sizes and the module's train/eval mode)."""
        kwargs = self._call_kwargs(kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        return self._program_for(args, kwargs, leaves, spec, check=False)

    def _program_for(self, args, kwargs, leaves, spec, check: bool) -> CompiledProgram:
        modes = self._modes()
        key = (self._signature(leaves, spec), modes)
        program = self._programs.get(key)
        # The ranks agree on the call before its first collective: on every call, or (with
        # check_inputs=False) when a signature first compiles.
        if check or program is None:
            self._check_ranks_agree(leaves, spec, modes)
        self._check_call(leaves)  # after the ranks agree: every rank raises it, or none
        if program is None:
            program = self._compile(args, kwargs)
            self._programs[key] = program
        return program

    def _call_kwargs(self, kwargs: dict) -> dict:
        """The call as compiled: a Hugging Face model that would return a key/value cache
        (``config.use_cache``) is called with ``use_cache=False`` (a cache is for
        generation; autosp compiles training and evaluation calls), said once."""
        if not self._use_cache_off or "use_cache" in kwargs:
            if kwargs.get("use_cache") is True:
                raise AutospError("use_cache=True: autosp compiles training and evaluation calls, which use no "
                                  "key/value cache; call the model with use_cache=False (generation with a cache "
                                  "is not sequence-parallel)")
            return kwargs
        if not self._said_use_cache and self.verbose:
            print("[autosp] calling the model with use_cache=False (config.use_cache is True; a key/value "
                  "cache is for generation)", file=sys.stderr)
        self._said_use_cache = True
        return {**kwargs, "use_cache": False}

    def _check_call(self, leaves) -> None:
        """Checks of one call on this rank alone: the sequence is long enough."""
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and leaf.dim() > self.seq_dim:
                if leaf.shape[self.seq_dim] < MIN_SEQ_LEN:
                    raise AutospError(
                        f"the sequence (dim {self.seq_dim}) has {leaf.shape[self.seq_dim]} position(s); autosp "
                        f"needs at least {MIN_SEQ_LEN}: torch.export specialises sizes 0 and 1, and a causal LM's "
                        "shifted labels (S - 1 positions) must not be one either")
                return

    def _check_ranks_agree(self, leaves, spec, modes: tuple = ()) -> None:
        """Every rank of the group must pass the same full-sequence inputs, in the same
        train/eval mode: :func:`autosp.inputs.check_inputs_agree` (one small all-gather,
        under the process group's timeout) names the first argument, dimension or
        contents that differ, with each rank's value."""
        if self.sp_group is None or collectives._SIMULATED or not dist.is_initialized():
            return
        check_inputs_agree(leaves, spec, input_paths(spec, leaves), self.sp_group, modes=modes,
                           seq_dim=self.seq_dim)

    def _compile(self, args, kwargs) -> CompiledProgram:
        """Transform on the group's first rank and send the program to the others (it is
        the same on every rank); each rank emits its own GraphModule."""
        def run():
            # On the group's first rank only: every rank runs the program (and plan) it sends.
            plan = self._plan(args, kwargs)
            return transform(self.module, args, kwargs, sp_size=self.sp_size, seq_dim=self.seq_dim,
                             gather_outputs=self.gather_outputs, pipeline=self.pipeline, dump_dir=self.dump_dir,
                             checkpointing=self.checkpointing, group_name=self.group_name, plan=plan,
                             mesh=self._mesh())

        group = self.sp_group
        if group is None or collectives._SIMULATED or not dist.is_initialized() or dist.get_world_size(group) == 1:
            transformed = run()
        else:
            transformed = _transform_once_per_group(run, group)
        self._bind_layout(transformed.module)
        program = emit_program(self.module, transformed, verbose=self.verbose, backend=self.backend,
                               checkpointing=self.checkpointing, grad_bucket_bytes=self.grad_bucket_bytes)
        seq = _seq_len(args, kwargs, self.seq_dim)
        if seq is not None and (not dist.is_initialized() or dist.get_rank() == 0):
            for line in kept_masks(transformed.module, seq):
                warnings.warn(line, stacklevel=4)
        program.shard_scale = self.shard_scale
        program.sharded_names = self.sharded_names
        return program

    def _mesh(self) -> dict:
        """The mesh request of a compilation: the user's, until a first compilation chose a
        layout; then that mesh (priced once, at the first call's length), so a later call
        (another batch size) runs on the same sub-groups and layout."""
        if self.layout is None or self.layout.ring == 1 and self.mesh_request["strategy"] == "ulysses":
            return self.mesh_request
        lay = self.layout
        strategy = "ulysses" if lay.ring == 1 else "ring" if lay.ulysses == 1 else "hybrid"
        return dict(self.mesh_request, strategy=strategy, ulysses_degree=lay.ulysses, ring_degree=lay.ring)

    def _bind_layout(self, module) -> None:
        """Register the sequence layout the compiler chose, and for a Ulysses x ring mesh
        its sub-groups (``<group_name>:ulysses``, ``<group_name>:ring``; created once per
        mesh, by the group's ranks only)."""
        lay = module_layout(module)
        if lay is None or self.sp_size == 1:
            return
        if self.verbose and (not dist.is_initialized() or dist.get_rank() == 0):
            print(f"[autosp] sequence parallelism: {lay.describe()} ({module_choice(module)})", flush=True)
        if self.layout is not None and lay != self.layout:
            raise AutospError(f"this call's sequence layout ({lay.describe()}) differs from an earlier call's "
                              f"({self.layout.describe()}); one module runs one mesh")
        self.layout = lay
        collectives.register_group(self.group_name, self.sp_group, layout=lay)
        if lay.ring == 1 or collectives._SIMULATED or not dist.is_initialized():
            return
        if lay not in self._mesh_groups:
            ranks = dist.get_process_group_ranks(self.sp_group)
            i, j = divmod(dist.get_rank(self.sp_group), lay.ulysses)
            ulysses = dist.new_group(ranks[i * lay.ulysses:(i + 1) * lay.ulysses], use_local_synchronization=True)
            ring = dist.new_group(ranks[j::lay.ulysses], use_local_synchronization=True)
            self._mesh_groups[lay] = (ulysses, ring)
        ulysses, ring = self._mesh_groups[lay]
        collectives.register_group(f"{self.group_name}:ulysses", ulysses)
        collectives.register_group(f"{self.group_name}:ring", ring)

    def gather_sequence(self, x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        """This rank's sequence shard of an output (``gather_outputs=False``) -> the whole
        sequence, in sequence order, on every rank. With ring attention the local shard
        holds the rank's pieces of the layout in order (zigzag: chunks i and 2R-1-i of
        2R, see :class:`autosp.runtime.collectives.SeqLayout`), not one contiguous run;
        this undoes that. Differentiable (the backward is the rank's slice)."""
        dim = self.seq_dim if dim is None else dim
        return collectives.restore_sequence_order(x, dim, self.group_name)

    def shard_sequence(self, x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        """A full-sequence tensor -> this rank's part of it, in the module's layout (the
        inverse of :meth:`gather_sequence`, zigzag included): the positions this rank's
        sequence-aligned outputs hold, so a loss computed outside the model on local
        logits pairs each logit with its own label. No communication; differentiable.
        Needs a first call (the compiler chooses the layout then).

        Example::

            logits = sp(ids).logits                        # this rank's positions
            local_labels = sp.shard_sequence(labels)       # the same positions of labels
        """
        dim = self.seq_dim if dim is None else dim
        if self.sp_size == 1:
            return x
        if not self._programs:
            raise AutospError("shard_sequence: call the module once first; the compiler chooses the sequence "
                              "layout at the first call")
        dim %= x.dim()
        return collectives.shard(x, x.shape[dim], dim, 0, 0, self.group_name)

    def _plan(self, args, kwargs) -> MemoryPlan | None:
        """The memory plan of this compilation: ``memory_plan``, or the planner's for
        ``memory_budget`` at this call's sequence length (the same on every rank: the
        planner is deterministic and every rank passes the same inputs)."""
        if self.memory_plan is not None:
            plan = self.memory_plan
        elif self.memory_budget is not None:
            from autosp.planner import plan_memory
            plan = plan_memory(self.module, args, kwargs, self.memory_budget, sp_size=self.sp_size,
                               seq_dim=self.seq_dim, drop_logits=self.drop_logits, verbose=self.verbose,
                               optimizer=self.optimizer, mesh=self.mesh_request,
                               fsdp=dist.get_world_size() if self.sharded_names and dist.is_initialized() else 1)
        elif self.drop_logits:
            plan = MemoryPlan(mode=self.checkpointing, drop_logits=True)
        else:
            return None
        return plan

    # ------------------------------------------------------------------ calling
    def forward(self, *args, **kwargs):
        kwargs = self._call_kwargs(kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        program = self._program_for(args, kwargs, leaves, spec, check=self.check_inputs)
        return program(self.module, [prepare_input(x) for x in leaves], self.grad_sync)

    @property
    def programs(self) -> list[CompiledProgram]:
        """The programs compiled so far (one per input signature)."""
        return list(self._programs.values())


def compile(model: torch.nn.Module, sp_size: int | None = None, group=None, seq_dim: int = 1,
            gather_outputs: bool = False, **options) -> AutospModule:
    """Make ``model`` sequence-parallel over ``sp_size`` ranks (see docs/DESIGN.md §2).

    Call it on every rank of an initialised torch.distributed job; every rank then calls
    the returned module with the same full-sequence inputs. The ranks of a group check that,
    on every call and before any collective: a fingerprint of every tensor input's contents,
    every size and non-tensor argument, and the train/eval mode, exchanged in one small
    all-gather (:mod:`autosp.inputs`); a difference raises the same :class:`AutospError` on
    every rank, naming the argument, the dimension or "contents" and each rank's value, and
    the module stays usable. ``check_inputs=False`` skips the check on calls whose signature
    already compiled, for callers that guarantee agreement (a mismatch then trains wrong, or
    fails inside the collectives). The sequence must have at least ``MIN_SEQ_LEN`` (3)
    positions. ``train()`` / ``eval()`` select separate programs (every submodule's
    ``training`` flag is part of the program's key). A Hugging Face model whose
    ``config.use_cache`` is set is called with ``use_cache=False`` (a key/value cache is for
    generation); an explicit ``use_cache=True`` is an error. Inputs may be views (``tokens[:, 1:]``),
    expanded tensors or int32 ids; they are passed on as dense tensors, and a view shares the
    compilation of a dense tensor of the same shape. ``sp_size`` defaults to the size of
    ``group`` (or the world; 1 without torch.distributed); a world larger than ``sp_size`` is
    split into consecutive sequence-parallel groups (data-parallel replicas). ``seq_dim`` is
    the inputs' sequence dimension. A scalar loss computed in the model is the global loss on
    every rank; sequence-aligned outputs are this rank's shard, or the full tensor with
    ``gather_outputs=True``.

    Gradients: after ``backward()`` through a call of the returned module, every parameter's
    ``.grad`` is the single-device gradient. The sum over the group belongs to that call: the
    call passes the parameters through per-bucket identity functions (about
    ``grad_bucket_bytes``, default 25 MiB, in reverse order of use) whose backward starts the
    bucket's all-reduce as soon as backward completes it and adds only this call's summed
    gradient to ``.grad``. So gradient accumulation over several backward calls is right,
    ``torch.autograd.grad`` returns summed gradients, and the user's plain ``model(...)`` (or
    a second compiled wrapper of it) is never synchronised by this one. Each compiled module
    binds its collectives to its own process group under a name of its own
    (``module.group_name``), so models compiled on different groups do not interfere.
    Collectives use the process group's timeout.

    Options: ``pipeline`` (a custom pass pipeline; every collective it inserts runs on this
    module's group, whatever group its passes name), ``dump_dir`` (IR after every pass), ``verbose`` (compile
    timings), ``backend`` (a ``torch.compile`` backend such as ``"inductor"`` for the emitted
    module, compiled as one graph; the gradient all-reduces then start when the backward is
    done), ``sync_data_parallel`` (default True: with a world larger than ``sp_size``,
    autosp also averages gradients over the data-parallel replicas; pass False when wrapping
    the module in ``DistributedDataParallel(module, process_group=module.mesh["dp"].get_group())``,
    which then does it), ``grad_bucket_bytes``, ``checkpointing`` (``"off"``; ``"sac"``:
    sequence-aware, keep attention and its
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
