"""autosp: automatic sequence parallelism for PyTorch transformers, as an MLIR compiler.

Public API::

    autosp.compile(model, sp_size=None, ...)   # -> nn.Module, compiled at the first call
    autosp.import_model(model, *args, **kw)    # -> ImportedModel (torch-dialect MLIR + argument records)
    autosp.run_pipeline(module, "builtin.module(autosp-dce)")
    autosp.emit_graph_module(module)           # -> torch.fx.GraphModule
"""
from autosp.api import AutospModule, compile
from autosp.backend.fx_emitter import emit_graph_module
from autosp.frontend.importer import ImportedModel, import_model
from autosp.ir.diagnostics import AutospError, DiagnosticError
from autosp.pipeline import PipelineError, run_pipeline

__version__ = "0.1.0"

__all__ = ["AutospError", "AutospModule", "DiagnosticError", "ImportedModel", "PipelineError", "__version__",
           "compile", "emit_graph_module", "import_model", "run_pipeline"]
