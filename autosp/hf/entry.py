"""The Hugging Face integration's entry points: :func:`sequence_parallel` and :data:`Trainer`.

They compose the integration's mixins onto a trainer class: :mod:`autosp.hf.trainer`'s
(data, gradients, token counts, evaluation, saving) and, for TRL's online RL trainers,
:mod:`autosp.hf.rl`'s (generations shared by the SP group). Above both, so neither imports
the other's entry.
"""
from __future__ import annotations

from typing import Any

import transformers

from autosp.hf.rl import rl_bases
from autosp.hf.trainer import _SequenceParallelMixin


def sequence_parallel(trainer_cls: type) -> type:
    """A subclass of ``trainer_cls`` (``transformers.Trainer`` or any subclass, e.g. TRL's
    ``SFTTrainer``) that trains the model with autosp's sequence parallelism. It takes two more
    keyword arguments: ``sp_size`` (ranks per sequence-parallel group; default: the world) and
    ``autosp_options`` (options of :func:`autosp.compile`, e.g. ``{"checkpointing": "sac"}``).

    Example::

        >>> from trl import SFTTrainer
        >>> SPSFTTrainer = autosp.hf.sequence_parallel(SFTTrainer)
        >>> trainer = SPSFTTrainer(model=model, args=config, train_dataset=ds, sp_size=2)
    """
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, transformers.Trainer)):
        raise TypeError(f"sequence_parallel expects a transformers.Trainer class, got {trainer_cls!r}")
    if getattr(trainer_cls, "_autosp_sequence_parallel", False):
        return trainer_cls
    # GRPO/RLOO (rl_bases): the SP group shares its replica's generations
    name = f"SequenceParallel{trainer_cls.__name__}"
    doc = (f"``{trainer_cls.__module__}.{trainer_cls.__qualname__}`` with autosp sequence parallelism "
           f"(autosp.hf.sequence_parallel); extra arguments ``sp_size`` and ``autosp_options``.")
    return type(name, (*rl_bases(trainer_cls), _SequenceParallelMixin, trainer_cls),
                {"__doc__": doc, "__module__": __name__, "__qualname__": name})


Trainer: Any = sequence_parallel(transformers.Trainer)
Trainer.__doc__ = ("``transformers.Trainer`` with autosp sequence parallelism: ``autosp.hf.Trainer(model=..., "
                   "args=..., train_dataset=..., sp_size=2)``. See :mod:`autosp.hf.trainer`.")
