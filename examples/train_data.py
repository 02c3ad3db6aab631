"""examples/train.py's batches: synthetic tokens, a --data file, and --pack's packed documents.

Synthetic tokens by default; --data takes a text file (bytes as tokens) or a tokenised
.npy / .bin (uint16) array. The batch of step k is a function of (--seed, k) only: sample
i of a step comes from its own generator seeded by (seed, step, i), and replica r takes
samples r*B .. (r+1)*B-1 (B = --batch), so a run resumed at another world size (same
global batch) feeds the same batches.

--pack packs whole documents into each row of --seq tokens, as pretraining does: a text
file's documents are its paragraphs (split on blank lines; one document per line when the
file has no blank line), a tokenised file's end at each --doc-sep ID token (kept as its
last token), synthetic ones are counting runs of random lengths. A row concatenates
documents greedily from a random one on; documents longer than --seq are first split into
pieces of --seq tokens, and the row's last document is cut at the row's end.
position_ids restart at 0 at every document, and each document's first label is -100, so
no token is predicted from another document; no attention_mask is passed, and the Hugging
Face model masks attention per document from the position_ids resets (a preset model is
also given document_ids, numbered from the resets: see train_state.model_loss).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from train_launch import UsageError


def check_options(args) -> None:
    """Raise :class:`UsageError` for a bad combination of --data, --pack and --doc-sep."""
    tokenised = args.data is not None and args.data.endswith((".npy", ".bin"))
    if args.doc_sep is not None:
        if not args.pack:
            raise UsageError("--doc-sep splits documents for --pack: add --pack")
        if not tokenised:
            raise UsageError("--doc-sep applies to a tokenised --data file (.npy/.bin); a text file's documents "
                             "are its paragraphs (split on blank lines)")
    if args.pack and tokenised and args.doc_sep is None:
        raise UsageError(f"--pack with the tokenised file {args.data} needs --doc-sep ID, the token id that ends "
                         "each document (e.g. the tokenizer's end-of-text id)")


class Batches:
    """The batches of a run, from its options (--data, --pack, --doc-sep, --seed, --batch,
    --seq): ``batches(step, replica)`` is replica ``replica``'s batch of step ``step`` as
    (input_ids, the extra model inputs, the number of documents packed in it). The extra
    inputs are --pack's ``position_ids`` and ``labels`` (empty without --pack; the number
    of documents is then 0), already on ``device``, like the input_ids."""

    def __init__(self, args, vocab: int, device: torch.device | str = "cpu"):
        self.args, self.vocab, self.device = args, vocab, torch.device(device)
        self.documents = load_documents(args.data, vocab, args.seq, args.doc_sep) if args.pack else None
        self.tokens = None if args.pack else load_tokens(args.data, vocab)

    def __call__(self, step: int, replica: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        if not self.args.pack:
            return make_batch(step, self.args, self.vocab, self.tokens, replica).to(self.device), {}, 0
        ids, position_ids, labels, n_docs = make_packed_batch(step, self.args, self.vocab, self.documents, replica)
        inputs = {"position_ids": position_ids.to(self.device), "labels": labels.to(self.device)}
        return ids.to(self.device), inputs, n_docs

    def describe(self) -> str:
        """Where --pack's documents come from, for the run's header."""
        if self.documents is not None:
            return self.documents.summary
        return f"synthetic documents of 1-{max(1, self.args.seq // 2)} tokens"


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
