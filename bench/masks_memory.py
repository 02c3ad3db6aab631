"""Bytes kept for backward per rank by the attention masks of the ways trainers call a
model, before and after the compiler recognises them.

    python bench/masks_memory.py [--seqs 1024 4096 16384] [--world 2]

Model: a Hugging Face Llama (hidden 64, 2 layers, 4 heads / 2 KV heads; Mistral with a
sliding window of 256 for the window rows), fp32, batch 1, SP over ``--world`` gloo ranks.
Calls: ``attention_mask`` all ones, right padding (a quarter of the row), a sliding window,
and ``position_ids`` without a mask (transformers then builds packed-document masks).
"Before": every mask kept materialised (the fold disabled); "after": what the compiler
does. Measured on rank 0 with :class:`autosp.memory.SavedTensors` (parameters excluded):
one forward at each length, the compiled program reused across lengths. Prints a table
and appends it to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autosp.testing.distributed import run_ranks  # noqa: E402
from results import append_section  # noqa: E402

CALLS = ("attention_mask all ones", "right padding", "sliding window 256", "position_ids (packed detection)")
MiB = 1 << 20


def _model(call: str):
    import transformers
    family = "Mistral" if "window" in call else "Llama"
    kwargs = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1 << 17, use_cache=False, attn_implementation="sdpa")
    if family == "Mistral":
        kwargs["sliding_window"] = 256
    return getattr(transformers, family + "ForCausalLM")(getattr(transformers, family + "Config")(**kwargs))


def _inputs(call: str, seq: int):
    ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(seq))
    kwargs = {"labels": ids.clone(), "use_cache": False}
    if "attention_mask" in call or "padding" in call:
        mask = torch.ones(1, seq, dtype=torch.long)
        if "padding" in call:
            mask[0, -seq // 4:] = 0
            kwargs["labels"][mask == 0] = -100
        kwargs["attention_mask"] = mask
    if "position_ids" in call:
        kwargs["position_ids"] = torch.arange(seq)[None]
    return ids, kwargs


def measure(rank, world, queue, call, seqs, before):
    import autosp
    from autosp.memory import SavedTensors
    if before:  # every mask kept, as before the compiler recognised windows and padding
        from autosp.passes import causal_mask
        causal_mask._window_of = lambda *a: None
        original = causal_mask.prove_causal

        def no_padding(sdpa):
            proof = original(sdpa)
            if proof.key_padding is not None or proof.window is not None:
                return causal_mask.MaskProof(False, "disabled by the benchmark")
            return proof
        causal_mask.prove_causal = no_padding
    torch.manual_seed(0)
    model = _model(call)
    compiled = autosp.compile(model)
    out = []
    for seq in seqs:
        ids, kwargs = _inputs(call, seq)
        with SavedTensors(list(model.parameters())) as counter:
            compiled(input_ids=ids, **kwargs)
        out.append(counter.bytes)
    queue.put((rank, out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    head = " | ".join(f"S={s}: before / after MiB" for s in args.seqs)
    rows = [f"| call | {head} | growth from S={args.seqs[-2]} to S={args.seqs[-1]}: before / after |",
            "|---|" + "---|" * (len(args.seqs) + 1)]
    print(rows[0], flush=True)
    for call in CALLS:
        found = {}
        for before in (True, False):
            found[before] = run_ranks(measure, args.world, args=(call, args.seqs, before), timeout=1800, fresh=True)[0]
        cells = " | ".join(f"{b / MiB:.1f} / {a / MiB:.1f}" for b, a in zip(found[True], found[False]))
        ratio = args.seqs[-1] / args.seqs[-2]
        grow = [found[x][-1] / found[x][-2] for x in (True, False)]
        rows.append(f"| {call} | {cells} | x{grow[0]:.2f} / x{grow[1]:.2f} (length x{ratio:g}) |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if not args.no_write:
        append_section("Attention masks: bytes kept for backward per rank, before / after recognition",
                       f"HF Llama/Mistral hidden 64, 2 layers, fp32, batch 1, P={args.world}, rank 0", table)


if __name__ == "__main__":
    main()
