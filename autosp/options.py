"""The compile options: one frozen value, checked once, turned into pipeline text in one place.

``autosp.compile(model, **options)`` builds a :class:`CompileOptions` from its keywords
(:meth:`CompileOptions.from_keywords`: every check, with the message naming the option);
the compiled module reads it, and :func:`sp_pipeline` writes the ``autosp-sp-pipeline``
text from it. The mesh request is a :class:`MeshOptions` everywhere (the planners, the
estimators and ``autosp-plan`` take one, or a dict of its fields). The string choices are
enums whose members equal their strings (``Strategy.RING == "ring"``), so a caller may pass
either.

Example::

    >>> opts = CompileOptions.from_keywords(sp_strategy="ring", checkpointing="sac")
    >>> opts.mesh.strategy is Strategy.RING, opts.checkpointing is Checkpointing.SAC
    (True, True)
    >>> sp_pipeline(4, "autosp0", False, opts.mesh, seq_len=8192)
    'builtin.module(autosp-sp-pipeline{sp-size=4 group=autosp0 gather-outputs=false strategy=ring ...})'
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from autosp.cost.plan import MemoryPlan
from autosp.ir.diagnostics import AutospError
from autosp.units import parse_bytes


class _Choice(str, enum.Enum):
    """A string choice: equal to its value, printed as its value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def parse(cls, value, option: str):
        """``value`` (a member or its string) as a member; else an error naming ``option``."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in cls)
            raise AutospError(f"{option} must be one of {choices}, got {value!r}") from None


# The values are defined where they act (the mesh chooser's STRATEGIES, the recurrence
# pricer's METHODS, the checkpoint pass's MODES); test_options checks these enums name
# exactly those.
class Strategy(_Choice):
    """How attention is split over the ranks (:mod:`autosp.cost.strategy`)."""
    AUTO = "auto"
    ULYSSES = "ulysses"
    RING = "ring"
    HYBRID = "hybrid"


class Recurrence(_Choice):
    """How a linear recurrence runs over the ranks (:mod:`autosp.cost.recurrence`)."""
    AUTO = "auto"
    HEADS = "heads"
    CHAIN = "chain"
    PREFIX = "prefix"


class Checkpointing(_Choice):
    """Activation checkpointing (``autosp-checkpoint``'s modes, and off)."""
    OFF = "off"
    SAC = "sac"
    SAC_MIN = "sac-min"
    FULL = "full"


CHECKPOINTING = tuple(m.value for m in Checkpointing)


def _positive(what: str, value) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise AutospError(f"{what} must be a positive int, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class MeshOptions:
    """What the Ulysses x ring mesh is chosen from, and how linear recurrences run on it.
    ``seq_len``: the length the choice is priced at (0: the example call's)."""

    strategy: Strategy = Strategy.ULYSSES  # (autosp.compile's default is "auto": from_keywords)
    ulysses_degree: int | None = None
    ring_degree: int | None = None
    ranks_per_node: int | None = None
    recurrence: Recurrence = Recurrence.AUTO
    seq_len: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "strategy", Strategy.parse(self.strategy, "sp_strategy"))
        object.__setattr__(self, "recurrence", Recurrence.parse(self.recurrence, "sp_recurrence"))
        for what in ("ulysses_degree", "ring_degree", "ranks_per_node", "seq_len"):
            _positive(what, getattr(self, what))

    @classmethod
    def of(cls, mesh: MeshOptions | Mapping | None) -> MeshOptions:
        """A mesh request as given (:class:`MeshOptions`, a dict of its fields, or None: Ulysses)."""
        if mesh is None:
            return cls()
        if isinstance(mesh, MeshOptions):
            return mesh
        unknown = set(mesh) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise AutospError(f"a mesh request has no field(s) {sorted(unknown)}; its fields: "
                              f"{[f.name for f in dataclasses.fields(cls)]}")
        return cls(**mesh)

    def pipeline_options(self, seq_len: int | None = None) -> str:
        """The ``autosp-sp-pipeline`` options of this request (priced at ``self.seq_len``,
        else ``seq_len``)."""
        return (f"strategy={self.strategy} ulysses-degree={self.ulysses_degree or 0} "
                f"ring-degree={self.ring_degree or 0} ranks-per-node={self.ranks_per_node or 0} "
                f"seq-len={self.seq_len or seq_len or 0} recurrence={self.recurrence}")

    def fixed_to(self, ulysses: int, ring: int) -> MeshOptions:
        """This request fixed to the mesh a compilation chose (``ulysses x ring``)."""
        strategy = "ulysses" if ring == 1 else "ring" if ulysses == 1 else "hybrid"
        return dataclasses.replace(self, strategy=Strategy(strategy), ulysses_degree=ulysses, ring_degree=ring)


def sp_pipeline(sp_size: int, group_name: str, gather_outputs: bool, mesh: MeshOptions | Mapping | None = None,
                seq_len: int | None = None) -> str:
    """The pipeline text of a compilation: ``autosp-sp-pipeline`` with every option
    (``sp_size=1``: the round trip's fuse-gqa and dce only, inside the same pass)."""
    return (f"builtin.module(autosp-sp-pipeline{{sp-size={sp_size} group={group_name} "
            f"gather-outputs={str(gather_outputs).lower()} {MeshOptions.of(mesh).pipeline_options(seq_len)}}})")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Every option of ``autosp.compile`` except ``sp_size`` and ``group`` (the process
    group), checked: the table of docs/user_guide.md, *Options*, says what each does."""

    seq_dim: int = 1
    gather_outputs: bool = False
    pipeline: str | None = None
    dump_dir: str | None = None
    verbose: bool = False
    backend: str | None = None
    sync_data_parallel: bool = True
    checkpointing: Checkpointing = Checkpointing.OFF
    grad_bucket_bytes: int = 25 << 20
    memory_plan: MemoryPlan | None = None
    memory_budget: int | None = None
    drop_logits: bool = False
    optimizer: str = "adamw"
    mesh: MeshOptions = MeshOptions(strategy=Strategy.AUTO)
    check_inputs: bool = True

    @classmethod
    def from_keywords(cls, *, seq_dim: int = 1, gather_outputs: bool = False, pipeline: str | None = None,
                      dump_dir: str | None = None, verbose: bool = False, backend: str | None = None,
                      sync_data_parallel: bool = True, checkpointing: str = "off",
                      grad_bucket_bytes: int = 25 << 20, memory_plan: MemoryPlan | None = None,
                      memory_budget: int | str | None = None, drop_logits: bool = False, optimizer: str = "adamw",
                      sp_strategy: str = "auto", ulysses_degree: int | None = None, ring_degree: int | None = None,
                      ranks_per_node: int | None = None, check_inputs: bool = True,
                      sp_recurrence: str = "auto", local_world_size: int | None = None) -> CompileOptions:
        """``autosp.compile``'s keywords as one checked value (``local_world_size``: the
        launcher's ``LOCAL_WORLD_SIZE``, the default ``ranks_per_node``)."""
        mesh = MeshOptions(strategy=Strategy.parse(sp_strategy, "sp_strategy"), ulysses_degree=ulysses_degree,
                           ring_degree=ring_degree,
                           ranks_per_node=_positive("ranks_per_node", ranks_per_node) or local_world_size or None,
                           recurrence=Recurrence.parse(sp_recurrence, "sp_recurrence"))
        return cls(seq_dim=seq_dim, gather_outputs=gather_outputs, pipeline=pipeline, dump_dir=dump_dir,
                   verbose=verbose, backend=backend, sync_data_parallel=sync_data_parallel,
                   checkpointing=Checkpointing.parse(checkpointing, "checkpointing"),
                   grad_bucket_bytes=grad_bucket_bytes, memory_plan=memory_plan,
                   memory_budget=None if memory_budget is None else parse_bytes(memory_budget),
                   drop_logits=drop_logits, optimizer=optimizer, mesh=mesh, check_inputs=check_inputs)

    def sp_pipeline(self, sp_size: int, group_name: str, seq_len: int | None,
                    mesh: MeshOptions | None = None) -> str:
        """This compilation's pipeline text: the user's ``pipeline``, else
        :func:`sp_pipeline` with these options (``mesh``: a mesh fixed by an earlier call)."""
        return self.pipeline or sp_pipeline(sp_size, group_name, self.gather_outputs, mesh or self.mesh, seq_len)
