"""Train a Llama-style decoder with autosp sequence parallelism: the main job.

    torchrun --nproc-per-node 2 examples/train.py --size tiny --seq 256 --steps 20 --verify

Every rank of a sequence-parallel group feeds the same full batch, exactly as it would
call the single-device model; autosp shards the sequence, and with more ranks than
--sp the groups are data-parallel replicas (each its own batch, gradients averaged).
Synthetic tokens by default; --data takes a text file (bytes as tokens) or a tokenised
.npy / .bin (uint16) array. The batch of step k is a function of (--seed, k) only: sample
i of a step comes from its own generator seeded by (seed, step, i), and replica r takes
samples r*B .. (r+1)*B-1 (B = --batch), so a run resumed at another world size (same
global batch) feeds the same batches. The printed loss is the global one: with several
replicas, the mean of their losses (the objective whose gradient the replicas average).
--verify also trains the single-device model on rank 0 with the same batches (with several
replicas, every replica's batch: it steps on the mean of their losses) and prints both
losses each step; with --dtype bf16 it trains an fp32 single-device model too, and asks
that SP be as close to fp32 as one device in bf16 is (one bf16 step of slack). The exit
code is non-zero on every rank when the check fails. The memory column is the peak
resident set size of each process on CPU (getrusage: everything the process holds, not
only tensors), torch.cuda.max_memory_allocated on CUDA (the caching allocator's tensors).

--pack packs whole documents into each row of --seq tokens, as pretraining does: a text
file's documents are its paragraphs (split on blank lines; one document per line when the
file has no blank line), a tokenised file's end at each --doc-sep ID token (kept as its
last token), synthetic ones are counting runs of random lengths. A row concatenates
documents greedily from a random one on; documents longer than --seq are first split into
pieces of --seq tokens, and the row's last document is cut at the row's end.
position_ids restart at 0 at every document, and each document's first label is -100, so
no token is predicted from another document; no attention_mask is passed, and the Hugging
Face model masks attention per document from the position_ids resets (a preset model is
also given document_ids, numbered from the resets). The compiled model and --verify's
reference get the same inputs.

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

--dry-run trains nothing: it compiles the model on the meta device and prints a rank's
memory plan (parameters, gradients, optimizer state, activation peak, total) against
--gpu-gib, for --world N simulated ranks (no torchrun needed; --sp defaults to N). A plan
that does not fit names the flag to try next, from what dominates it: a further
--checkpointing rung for activations, --fsdp (and ranks to shard over) for model state,
else more ranks or a real run with --memory-budget.
Runs on CPU (gloo) or CUDA (nccl); without torchrun it runs as a world of one.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import re
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import autosp  # noqa: E402
from autosp import AutospError  # noqa: E402
from autosp.driver import CHECKPOINTING
from autosp.units import parse_bytes  # noqa: E402
from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike  # noqa: E402

SIZES = LLAMA_PRESETS  # tiny, small, 1b, 8b (Llama-3-8B's shape)
# Model state per parameter under AdamW: weights + gradients + two fp32 moments (fp32: 4 + 4
# + 8; bf16: 2 + 2 + 8 + a 4-byte fp32 master copy). FSDP turns on by itself (world > 1) when
# that exceeds this fraction of one GPU's memory.
STATE_BYTES_PER_PARAM = 16
FSDP_AUTO_FRACTION = 1 / 8
GiB = 1 << 30


class UsageError(Exception):
    """A bad option found after the process group exists (every rank finds it alike)."""


class BudgetError(UsageError):
    """--memory-budget below what the compiler can plan: autosp's planner raises it at the
    first step's compilation on every rank (each sequence-parallel group plans the same
    shapes, and a group's first rank hands its error to the others)."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default=None, help="model preset (default: tiny)")
    p.add_argument("--model", metavar="DIR",
                   help="a local Hugging Face model directory (config.json + safetensors), loaded with "
                        "AutoModelForCausalLM.from_pretrained(DIR, local_files_only=True); not with --size/--layers")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--seq", type=int, default=256, help="sequence length (need not divide by --sp)")
    p.add_argument("--batch", type=int, default=2, help="sequences per data-parallel replica per step")
    p.add_argument("--sp", type=int, help="sequence-parallel size (default: all ranks)")
    p.add_argument("--sp-strategy", choices=["auto", "ulysses", "ring", "hybrid"], default="auto",
                   help="how attention is split over the sequence-parallel ranks (default: chosen)")
    p.add_argument("--steps", type=int, default=20, help="total steps (a resumed run continues up to this one)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--compile", action="store_true", help="compile the emitted module with Inductor")
    p.add_argument("--checkpointing", choices=CHECKPOINTING, default="off",
                   help="sac: keep attention, recompute the rest of each layer in backward; "
                        "sac-min: keep attention's output only, recompute q/k/v and their all-to-alls; "
                        "full: keep only each layer's input")
    p.add_argument("--memory-budget", default=None,
                   help="bytes per rank the step must fit (e.g. 40MiB, 70GiB): the compiler plans per-layer "
                        "checkpointing, tiled loss/MLP and offload with its memory model and prints the plan")
    p.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=None,
                   help="shard parameters, gradients and optimizer state with FSDP2 over all ranks "
                        "(fully_shard per decoder block, then the root). Default: off on one rank; on more, on "
                        f"when {STATE_BYTES_PER_PARAM} bytes per parameter exceed 1/{round(1 / FSDP_AUTO_FRACTION)} "
                        "of a GPU's memory (the CUDA device's, else --gpu-gib): on for --size 1b and 8b")
    p.add_argument("--verify", action="store_true", help="train the single-device model alongside on rank 0")
    p.add_argument("--data", help="text file, or tokenised .npy/.bin (uint16) file")
    p.add_argument("--pack", action="store_true",
                   help="pack whole documents into each row: position_ids restart at each document, whose first "
                        "label is ignored (documents: a text file's paragraphs, or one per line "
                        "without blank lines; a tokenised file's split at --doc-sep; else synthetic)")
    p.add_argument("--doc-sep", type=int, metavar="ID",
                   help="with --pack and a tokenised --data file: the token id that ends each document (e.g. the "
                        "tokenizer's end-of-text id), kept as the document's last token")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="DIR",
                   help="save model, optimizer and step with torch.distributed.checkpoint to DIR/step-NNNNNN "
                        "after the last step (and every --save-every steps)")
    p.add_argument("--save-every", type=int, metavar="N", help="with --save: also save every N steps")
    p.add_argument("--resume", metavar="DIR",
                   help="continue from a --save checkpoint (a step-NNNNNN folder, or the --save DIR for its "
                        "latest); any world size, --sp or --fsdp")
    p.add_argument("--init-from", metavar="FILE",
                   help="start from a torch.save'd plain state_dict() of the unsharded model (works with --fsdp)")
    p.add_argument("--dry-run", action="store_true",
                   help="train nothing: compile on the meta device and print a rank's memory plan")
    p.add_argument("--world", type=int, metavar="N",
                   help="with --dry-run: the number of ranks to plan for (default: torchrun's, else 1)")
    p.add_argument("--gpu-gib", type=float, default=80.0,
                   help="GPU memory per rank in GiB: --dry-run's budget, and the automatic --fsdp rule off CUDA "
                        "(default 80)")
    # Hidden debug knobs for the tests' negative controls.
    p.add_argument("--debug-sp-loss-offset", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--debug-raise-on-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    _check_options(args)
    return args


def _fail(message: str):
    """A one-line error for a bad option (before any process group exists)."""
    raise SystemExit(f"train.py: error: {message}")


def _check_options(args) -> None:
    if args.model is not None:
        if args.size is not None or args.layers is not None:
            _fail("--model DIR loads its own configuration: drop --size/--layers, or drop --model")
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            _fail(f"--model {args.model}: no config.json there (a local Hugging Face model directory is expected)")
    elif args.size is None:
        args.size = "tiny"
    if args.save_every is not None:
        if args.save is None:
            _fail("--save-every needs --save DIR")
        if args.save_every < 1:
            _fail(f"--save-every must be >= 1, got {args.save_every}")
    if args.resume is not None and args.init_from is not None:
        _fail("--resume and --init-from both set the starting weights: pass one")
    if args.init_from is not None and not os.path.isfile(args.init_from):
        _fail(f"--init-from {args.init_from}: no such file")
    if args.resume is not None:
        args.resume = resolve_checkpoint(args.resume)
    if args.world is not None and not args.dry_run:
        _fail("--world simulates ranks for --dry-run only; under torchrun the world is --nproc-per-node")
    if args.memory_budget is not None:
        try:
            parse_bytes(args.memory_budget)
        except AutospError as e:
            _fail(f"--memory-budget {args.memory_budget}: {e}")
    if args.dry_run:
        if args.memory_budget is not None:
            _fail("--dry-run plans the --checkpointing you give; --memory-budget is planned by the compiler at "
                  "a real run's first step: drop --dry-run (or --memory-budget)")
        for flag in ("verify", "save", "resume", "init_from", "data", "pack"):
            if getattr(args, flag):
                _fail(f"--dry-run trains nothing: --{flag.replace('_', '-')} does not apply")
        if args.world is not None and args.world < 1:
            _fail(f"--world must be >= 1, got {args.world}")
    elif args.fsdp and "RANK" not in os.environ:
        _fail("--fsdp shards over the ranks of a torchrun job: run under torchrun")
    _check_pack_options(args)


def _check_pack_options(args) -> None:
    tokenised = args.data is not None and args.data.endswith((".npy", ".bin"))
    if args.doc_sep is not None:
        if not args.pack:
            _fail("--doc-sep splits documents for --pack: add --pack")
        if not tokenised:
            _fail("--doc-sep applies to a tokenised --data file (.npy/.bin); a text file's documents are its "
                  "paragraphs (split on blank lines)")
    if not args.pack:
        return
    if tokenised and args.doc_sep is None:
        _fail(f"--pack with the tokenised file {args.data} needs --doc-sep ID, the token id that ends each "
              "document (e.g. the tokenizer's end-of-text id)")


def checkpoint_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:06d}")


def resolve_checkpoint(path: str) -> str:
    """The checkpoint folder ``--resume path`` names: ``path`` itself when it holds a DCP
    checkpoint (``.metadata``), else its latest ``step-NNNNNN`` folder that does."""
    if not os.path.isdir(path):
        _fail(f"--resume {path}: no such directory")
    if os.path.isfile(os.path.join(path, ".metadata")):
        return path
    steps = sorted(d for d in os.listdir(path)
                   if d.startswith("step-") and os.path.isfile(os.path.join(path, d, ".metadata")))
    if not steps:
        _fail(f"--resume {path}: not a checkpoint (no .metadata, no step-NNNNNN folder holding one)")
    return os.path.join(path, steps[-1])


def load_tokens(path: str | None, vocab: int) -> torch.Tensor | None:
    """All tokens of a dataset as one 1-D tensor (None: synthetic data)."""
    if path is None:
        return None
    import numpy as np
    if path.endswith(".npy"):
        data = np.load(path)
    elif path.endswith(".bin"):
        data = np.fromfile(path, dtype=np.uint16)
    else:
        data = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)
    tokens = torch.from_numpy(data.astype(np.int64)) % vocab
    return tokens


def sample_seed(seed: int, step: int, index: int) -> int:
    """The generator seed of sample ``index`` of step ``step``'s global batch."""
    return ((seed * 1_000_003 + step) * 1_000_033 + index) % (1 << 63)


def make_batch(step: int, args, vocab: int, tokens, replica: int) -> torch.Tensor:
    """Replica ``replica``'s ``args.batch`` sequences of step ``step``: samples
    ``replica * batch ...`` of the step's global batch, each a function of (seed, step, its
    index) only, so the batches of a step do not depend on the world size or on resuming."""
    rows = []
    for i in range(args.batch):
        gen = torch.Generator().manual_seed(sample_seed(args.seed, step, replica * args.batch + i))
        if tokens is None:
            # A learnable synthetic language: each sequence counts up from a random start.
            start = int(torch.randint(0, vocab, (1,), generator=gen))
            rows.append((start + torch.arange(args.seq)) % vocab)
        else:
            start = int(torch.randint(0, len(tokens) - args.seq - 1, (1,), generator=gen))
            rows.append(tokens[start:start + args.seq])
    return torch.stack(rows)


# ---------------------------------------------------------------- --pack
@dataclass
class Documents:
    """The documents of a --data file for --pack: document ``i`` is ``tokens[starts[i]:ends[i]]``
    (token ids already taken modulo the vocabulary), none longer than a row."""

    tokens: torch.Tensor
    starts: torch.Tensor
    ends: torch.Tensor
    summary: str  # how they were found, for the run's header

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[int(self.starts[i]):int(self.ends[i])]

    def cycle(self, first: int) -> Iterator[torch.Tensor]:
        """Documents ``first, first + 1, ...`` in file order, wrapping around, without end."""
        i = first
        while True:
            yield self[i % len(self)]
            i += 1


def load_documents(path: str | None, vocab: int, seq: int, doc_sep: int | None = None) -> Documents | None:
    """--pack's documents of a --data file (None: synthetic documents, see :func:`synthetic_documents`).

    A text file (bytes as tokens) is split on blank lines (lines holding only whitespace)
    into paragraphs, each stripped of surrounding whitespace; a file without any blank
    line holds one document per line. A tokenised .npy/.bin file is split after every
    ``doc_sep`` token (compared before the modulo), which stays as its document's last
    token; a document of nothing but the separator is dropped. Empty documents are
    dropped, and documents longer than ``seq`` are split into pieces of ``seq`` tokens
    (the last one shorter), each packed as a document of its own.
    """
    if path is None:
        return None
    import numpy as np
    if path.endswith((".npy", ".bin")):
        data = (np.load(path) if path.endswith(".npy") else np.fromfile(path, dtype=np.uint16)).reshape(-1)
        data = data.astype(np.int64)
        after_sep: np.ndarray = np.flatnonzero(data == doc_sep) + 1
        if len(after_sep) == 0:
            raise UsageError(f"--doc-sep {doc_sep}: {path} holds no such token; pass the id that ends its documents")
        starts = np.concatenate([[0], after_sep])
        ends = np.concatenate([after_sep, [len(data)]])
        lone_sep = (ends - starts == 1) & (data[np.minimum(starts, len(data) - 1)] == doc_sep)
        keep = (ends > starts) & ~lone_sep
        starts, ends = starts[keep], ends[keep]
        rule = f"split after each --doc-sep {doc_sep}"
    else:
        raw = open(path, "rb").read()
        blank_lines = re.search(rb"\n[ \t\r\f\v]*\n", raw) is not None
        pieces = re.split(rb"\n(?:[ \t\r\f\v]*\n)+" if blank_lines else rb"\n", raw)
        docs = [d for d in (piece.strip() for piece in pieces) if d]
        data = np.frombuffer(b"".join(docs), dtype=np.uint8).astype(np.int64)
        ends = np.cumsum([len(d) for d in docs], dtype=np.int64)
        starts = ends - np.array([len(d) for d in docs], dtype=np.int64)
        rule = "paragraphs: split on blank lines" if blank_lines else "one per line: the file has no blank line"
    n_docs = len(starts)
    if n_docs == 0 or int((ends - starts).sum()) < seq:
        raise UsageError(f"--pack: {path} holds {n_docs} document(s), {int((ends - starts).sum())} tokens: "
                         f"fewer than one row of --seq {seq}")
    # Documents longer than a row: pieces of `seq` tokens, each its own document.
    lengths = ends - starts
    n_pieces = -(-lengths // seq)
    of_doc: np.ndarray = np.repeat(np.arange(n_docs), n_pieces)
    k = np.arange(int(n_pieces.sum())) - np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    starts = starts[of_doc] + k * seq
    ends = np.minimum(starts + seq, ends[of_doc])
    summary = f"{n_docs} documents from {path} ({rule}), mean {lengths.mean():.1f} tokens"
    if len(starts) > n_docs:
        summary += f"; {int((lengths > seq).sum())} longer than --seq {seq} split: {len(starts)} to pack"
    return Documents(torch.from_numpy(data) % vocab, torch.from_numpy(starts), torch.from_numpy(ends), summary)


def synthetic_documents(gen: torch.Generator, vocab: int, seq: int) -> Iterator[torch.Tensor]:
    """Endless synthetic documents drawn from ``gen``: each counts up from a random start
    (make_batch's language) for a random length of 1 .. max(1, seq // 2) tokens."""
    longest = max(1, seq // 2)
    while True:
        start = int(torch.randint(0, vocab, (1,), generator=gen))
        length = int(torch.randint(1, longest + 1, (1,), generator=gen))
        yield (start + torch.arange(length)) % vocab


def pack_row(documents: Iterator[torch.Tensor], seq: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One row of ``seq`` tokens packed greedily from ``documents``: (input_ids, position_ids,
    the number of documents in it). Documents are concatenated in order until the row is
    full, the last one cut at the row's end (its rest is not carried over: every row stands
    alone); position_ids count 0, 1, ... from each document's start. Empty documents are skipped.

    >>> ids, pos, n = pack_row(iter([torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10, 11])]), 5)
    >>> ids.tolist(), pos.tolist(), n
    ([5, 6, 7, 8, 9], [0, 1, 2, 0, 1], 2)
    """
    ids, positions, filled = [], [], 0
    while filled < seq:
        doc = next(documents)[:seq - filled]
        if len(doc):
            ids.append(doc)
            positions.append(torch.arange(len(doc)))
            filled += len(doc)
    return torch.cat(ids), torch.cat(positions), len(ids)


def packed_labels(ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Labels of packed rows for a model that shifts them inside (Hugging Face's convention:
    ``labels[t]`` is predicted from position t - 1): the inputs, with -100 (ignored) at each
    document's first token, so that no document's first token is predicted from the end of
    the one before it.

    >>> packed_labels(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([0, 1, 2, 0, 1])).tolist()
    [-100, 6, 7, -100, 9]
    """
    return ids.masked_fill(position_ids == 0, -100)


def make_packed_batch(step: int, args, vocab: int, documents: Documents | None,
                      replica: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """--pack's counterpart of :func:`make_batch`: replica ``replica``'s ``args.batch`` packed
    rows of step ``step`` as (input_ids, position_ids, labels, the number of documents in
    them). Each row is a function of (seed, step, its index in the global batch) only: its
    generator picks the first document (``documents``' file order follows it, wrapping
    around) or draws the synthetic documents (``documents`` None)."""
    rows, positions, count = [], [], 0
    for i in range(args.batch):
        gen = torch.Generator().manual_seed(sample_seed(args.seed, step, replica * args.batch + i))
        if documents is None:
            source = synthetic_documents(gen, vocab, args.seq)
        else:
            source = documents.cycle(int(torch.randint(0, len(documents), (1,), generator=gen)))
        ids, pos, n = pack_row(source, args.seq)
        rows.append(ids)
        positions.append(pos)
        count += n
    ids, position_ids = torch.stack(rows), torch.stack(positions)
    return ids, position_ids, packed_labels(ids, position_ids), count


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


def bf16_spacing(x: float) -> float:
    """The gap between adjacent bfloat16 numbers at |x|'s magnitude (8 significant bits).

    >>> bf16_spacing(7.0)  # 7 lies in [4, 8): 2**(2 - 7)
    0.03125
    """
    if x == 0 or not math.isfinite(x):
        return 0.0
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


@dataclass
class LossCheck:
    """The verdict of --verify: ``ok``, and the summary lines that say why."""

    ok: bool
    lines: list[str]


def check_fp32(sp: list[float], single: list[float]) -> LossCheck:
    """fp32: every step's SP loss is within 1e-3 x max(1, |first loss|) of the single-device loss.

    >>> check_fp32([5.0, 4.0], [5.0, 4.00001]).ok, check_fp32([5.0, 4.0], [5.0, 4.1]).ok
    (True, False)
    """
    tol = 1e-3 * max(1.0, abs(single[0])) if single else 0.0
    lines = [f"  verify (fp32): every step |SP loss - single-device loss| <= {tol:.1e}",
             f"  {'step':>6}  {'|SP - single|':>13}  ok"]
    ok = len(sp) == len(single)
    for i, (a, b) in enumerate(zip(sp, single)):
        d = abs(a - b)
        good = math.isfinite(a) and math.isfinite(b) and d <= tol
        ok &= good
        lines.append(f"  {i + 1:>6}  {d:13.2e}  {'yes' if good else 'NO'}")
    return LossCheck(ok, lines)


def check_bf16(sp: list[float], single: list[float], fp32: list[float]) -> LossCheck:
    """bf16: SP must be as accurate as one device in bf16, measured against an fp32 reference.

    Every step needs |SP - fp32| <= |single-device bf16 - fp32| + one bf16 step at the
    fp32 loss's magnitude (:func:`bf16_spacing`): SP may round differently (sums split
    across ranks) but must not be further from fp32 than one device is. The three losses are
    taken at the same weights (the references are reset to the SP model's weights before
    each step): bf16 weights round every update, so free-running bf16 runs wander off the
    fp32 trajectory by 0.1-0.6 after ~10 steps, each its own way, and a rule comparing them
    would judge that noise, not SP.

    >>> check_bf16([7.01], [7.02], [7.0]).ok   # SP closer to fp32 than one device
    True
    >>> check_bf16([7.10], [7.02], [7.0]).ok   # 0.10 > 0.02 + 0.03125
    False
    """
    lines = ["  verify (bf16): every step |SP - fp32| <= |single-device bf16 - fp32| + one bf16 step",
             f"  {'step':>6}  {'|SP - fp32|':>11}  {'|1-dev bf16 - fp32|':>19}  {'bf16 step':>9}  {'margin':>9}  ok"]
    ok = len(sp) == len(single) == len(fp32)
    for i, (a, b, r) in enumerate(zip(sp, single, fp32)):
        d_sp, d_single, ulp = abs(a - r), abs(b - r), bf16_spacing(r)
        margin = d_single + ulp - d_sp
        good = all(map(math.isfinite, (a, b, r))) and margin >= 0
        ok &= good
        lines.append(f"  {i + 1:>6}  {d_sp:11.2e}  {d_single:19.2e}  {ulp:9.2e}  {margin:9.2e}  "
                     f"{'yes' if good else 'NO'}")
    return LossCheck(ok, lines)


def _shutdown(device, clean: bool) -> None:
    """Leave the process group: after a barrier when every rank is known to be here.

    ``clean`` means all ranks reached the same point (the shared verdict), so a barrier is
    safe; it has a timeout, so a vanished peer cannot hang the exit. After an exception or
    an interrupt the peers may sit inside another collective: no barrier then, only destroy.
    """
    if not dist.is_available() or not dist.is_initialized():
        return
    if clean:
        try:
            kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
            dist.barrier(async_op=True, **kwargs).wait(timedelta(seconds=60))
        except Exception:  # noqa: BLE001 - a peer left; there is nothing left to wait for
            pass
    dist.destroy_process_group()


def _terminate(signum, frame):
    # torchrun sends SIGTERM to the other ranks when one fails: unwind so the finally
    # block leaves the process group instead of dying mid-collective.
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    distributed = "RANK" in os.environ
    if args.dry_run:  # one process plans for --world ranks; under torchrun, rank 0 prints it
        if int(os.environ.get("RANK", 0)) != 0:
            return 0
        return dry_run(args, args.world or int(os.environ.get("WORLD_SIZE", 1)))
    world = int(os.environ.get("WORLD_SIZE", 1)) if distributed else 1
    sp = args.sp or world
    # Checked before the process group exists: every rank fails alike, nothing to clean up.
    if world % sp:
        raise SystemExit(f"--sp {sp} must divide the number of ranks ({world})")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # FSDP2's default mesh uses the current device
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=5))
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminate)
    rank = dist.get_rank() if distributed else 0
    clean, status = False, 1
    try:
        status = 0 if train(args, device, distributed, rank, world, sp) else 1
        clean = True  # train() returned on every rank: the verdict was shared
        if status:
            print(f"rank {rank}: exit status {status}: the verify check failed", file=sys.stderr, flush=True)
    except UsageError as e:  # found alike on every rank (e.g. the checkpoint's step): one line, from rank 0
        clean, status = True, 2
        if rank == 0:
            print(f"train.py: error: {e}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"rank {rank}: interrupted", file=sys.stderr, flush=True)
        status = 130
    except Exception as e:  # noqa: BLE001 - report, leave the group, exit non-zero
        if _peer_lost(e):
            # This rank only waited on a peer that failed or left; the peer's log has the cause.
            print(f"rank {rank}: stopped: another rank failed or left ({type(e).__name__})",
                  file=sys.stderr, flush=True)
        else:
            print(f"rank {rank}: failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    finally:
        if distributed:
            _shutdown(device, clean)
    return status


def _peer_lost(e: Exception) -> bool:
    """Whether ``e`` is a collective failing because another rank went away.

    NCCL raises DistBackendError; gloo raises a plain RuntimeError naming its transport.
    """
    text = str(e)
    return isinstance(e, dist.DistBackendError) or (
        isinstance(e, RuntimeError) and "gloo" in text and ("Connection closed" in text or "Connection reset" in text))


# ---------------------------------------------------------------- model, FSDP, checkpoints
def model_config(args) -> LlamaConfig:
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
    return not isinstance(model, LlamaLike)


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


def model_loss(model, ids: torch.Tensor, hf: bool, position_ids: torch.Tensor | None = None,
               labels: torch.Tensor | None = None) -> torch.Tensor:
    """The training loss of one batch (labels = inputs by default, shifted inside the model):
    LlamaLike returns a dict with "loss", a Hugging Face model a ModelOutput with ``.loss``.
    --pack passes its ``position_ids`` and ``labels`` (:func:`make_packed_batch`); no
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


def auto_fsdp(n_params: int, world: int, gpu_bytes: float) -> bool:
    """The default of --fsdp: on with more than one rank when the model state does not
    comfortably fit one GPU (more than FSDP_AUTO_FRACTION of its memory)."""
    return world > 1 and n_params * STATE_BYTES_PER_PARAM > FSDP_AUTO_FRACTION * gpu_bytes


def gpu_memory_bytes(args, device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return args.gpu_gib * GiB


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() lists a tied weight once


def local_param_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters this rank holds (its shards under FSDP)."""
    from torch.distributed.tensor import DTensor
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
               for p in model.parameters())


def shard_model(model: torch.nn.Module) -> int:
    """FSDP2 over the whole world: fully_shard each decoder block, then the root."""
    from torch.distributed.fsdp import fully_shard
    blocks = decoder_blocks(model)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return len(blocks)


def full_params(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter whole (a collective under FSDP: call it on every rank)."""
    from torch.distributed.tensor import DTensor
    return [p.full_tensor() if isinstance(p, DTensor) else p.detach() for p in model.parameters()]


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
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
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
    ``model`` (FSDP-sharded or not); returns the state_dict (the references load it too)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    state = torch.load(path, map_location="cpu", weights_only=True)
    # A shallow copy: under FSDP, set_model_state_dict replaces the dict's tensors by shards.
    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True))
    return state


def copy_state_to_references(model, opt, refs, ref_opts, rank: int) -> None:
    """After --resume: the rank-0 references take the loaded weights and optimizer state
    (gathered whole from the shards: a collective, every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return
    for name, ref in refs.items():
        # A copy: without FSDP the state dict holds the optimizer's own tensors, which the
        # reference's optimizer would otherwise share (and step twice).
        set_state_dict(ref, ref_opts[name], model_state_dict=model_sd, optim_state_dict=copy.deepcopy(optim_sd),
                       options=StateDictOptions(full_state_dict=True))


# ---------------------------------------------------------------- --dry-run
def plan_rows(est, world: int, fsdp: bool, budget_bytes: float) -> tuple[list[tuple[str, str]], bool]:
    """The memory plan of one rank as table rows, and whether it fits ``budget_bytes``.
    With FSDP, parameters, gradients and optimizer state are divided by the world (ZeRO-3)."""
    zero_stage, shards = (3, world) if fsdp else (0, 1)
    share = f" (/ {shards})" if shards > 1 else ""
    total = est.total_bytes(zero_stage, shards)
    fits = total <= budget_bytes

    def gib(n: float) -> str:
        return f"{n / GiB:10.2f} GiB"

    rows = [("parameters" + share, gib(est.param_bytes // shards)),
            ("gradients" + share, gib(est.grad_bytes // shards)),
            ("optimizer state (AdamW)" + share, gib(est.optimizer_bytes // shards)),
            ("activation peak", gib(est.activation_peak_bytes)),
            ("total", gib(total)),
            (f"budget --gpu-gib {budget_bytes / GiB:g}",
             f"{'fits' if fits else 'does not fit'} ({100 * total / budget_bytes:.0f}% of the budget)")]
    return rows, fits


def next_flag(est, world: int, sp: int, fsdp: bool, checkpointing: str, budget_bytes: float,
              sp_given: bool = False) -> str | None:
    """What to try when a --dry-run plan does not fit (None when it fits), from the part of
    the plan that dominates it:

    * the activation peak at least the model state, and a --checkpointing rung left
      (off -> sac -> sac-min -> full, each keeping less for backward): the next rung;
    * else, FSDP off: --fsdp, which divides the model state by the ranks (on one rank with
      the smallest power-of-two --world whose share fits next to the activations);
    * else the model state dominating (FSDP on): more ranks to shard it over, the smallest
      power-of-two multiple of --world whose share fits next to the activations;
    * else (activations, every layer already recomputed): a real run with
      --memory-budget (the compiler tiles the loss and MLP and offloads), or twice the
      sequence-parallel ranks, which share each sequence.

    >>> from autosp.planning.estimate import MemoryEstimate
    >>> est = MemoryEstimate(1024, 8, torch.float32, "off", 0, 0, activation_peak_bytes=100 * GiB,
    ...                      param_bytes=4 * GiB, grad_bytes=4 * GiB, optimizer_bytes=8 * GiB)
    >>> next_flag(est, 8, 8, False, "off", 80 * GiB)
    '--checkpointing sac'
    """
    state = est.state_bytes(3, world) if fsdp else est.state_bytes(0, 1)
    act = est.activation_peak_bytes
    if state + act <= budget_bytes:
        return None
    rungs = ("off", "sac", "sac-min", "full")
    rung = rungs.index(checkpointing) if checkpointing in rungs else len(rungs) - 1
    if act >= state and rung + 1 < len(rungs):
        return f"--checkpointing {rungs[rung + 1]}"
    whole_state = est.state_bytes(0, 1)

    def ranks_for_state(start: int) -> int | None:
        """The smallest power-of-two multiple of ``start`` (up to 2**16 ranks) whose FSDP
        share of the model state fits next to the activation peak."""
        n = start
        while n <= 1 << 16:
            if whole_state / n + act <= budget_bytes:
                return n
            n *= 2
        return None

    if not fsdp:
        if world > 1:
            return "--fsdp"
        n = ranks_for_state(2)
        return f"--world {n} --fsdp" if n else f"--world {2 * world} --fsdp"
    if state > act:
        n = ranks_for_state(2 * world)
        if n:
            return f"--world {n}"
    more_sp = f"--world {2 * world} --sp {2 * sp}" if sp_given else f"--world {2 * world}"
    return f"--memory-budget {budget_bytes / GiB:g}GiB (a real run, not --dry-run: the compiler tiles the loss " \
           f"and MLP and offloads to fit) or {more_sp} (twice the sequence-parallel ranks)"


def dry_run(args, world: int) -> int:
    """--dry-run: compile on the meta device and print a rank's memory plan (no training,
    no real parameters: an 8B model is shapes only)."""
    from autosp.planning.estimate import MemoryModel, meta_model
    sp = args.sp or world
    if world % sp:
        raise SystemExit(f"--sp {sp} must divide the number of ranks ({world})")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.model:
        from transformers import AutoConfig
        what: object = AutoConfig.from_pretrained(args.model, local_files_only=True)
        what.use_cache = False  # type: ignore[attr-defined]  # MemoryModel calls the model without use_cache=False
        name = f"Hugging Face '{getattr(what, 'model_type', '?')}' from {args.model}"
    else:
        cfg = model_config(args)
        what, name = cfg, f"Llama-style '{args.size}' {cfg.layers} layers"
    print(f"dry run: compiling {name} on the meta device for SP {sp} ...", flush=True)
    t0 = time.perf_counter()
    model_on_meta = meta_model(what, dtype)
    n_params = count_params(model_on_meta)
    budget = args.gpu_gib * GiB
    fsdp = args.fsdp if args.fsdp is not None else auto_fsdp(n_params, world, budget)
    # With FSDP the plan is the step the runtime executes: FSDP2 over all ranks, one layer
    # unsharded at a time (plus the prefetch), each layer's whole gradient until its reduce-scatter.
    memory_model = MemoryModel(model_on_meta, sp, dtype, args.checkpointing, batch=args.batch,
                               fsdp=world if fsdp and world > 1 else 1)
    est = memory_model.estimate(args.seq)
    rows, fits = plan_rows(est, world, fsdp, budget)
    params_text = f"{n_params / 1e9:.2f}B" if n_params >= 1e8 else f"{n_params / 1e6:.2f}M"
    print(f"autosp {autosp.__version__} | dry run (meta device, nothing trained) | {name}, "
          f"{params_text} params | {world} rank(s): {world // sp} data-parallel x {sp} sequence-parallel | "
          f"FSDP {'on over ' + str(world) + ' ranks' if fsdp else 'off'} | seq {args.seq}, batch {args.batch}, "
          f"{args.dtype}, checkpointing {args.checkpointing} | planned in {time.perf_counter() - t0:.1f}s")
    width = max(len(k) for k, _ in rows)
    print("memory per rank:\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows), flush=True)
    if not fits:
        flag = next_flag(est, world, sp, fsdp, args.checkpointing, budget, sp_given=args.sp is not None)
        print(f"does not fit {args.gpu_gib:g} GiB: try {flag}", flush=True)
    print(f"this process's peak host memory: {peak_memory_mib(torch.device('cpu')):.0f} MiB "
          "(the model is shapes only)", flush=True)
    return 0


# ---------------------------------------------------------------- training
def train(args, device, distributed: bool, rank: int, world: int, sp: int) -> bool:
    """The training loop; returns the verdict (True: passed or not verifying), shared by all ranks."""
    dp, replica = world // sp, rank // sp
    if device.type == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", max(1, (os.cpu_count() or 1) // world))))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model, vocab, description = build_model(args, dtype)
    hf = is_hf(model)
    n_params = count_params(model)
    fsdp = args.fsdp if args.fsdp is not None else auto_fsdp(n_params, world, gpu_memory_bytes(args, device))
    # --verify: the single-device model in the same dtype and, in bf16, an fp32 one too; all
    # three start from the same (bf16-representable) weights and see the same batches. They
    # are plain copies made before FSDP shards the model.
    refs: dict[str, torch.nn.Module] = {}
    if args.verify and rank == 0:
        refs["single"] = copy.deepcopy(model).to(device)
        if dtype != torch.float32:
            refs["fp32"] = copy.deepcopy(model).float().to(device)
    if fsdp:
        n_blocks = shard_model(model)  # moves the shards to the mesh's device
        fsdp_text = f"FSDP on (fully_shard on {n_blocks} blocks + the root, over {world} ranks)"
    else:
        model.to(device)
        fsdp_text = "FSDP off"
    if args.fsdp is None and world > 1:
        gpu = gpu_memory_bytes(args, device)
        fsdp_text += (f" [automatic: model state {n_params * STATE_BYTES_PER_PARAM / GiB:.1f} GiB "
                      f"{'>' if fsdp else '<='} 1/{round(1 / FSDP_AUTO_FRACTION)} of {gpu / GiB:.0f} GiB]")
    if args.init_from:
        state = load_plain_state_dict(model, args.init_from)
        for ref in refs.values():
            ref.load_state_dict(state)
        del state
    t0 = time.perf_counter()
    budget = dict(memory_budget=args.memory_budget, drop_logits=True, verbose=rank == 0) if args.memory_budget else {}
    sp_model = autosp.compile(model, sp_size=sp, backend="inductor" if args.compile else None,
                              checkpointing=args.checkpointing, sp_strategy=args.sp_strategy, **budget)
    opt = torch.optim.AdamW(sp_model.parameters(), lr=args.lr, weight_decay=0.0)
    ref_opts = {k: torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.0) for k, m in refs.items()}
    start_step, resumed = 0, ""
    if args.resume:
        start_step, seed = load_checkpoint(args.resume, model, opt)
        if args.verify:
            copy_state_to_references(model, opt, refs, ref_opts, rank)
        resumed = f"resumed from {args.resume} at step {start_step}"
        if seed != args.seed:
            resumed += f"; warning: it was trained with --seed {seed}, this run's batches follow --seed {args.seed}"
        if start_step >= args.steps:
            raise UsageError(f"--resume {args.resume} is at step {start_step}: --steps {args.steps} leaves "
                             "nothing to run (--steps counts from the start of training)")
    param_bytes = torch.tensor([local_param_bytes(model)], dtype=torch.float64)
    if distributed:
        gathered_bytes = [torch.zeros_like(param_bytes) for _ in range(world)]
        dist.all_gather(gathered_bytes, param_bytes)
        param_bytes = torch.cat(gathered_bytes)
    documents = load_documents(args.data, vocab, args.seq, args.doc_sep) if args.pack else None
    tokens = None if args.pack else load_tokens(args.data, vocab)
    if rank == 0:
        full_bytes = n_params * torch.empty((), dtype=dtype).element_size()
        print(f"autosp {autosp.__version__} | {world} rank(s): {dp} data-parallel x {sp} sequence-parallel | "
              f"{description}, {n_params / 1e6:.2f}M params | "
              f"seq {args.seq}, batch {args.batch}, {args.dtype}, {device.type}"
              + (f" | loss: the mean over the {dp} replicas" if dp > 1 else ""), flush=True)
        print(f"{fsdp_text} | parameter bytes per rank {int(param_bytes.max())} "
              f"({param_bytes.max() / 2**20:.2f} MiB; unsharded {full_bytes / 2**20:.2f} MiB)", flush=True)
        if args.init_from:
            print(f"initialised from {args.init_from}", flush=True)
        if resumed:
            print(resumed, flush=True)
        if args.pack:
            found = (documents.summary if documents is not None
                     else f"synthetic documents of 1-{max(1, args.seq // 2)} tokens")
            print(f"packing: {found} | rows of {args.seq} tokens, position_ids restart at each document, "
                  "its first label ignored", flush=True)

    step_times, losses, packed_docs = [], [], []
    ref_losses: dict[str, list[float]] = {k: [] for k in refs}
    reset_refs = args.verify and dtype != torch.float32
    for step in range(start_step, args.steps):
        if args.debug_raise_on_rank == rank and step == 1:
            raise RuntimeError(f"--debug-raise-on-rank {rank}: a deliberate failure at step 2")
        # Replica r's batch as (input_ids, extra inputs: --pack's position_ids and labels, to
        # every model alike). This rank feeds its replica's; the references (rank 0) all of them.
        batches: dict[int, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
        for r in range(dp) if refs else (replica,):
            if args.pack:
                ids, position_ids, labels, n_docs = make_packed_batch(step, args, vocab, documents, r)
                batches[r] = ids.to(device), {"position_ids": position_ids.to(device), "labels": labels.to(device)}
                if r == replica:
                    packed_docs.append(n_docs)
            else:
                batches[r] = make_batch(step, args, vocab, tokens, r).to(device), {}
        ids, inputs = batches[replica]
        if reset_refs:  # bf16: each step's losses at the SP model's own weights (see check_bf16)
            with torch.no_grad():
                weights = full_params(model)  # every rank: a collective under FSDP
                for ref in refs.values():
                    for p_ref, p in zip(ref.parameters(), weights):
                        p_ref.copy_(p)
                del weights
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        try:
            loss = model_loss(sp_model, ids, hf, **inputs)
        except AutospError as e:  # the first call compiles: a --memory-budget too small fails here
            if step == start_step and args.memory_budget is not None and "memory_budget" in str(e):
                reason = re.sub(r"^rank \d+ could not compile the model for this group: (AutospError: )?", "",
                                str(e))
                raise BudgetError(f"the memory budget {args.memory_budget} cannot fit a step of seq {args.seq}, "
                                  f"batch {args.batch} over {sp} sequence-parallel rank(s): {reason}") from None
            raise
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step == start_step and rank == 0:
            print(f"step {step + 1} includes compilation: {time.perf_counter() - t0:.1f}s", flush=True)
        step_times.append(elapsed)
        # The global loss: every rank of a replica holds its replica's loss, so the mean over
        # the world is the mean over the replicas (what their averaged gradients descend).
        global_loss = loss.detach().to(torch.float64)
        if dp > 1:
            dist.all_reduce(global_loss)
            global_loss /= world
        # The debug offset moves the reported SP loss only: a negative control for --verify.
        losses.append(global_loss.item() + args.debug_sp_loss_offset)
        line = f"step {step + 1:>4}/{args.steps} | loss {losses[-1]:9.6f}"
        if args.pack:
            line += f" | {packed_docs[-1]:4d} docs"
        for name, ref in refs.items():
            # The data-parallel objective on one device: the mean of the replicas' losses
            # (one backward per replica's batch, each scaled by 1/dp, accumulating).
            ref_opts[name].zero_grad(set_to_none=True)
            ref_loss = 0.0
            for ref_ids, ref_inputs in batches.values():
                part = model_loss(ref, ref_ids, hf, **ref_inputs)
                (part / dp).backward()
                ref_loss += part.item() / dp
            ref_opts[name].step()
            ref_losses[name].append(ref_loss)
            label = "single-device" if name == "single" else "single-device fp32"
            line += f" | {label} {ref_losses[name][-1]:9.6f} | diff {abs(losses[-1] - ref_losses[name][-1]):.1e}"
        tok_s = args.batch * args.seq * dp / elapsed
        line += (f" | {tok_s:9.0f} tok/s | {elapsed:6.2f} s/step | "
                 f"{memory_label(device)} {peak_memory_mib(device):7.1f} MiB")
        if rank == 0:
            print(line, flush=True)
        done = step + 1
        if args.save and (done == args.steps or (args.save_every and done % args.save_every == 0)):
            t_save = time.perf_counter()
            path = checkpoint_dir(args.save, done)
            save_checkpoint(path, model, opt, done, args.seed)
            if rank == 0:
                print(f"saved step {done} to {path} ({time.perf_counter() - t_save:.1f}s)", flush=True)

    memory = torch.tensor([peak_memory_mib(device)], dtype=torch.float64, device=device)
    if distributed:
        gathered = [torch.zeros_like(memory) for _ in range(world)]
        dist.all_gather(gathered, memory)
        memory = torch.cat(gathered)
    check = None
    if rank == 0:
        if "fp32" in refs:
            check = check_bf16(losses, ref_losses["single"], ref_losses["fp32"])
        elif refs:
            check = check_fp32(losses, ref_losses["single"])
    # Every rank learns the verdict (rank 0 holds the references), so all exit alike.
    bad = args.verify and not (all(map(math.isfinite, losses)) and (check is None or check.ok))
    failed = torch.tensor([int(bad)], device=device)
    if distributed:
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if rank == 0:
        steady = step_times[1:] or step_times
        mean = sum(steady) / len(steady)
        span = f"step {args.steps}" if start_step + 1 == args.steps else f"steps {start_step + 1}-{args.steps}"
        ran = f"{len(losses)}" + (f" ({span}, resumed)" if start_step else "")
        rows = [("steps", ran), ("tokens per step", f"{args.batch * args.seq * dp}"),
                ("mean step time (after the first)", f"{mean:.3f} s"),
                ("throughput", f"{args.batch * args.seq * dp / mean:.0f} tok/s"),
                ("loss first -> last" + (f" (mean of {dp} replicas)" if dp > 1 else ""),
                 f"{losses[0]:.4f} -> {losses[-1]:.4f}"),
                (f"{memory_label(device)} per rank ({'torch.cuda' if device.type == 'cuda' else 'getrusage'})",
                 ", ".join(f"{m:.0f}" for m in memory.tolist()) + " MiB")]
        if args.pack:
            n_rows = args.batch * len(packed_docs)
            rows.append(("documents packed" + (" (replica 0)" if dp > 1 else ""),
                         f"{sum(packed_docs)} in {n_rows} rows ({sum(packed_docs) / n_rows:.1f} per row)"))
        if "single" in ref_losses:
            diffs = [abs(a - b) for a, b in zip(losses, ref_losses["single"])]
            rows.append(("max |loss - single-device loss|", f"{max(diffs):.2e}"))
        if "fp32" in ref_losses:
            rows.append(("max |loss - fp32 loss|",
                         f"{max(abs(a - b) for a, b in zip(losses, ref_losses['fp32'])):.2e}"))
        width = max(len(k) for k, _ in rows)
        print("\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows))
        if check is not None:
            print("\n".join(check.lines))
        if check is not None:
            print("VERIFY FAILED: the sequence-parallel loss is off (the rows marked NO, or a non-finite loss)"
                  if failed.item() else "VERIFY PASSED", flush=True)
    return not failed.item()


if __name__ == "__main__":
    sys.exit(main())
