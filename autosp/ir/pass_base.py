"""The base class of autosp passes.

A pass is a small frozen dataclass: ``name`` (``autosp-…``), a one-line ``summary``
(the first line of its docstring) and typed option fields, spelled in kebab case on
the command line (``sp_size: int`` <-> ``sp-size=4``). Options are separated by spaces,
as in MLIR (``{sp-size=4 group=sp}``); a field typed ``tuple[int, ...]`` or
``tuple[str, ...]`` is a list option, its items separated by commas (``dims=1,2``).
``apply`` transforms a ``builtin.module`` in place and raises
:class:`~autosp.ir.diagnostics.DiagnosticError` on bad input. A pass that is a pipeline
of other passes returns them from :meth:`ModulePass.expand`, so the pipeline runner
dumps, times and reproduces each of them. Passes never import the pipeline, the API or
the CLI.

Example::

    @dataclass(frozen=True)
    class DeadCodeElimination(ModulePass):
        \"\"\"Erase torch ops whose results are unused.\"\"\"
        name: ClassVar[str] = "autosp-dce"

        def apply(self, module: ir.Operation) -> None:
            eliminate_dead_code(module)
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import ClassVar

from torch_mlir import ir


class PassOptionError(ValueError):
    """An unknown option or a value of the wrong type."""


@dataclass(frozen=True)
class ModulePass:
    name: ClassVar[str] = ""

    @classmethod
    def summary(cls) -> str:
        """The first line of the pass's docstring."""
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def options(cls) -> dict[str, tuple[type, object]]:
        """``{"sp-size": (int, 1), ...}``: the typed options and their defaults."""
        hints = typing.get_type_hints(cls)
        out = {}
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            out[f.name.replace("_", "-")] = (hints[f.name], default)
        return out

    @classmethod
    def from_options(cls, options: dict[str, str]) -> ModulePass:
        """Build from ``{"sp-size": "4"}``; raise PassOptionError naming the bad option."""
        known = cls.options()
        kwargs = {}
        for key, text in options.items():
            if key not in known:
                valid = ", ".join(known) or "none"
                raise PassOptionError(f"pass '{cls.name}' has no option '{key}' (options: {valid})")
            typ, _ = known[key]
            kwargs[key.replace("-", "_")] = _convert(cls.name, key, typ, text)
        return cls(**kwargs)

    def option_string(self) -> str:
        """``{sp-size=4 dims=1,2}`` for the non-default options (empty string if none)."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or value != f.default:
                parts.append(f"{f.name.replace('_', '-')}={_format(value)}")
        return "{" + " ".join(parts) + "}" if parts else ""

    def pipeline_text(self) -> str:
        return self.name + self.option_string()

    def expand(self) -> list[ModulePass] | None:
        """The passes this pass stands for when it is a pipeline of passes, else None.

        The pipeline runner runs the expansion element by element, so IR dumps, timings
        and reproducers name the sub-passes. Example::

            def expand(self):
                return [DeadCodeElimination(), AnnotateSequence()]
        """
        return None

    def apply(self, module: ir.Operation) -> None:
        """Transform ``module`` in place; a pipeline pass runs its expansion."""
        passes = self.expand()
        if passes is None:  # pragma: no cover - every concrete pass overrides apply or expand
            raise NotImplementedError(f"pass '{self.name}' defines neither apply() nor expand()")
        for p in passes:
            p.apply(module)


def type_name(typ) -> str:
    """``int``, ``bool``, ``str`` or ``list of int`` (a ``tuple[int, ...]`` field)."""
    item = _list_item_type(typ)
    if item is not None:
        return f"list of {item.__name__}"
    return getattr(typ, "__name__", str(typ))


def _list_item_type(typ):
    """The item type of a list option (``tuple[int, ...]`` -> int), else None."""
    if typing.get_origin(typ) is tuple:
        args = [a for a in typing.get_args(typ) if a is not Ellipsis]
        return args[0] if args else str
    return None


def _format(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(_format(v) for v in value)
    return str(value)


def _convert(pass_name: str, key: str, typ: type, text: str):
    item = _list_item_type(typ)
    if item is not None:  # a list option: items separated by commas, optionally in braces
        text = text.strip()
        if text[:1] in "{[" and text[-1:] in "}]":
            text = text[1:-1]
        return tuple(_convert(pass_name, key, item, t.strip()) for t in text.split(",") if t.strip())
    try:
        if typ is bool:
            if text.lower() in ("1", "true", "on", "yes", ""):
                return True
            if text.lower() in ("0", "false", "off", "no"):
                return False
            raise ValueError(text)
        return typ(text)
    except ValueError:
        raise PassOptionError(
            f"option '{key}' of pass '{pass_name}' expects {type_name(typ)}, got '{text}'"
        ) from None
