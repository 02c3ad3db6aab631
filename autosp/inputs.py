"""The entry contract: every rank of a sequence-parallel group passes the same inputs.

autosp's programs take the rank's shard of each input from the *full* inputs every rank
passes; ranks that pass different batches (a ``DistributedSampler``, Hugging Face Trainer's
default loader) would train on a chimera of them without any error. So each call first
checks, over the group, a cheap fingerprint of the call (:func:`check_inputs_agree`):

- the call's structure (argument names, non-tensor values, dtypes and sizes) and the
  module's ``training`` flags, hashed on the host;
- the contents of every tensor input, three int64 per tensor computed on the tensor's
  device (sums of its words, modulo a prime, with and without position weights: exact
  integer arithmetic, so every device and reduction order gives the same value);

exchanged in one all-gather of a fixed-size int64 vector. When they all agree, that is
the whole cost. When any differs, a second exchange (on this error path only) brings each
rank's per-input record, and every rank raises the same :class:`AutospError` naming the
argument, the dimension or "contents", and each rank's value, before any collective of
the program: the module stays usable.

Example::

    >>> check_inputs_agree(leaves, spec, paths, group, modes=(True,))   # raises on disagreement
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from autosp.ir.diagnostics import AutospError

# The prime modulus of the content sums: every product of two residues is < 2^62 and a sum
# of up to 2^32 of them stays below 2^63, so int64 never overflows.
_P = 2**31 - 1
_HEADER = 4  # tensors, structure hash, training-mode hash, sizes hash
_CONTENT = 3  # content fingerprint words per tensor, and in the combined vector
_CHUNK = 1 << 22  # elements read at a time

HINT = ("every rank of a sequence-parallel group must pass the same full-sequence inputs (a DistributedSampler, "
        "or Hugging Face Trainer's default data loader, gives each rank its own batch: shard the data over "
        "data-parallel replicas only, e.g. with autosp.data.DistributedSampler or autosp.hf.Trainer). autosp.hf's "
        "data loaders already do: there, the batch became per-rank after loading, e.g. sampled or shuffled from a "
        "per-process seed (set_seed(seed, device_specific=True), as TRL's online trainers do): seed by data-parallel "
        "replica (autosp.data.data_parallel_rank) or broadcast from the group's first rank; "
        "autosp.hf.sequence_parallel does both for GRPOTrainer and RLOOTrainer")


def _words(flat: torch.Tensor) -> torch.Tensor:
    """A flat tensor's elements as int64 words that determine them exactly (floats by
    their bits; a complex element as two words)."""
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    if flat.dtype == torch.bool:
        return flat.to(torch.int64)
    if flat.is_floating_point():
        as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
        return flat.view(as_int).to(torch.int64)
    return flat.to(torch.int64)


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Three int64 on ``t``'s device that change when any element changes or moves:
    ``sum(w)``, ``sum(w * (i + 1))`` and ``sum(w * ((i + 1)^2 mod p))`` modulo p over the
    element words ``w`` at flat index ``i``. Large tensors (``inputs_embeds``) are read in
    chunks of ``_CHUNK`` elements, so the int64 temporaries stay small.

    Example::

        >>> fingerprint(torch.tensor([1, 2])).tolist() != fingerprint(torch.tensor([2, 1])).tolist()
        True
    """
    flat = t.detach().reshape(-1)
    sums = torch.zeros(_CONTENT, dtype=torch.int64, device=t.device)
    for start in range(0, flat.numel(), _CHUNK):
        w = torch.remainder(_words(flat.narrow(0, start, min(_CHUNK, flat.numel() - start))), _P)
        i = torch.arange(start + 1, start + w.numel() + 1, device=w.device, dtype=torch.int64)
        i2 = torch.remainder(i * i, _P)
        part = torch.stack([w.sum(), torch.remainder(w * i, _P).sum(), torch.remainder(w * i2, _P).sum()])
        sums = torch.remainder(sums + part, _P)
    return sums


def _crc(value) -> int:
    return zlib.crc32(repr(value).encode())


def _device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_inputs_agree(leaves, spec, paths: list[str], group, modes: tuple = (), seq_dim: int | None = None,
                       state: tuple = ()) -> None:
    """Raise :class:`AutospError` on every rank of ``group`` unless all its ranks pass the
    same call: structure ``spec``, the same non-tensor ``leaves``, tensor leaves of the same
    dtype, sizes and contents, the same module ``modes`` (``training`` flags) and the same
    program ``state`` (what else selects the program: autocast, the modules' checkpointing
    switches; ranks running different programs would exchange messages that do not match). One
    all-gather of ``4 + 3`` int64 per rank when they agree (see the module docstring);
    under the process group's timeout."""
    tensors = [(p, t) for p, t in zip(paths, leaves) if isinstance(t, torch.Tensor)]
    others = [(p, repr(x)) for p, x in zip(paths, leaves) if not isinstance(x, torch.Tensor)]
    device = _device(group)
    sizes = [(p, str(t.dtype), tuple(t.shape)) for p, t in tensors]
    header = torch.tensor([len(tensors), _crc((spec, others)), _crc((modes, state)), _crc(sizes)], dtype=torch.int64,
                          device=device)
    prints = [fingerprint(t).to(device) for _, t in tensors]
    content = torch.zeros(_CONTENT, dtype=torch.int64, device=device)
    for j, fp in enumerate(prints):  # combined in position: a swap of two inputs also shows
        content = torch.remainder(content + fp * (j + 1), _P)
    mine = torch.cat([header, content])
    ranks = dist.get_process_group_ranks(group)
    table = torch.empty(len(ranks) * mine.numel(), dtype=torch.int64, device=device)
    dist.all_gather_single(table, mine, group=group)
    rows = table.view(len(ranks), -1).tolist()
    if all(row == rows[0] for row in rows):
        return
    # Some rank differs: every rank knows it (the same table), so all take this path.
    record = {"spec": repr(spec), "others": others, "modes": list(modes), "state": repr(state), "sizes": sizes,
              "prints": [fp.tolist() for fp in prints],
              "heads": [_head(t) for _, t in tensors]}
    records: list = [None] * len(ranks)
    dist.all_gather_object(records, record, group=group)
    raise AutospError(describe_difference(records, ranks, seq_dim))


def _head(t: torch.Tensor, n: int = 6) -> list:
    return t.detach().reshape(-1)[:n].cpu().tolist()


def describe_difference(records: list[dict], ranks: list[int], seq_dim: int | None = None) -> str:
    """The first thing that differs between the ranks' call records, as one message."""
    def each(values) -> str:
        return ", ".join(f"rank {r}: {v}" for r, v in zip(ranks, values))

    def fail(what: str, values) -> str:
        return f"{what} differs across the ranks of the sequence-parallel group ({each(values)}); {HINT}"

    first = records[0]
    if any(r["modes"] != first["modes"] for r in records):
        flags = [("train" if all(r["modes"]) else "eval" if not any(r["modes"]) else "mixed") for r in records]
        return fail("the module's train/eval mode", flags)
    if any(r.get("state") != first.get("state") for r in records):
        return fail("the program's state (autocast, or the modules' checkpointing switches)",
                    [r.get("state") for r in records])
    names = [[p for p, *_ in r["sizes"]] + [p for p, _ in r["others"]] for r in records]
    if any(n != names[0] for n in names) or any(r["spec"] != first["spec"] for r in records):
        return fail("the call's arguments", [", ".join(n) or "none" for n in names])
    for k, (path, _) in enumerate(first["others"]):
        values = [r["others"][k][1] for r in records]
        if len(set(values)) > 1:
            return fail(f"{path}", values)
    for k, (path, _, shape) in enumerate(first["sizes"]):
        dtypes = [r["sizes"][k][1] for r in records]
        if len(set(dtypes)) > 1:
            return fail(f"the dtype of {path}", dtypes)
        shapes = [r["sizes"][k][2] for r in records]
        if len({len(s) for s in shapes}) > 1:
            return fail(f"the number of dimensions of {path}", [len(s) for s in shapes])
        for d in range(len(shape)):
            dims = [s[d] for s in shapes]
            if len(set(dims)) > 1:
                kind = " (the sequence)" if d == seq_dim else ""
                return fail(f"{path} dim {d}{kind}", dims)
    for k, (path, _, _) in enumerate(first["sizes"]):
        prints = [tuple(r["prints"][k]) for r in records]
        if len(set(prints)) > 1:
            values = [f"{_hex(fp)} starting {r['heads'][k]}" for fp, r in zip(prints, records)]
            return fail(f"the contents of {path}", values)
    return fail("the call", ["(differs)"] * len(records))  # a hash collision of the structure


def _hex(fp) -> str:
    return "fingerprint " + "-".join(f"{x:08x}" for x in fp)
