"""Frontend: PyTorch model -> torch-dialect MLIR (see :mod:`autosp.frontend.importer`)."""
from autosp.frontend.importer import ArgInfo, ImportedModel, import_model, read_arguments

__all__ = ["ArgInfo", "ImportedModel", "import_model", "read_arguments"]
