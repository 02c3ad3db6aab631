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
from autosp.hf.trainer import FusedLogProbsOutput, SequenceParallelModel, Trainer, sequence_parallel

__all__ = ["FusedLogProbsOutput", "SequenceParallelModel", "Trainer", "sequence_parallel"]
