"""CPU attention kernels for structured masks against SDPA with the dense mask they replace.

    python bench/attention_kernels.py [--seq 4096] [--heads 4] [--dim 64] [--repeats 3]

For each structure the compiler recognises (causal + key padding, a causal sliding window,
packed documents) this times one forward + backward of

- "dense": ``scaled_dot_product_attention`` with the [1, 1, S, S] boolean mask (what the
  program runs when the mask is kept materialised), and
- "kernel": the autosp kernel (:mod:`autosp.runtime.attention`) the emitter calls instead,

side by side in one process, one thread, fp32, batch 1 (one rank's heads under Ulysses), and
counts the bytes autograd keeps for backward (:class:`autosp.planning.memory.SavedTensors`). It also
tries FlexAttention (``torch.nn.attention.flex_attention``, compiled), the other candidate
the issue names, and reports why it cannot serve when it fails. Prints a table and appends
it to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results import append_section  # noqa: E402

from autosp.planning.memory import SavedTensors  # noqa: E402
from autosp.runtime import attention  # noqa: E402

MiB = 1 << 20


def structures(seq: int):
    """(name, dense boolean mask [1, 1, S, S], kernel(q, k, v)) per structure."""
    i = torch.arange(seq)
    causal = i[None, :] <= i[:, None]
    pad = torch.ones(1, seq, dtype=torch.bool)
    pad[0, -seq // 4:] = False
    window = 512
    docs = (i // 512)[None]  # 8 documents of 512 at S = 4096
    return [
        ("causal + key padding (right, S/4)", (causal[None, None] & pad[:, None, None, :]),
         lambda q, k, v: attention.key_padded_causal_attention(q, k, v, pad[:, None, None, :])),
        (f"sliding window {window}", (causal & (i[:, None] - i[None, :] < window))[None, None],
         lambda q, k, v: attention.sliding_window_attention(q, k, v, window=window)),
        ("packed documents (8 x S/8)", (causal[None, None] & (docs[:, None, :, None] == docs[:, None, None, :])),
         lambda q, k, v: attention.document_attention(q, k, v, docs[:, None, None, :])),
    ]


def _step(fn, q, k, v) -> tuple[float, int]:
    for t in (q, k, v):
        t.grad = None
    start = time.perf_counter()
    with SavedTensors([q, k, v]) as saved:
        out = fn(q, k, v)
    out.sum().backward()
    return time.perf_counter() - start, saved.bytes


def _flex(seq: int, q, k, v) -> str:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        docs = torch.arange(seq) // 512

        def mask_mod(b, h, qi, ki):
            return (ki <= qi) & (docs[qi] == docs[ki])
        block = create_block_mask(mask_mod, 1, 1, seq, seq, device="cpu")
        out = torch.compile(flex_attention)(q, k, v, block_mask=block)
        out.sum().backward()
        return "runs"
    except Exception as e:  # noqa: BLE001 - the reason is the result
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, args.heads, args.seq, args.dim, requires_grad=True) for _ in range(3))
    rows = ["| structure | dense mask: ms fwd+bwd | kernel: ms fwd+bwd | speed-up | dense: MiB kept | kernel: MiB kept | max abs diff |",
            "|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for name, mask, kernel in structures(args.seq):
        dense = lambda q, k, v, mask=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
        best = {}
        for label, fn in (("dense", dense), ("kernel", kernel)):  # alternate: the same machine state
            runs = [_step(fn, q, k, v) for _ in range(args.repeats)]
            best[label] = (min(t for t, _ in runs), runs[0][1])
        with torch.no_grad():
            diff = float((dense(q, k, v) - kernel(q, k, v)).abs().max())
        rows.append(f"| {name} | {best['dense'][0] * 1e3:.0f} | {best['kernel'][0] * 1e3:.0f} | "
                    f"x{best['dense'][0] / best['kernel'][0]:.2f} | {best['dense'][1] / MiB:.1f} | "
                    f"{best['kernel'][1] / MiB:.1f} | {diff:.1e} |")
        print(rows[-1], flush=True)
    flex = _flex(args.seq, q, k, v)
    table = "\n".join(rows) + f"\n\nFlexAttention (compiled, packed documents, forward + backward) on CPU: {flex}"
    print(table.splitlines()[-1])
    if not args.no_write:
        append_section("Structured-mask attention kernels vs SDPA with the dense mask (CPU)",
                       f"torch {torch.__version__}, 1 thread, fp32, S={args.seq}, {args.heads} heads x {args.dim}, "
                       f"best of {args.repeats}", table)


if __name__ == "__main__":
    main()
