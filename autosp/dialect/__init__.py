"""The ``autosp`` dialect, defined in IRDL (``autosp.irdl.mlir``).

It is loaded into every context autosp creates (:func:`autosp.ir.make_context`) and can
be loaded into ``torch-mlir-opt`` with ``--irdl-file=$(python -m autosp.dialect)``.
"""
from __future__ import annotations

from pathlib import Path

IRDL_FILE = Path(__file__).with_name("autosp.irdl.mlir")
