"""The CUDA path checked without a GPU: a compiled program's training step as CUDA runs it.

:func:`cuda_step` compiles a model as :func:`autosp.compile` would for ``sp_size`` ranks
(on meta weights: an 8B config needs no memory), then runs one forward and backward of a
simulated rank with every attention call on **CUDA's kernels** (``kernels.target("cuda")``:
each runtime branch takes its CUDA path and the CUDA kernels' meta implementations give
their shapes, saved tensors and allocations). It records, per rank:

- every dispatched op with its input shapes (:attr:`CudaStep.ops`), and the attention
  kernels among them (:attr:`CudaStep.attention`);
- every allocation and free, as the memory model counts them (peak live bytes, bytes saved
  for backward);
- every tensor handed to a collective or a ring send, with its bytes
  (:class:`autosp.runtime.collectives.WireRecord`).

:meth:`CudaStep.problems` lists what would be wrong on a GPU, and :meth:`CudaStep.check`
raises on them:

- **quadratic tensors**: a tensor created with two sequence-sized dims (each one of the
  lengths a rank's sequence shard, a ring piece or the whole sequence has): S x S masks or
  scores, or a ring pair's (S/P) x (S/P) scores. A length equal to a model dim (S/16 =
  4096 = hidden at S = 64K) cannot be told from it by shape and is left out
  (:attr:`CudaStep.ambiguous`): check at :func:`clear_length` instead;
- **math attention**: ``F.scaled_dot_product_attention`` reached on CUDA (its kernel choice
  is made at run time and may fall to math), the math kernel's fallback warning, or the
  CPU kernel dispatched for a CUDA program;
- **collectives NCCL refuses**: a non-contiguous input, or a dtype NCCL has no type for.

Why meta and not fake CUDA tensors: on a CPU-only build, autograd aborts the process as
soon as a fake CUDA tensor that requires grad enters the graph (the autograd engine asks
the CUDA device guard for a stream). So the step runs on meta tensors that stand for CUDA
ones; the CUDA kernels' meta implementations are the ones ``FakeTensorMode`` would run.
What the kernels *compute* is checked separately, on CPU against eager attention with the
kernels emulated to their contracts (python_tests/unit/test_cuda_kernels.py).

Example::

    >>> config = transformers.AutoConfig.from_pretrained("bench/configs/llama-3-8b.json")
    >>> step = cuda_step(config, 131072, sp_size=8, call="position_ids")[-1]   # the last rank
    >>> step.check()                       # no S x S tensor, no math attention, NCCL-ready collectives
    >>> step.kernels()                     # {'varlen flash': 32, 'varlen flash backward': 32, ...}
"""
from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from autosp.options import MeshOptions
from autosp.runtime import collectives

if TYPE_CHECKING:
    from autosp.planning.estimate import MemoryEstimate

aten = torch.ops.aten

ATTENTION_KERNELS = {
    aten._scaled_dot_product_flash_attention.default: "flash",
    aten._scaled_dot_product_flash_attention_backward.default: "flash backward",
    aten._flash_attention_forward.default: "varlen flash",
    aten._flash_attention_backward.default: "varlen flash backward",
    aten._scaled_dot_product_efficient_attention.default: "efficient",
    aten._scaled_dot_product_efficient_attention_backward.default: "efficient backward",
    aten._scaled_dot_product_flash_attention_for_cpu.default: "cpu flash",
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: "cpu flash backward",
}
# The dtypes ProcessGroupNCCL maps to an NCCL type (bool travels as uint8).
NCCL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
               torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)
CALLS = ("plain", "position_ids", "padded", "packed")


def trainer_call(kind: str, ids: torch.Tensor) -> dict:
    """The keyword arguments besides ``input_ids`` and ``labels`` of a call ``kind``, for
    ids [B, S] on any device (meta: no values), as trainers call models:

    - ``plain``: none;
    - ``position_ids``: ``position_ids`` and an all-ones ``attention_mask`` (HF Trainer with
      a padding collator on full rows; the compiler proves causal + key padding);
    - ``padded``: ``position_ids`` and an ``attention_mask`` with right padding (a quarter
      of each row, where the ids have values);
    - ``packed``: ``position_ids`` restarting every 1024 tokens, no mask (TRL's padding-free
      packing; the compiler proves attention within documents).
    """
    b, s = ids.shape
    dev = ids.device
    if kind == "plain":
        return {}
    if kind == "packed":
        return {"position_ids": (torch.arange(s, device=dev) % 1024)[None].expand(b, s)}
    if kind not in CALLS:
        raise ValueError(f"unknown call {kind!r} (calls: {', '.join(CALLS)})")
    mask = torch.ones(b, s, dtype=torch.long, device=dev)
    if kind == "padded" and dev.type != "meta":
        mask[:, -max(1, s // 4):] = 0
    return {"position_ids": torch.arange(s, device=dev)[None].expand(b, s), "attention_mask": mask}


def sequence_sizes(seq_len: int, sp_size: int) -> set[int]:
    """The lengths a sequence piece can have at ``seq_len`` over ``sp_size`` ranks: the
    whole sequence, each rank's chunk (Ulysses, a ring's frame) and each zigzag piece."""
    sizes = {seq_len}
    for parts in {sp_size, 2 * sp_size, *[d for d in range(1, sp_size + 1) if sp_size % d == 0],
                  *[2 * d for d in range(1, sp_size + 1) if sp_size % d == 0]}:
        sizes.update({seq_len // parts, -(-seq_len // parts)})
    return {n for n in sizes if n > 1}


@dataclass
class OpRecord:
    name: str
    shapes: tuple


@dataclass
class CudaStep:
    """One simulated rank's training step on CUDA's kernels (see the module docstring)."""
    seq_len: int
    sp_size: int
    rank: int
    ops: list = field(default_factory=list)          # [OpRecord]
    attention: list = field(default_factory=list)    # [(kernel, shapes)]
    wire: list = field(default_factory=list)         # [WireRecord]
    quadratic: list = field(default_factory=list)    # [(op, shape)]
    math: list = field(default_factory=list)         # what reached math attention
    warnings: list = field(default_factory=list)     # autosp's kernel fallback warnings
    ambiguous: list = field(default_factory=list)  # sequence sizes equal to a model dim: not checked
    peak_bytes: int = 0
    activation_peak_bytes: int = 0
    saved_bytes: int = 0
    estimate: MemoryEstimate | None = None

    def kernels(self) -> dict:
        """Attention kernel calls by kernel name."""
        return dict(Counter(k for k, _ in self.attention))

    def wire_bytes(self) -> dict:
        """Bytes handed to collectives, by kind (forward and backward together)."""
        out: Counter = Counter()
        for w in self.wire:
            out[w.kind] += w.bytes
        return dict(out)

    def problems(self) -> list[str]:
        """What would be wrong on a GPU: quadratic tensors, math attention, collectives
        NCCL refuses (one line each, at most five of a kind)."""
        out = [f"a tensor with two sequence dims: {op} -> {list(shape)}" for op, shape in self.quadratic[:5]]
        out += [f"math attention on CUDA: {what}" for what in self.math[:5]]
        for w in self.wire:
            if not w.contiguous:
                out.append(f"a non-contiguous {w.kind} input {list(w.shape)} over {w.group}")
            if w.dtype not in NCCL_DTYPES:
                out.append(f"a {w.kind} of {w.dtype} over {w.group}: NCCL has no such type")
        return out

    def check(self) -> CudaStep:
        """Raise AssertionError listing :meth:`problems`; return self when there are none."""
        found = self.problems()
        if found:
            raise AssertionError(f"the CUDA step of rank {self.rank} (S = {self.seq_len}, P = {self.sp_size}):\n  "
                                 + "\n  ".join(found))
        return self


class _Recorder(TorchDispatchMode):
    """Every op with its input shapes; attention kernels; tensors with two sequence dims."""

    def __init__(self, step: CudaStep, sizes: set[int], keep_ops: bool):
        super().__init__()
        self.step, self.sizes, self.keep_ops = step, sizes, keep_ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        if self.keep_ops:
            self.step.ops.append(OpRecord(str(func), shapes))
        kernel = ATTENTION_KERNELS.get(func)
        if kernel is not None:
            self.step.attention.append((kernel, shapes))
            if kernel.startswith("cpu"):
                self.step.math.append(f"{func} (the CPU kernel) in a CUDA program")
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            # (a dim broadcast with stride 0, e.g. a key bias expanded over the queries, holds nothing)
            if isinstance(t, torch.Tensor) and sum(1 for n, st in zip(t.shape, t.stride())
                                                   if n in self.sizes and st != 0) >= 2:
                self.step.quadratic.append((str(func), tuple(t.shape)))
        return out


class _NoHighLevelSdpa(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` on a CUDA program's tensors: its run-time kernel
    choice (math on fake CUDA) is what the explicit kernels replace."""

    def __init__(self, step: CudaStep):
        super().__init__()
        self.step = step

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            self.step.math.append(f"F.scaled_dot_product_attention{shapes}")
        return func(*args, **(kwargs or {}))


class _Watch:
    """The harness's context around one rank's step (MemoryModel.estimate's ``watch``)."""

    def __init__(self, step: CudaStep, keep_ops: bool, model_dims: set[int] = frozenset()):  # type: ignore[assignment]
        self.step = step
        sizes = sequence_sizes(step.seq_len, step.sp_size)
        step.ambiguous = sorted(sizes & model_dims)
        self.recorder = _Recorder(step, sizes - model_dims, keep_ops)
        self.function_mode = _NoHighLevelSdpa(step)
        self.wire = collectives.observe()
        self.caught = warnings.catch_warnings(record=True)

    def __enter__(self):
        from autosp.runtime import kernels
        kernels._WARNED.clear()  # each step reports its own fallbacks
        self._log = self.caught.__enter__()
        warnings.simplefilter("always")
        self.wire.__enter__()
        self.function_mode.__enter__()
        self.recorder.__enter__()
        return self

    def __exit__(self, *exc):
        self.recorder.__exit__(*exc)
        self.function_mode.__exit__(*exc)
        self.wire.__exit__(*exc)
        self.caught.__exit__(*exc)
        self.step.wire = list(self.wire.records)
        for w in self._log:
            text = str(w.message)
            if text.startswith("autosp:") and " on CUDA" in text:
                self.step.warnings.append(text)
                if "math kernel" in text:
                    self.step.math.append(text)


def model_dims(module: torch.nn.Module) -> set[int]:
    """Every size of every parameter and buffer dim (hidden, ffn, vocab, head dims...): a
    sequence length equal to one of them cannot be told apart from it by shape, so the
    quadratic check leaves it out (:attr:`CudaStep.ambiguous`; :func:`clear_length` gives
    a length without such collisions)."""
    return {n for t in [*module.parameters(), *module.buffers()] for n in t.shape if n > 1}


def clear_length(seq_len: int, sp_size: int, dims: set[int]) -> int:
    """The smallest length >= ``seq_len``, a multiple of ``2 * sp_size`` unless ``seq_len``
    itself is clear, none of whose :func:`sequence_sizes` is one of ``dims``."""
    if not sequence_sizes(seq_len, sp_size) & dims:
        return seq_len
    n = seq_len + 2 * sp_size - seq_len % (2 * sp_size)
    while sequence_sizes(n, sp_size) & dims:
        n += 2 * sp_size
    return n


def cuda_step(model_or_config, seq_len: int, *, sp_size: int = 1, call="position_ids", batch: int = 1,
              checkpointing: str = "off", dtype: torch.dtype = torch.bfloat16, ranks=None, fsdp: int = 1,
              mesh: MeshOptions | Mapping | None = None, plan=None, keep_ops: bool = False, model=None) -> list[CudaStep]:
    """One training step of ``model_or_config`` (as :func:`autosp.planning.estimate.estimate_memory`
    takes it) at ``seq_len`` over ``sp_size`` ranks on CUDA's kernels, per simulated rank
    in ``ranks`` (default: the first and the last). ``call``: a :data:`CALLS` name or a
    function of the meta ids returning the call's other keyword arguments. ``mesh`` (e.g.
    ``{"strategy": "ring"}``), ``checkpointing``, ``plan`` (a MemoryPlan), ``fsdp``: as for
    the memory model. ``model``: an already built :class:`autosp.planning.estimate.MemoryModel` to
    reuse (its compilation is the slow part). ``keep_ops``: keep every op (large)."""
    from autosp.planning.estimate import MemoryModel
    inputs = call if callable(call) else (lambda ids: trainer_call(call, ids))
    if model is None:
        model = MemoryModel(model_or_config, sp_size, dtype, checkpointing, batch=batch, fsdp=fsdp, inputs=inputs,
                            plan=plan, mesh=mesh, device="cuda")
    dims = model_dims(model.model)
    steps = []
    for r in (ranks if ranks is not None else sorted({0, sp_size - 1})):
        step = CudaStep(seq_len, sp_size, r)
        est = model.estimate(seq_len, watch=lambda rank, step=step: _Watch(step, keep_ops, dims), rank=r)
        step.peak_bytes, step.activation_peak_bytes, step.saved_bytes = (
            est.peak_bytes, est.activation_peak_bytes, est.saved_bytes)
        step.estimate = est
        steps.append(step)
    return steps
