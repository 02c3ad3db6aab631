"""``python -m autosp.tools.layout_docs [--write]``: the module map of docs/DESIGN.md §4 from the tree.

Every module of ``autosp/`` and ``passes/`` with the first sentence of its docstring, package by
package, read with ``ast`` (nothing is imported). ``--write`` replaces the text between the
``<!-- layout:begin -->`` and ``<!-- layout:end -->`` markers of docs/DESIGN.md; a test keeps
that text equal to this output, so §4 never drifts from the tree: a new module without a
docstring, or one moved, fails it.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
BEGIN, END = "<!-- layout:begin -->", "<!-- layout:end -->"


def summary(path: Path) -> str:
    """The first sentence of the module's docstring (its first paragraph, joined)."""
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=True) or ""
    first = " ".join(doc.strip().split("\n\n", 1)[0].split())
    match = re.match(r"(.+?\.)(\s|$)", first)
    sentence = match.group(1) if match else first
    if len(sentence) > 160:
        sentence = sentence[:160].rsplit(" ", 1)[0] + " …"
    return sentence.replace("|", "\\|")


def _packages() -> list[tuple[str, Path]]:
    pkg = ROOT / "autosp"
    subs = sorted(p for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    return [("autosp/", pkg)] + [(f"autosp/{p.name}/", p) for p in subs] + [("passes/ (autosp.passes)", ROOT / "passes")]


def render() -> str:
    """Markdown: one table per package, a row per module (the package's ``__init__`` first)."""
    lines = ["Generated from the module docstrings by `python -m autosp.tools.layout_docs --write`.", ""]
    for title, folder in _packages():
        lines += [f"**{title}** {summary(folder / '__init__.py')}", "", "| module | what |", "|---|---|"]
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                lines.append(f"| `{path.name}` | {summary(path) or '(no docstring)'} |")
        lines.append("")
    return "\n".join(lines)


def current() -> str:
    """The text between the markers in docs/DESIGN.md."""
    text = DESIGN.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n")


def write() -> None:
    text = DESIGN.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DESIGN.write_text(f"{head}{BEGIN}\n{render()}\n{END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(render())
