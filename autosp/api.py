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
import itertools
import os
import re
import sys
import warnings
import weakref

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from autosp.backend.module import CompiledProgram
from autosp.backend.shape_check import check_shapes
from autosp.cost.plan import MemoryPlan
from autosp.driver import (
    emit_program,
    kept_masks,
    module_choice,
    module_layout,
    seq_len_of,
    transform,
    transform_once_per_group,
)
from autosp.frontend.importer import autocast_off, autocast_state, input_paths, input_sequence_dims, prepare_input
from autosp.inputs import check_inputs_agree
from autosp.ir.diagnostics import AutospError
from autosp.module_checkpointing import request_key, requested_checkpointing
from autosp.options import CompileOptions, MeshOptions
from autosp.pipeline import PipelineError
from autosp.program_key import (
    describe_changes,
    describe_rank_differences,
    key_fingerprint,
    module_state_key,
    state_table,
    training_flags,
)
from autosp.runtime import collectives, fsdp
from autosp.runtime.context import RuntimeContext
from autosp.runtime.grad_sync import GradientSync
from autosp.runtime.outside_grads import OutsideGradients

# The shortest sequence a call may have (torch.export specialises sizes 0 and 1; a causal
# LM's shifted labels hold S - 1 positions).
MIN_SEQ_LEN = 3

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


class AutospModule(torch.nn.Module):
    """Wraps the user's model; compiles it per input signature at the first call.

    ``self.module`` is the user's model, so ``parameters()``/``state_dict()`` are the
    user's own tensors (prefixed ``module.``).

    Process groups and gradient synchronisation belong to this wrapper: its programs'
    collectives name a group unique to it (``group_name``, bound to its own
    ``ProcessGroup``, ``sp_group``, by its :class:`RuntimeContext` ``runtime``, which
    unregisters the names when the wrapper is garbage-collected), so two compiled models on
    different groups never talk over each other. ``grad_sync`` (a :class:`GradientSync` on the same group, or on the
    whole dp x sp mesh) is armed by each compiled call: a backward through the plain model,
    or through another wrapper of the same model, is not synchronised by this one, and
    each backward adds only its own call's summed gradient to ``.grad``.
    """

    _instances = itertools.count()

    def __init__(self, model: torch.nn.Module, sp_size: int | None = None, group=None,
                 options: CompileOptions | None = None, **keywords):
        super().__init__()
        self.module = model
        if options is None:  # autosp.compile's keywords, checked once (autosp.options)
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or None
            options = CompileOptions.from_keywords(**keywords, local_world_size=local)
        elif keywords:
            raise TypeError(f"AutospModule: options= and keywords {sorted(keywords)} together; pass one")
        self.options = options
        self.layout: collectives.SeqLayout | None = None  # the compiled layout (see gather_sequence)
        self._mesh_groups: dict = {}
        _check_launch(sp_size, group)
        self.sp_size = _resolve_sp_size(sp_size, group)
        config = getattr(model, "config", None)
        self._use_cache_off = bool(getattr(config, "use_cache", False)) and _accepts(model, "use_cache")
        self._said_use_cache = False
        self.group = group
        requested_checkpointing(model)  # checkpointing on the modules autosp cannot honour: an error now
        self._said_checkpointing: set = set()
        self._programs: dict[object, CompiledProgram] = {}
        self._shapes_checked: set = set()  # (program id, sequence length class): see _check_shapes
        # A name of its own: the IR names groups by string, and the runtime binds each name
        # to one process group, so a shared name would let a later module rebind an earlier one's.
        self.group_name = f"autosp{next(AutospModule._instances)}"
        self.runtime = RuntimeContext(self.group_name)  # its names' entries go with this module
        self.sp_group = None
        self.grad_sync = None
        self.mesh = None
        sharded = [(n, p) for n, p in model.named_parameters() if fsdp.is_sharded(p)]
        try:
            for name, p in sharded:
                fsdp.check_supported(name, p)
            if sharded:
                fsdp.check_policies(model)  # FSDP2 policies autosp does not honour, by name
        except ValueError as e:
            raise AutospError(str(e)) from None
        # Sharded parameters' gradients are summed over the whole FSDP mesh (every rank) by
        # a reduce-scatter: the SP sum, and the replicas' mean with this factor.
        self.shard_scale = 1.0
        self._fsdp_root_ready = False
        self._fsdp_outside = None
        if sharded:  # (and FSDP2's own hooks, where the user calls a sharded module outside, alike)
            try:
                self._fsdp_outside = fsdp.OutsideCalls(model, dist.get_world_size() // self.sp_size)
            except ValueError as e:
                raise AutospError(str(e)) from None
            self.shard_scale = self._fsdp_outside.scale
            handle = model.register_forward_pre_hook(_plain_fsdp_call(self._fsdp_outside))
            weakref.finalize(self, handle.remove)
        self.sharded_names = frozenset(name for name, _ in sharded)
        dense = [p for p in model.parameters() if not fsdp.is_sharded(p)]
        if self.sp_size > 1:
            sp_group, self.mesh = _sequence_parallel_group(self.sp_size, group)
            self.sp_group = sp_group if sp_group is not None else dist.group.WORLD
            self.runtime.bind(self.sp_group)
            if self.mesh is None or not self.options.sync_data_parallel:
                # Sum over the sequence-parallel ranks only (data parallelism, if any, is
                # the caller's: e.g. DDP over self.mesh["dp"]).
                self.grad_sync = GradientSync(dense, self.sp_group, bucket_bytes=self.options.grad_bucket_bytes)
            else:
                # DP x SP: sum over the sequence-parallel ranks, average over the replicas,
                # in one all-reduce over the whole mesh.
                dp = self.mesh["dp"].size()
                self.grad_sync = GradientSync(dense, dist.group.WORLD, bucket_bytes=self.options.grad_bucket_bytes,
                                              scale=1.0 / dp)
            # Gradients the user's loss gives the parameters outside the call, on sharded outputs.
            self.grad_sync.outside = OutsideGradients(
                [(n, p) for n, p in model.named_parameters() if not fsdp.is_sharded(p)],
                self.grad_sync.group, self.grad_sync.scale, model)
        elif group is None and self.options.sync_data_parallel and dist.is_available() and dist.is_initialized() and \
                dist.get_world_size() > 1:
            # sp_size=1 in a larger world: every rank is a data-parallel replica of its own,
            # and sync_data_parallel's contract (average over the replicas) still holds.
            self.grad_sync = GradientSync(dense, dist.group.WORLD, bucket_bytes=self.options.grad_bucket_bytes,
                                          scale=1.0 / dist.get_world_size())

    # ------------------------------------------------------------------ compilation
    def _signature(self, leaves, spec):
        parts: list[tuple] = []
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        dims = iter(input_sequence_dims(tensors, self.options.seq_dim)[0])  # (S is not part of the signature)
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                seq = next(dims)
                shape = tuple(None if d == seq else s for d, s in enumerate(leaf.shape))
                parts.append(("T", leaf.dtype, leaf.device, shape))
            else:
                parts.append(("C", repr(leaf)))
        return spec, tuple(parts)

    def _modes(self) -> tuple:
        """The ``training`` flag of every submodule: part of a program's key (in
        :func:`module_state_key`: dropout, and anything else a module does differently in
        ``train()`` and ``eval()``)."""
        return training_flags(module_state_key(self.module))

    def compile_for(self, *args, **kwargs) -> CompiledProgram:
        """Compile (or fetch from the cache) the program for this call's signature (its
        structure, dtypes, non-sequence sizes and the module's train/eval mode)."""
        kwargs = self._call_kwargs(kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        return self._program_for(args, kwargs, leaves, spec, check=False)

    def _program_for(self, args, kwargs, leaves, spec, check: bool) -> CompiledProgram:
        # What selects the program: the signature; the Python state the trace reads (every
        # module's plain attributes, train/eval flags included, hooks, config:
        # autosp.program_key), as the number of that state (_module_state_number); the autocast
        # it is exported under (importer); the modules' checkpointing switches (module_checkpointing).
        current = module_state_key(self.module)
        last = self.__dict__.get("_last_module_state")  # (state, number) of the previous call
        number = last[1] if last is not None and last[0] == current else self._module_state_number(current)
        state = (autocast_state(), request_key(self.module))
        key: tuple = (self._signature(leaves, spec), number, *state)
        program = self._programs.get(key)
        if program is not None and not _fits(program, leaves):
            # an inferred sequence dim the export left static: that size is part of the key
            key = (key, tuple(tuple(x.shape) for x in leaves if isinstance(x, torch.Tensor)))
            program = self._programs.get(key)
        # The ranks agree on the call before its first collective: on every call, or (with
        # check_inputs=False) when a signature first compiles.
        if check or program is None:
            try:
                self._check_ranks_agree(leaves, spec, training_flags(current),
                                        state=(*state, ("module state", self._module_state_print(number))))
            except AutospError as e:  # the same message on every rank: all take the same path
                if "the program's state" not in str(e):
                    raise
                raise AutospError(f"{e}. {self._module_state_differences(number)}") from None
        self._check_call(leaves)  # after the ranks agree: every rank raises it, or none
        if program is None:
            if last is not None and last[1] != number and self.options.verbose and (
                    not dist.is_initialized() or dist.get_rank() == 0):
                print("[autosp] compiling again: the model's state changed since the last call: " +
                      "; ".join(describe_changes(self.module, last[0], current)), file=sys.stderr, flush=True)
            program = self._compile(args, kwargs)
            self._programs[key] = program
            traced = module_state_key(self.module)
            if traced != current:
                # forward changed the state it reads (a counter; on the group's first rank, which
                # traces): the program keeps the values it read, and the changed state is given
                # this state's number (else every call would trace again, and the ranks disagree)
                warnings.warn("[autosp] the model's forward changed its own state while it was traced; the "
                              "compiled program keeps the values it read: " +
                              "; ".join(describe_changes(self.module, current, traced)), stacklevel=4)
                self._module_state_numbers.setdefault(traced, number)
                current = traced
        self._last_module_state = (current, number)
        return program

    def _module_state_number(self, module_state: tuple) -> int:
        """The number of a module state (:func:`module_state_key`) in this wrapper's program keys:
        one per state seen (each compiled a program), so a key is cheap to hash."""
        numbers = self.__dict__.setdefault("_module_state_numbers", {})
        number = numbers.get(module_state)
        if number is None:
            states = self.__dict__.setdefault("_module_states", [])
            number = numbers[module_state] = len(states)
            states.append(module_state)
        return number

    def _module_state_differences(self, number: int) -> str:
        """Which module attributes differ between the ranks (a collective: on every rank of the
        group, after a disagreement every rank saw)."""
        mine = state_table(self.module, self._module_states[number])
        tables: list = [None] * dist.get_world_size(self.sp_group)
        dist.all_gather_object(tables, mine, group=self.sp_group)
        lines = describe_rank_differences(tables, dist.get_process_group_ranks(self.sp_group))
        if not lines:
            return ("The module attributes autosp can name are the same on every rank (compare the autocast and "
                    "checkpointing entries above, and the names of the modules' attributes)")
        return ("The module state differs (the Python attributes the compiled program bakes in, "
                "autosp.program_key): " + "; ".join(lines))

    def _module_state_print(self, number: int) -> int:
        """The checksum of module state ``number`` for the ranks' agreement check (of the state
        it was first seen in: the same on every rank), computed once."""
        prints = self.__dict__.setdefault("_module_state_prints", {})
        if number not in prints:
            prints[number] = key_fingerprint(self._module_states[number])
        return prints[number]

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
        if not self._said_use_cache and self.options.verbose:
            print("[autosp] calling the model with use_cache=False (config.use_cache is True; a key/value "
                  "cache is for generation)", file=sys.stderr)
        self._said_use_cache = True
        return {**kwargs, "use_cache": False}

    def _check_call(self, leaves) -> None:
        """Checks of one call on this rank alone: the sequence is long enough."""
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and leaf.dim() > self.options.seq_dim:
                if leaf.shape[self.options.seq_dim] < MIN_SEQ_LEN:
                    raise AutospError(
                        f"the sequence (dim {self.options.seq_dim}) has {leaf.shape[self.options.seq_dim]} position(s); autosp "
                        f"needs at least {MIN_SEQ_LEN}: torch.export specialises sizes 0 and 1, and a causal LM's "
                        "shifted labels (S - 1 positions) must not be one either")
                return

    def _check_ranks_agree(self, leaves, spec, modes: tuple = (), state: tuple = ()) -> None:
        """Every rank of the group must pass the same full-sequence inputs, in the same
        train/eval mode and program ``state``: :func:`autosp.inputs.check_inputs_agree` (one small all-gather,
        under the process group's timeout) names the first argument, dimension or
        contents that differ, with each rank's value."""
        if self.sp_group is None or collectives.simulating() or not dist.is_initialized():
            return
        check_inputs_agree(leaves, spec, input_paths(spec, leaves), self.sp_group, modes=modes,
                           seq_dim=self.options.seq_dim, state=state)

    def _compile(self, args, kwargs) -> CompiledProgram:
        """Transform on the group's first rank and send the program to the others (it is
        the same on every rank); each rank emits its own GraphModule."""
        checkpointing, module_plan = self._module_checkpointing()

        def run():
            # On the group's first rank only: every rank runs the program (and plan) it sends.
            plan = self._plan(args, kwargs, checkpointing, module_plan)
            try:
                return transform(self.module, args, kwargs, sp_size=self.sp_size, seq_dim=self.options.seq_dim,
                                 gather_outputs=self.options.gather_outputs, pipeline=self.options.pipeline, dump_dir=self.options.dump_dir,
                                 checkpointing=checkpointing, group_name=self.group_name, plan=plan,
                                 mesh=self._mesh())
            except PipelineError as e:
                counts = re.search(r"has (\d+) checkpoint regions .*?'layers' gives (\d+)", str(e))
                if module_plan is None or counts is None:
                    raise
                # The modules' per-layer choices (every_n_layers) against autosp's regions, one
                # per attention layer: a hybrid's layers without attention share a region.
                request = requested_checkpointing(self.module)
                raise AutospError(
                    f"the model's {request.describe() if request else 'checkpointing'} cannot be honoured: autosp "
                    f"checkpoints per region (one per attention layer) and finds {counts[1]} in this program for "
                    f"{counts[2]} checkpointable layers. Switch it on for every layer (every_n_layers=1: autosp's "
                    "full recompute), or pass autosp.compile(..., memory_plan=MemoryPlan(layers=...)) with one "
                    "choice per region") from None

        group = self.sp_group
        if group is None or collectives.simulating() or not dist.is_initialized() or dist.get_world_size(group) == 1:
            transformed = run()
        else:
            transformed = transform_once_per_group(run, group)
        self._bind_layout(transformed.module)
        tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        dims = [a.seq_dim for a in transformed.args if a.kind == "input"]
        program = emit_program(self.module, transformed, verbose=self.options.verbose, backend=self.options.backend,
                               checkpointing=checkpointing, grad_bucket_bytes=self.options.grad_bucket_bytes,
                               shard_scale=self.shard_scale, sharded_names=self.sharded_names,
                               input_shapes=[tuple(None if d == seq else n for d, n in enumerate(x.shape))
                                             for x, seq in zip(tensors, dims)])
        seq = seq_len_of(args, kwargs, self.options.seq_dim)
        if seq is not None and (not dist.is_initialized() or dist.get_rank() == 0):
            for line in kept_masks(transformed.module, seq):
                warnings.warn(line, stacklevel=4)
        return program

    def _module_checkpointing(self) -> tuple[str, MemoryPlan | None]:
        """``(checkpointing, plan)`` of this compilation: autosp's own options, or else the
        checkpointing switched on on the model's modules (``activation_checkpointing_enable()``,
        :mod:`autosp.module_checkpointing`) as autosp's. Explicit options win (said once)."""
        request = requested_checkpointing(self.module)
        if request is None:
            return self.options.checkpointing, None
        own = ("checkpointing=" + repr(self.options.checkpointing) if self.options.checkpointing != "off" else
               "memory_plan" if self.options.memory_plan is not None else
               "memory_budget" if self.options.memory_budget is not None else None)
        if own is not None:
            self._say(f"the model's {request.describe()} is replaced by autosp's {own}")
            return self.options.checkpointing, None
        self._say(f"honouring the model's {request.describe()} as autosp's checkpointing")
        if request.uniform and not request.offload:
            return "full", None
        if not request.layers:
            raise AutospError(f"{request.describe()}: a stack-level checkpointing flag with offload has no per-layer "
                              "choices autosp can read; pass autosp.compile(..., memory_plan=MemoryPlan(layers=("
                              "'full+offload', ...))) instead")
        return self.options.checkpointing, MemoryPlan(layers=request.region_choices(), tile_loss=False)

    def _say(self, line: str) -> None:
        """One line on stderr from the first rank, once per text (verbose or not: it changes memory)."""
        if line in self._said_checkpointing:
            return
        self._said_checkpointing.add(line)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"[autosp] {line}", file=sys.stderr, flush=True)

    def _mesh(self) -> MeshOptions:
        """The mesh request of a compilation: the user's, until a first compilation chose a
        layout; then that mesh (priced once, at the first call's length), so a later call
        (another batch size) runs on the same sub-groups and layout."""
        mesh = self.options.mesh
        if self.layout is None or self.layout.ring == 1 and mesh.strategy == "ulysses":
            return mesh
        return mesh.fixed_to(self.layout.ulysses, self.layout.ring)

    def _bind_layout(self, module) -> None:
        """Register the sequence layout the compiler chose, and for a Ulysses x ring mesh
        its sub-groups (``<group_name>:ulysses``, ``<group_name>:ring``; created once per
        mesh, by the group's ranks only)."""
        lay = module_layout(module)
        if lay is None or self.sp_size == 1:
            return
        if self.options.verbose and (not dist.is_initialized() or dist.get_rank() == 0):
            print(f"[autosp] sequence parallelism: {lay.describe()} ({module_choice(module)})", flush=True)
        if self.layout is not None and lay != self.layout:
            raise AutospError(f"this call's sequence layout ({lay.describe()}) differs from an earlier call's "
                              f"({self.layout.describe()}); one module runs one mesh")
        self.layout = lay
        self.runtime.bind(self.sp_group, layout=lay)
        if lay.ring == 1 or collectives.simulating() or not dist.is_initialized():
            return
        if lay not in self._mesh_groups:
            ranks = dist.get_process_group_ranks(self.sp_group)
            i, j = divmod(dist.get_rank(self.sp_group), lay.ulysses)
            ulysses = dist.new_group(ranks[i * lay.ulysses:(i + 1) * lay.ulysses], use_local_synchronization=True)
            ring = dist.new_group(ranks[j::lay.ulysses], use_local_synchronization=True)
            self._mesh_groups[lay] = (ulysses, ring)
        ulysses, ring = self._mesh_groups[lay]
        self.runtime.bind(ulysses, axis="ulysses")
        self.runtime.bind(ring, axis="ring")

    def gather_sequence(self, x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        """This rank's sequence shard of an output (``gather_outputs=False``) -> the whole
        sequence, in sequence order, on every rank. With ring attention the local shard
        holds the rank's pieces of the layout in order (zigzag: chunks i and 2R-1-i of
        2R, see :class:`autosp.runtime.collectives.SeqLayout`), not one contiguous run;
        this undoes that. Differentiable (the backward is the rank's slice)."""
        dim = self.options.seq_dim if dim is None else dim
        if self.grad_sync is not None and self.grad_sync.outside is not None:
            self.grad_sync.outside.gathered(x)  # a whole loss follows: nothing outside is a share
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
        dim = self.options.seq_dim if dim is None else dim
        if self.sp_size == 1:
            return x
        if not self._programs:
            raise AutospError("shard_sequence: call the module once first; the compiler chooses the sequence "
                              "layout at the first call")
        dim %= x.dim()
        return collectives.shard(x, x.shape[dim], dim, 0, 0, self.group_name)

    def _plan(self, args, kwargs, checkpointing: str = "off", module_plan: MemoryPlan | None = None
              ) -> MemoryPlan | None:
        """The memory plan of this compilation: ``memory_plan``, or the planner's for
        ``memory_budget`` at this call's sequence length (the same on every rank: the
        planner is deterministic and every rank passes the same inputs), or the modules'
        per-layer checkpointing (``module_plan``), with ``drop_logits``."""
        if self.options.memory_plan is not None:
            plan = self.options.memory_plan
        elif self.options.memory_budget is not None:
            from autosp.planning.planner import plan_memory
            plan = plan_memory(self.module, args, kwargs, self.options.memory_budget, sp_size=self.sp_size,
                               seq_dim=self.options.seq_dim, drop_logits=self.options.drop_logits, verbose=self.options.verbose,
                               optimizer=self.options.optimizer, mesh=self.options.mesh,
                               fsdp=dist.get_world_size() if self.sharded_names and dist.is_initialized() else 1)
        elif self.options.drop_logits:
            plan = MemoryPlan(mode=checkpointing, drop_logits=True,
                              layers=module_plan.layers if module_plan is not None else ())
        else:
            return module_plan
        return plan

    # ------------------------------------------------------------------ calling
    def forward(self, *args, **kwargs):
        if self.sharded_names and not self._fsdp_root_ready:
            fsdp.init_root(self.module)  # for FSDP2's own hooks where a sharded module is called outside
            self._fsdp_root_ready = True
        kwargs = self._call_kwargs(kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        program = self._program_for(args, kwargs, leaves, spec, check=self.options.check_inputs)
        self._check_shapes(program, args, kwargs, leaves)
        if self._fsdp_outside is not None:
            self._fsdp_outside.compiled()
        with autocast_off():  # the program's casts are its own ops (autocast_state)
            return program(self.module, [prepare_input(x) for x in leaves], self.grad_sync)

    def _check_shapes(self, program: CompiledProgram, args, kwargs, leaves) -> None:
        """Before a program first runs at a sequence length's class (its remainder over the
        ranks, and whether some rank's share is short or empty): its forward on meta tensors
        (:func:`autosp.backend.shape_check.check_shapes`), each rank its own share, the
        verdicts exchanged in one all-gather, so all raise the same error, or none, before the
        program's first collective."""
        seq = seq_len_of(args, kwargs, self.options.seq_dim)
        if self.sp_size == 1 or seq is None or collectives.simulating() or torch.compiler.is_compiling():
            return
        key = (id(program), seq % self.sp_size, min(seq // self.sp_size, 2))
        if key in self._shapes_checked:
            return
        inputs = [prepare_input(x) for x in leaves]
        if self.sp_group is None or not dist.is_initialized():  # one process: every distinct share
            result = check_shapes(program, self.module, inputs, sp_size=self.sp_size, layout=self.layout, seq_len=seq)
        else:  # each rank its own share; the verdicts exchanged, so all raise the same error or none
            failure = None
            try:
                result = check_shapes(program, self.module, inputs, sp_size=self.sp_size, layout=self.layout,
                                      seq_len=seq, ranks=[dist.get_rank(self.sp_group)])
            except AutospError as e:
                result, failure = None, str(e)
            verdicts: list = [None] * dist.get_world_size(self.sp_group)
            dist.all_gather_object(verdicts, failure, group=self.sp_group)
            failed = next((v for v in verdicts if v is not None), None)
            if failed is not None:
                raise AutospError(failed)
        if result is not None and result.stopped and self.options.verbose and (
                not dist.is_initialized() or dist.get_rank() == 0):
            print(f"[autosp] shape check stopped at {result.stopped} (needs values: later ops unchecked)",
                  file=sys.stderr, flush=True)
        self._shapes_checked.add(key)

    @property
    def programs(self) -> list[CompiledProgram]:
        """The programs compiled so far (one per input signature)."""
        return list(self._programs.values())


def _plain_fsdp_call(outside: fsdp.OutsideCalls):
    """A forward pre-hook: the plain model is called, FSDP2 reduces with the user's factors."""
    def hook(module, args):
        if not torch.compiler.is_compiling():  # (autosp's own export traces the model)
            outside.plain()
    hook.__autosp_inert__ = True  # type: ignore[attr-defined]  # not part of a program's key
    return hook


def _fits(program: CompiledProgram, leaves) -> bool:
    """Do the call's tensor inputs have the sizes ``program`` was compiled for (its dynamic
    dims free)? A signature frees every dim :func:`input_sequence_dims` names, also one the
    export then kept static (a size that only equalled S)."""
    shapes = program.input_shapes
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    return shapes is None or len(shapes) == len(tensors) and all(
        len(want) == x.dim() and all(w is None or w == n for w, n in zip(want, x.shape))
        for want, x in zip(shapes, tensors))


def compile(model: torch.nn.Module, sp_size: int | None = None, group=None, seq_dim: int = 1,
            gather_outputs: bool = False, **options) -> AutospModule:
    """Make ``model`` sequence-parallel over ``sp_size`` ranks (default: the group's or the
    world's size; a larger world is split into data-parallel replicas of ``sp_size`` ranks).

    Call it on every rank of an initialised torch.distributed job; every rank then calls the
    returned module with the same full-sequence inputs (checked on every call before any
    collective: a difference raises the same :class:`AutospError` on every rank). It
    compiles at the first call of each input signature and train/eval mode. A scalar loss
    computed in the model is the global loss on every rank, sequence-aligned outputs are
    this rank's shard (``gather_outputs=True``: whole), and after ``backward()`` every
    ``.grad`` is the single-device gradient. ``seq_dim`` is the inputs' sequence dimension.

    The options (``memory_budget``, ``checkpointing``, ``sp_strategy``, ``backend``, ...) are
    in the table of docs/user_guide.md, *Options*; the contract in docs/DESIGN.md §2.

    Example::

        dist.init_process_group("gloo")
        model = autosp.compile(model, memory_budget="70GiB")
        loss = model(ids, labels=labels)["loss"]
        loss.backward()
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"autosp.compile expects an nn.Module, got {type(model).__name__}")
    return AutospModule(model, sp_size=sp_size, group=group, seq_dim=seq_dim, gather_outputs=gather_outputs,
                        **options)
