"""examples/train.py's model and its state: build, FSDP, checkpoints, memory.

Model: --size picks a preset (tiny, small, 1b, 8b = Llama-3-8B's shape; default tiny);
--model DIR loads a local Hugging Face model directory (config.json + safetensors,
nothing is downloaded) instead; the two are exclusive.

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

import os
import resource

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
    elif args.size is None:
        args.size = "tiny"
    if args.save_every is not None:
        if args.save is None:
            raise UsageError("--save-every needs --save DIR")
        if args.save_every < 1:
            raise UsageError(f"--save-every must be >= 1, got {args.save_every}")
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
    """(the model on the CPU in ``dtype``, its vocabulary size, a description)."""
    if args.model:
        from transformers import AutoModelForCausalLM
        # from_pretrained returns the model in eval mode, which is kept: no dropout, so the
        # SP run and --verify's reference compute the same function.
        model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa", local_files_only=True)
        cfg = model.config
        return (model.to(dtype), cfg.vocab_size,
                f"Hugging Face '{cfg.model_type}' from {args.model}, {cfg.num_hidden_layers} layers")
    cfg = model_config(args)
    torch.manual_seed(args.seed)
    return LlamaLike(cfg).to(dtype), cfg.vocab, f"Llama-style '{args.size}' {cfg.layers} layers"


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


def place_model(model: torch.nn.Module, args, device, world: int) -> str:
    """Put ``model`` where it trains: sharded with FSDP2 (--fsdp, or by default when
    :func:`auto_fsdp` says so) or whole on ``device``; returns a description for the header."""
    n_params, gpu = count_params(model), gpu_memory_bytes(args, device)
    fsdp = args.fsdp if args.fsdp is not None else auto_fsdp(n_params, world, gpu)
    if fsdp:
        n_blocks = shard_model(model)  # moves the shards to the mesh's device
        text = f"FSDP on (fully_shard on {n_blocks} blocks + the root, over {world} ranks)"
    else:
        model.to(device)
        text = "FSDP off"
    if args.fsdp is None and world > 1:
        text += (f" [automatic: model state {n_params * STATE_BYTES_PER_PARAM / GiB:.1f} GiB "
                 f"{'>' if fsdp else '<='} 1/{round(1 / FSDP_AUTO_FRACTION)} of {gpu / GiB:.0f} GiB]")
    return text


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
