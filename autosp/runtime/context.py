"""The runtime state one compiled module owns: the process groups its programs name, and
its sequence layout.

An emitted program's collectives name their group by a string (``"autosp0"``, as the IR's
``group = "autosp0"``), and :mod:`autosp.runtime.collectives` resolves the string in its
name table. A :class:`RuntimeContext` owns one base name's entries there (``autosp0`` and
its mesh sub-groups ``autosp0:ulysses``, ``autosp0:ring``): :meth:`RuntimeContext.bind`
writes them, and a ``weakref.finalize`` removes them when the context is garbage-collected
(or :meth:`RuntimeContext.close`\\ d). ``AutospModule`` keeps its context as ``runtime``,
so a compiled module's groups and layout go when the module goes, and two modules (two
base names, one live context per name) never share an entry.

Why a name table that contexts own, and not a GraphModule holding its context: the emitted
graph stays the program the IR describes (``all_to_all(x, 2, 1, 1, "autosp0", seq_len)``,
no process-group object in it), a name can be rebound without emitting again (negative
controls do), and torch.compile traces reads of a plain dict (it cannot trace a
``WeakValueDictionary``, so the table itself holds its entries and the finalizer removes them).

Example::

    >>> rt = RuntimeContext("autosp7")
    >>> rt.bind(pg, layout=SeqLayout(ulysses=2, ring=2))    # pg: this rank's 4-rank group
    >>> rt.bind(ulysses_pg, axis="ulysses"); rt.bind(ring_pg, axis="ring")
    >>> collectives.group_size("autosp7:ring")
    2
    >>> del rt                      # every "autosp7..." name is gone (after gc.collect() in a cycle)
"""
from __future__ import annotations

import weakref

from autosp.runtime import collectives
from autosp.runtime.collectives import SeqLayout


def _release(names: list[str]) -> None:
    """Unregister ``names`` (a context's, called by its finalizer: it holds no reference to
    the context itself)."""
    for name in names:
        collectives.unregister_group(name)
    names.clear()


class RuntimeContext:
    """The group names (``name``, ``name:<axis>``) and sequence layout of one compiled
    module, registered in :mod:`autosp.runtime.collectives` while the context lives.

    At most one live context per ``name`` (a second one raises ``ValueError``), so no
    context removes another's entries. A copy of the context is the context itself (a
    copied module resolves the same names, which live until every holder is gone). Also a
    context manager that closes it on exit.
    """

    _live: weakref.WeakValueDictionary[str, RuntimeContext] = weakref.WeakValueDictionary()

    def __init__(self, name: str):
        if not name or ":" in name:
            raise ValueError(f"RuntimeContext: {name!r} is not a base group name (no ':')")
        if RuntimeContext._live.get(name) is not None:
            raise ValueError(f"RuntimeContext: the group name {name!r} already has a live context; close() "
                             "it (or drop every reference to it) first")
        self.name = name
        self.layout: SeqLayout | None = None
        self._names: list[str] = []
        self._finalizer = weakref.finalize(self, _release, self._names)
        self._finalizer.atexit = False  # nothing to release when the process ends
        RuntimeContext._live[name] = self

    def bind(self, group, layout: SeqLayout | None = None, axis: str = "") -> str:
        """Bind ``name`` (or the sub-group ``name:<axis>``) to the process group ``group``
        (None: the default group), the base name with its ``layout`` (None: the even
        split); returns the bound name."""
        if self.closed:
            raise RuntimeError(f"RuntimeContext {self.name!r} is closed")
        if axis and layout is not None:
            raise ValueError(f"RuntimeContext.bind: a layout belongs to the base name {self.name!r}, "
                             f"not to its {axis!r} sub-group")
        name = f"{self.name}:{axis}" if axis else self.name
        collectives.register_group(name, group, layout=layout)
        if not axis:
            self.layout = layout
        if name not in self._names:
            self._names.append(name)
        return name

    @property
    def names(self) -> tuple[str, ...]:
        """The names this context has bound (and will remove), in binding order."""
        return tuple(self._names)

    @property
    def closed(self) -> bool:
        """Whether the entries are released (:meth:`close`, or the finalizer ran)."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Remove this context's entries now (idempotent); garbage collection does it too."""
        self._finalizer()
        if RuntimeContext._live.get(self.name) is self:
            del RuntimeContext._live[self.name]

    def __enter__(self) -> RuntimeContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __copy__(self) -> RuntimeContext:
        return self

    def __deepcopy__(self, memo) -> RuntimeContext:
        return self

    def __repr__(self) -> str:
        state = "closed" if self.closed else ", ".join(self._names) or "nothing bound"
        return f"RuntimeContext({self.name!r}: {state})"
