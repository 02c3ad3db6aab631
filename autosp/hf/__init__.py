"""Hugging Face integrations: ``transformers.Trainer`` and its subclasses (TRL) with autosp.

Example::

    import autosp.hf
    trainer = autosp.hf.Trainer(model=model, args=args, train_dataset=ds, sp_size=2)
    trainer.train()

    from trl import SFTTrainer
    trainer = autosp.hf.sequence_parallel(SFTTrainer)(model=model, args=config, train_dataset=ds, sp_size=2)

See :mod:`autosp.hf.trainer` for what the integration does with data, gradients, token
counts, evaluation and saving.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["FusedLogProbsOutput", "SequenceParallelModel", "Trainer", "sequence_parallel"]

if TYPE_CHECKING:
    from autosp.hf.entry import Trainer, sequence_parallel
    from autosp.hf.trainer import FusedLogProbsOutput, SequenceParallelModel


def __getattr__(name: str):
    # The Trainer integration imports transformers, and only where a user asks for it: a
    # core install (no transformers) imports ``autosp.hf`` without it.
    if name in ("Trainer", "sequence_parallel"):
        from autosp.hf import entry
        return getattr(entry, name)
    if name in __all__:
        from autosp.hf import trainer
        return getattr(trainer, name)
    raise AttributeError(f"module 'autosp.hf' has no attribute {name!r}")
