"""examples/train.py's model and its state: build, FSDP, checkpoints, memory.

Model: --size picks a preset (tiny, small, 1b, 8b = Llama-3-8B's shape; default tiny);
--model DIR loads a local Hugging Face model directory (config.json + safetensors,
nothing is downloaded) instead; the two are exclusive. No rank holds the whole model: it
is built on the meta device, sharded (--fsdp), then each rank allocates its own part and
fills it: from the safetensors files, reading only its rows (model.safetensors or a
sharded checkpoint's index), or with the preset's seeded initialisation, one tensor at a
time. --save-hf DIR writes a Hugging Face checkpoint at the end (config.json +
model.safetensors, loadable by from_pretrained; a preset as a LlamaForCausalLM), one
gathered tensor at a time.

--fsdp shards the model state with FSDP2 (fully_shard on each decoder block, then on
the root) over all ranks before autosp.compile; --no-fsdp keeps it replicated. By default
FSDP is off on one rank and, on more, on when the model state (16 bytes per parameter:
weights, gradients and AdamW's fp32 moments) exceeds 1/8 of a GPU's memory (the CUDA
device's, or --gpu-gib): on for --size 1b and 8b, off for tiny and small.

Checkpoints (torch.distributed.checkpoint, with or without FSDP, any world size):
--save DIR writes model, optimizer and step to DIR/step-NNNNNN after the last step and
every --save-every N steps; --resume DIR (a step folder, or DIR for its latest one)
loads them and continues up to --steps (the total step count). --init-from FILE.pt loads
a torch.save'd plain state_dict of the unsharded model (sharded or not).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import resource
import shutil

import torch
import torch.distributed as dist
from train_launch import UsageError

from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike

SIZES = LLAMA_PRESETS  # tiny, small, 1b, 8b (Llama-3-8B's shape)
# Model state per parameter under AdamW: weights + gradients + two fp32 moments (fp32: 4 + 4
# + 8; bf16: 2 + 2 + 8 + a 4-byte fp32 master copy). FSDP turns on by itself (world > 1) when
# that exceeds this fraction of one GPU's memory.
STATE_BYTES_PER_PARAM = 16
FSDP_AUTO_FRACTION = 1 / 8
GiB = 1 << 30


def check_options(args) -> None:
    """Raise :class:`UsageError` for a bad --model / --size, --save-every, --resume or
    --init-from; set the default --size, and --resume to the checkpoint folder it names."""
    if args.model is not None:
        if args.size is not None or args.layers is not None:
            raise UsageError("--model DIR loads its own configuration: drop --size/--layers, or drop --model")
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            raise UsageError(f"--model {args.model}: no config.json there (a local Hugging Face model directory "
                             "is expected)")
        if not getattr(args, "from_scratch", False) and not any(
                os.path.isfile(os.path.join(args.model, f)) for f in ("model.safetensors", "model.safetensors.index.json")):
            raise UsageError(f"--model {args.model}: no model.safetensors or model.safetensors.index.json there "
                             "(the weights are read by slice from safetensors files; convert a .bin checkpoint "
                             "with save_pretrained)")
    elif args.size is None:
        args.size = "tiny"
    if getattr(args, "from_scratch", False):
        if args.model is None:
            raise UsageError("--from-scratch needs --model DIR (a preset is always built from its seeded "
                             "initialisation)")
        if getattr(args, "verify", False):
            raise UsageError("--from-scratch with --verify: the single-device reference is loaded from the checkpoint; "
                             "drop one of them")
    if args.save_every is not None:
        if args.save is None:
            raise UsageError("--save-every needs --save DIR")
        if args.save_every < 1:
            raise UsageError(f"--save-every must be >= 1, got {args.save_every}")
    if getattr(args, "save_hf", None) is not None and os.path.isfile(args.save_hf):
        raise UsageError(f"--save-hf {args.save_hf}: a file is there, not a directory")
    if args.resume is not None and args.init_from is not None:
        raise UsageError("--resume and --init-from both set the starting weights: pass one")
    if args.init_from is not None and not os.path.isfile(args.init_from):
        raise UsageError(f"--init-from {args.init_from}: no such file")
    if args.resume is not None:
        args.resume = resolve_checkpoint(args.resume)


# ---------------------------------------------------------------- the model
def model_config(args) -> LlamaConfig:
    """The preset model's configuration: --size, with --layers and a --seq-long position table."""
    cfg_kwargs = dict(SIZES[args.size])
    if args.layers:
        cfg_kwargs["layers"] = args.layers
    return LlamaConfig(max_positions=max(2048, args.seq), **cfg_kwargs)


def build_model(args, dtype: torch.dtype) -> tuple[torch.nn.Module, int, str]:
    """(the model in ``dtype`` with its parameters on the meta device, its vocabulary size,
    a description). Its buffers are real (computed by the constructors, e.g. the rotary
    inverse frequencies); its weights are put in place after sharding by :func:`place_model`
    (the checkpoint's, or the preset's initialisation): no rank builds the whole model."""
    with parameters_on_meta():
        model, vocab, description = _construct(args)
    return model.to(dtype), vocab, description


def build_plain_model(args, dtype: torch.dtype) -> torch.nn.Module:
    """The same model built the ordinary way, whole, on the CPU: ``from_pretrained`` for
    --model, the seeded constructor for a preset (--verify's single-device reference)."""
    if args.model:
        from transformers import AutoModelForCausalLM
        # from_pretrained returns the model in eval mode, which is kept: no dropout, so the
        # SP run and --verify's reference compute the same function.
        model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa", local_files_only=True)
        return model.to(dtype)
    torch.manual_seed(args.seed)
    return LlamaLike(model_config(args)).to(dtype)


def _construct(args) -> tuple[torch.nn.Module, int, str]:
    """The model's constructor (under :func:`parameters_on_meta`), its vocabulary, a description."""
    if args.model:
        from transformers import AutoConfig, AutoModelForCausalLM
        cfg = AutoConfig.from_pretrained(args.model, local_files_only=True)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        model.eval()  # as from_pretrained returns it: no dropout (see build_plain_model)
        return (model, cfg.vocab_size,
                f"Hugging Face '{cfg.model_type}' from {args.model}, {cfg.num_hidden_layers} layers")
    cfg = model_config(args)
    return LlamaLike(cfg), cfg.vocab, f"Llama-style '{args.size}' {cfg.layers} layers"


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside get their parameters on the meta device (shapes only, no memory)
    and keep their buffers where their constructors make them (the CPU)."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def is_hf(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face model (not the preset LlamaLike)."""
    return not isinstance(model, LlamaLike)


def model_loss(model, ids: torch.Tensor, hf: bool, position_ids: torch.Tensor | None = None,
               labels: torch.Tensor | None = None) -> torch.Tensor:
    """The training loss of one batch (labels = inputs by default, shifted inside the model):
    LlamaLike returns a dict with "loss", a Hugging Face model a ModelOutput with ``.loss``.
    --pack passes its ``position_ids`` and ``labels`` (train_data.make_packed_batch); no
    attention_mask, so a Hugging Face model masks attention per document from the
    position_ids resets (use_cache=False: no cache, which that detection needs); the
    preset model gets ``document_ids`` too, numbered from the resets."""
    labels = ids if labels is None else labels
    extra = {} if position_ids is None else {"position_ids": position_ids}
    if position_ids is not None and not hf:  # the preset model takes document ids: 0, 1, ... per row
        extra["document_ids"] = (position_ids == 0).cumsum(-1)
    if hf:
        out = model(input_ids=ids, labels=labels, use_cache=False, **extra)
    else:
        out = model(ids, labels=labels, **extra)
    return out["loss"] if isinstance(out, dict) and "loss" in out else out.loss


def count_params(model: torch.nn.Module) -> int:
    """The number of parameters (a tied weight counted once)."""
    return sum(p.numel() for p in model.parameters())  # parameters() lists a tied weight once


def local_param_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters this rank holds (its shards under FSDP)."""
    from torch.distributed.tensor import DTensor
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
               for p in model.parameters())


# ---------------------------------------------------------------- FSDP
def auto_fsdp(n_params: int, world: int, gpu_bytes: float) -> bool:
    """The default of --fsdp: on with more than one rank when the model state does not
    comfortably fit one GPU (more than FSDP_AUTO_FRACTION of its memory)."""
    return world > 1 and n_params * STATE_BYTES_PER_PARAM > FSDP_AUTO_FRACTION * gpu_bytes


def gpu_memory_bytes(args, device) -> float:
    """One GPU's memory: the CUDA device's, else --gpu-gib."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return args.gpu_gib * GiB


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards one by one: LlamaLike's blocks, a Hugging Face model's
    decoder layers (``model.model.layers``, or the classes its ``_no_split_modules`` names)."""
    if isinstance(model, LlamaLike):
        return list(model.blocks)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is not None:
        return list(layers)
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise UsageError(f"--fsdp: cannot find the decoder layers of {type(model).__name__}")
    return blocks


def shard_model(model: torch.nn.Module) -> int:
    """FSDP2 over the whole world: fully_shard each decoder block, then the root; returns
    the number of blocks."""
    from torch.distributed.fsdp import fully_shard
    blocks = decoder_blocks(model)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return len(blocks)


def place_model(model: torch.nn.Module, args, device, world: int) -> tuple[str, int]:
    """Put ``model`` (built by :func:`build_model`, parameters on the meta device) where it
    trains: sharded with FSDP2 (--fsdp, or by default when :func:`auto_fsdp` says so) or
    whole on ``device``; then give each rank's parameters their values (:func:`materialise`).
    Returns a description for the header and the checkpoint bytes this rank read."""
    n_params, gpu = count_params(model), gpu_memory_bytes(args, device)
    fsdp = args.fsdp if args.fsdp is not None else auto_fsdp(n_params, world, gpu)
    if fsdp:
        n_blocks = shard_model(model)  # shards of meta parameters, on the mesh's device type
        text = f"FSDP on (fully_shard on {n_blocks} blocks + the root, over {world} ranks)"
    else:
        text = "FSDP off"
    if args.fsdp is None and world > 1:
        text += (f" [automatic: model state {n_params * STATE_BYTES_PER_PARAM / GiB:.1f} GiB "
                 f"{'>' if fsdp else '<='} 1/{round(1 / FSDP_AUTO_FRACTION)} of {gpu / GiB:.0f} GiB]")
    return text, materialise(model, args, device)


# ---------------------------------------------------------------- weights
def materialise(model: torch.nn.Module, args, device) -> int:
    """Allocate this rank's part of ``model``'s parameters on ``device`` (its FSDP shards, or
    the whole model when replicated) and fill it: --model from its safetensors files, each
    rank reading only its own rows (:func:`load_hf_weights`); a preset with the seeded
    initialisation of its constructor (:func:`init_preset`). Buffers keep the values their
    constructors computed (the rotary inverse frequencies: not in any checkpoint); tied
    parameters stay tied. Returns the checkpoint bytes read (0 for a preset)."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    ties = _aliases(model)
    # Swapping keeps each Parameter object (tied ones stay one object); FSDP2 swaps by itself.
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    params = dict(model.named_parameters(remove_duplicate=False))
    for names in ties:
        if any(params[n] is not params[names[0]] for n in names):
            raise RuntimeError(f"tied parameters {names} came apart when the model was materialised")
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
        if args.model and getattr(args, "from_scratch", False):
            init_from_scratch(model, args.seed)
            return 0
        if args.model:
            return load_hf_weights(model, args.model)
        init_preset(model, args.seed)
        return 0


def init_from_scratch(model: torch.nn.Module, seed: int) -> None:
    """--from-scratch: each rank fills its own part of every parameter in place (no whole
    tensor, no checkpoint): normal(0, 0.02) for matrices, one for vectors named like a norm's
    weight, zero for other vectors (biases). Seeded per rank; not the weights one device
    would draw (it trains a fresh model; --verify refuses it)."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    for name, p in model.named_parameters():
        local, _ = local_part(p)
        owner = name.rpartition(".")[0].rpartition(".")[2]  # the module's own name: "input_layernorm"
        if local.dim() >= 2:
            local.copy_(torch.empty(local.shape, dtype=torch.float32).normal_(std=0.02, generator=gen))
        elif "norm" in owner:
            local.fill_(1.0)
        else:
            local.zero_()


def _aliases(model: torch.nn.Module) -> list[list[str]]:
    """The names of each parameter, grouped by parameter (a tied one has several), in order."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return list(groups.values())


def local_part(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's part of parameter or buffer ``t`` (its FSDP shard, or ``t`` whole) and where
    it starts in the whole tensor (an offset per dimension)."""
    from torch.distributed.tensor import DTensor
    if not isinstance(t, DTensor):
        return t.detach(), (0,) * t.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local = t.to_local().detach()
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if tuple(local.shape) != tuple(shape):
        raise RuntimeError(f"a shard of shape {tuple(local.shape)} where {tuple(shape)} was expected")
    return local, tuple(offset)


def init_preset(model: torch.nn.Module, seed: int) -> None:
    """Fill a meta-built preset (LlamaLike) as ``torch.manual_seed(seed); LlamaLike(cfg)``
    does, one whole tensor at a time, keeping this rank's part of each: the constructor's
    draws replayed in its order (nn.Linear's kaiming-uniform and nn.Embedding's normal
    defaults), then :func:`autosp.models.init_weights` (normal(0, 0.02), in module order: a
    tied weight takes the last draw), RMSNorm weights at one."""
    from autosp.models import RMSNorm
    torch.manual_seed(seed)
    for m in model.modules():  # the constructor's own draws: they move the generator
        if isinstance(m, torch.nn.Linear):
            w = torch.empty(m.out_features, m.in_features)
            torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            if m.bias is not None:
                bound = 1 / math.sqrt(m.in_features) if m.in_features > 0 else 0
                torch.empty(m.out_features).uniform_(-bound, bound)
        elif isinstance(m, torch.nn.Embedding):
            torch.empty(m.num_embeddings, m.embedding_dim).normal_()
    for m in model.modules():
        for name, p in m.named_parameters(recurse=False):
            local, offset = local_part(p)
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) and name == "weight":
                full = torch.empty(p.shape).normal_(std=0.02)
                local.copy_(full[tuple(slice(o, o + n) for o, n in zip(offset, local.shape))])
            elif isinstance(m, torch.nn.Linear) and name == "bias":
                local.zero_()
            elif isinstance(m, RMSNorm) and name == "weight":
                local.fill_(1.0)
            else:
                raise RuntimeError(f"init_preset: no rule for the parameter {name} of {type(m).__name__}")


class SafetensorsCheckpoint:
    """The tensors of a Hugging Face safetensors checkpoint: ``model.safetensors``, or the
    files ``model.safetensors.index.json`` maps them to. :meth:`read` copies a block of a
    tensor (a range of rows, say) with plain file reads into the caller's tensor: nothing is
    memory-mapped, so the process holds what it asked for and no more. ``bytes_read``
    counts the tensor bytes read."""

    DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}

    def __init__(self, directory: str):
        index, single = (os.path.join(directory, f) for f in ("model.safetensors.index.json", "model.safetensors"))
        if os.path.isfile(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.isfile(single):
            files = ["model.safetensors"]
        else:
            raise UsageError(f"{directory}: no model.safetensors or model.safetensors.index.json (the weights are "
                             "read by slice from safetensors files; convert a .bin checkpoint with save_pretrained)")
        self.directory, self.bytes_read = directory, 0
        self.tensors: dict[str, tuple[str, torch.dtype, tuple[int, ...], int]] = {}  # name: file, dtype, shape, start
        self._files: dict[str, object] = {}
        for file in files:
            path = os.path.join(directory, file)
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if info["dtype"] not in self.DTYPES:
                    raise UsageError(f"{path}: tensor '{name}' has dtype {info['dtype']}, which this loader does not read")
                self.tensors[name] = (path, self.DTYPES[info["dtype"]], tuple(info["shape"]), 8 + n + info["data_offsets"][0])

    def read(self, name: str, out: torch.Tensor, offset: tuple[int, ...]) -> None:
        """Copy the block of tensor ``name`` that starts at ``offset`` and has ``out``'s shape
        into ``out``: the rows it spans are read (whole rows: an FSDP shard's rows are one
        contiguous range), converted to ``out``'s dtype and device if they differ."""
        path, dtype, shape, start = self.tensors[name]
        if len(shape) == 0:
            rows, lo, row_elems = 1, 0, 1
        else:
            rows, lo, row_elems = out.shape[0], offset[0], math.prod(shape[1:])
        block = torch.empty((rows,) + tuple(shape[1:]), dtype=dtype) if len(shape) else torch.empty((), dtype=dtype)
        direct = (out.device.type == "cpu" and out.dtype == dtype and out.is_contiguous()
                  and tuple(out.shape) == tuple(block.shape))
        if direct:
            block = out
        size = rows * row_elems * block.element_size()
        buffer = memoryview(block.view(-1).view(torch.uint8).numpy()) if size else memoryview(b"")
        f = self._files.get(path) or self._files.setdefault(path, open(path, "rb", buffering=0))
        f.seek(start + lo * row_elems * block.element_size())
        got = 0
        while got < size:
            n = f.readinto(buffer[got:])
            if not n:
                raise RuntimeError(f"{path}: tensor '{name}' is cut short")
            got += n
        self.bytes_read += size
        if not direct:
            inner = tuple(slice(o, o + n) for o, n in zip(offset[1:], out.shape[1:]))
            out.copy_(block[(slice(None),) + inner] if len(shape) else block)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def load_hf_weights(model: torch.nn.Module, directory: str) -> int:
    """Fill this rank's part of every parameter and persistent buffer of ``model`` from the
    safetensors checkpoint in ``directory``, reading only that part (an FSDP shard's rows);
    a tied parameter is read once, under any of its names. A tensor the model has and the
    checkpoint lacks, one of another shape, or one the checkpoint has and the model does not
    use is a :class:`UsageError` naming it. Returns the bytes read."""
    ckpt = SafetensorsCheckpoint(directory)
    entries: dict[int, tuple[torch.Tensor, list[str]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        entries.setdefault(id(p), (p, []))[1].append(name)
    for name, b in _persistent_buffers(model):
        entries.setdefault(id(b), (b, []))[1].append(name)
    used: set[str] = set()
    try:
        for t, names in entries.values():
            name = next((n for n in names if n in ckpt.tensors), None)
            if name is None:
                tied = f" (nor under its tied names {names[1:]})" if len(names) > 1 else ""
                raise UsageError(f"--model {directory}: the checkpoint has no tensor '{names[0]}'{tied}")
            shape = ckpt.tensors[name][2]
            if shape != tuple(t.shape):
                raise UsageError(f"--model {directory}: tensor '{name}' has shape {list(shape)} in the checkpoint, "
                                 f"the model expects {list(t.shape)}")
            local, offset = local_part(t)
            ckpt.read(name, local, offset)
            used.update(names)
    finally:
        ckpt.close()
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()]
    unused = sorted(n for n in ckpt.tensors if n not in used and not any(r.search(n) for r in ignored))
    if unused:
        raise UsageError(f"--model {directory}: the checkpoint has tensors the model does not use: "
                         f"{', '.join(unused[:5])}" + (f" and {len(unused) - 5} more" if len(unused) > 5 else ""))
    return ckpt.bytes_read


def _persistent_buffers(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The buffers a state_dict holds (not the non-persistent ones), by name."""
    out = []
    for prefix, m in model.named_modules():
        for name, b in m.named_buffers(recurse=False):
            if b is not None and name not in m._non_persistent_buffers_set:
                out.append((f"{prefix}.{name}" if prefix else name, b))
    return out


# ---------------------------------------------------------------- checkpoints
def checkpoint_dir(root: str, step: int) -> str:
    """The folder of step ``step``'s checkpoint under --save ``root``."""
    return os.path.join(root, f"step-{step:06d}")


def resolve_checkpoint(path: str) -> str:
    """The checkpoint folder ``--resume path`` names: ``path`` itself when it holds a DCP
    checkpoint (``.metadata``), else its latest ``step-NNNNNN`` folder that does."""
    if not os.path.isdir(path):
        raise UsageError(f"--resume {path}: no such directory")
    if os.path.isfile(os.path.join(path, ".metadata")):
        return path
    steps = sorted(d for d in os.listdir(path)
                   if d.startswith("step-") and os.path.isfile(os.path.join(path, d, ".metadata")))
    if not steps:
        raise UsageError(f"--resume {path}: not a checkpoint (no .metadata, no step-NNNNNN folder holding one)")
    return os.path.join(path, steps[-1])


def save_checkpoint(path: str, model, opt, step: int, seed: int) -> None:
    """Model, optimizer, step (and the data seed) with torch.distributed.checkpoint:
    each rank writes its shards; any world size can load them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd,
              "progress": {"step": torch.tensor(step), "seed": torch.tensor(seed)}}, checkpoint_id=path,
             no_dist=not dist.is_initialized())


def load_checkpoint(path: str, model, opt, load_optimizer: bool = True) -> tuple[int, int]:
    """Load a :func:`save_checkpoint` folder into ``model`` and ``opt`` (resharded to this
    world); returns (step, seed). ``load_optimizer=False`` leaves ``opt`` fresh (the tests'
    negative control)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )
    progress = {"step": torch.tensor(0), "seed": torch.tensor(0)}
    if load_optimizer:
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd, "progress": progress}
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        state = {"model": get_model_state_dict(model), "progress": progress}
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
        set_model_state_dict(model, state["model"])
    return int(progress["step"]), int(progress["seed"])


def load_plain_state_dict(model, path: str) -> dict:
    """--init-from: a torch.save'd plain state_dict of the unsharded model, loaded into
    ``model`` (FSDP-sharded or not); returns the state_dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    state = torch.load(path, map_location="cpu", weights_only=True)
    # A shallow copy: under FSDP, set_model_state_dict replaces the dict's tensors by shards.
    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True))
    return state


# ---------------------------------------------------------------- Hugging Face checkpoints
_ST_CODES = {v: k for k, v in SafetensorsCheckpoint.DTYPES.items()}
# The preset's names -> transformers' LlamaForCausalLM's (the same computation: RMSNorm,
# RoPE on halves, SwiGLU, GQA, tied embeddings).
_PRESET_TO_HF = [(r"^embed\.", "model.embed_tokens."), (r"^norm\.", "model.norm."),
                 (r"^blocks\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
                 (r"^blocks\.(\d+)\.mlp_norm\.", r"model.layers.\1.post_attention_layernorm."),
                 (r"^blocks\.(\d+)\.attn\.", r"model.layers.\1.self_attn."),
                 (r"^blocks\.(\d+)\.mlp\.(gate|up|down)\.", r"model.layers.\1.mlp.\2_proj.")]


def hf_config(model: torch.nn.Module, dtype: torch.dtype):
    """The transformers configuration of ``model``: a Hugging Face model's own, a preset's
    as a LlamaConfig; its ``dtype`` the weights'."""
    import copy

    import transformers
    if is_hf(model):
        config = copy.deepcopy(model.config)
    else:
        c = model.cfg
        config = transformers.LlamaConfig(
            vocab_size=c.vocab, hidden_size=c.hidden, intermediate_size=c.ffn or 4 * c.hidden,
            num_hidden_layers=c.layers, num_attention_heads=c.heads, num_key_value_heads=c.kv_heads or c.heads,
            head_dim=c.head_dim, max_position_embeddings=c.max_positions, rms_norm_eps=c.eps,
            rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
            tie_word_embeddings=c.tie_embeddings, attention_bias=False, mlp_bias=False)
        config.architectures = ["LlamaForCausalLM"]
    config.dtype = dtype
    return config


def hf_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name in a Hugging Face checkpoint, tensor) of each parameter (a tied one once, under
    its first name, as save_pretrained keeps it) and persistent buffer of ``model``."""
    out = list(model.named_parameters()) + _persistent_buffers(model)
    if is_hf(model):
        return out
    renamed = []
    for name, t in out:
        for pattern, repl in _PRESET_TO_HF:
            name = re.sub(pattern, repl, name)
        renamed.append((name, t))
    return renamed


def save_hf_checkpoint(directory: str, model: torch.nn.Module, dtype: torch.dtype, source: str | None = None) -> int:
    """--save-hf: write ``model`` as a Hugging Face checkpoint that ``from_pretrained`` loads
    (config.json and one model.safetensors; with --model, the source directory's tokenizer and
    generation files beside them). A collective under FSDP: every rank gathers one tensor's
    whole value at a time (``full_tensor``) and rank 0 streams it into the file, whose header
    is written first from the shapes; no rank holds more than one whole tensor. Returns the
    bytes written (rank 0; 0 elsewhere)."""
    from torch.distributed.tensor import DTensor
    rank = dist.get_rank() if dist.is_initialized() else 0
    tensors = hf_tensors(model)
    header, at = {}, 0
    for name, t in tensors:
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_CODES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + n]}
        at += n
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    f = None
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        hf_config(model, dtype).save_pretrained(directory)
        if source:
            for name in os.listdir(source):
                if name.startswith("tokenizer") or name in ("special_tokens_map.json", "generation_config.json",
                                                            "vocab.json", "merges.txt", "chat_template.jinja"):
                    shutil.copy(os.path.join(source, name), directory)
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index):
            os.remove(index)  # a sharded checkpoint saved there before would shadow this one
        f = open(os.path.join(directory, "model.safetensors.tmp"), "wb")
        f.write(len(text).to_bytes(8, "little") + text)
    try:
        with torch.no_grad():
            for _, t in tensors:
                full = t.full_tensor() if isinstance(t, DTensor) else t.detach()
                if f is not None:
                    f.write(full.cpu().contiguous().view(-1).view(torch.uint8).numpy().data)
                del full
    finally:
        if f is not None:
            f.close()
    if f is not None:
        os.replace(os.path.join(directory, "model.safetensors.tmp"), os.path.join(directory, "model.safetensors"))
    if dist.is_initialized():
        dist.barrier()
    return 8 + len(text) + at if rank == 0 else 0


# ---------------------------------------------------------------- memory
def peak_memory_mib(device) -> float:
    """CUDA: the caching allocator's peak of tensor bytes (max_memory_allocated). CPU: the
    process's peak resident set size (getrusage), which counts everything it maps (Python,
    libraries, the compiler), not allocator bytes."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def memory_label(device) -> str:
    """What :func:`peak_memory_mib` measures on ``device``, for the column and the summary."""
    return "peak alloc" if device.type == "cuda" else "peak RSS"
