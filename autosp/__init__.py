"""autosp: automatic sequence parallelism for PyTorch transformers, as an MLIR compiler.

Public API::

    autosp.compile(model, sp_size=None, ...)   # -> nn.Module, compiled at the first call
    autosp.import_model(model, *args, **kw)    # -> ImportedModel (torch-dialect MLIR + argument records)
    autosp.run_pipeline(module, "builtin.module(autosp-dce)")
    autosp.emit_graph_module(module)           # -> torch.fx.GraphModule
    autosp.estimate_memory("8b", seq_len=131072, sp_size=8, checkpointing="sac")  # -> MemoryEstimate
    autosp.max_context(80 * 2**30, "8b", sp_size=8, checkpointing="sac")          # -> tokens
    autosp.measure_step(lambda: model(ids, labels=ids)["loss"], model.parameters())  # -> MemoryReport

Names are imported lazily, so tools that only touch the IR (``autosp-opt``) do not pay
for importing torch's export machinery.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "compile": "autosp.api", "AutospModule": "autosp.api",
    "emit_graph_module": "autosp.backend.fx_emitter",
    "import_model": "autosp.frontend.importer", "ImportedModel": "autosp.frontend.importer",
    "AutospError": "autosp.ir.diagnostics", "DiagnosticError": "autosp.ir.diagnostics",
    "run_pipeline": "autosp.pipeline", "PipelineError": "autosp.pipeline",
    "estimate_memory": "autosp.planning.estimate", "max_context": "autosp.planning.estimate", "MemoryEstimate": "autosp.planning.estimate",
    "measure_step": "autosp.planning.memory", "MemoryReport": "autosp.planning.memory",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autosp' has no attribute '{name}'")
