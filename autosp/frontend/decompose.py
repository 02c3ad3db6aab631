"""Decomposition: an exported program -> the same program in the ops the importer takes.

``ExportedProgram.run_decompositions`` retraces the whole program through AOTAutograd:
a metadata pass and a graph pass, each through functionalization's wrapper tensors,
under the export's symbolic shapes. On the suite's models that was about 60 % of a
compile. When the program writes to no tensor, one retrace is enough: :func:`decompose`
runs the program's graph through ``make_fx`` under the export's own fake mode (the same
ShapeEnv, so the same symbols), with the same table and the same composite ops kept
whole as ``run_decompositions``, keeping each node's metadata (source lines become MLIR
locations). ``python bench/compile_time.py --decompositions`` compares the two.

It falls back to ``run_decompositions`` where functionalization is needed: a program
torch.export gave with an in-place op on a value it computes (``w /= w.sum(-1)`` in
Mixtral's router), or a decomposed graph that writes; and where the retrace raises, so
that torch's own path decides, and explains, what cannot be decomposed. The result's
``graph_module.meta[DECOMPOSED_BY]`` says which path ran, and why. In a graph nothing
writes, an alias (a view of the whole tensor) is its input: aliases are dropped, as
functionalization drops them. Sizes are read from the inputs (:func:`_sizes_from_symbols`).

Example::

    >>> decomposed = decompose(exported, table)     # an ExportedProgram, as run_decompositions returns
"""
from __future__ import annotations

import operator
import os
from collections.abc import Iterator

import sympy
import torch
import torch.fx
from torch.export.graph_signature import ExportGraphSignature, OutputSpec, SymIntArgument, TensorArgument

# AUTOSP_DECOMPOSE=aot: always decompose with run_decompositions (to compare, or to rule this path out).
DECOMPOSE_ENV = "AUTOSP_DECOMPOSE"
DECOMPOSED_BY = "autosp_decomposed_by"  # in the result's graph_module.meta: "retrace", or "run_decompositions: why"


def writing_nodes(graph: torch.fx.Graph) -> Iterator[torch.fx.Node]:
    """The calls of ``graph`` to an op whose schema writes to an argument."""
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            yield node


def writes(graph: torch.fx.Graph) -> str | None:
    """The first op of ``graph`` whose schema writes to an argument, else None."""
    node = next(writing_nodes(graph), None)
    return None if node is None else str(node.target)


def why_not(program: torch.export.ExportedProgram) -> str | None:
    """Why :func:`decompose` must take ``run_decompositions`` for ``program``, or None."""
    if os.environ.get(DECOMPOSE_ENV) == "aot":
        return f"{DECOMPOSE_ENV}=aot"
    op = writes(program.graph)
    return f"the program writes to a tensor it computes ({op})" if op else None


def decompose(program: torch.export.ExportedProgram, table: dict) -> torch.export.ExportedProgram:
    """``program.run_decompositions(table)``, by one retrace when the program writes to no
    tensor (see the module's docstring)."""
    why = why_not(program)
    if why is None:
        try:
            decomposed = _retrace(program, table)
        except Exception as e:  # noqa: BLE001 # torch's own path decides (and explains) what this one cannot trace
            why = f"the retrace raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        else:
            op = writes(decomposed.graph)
            if op is None:
                decomposed.graph_module.meta[DECOMPOSED_BY] = "retrace"
                return decomposed
            why = f"the decomposed program writes to a tensor ({op})"
    decomposed = program.run_decompositions(table)
    decomposed.graph_module.meta[DECOMPOSED_BY] = f"run_decompositions: {why}"
    return decomposed


def _retrace(program: torch.export.ExportedProgram, table: dict) -> torch.export.ExportedProgram:
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch.export.exported_program import (
        ExportedProgram,
        _get_updated_module_call_graph,
        _get_updated_range_constraints,
        _override_composite_implicit_decomp,
        _split_decomp_table_to_cia_and_python_decomp,
    )
    from torch.fx.experimental.proxy_tensor import make_fx

    # As run_decompositions: the table's composite ops decomposed by its entries, every
    # other composite op kept whole (SDPA, softmax...), the rest of the table in make_fx.
    composite, python_table = _split_decomp_table_to_cia_and_python_decomp(dict(table))
    graph_module = program.graph_module
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    values = [n.meta["val"] for n in placeholders]

    def run(*args):
        with torch.fx.traceback.preserve_node_meta():  # each new node gets its source node's metadata
            return torch.fx.Interpreter(graph_module).run(*args)

    # (the caller's saved-tensor hooks, e.g. a memory counter around a call that compiles,
    # see identity hooks instead: autograd records the fake trace as it records export's)
    with detect_fake_mode(values), _override_composite_implicit_decomp(composite), enable_python_dispatcher(), \
            torch.autograd.graph.saved_tensors_hooks(_same, _same):
        traced = make_fx(run, decomposition_table=python_table, tracing_mode="real", pre_dispatch=False,
                         record_stack_traces=False)(*values)
    graph = traced.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.alias.default:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    _sizes_from_symbols(graph)
    for new, old in zip((n for n in graph.nodes if n.op == "placeholder"), placeholders, strict=True):
        new.name = new.target = old.name  # the signature's input names
        new.meta.update(old.meta)
    graph.lint()
    traced.recompile()
    traced.meta.update(graph_module.meta)

    signature = program.graph_signature
    outputs = []
    for spec, node in zip(signature.output_specs, graph.output_node().args[0], strict=True):
        arg = spec.arg
        if isinstance(arg, TensorArgument | SymIntArgument):
            arg = type(arg)(name=node.name)
        outputs.append(OutputSpec(kind=spec.kind, arg=arg, target=spec.target))
    new_signature = ExportGraphSignature(input_specs=list(signature.input_specs), output_specs=outputs)
    return ExportedProgram(
        root=traced, graph=graph, graph_signature=new_signature, state_dict=program.state_dict,
        range_constraints=_get_updated_range_constraints(traced, program.range_constraints),
        module_call_graph=_get_updated_module_call_graph(graph_module, signature, traced, new_signature,
                                                         program.module_call_graph),
        example_inputs=program.example_inputs, constants=program.constants)


def _same(t):
    return t


# A size, stride or element count read from a tensor the program computes.
_SIZE_QUERIES = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default, torch.ops.aten.sym_stride.int,
                 torch.ops.aten.sym_storage_offset.default)


# Functions of sizes the trace writes (no effect but their value).
_SIZE_ARITHMETIC = (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
                    torch.sym_max, torch.sym_min)


def _sizes_from_symbols(graph: torch.fx.Graph) -> None:
    """Each size make_fx read from a computed tensor (``numel`` of a slice, for a view's
    ``-1``), written instead as the arithmetic of the input sizes it equals (its symbolic
    expression), as functionalization's trace writes it: the passes follow sizes back to
    the inputs' symbols, not through a tensor's metadata. A size whose value is a symbol
    is read once, from the first input that has it (the labels' length is the ids'
    length; a stride ``sym_max(S, 1)`` with S >= 2 is S). An expression beyond ``+``,
    ``*``, ``//`` and ``%`` raises (and :func:`decompose` falls back)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    symbols: dict = {}  # sympy symbol -> (placeholder, dim)
    for p in placeholders:
        value = p.meta.get("val")
        if isinstance(value, torch.Tensor):
            for d, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    symbols.setdefault(size.node.expr, (p, d))
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod  # (private: a torch without it falls back)
    made: dict = {}  # sympy symbol -> its sym_size node

    def symbol(expr):
        if expr not in made:
            if expr not in symbols:
                raise NotImplementedError(f"no input has the size {expr}")
            p, d = symbols[expr]
            with graph.inserting_after(placeholders[-1]):
                node = graph.call_function(torch.ops.aten.sym_size.int, (p, d))
            node.meta["val"] = p.meta["val"].shape[d]
            made[expr] = node
        return made[expr]

    def build(expr, before):
        """(a node or an int, its value) computing ``expr``."""
        if expr.is_Integer:
            return int(expr), int(expr)
        if expr.is_Symbol:
            node = symbol(expr)
            return node, node.meta["val"]
        if isinstance(expr, sympy.Add | sympy.Mul):
            op = operator.add if isinstance(expr, sympy.Add) else operator.mul
            terms = [build(a, before) for a in expr.args]
            node, value = terms[0]
            for term, term_value in terms[1:]:
                with graph.inserting_before(before):
                    node = graph.call_function(op, (node, term))
                value = op(value, term_value)
                node.meta["val"] = value
            return node, value
        if isinstance(expr, FloorDiv | PythonMod | Mod):
            op = operator.floordiv if isinstance(expr, FloorDiv) else operator.mod
            (a, a_value), (b, b_value) = (build(x, before) for x in expr.args)
            with graph.inserting_before(before):
                node = graph.call_function(op, (a, b))
            node.meta["val"] = op(a_value, b_value)
            return node, node.meta["val"]
        raise NotImplementedError(f"the size {expr} ({type(expr).__name__})")

    for node in list(graph.nodes):
        if node.op != "call_function" or node in made.values():
            continue
        value = node.meta.get("val")
        query = node.target in _SIZE_QUERIES
        if isinstance(value, torch.SymInt) and value.node.expr.is_Integer:
            value = int(value.node.expr)
        if isinstance(value, torch.SymInt) and value.node.expr in symbols:
            replacement = symbol(value.node.expr)  # (also a sym_max(s, 1) the trace wrote for a stride)
        elif not query or node.args[0].op == "placeholder":
            continue  # arithmetic the trace wrote, or an input's static size or stride: as it is
        elif isinstance(value, torch.SymInt):
            replacement = build(value.node.expr, node)[0]
        elif isinstance(value, int):
            replacement = value
        else:
            raise NotImplementedError(f"{node.target} of {value!r}")
        _replace_uses(node, replacement)
        if query or node.target in _SIZE_ARITHMETIC:
            graph.erase_node(node)


def _replace_uses(node: torch.fx.Node, replacement) -> None:
    """Every use of ``node`` reads ``replacement`` (a node, or a constant) instead."""
    def swap(a):
        return replacement if a is node else a
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, swap)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, swap)
