"""The base class of autosp passes.

A pass is a small frozen dataclass: ``name`` (``autosp-…``), a one-line ``summary``
(the first line of its docstring) and typed option fields, spelled in kebab case on
the command line (``sp_size: int`` <-> ``sp-size=4``). ``apply`` transforms a
``builtin.module`` in place and raises :class:`~autosp.ir.diagnostics.DiagnosticError`
on bad input. Passes never import the pipeline, the API or the CLI.

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
    def from_options(cls, options: dict[str, str]) -> "ModulePass":
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
        """``{sp-size=4}`` for the non-default options (empty string if none)."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or value != f.default:
                if isinstance(value, bool):
                    value = "true" if value else "false"
                parts.append(f"{f.name.replace('_', '-')}={value}")
        return "{" + " ".join(parts) + "}" if parts else ""

    def pipeline_text(self) -> str:
        return self.name + self.option_string()

    def apply(self, module: ir.Operation) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def _convert(pass_name: str, key: str, typ: type, text: str):
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
            f"option '{key}' of pass '{pass_name}' expects {typ.__name__}, got '{text}'"
        ) from None
