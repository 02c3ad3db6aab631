"""Bytes kept for backward per rank by the attention masks of the ways trainers call a
model, before and after the compiler recognises them.

    python bench/masks_memory.py [--measured 4096 16384] [--simulated 65536] [--world 2]

Models: Hugging Face Llama / Mistral (sliding window 256) / GPT-2 (eager attention),
hidden 64, 2 layers, 4 heads (Llama/Mistral: 2 KV heads), fp32, batch 1, SP over
``--world`` ranks. Calls:

- ``position_ids`` + ``attention_mask`` all ones, and + right padding (a quarter of the row);
- packed documents: ``position_ids`` restarting every 1024 tokens, no mask;
- Mistral's sliding window with ``position_ids`` + all-ones mask;
- GPT-2 eager (matmul-softmax attention) with ``position_ids`` + right padding.

"Before": what the compiler did before it proved these masks (every mask kept
materialised, hand-written attention left as written); "after": what it does now. The
``--measured`` lengths run on gloo ranks and count with :class:`autosp.planning.memory.SavedTensors`
on rank 0 (one forward, the compiled program reused across lengths); the ``--simulated``
lengths run the same compiled program on the meta device with the memory model
(:class:`autosp.planning.estimate.MemoryModel`, rank 0), as do measured cells that would not fit
this machine (marked "sim"). Prints a table and appends it to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results import append_section  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

CALLS = ("position_ids + attention_mask all ones", "position_ids + right padding", "packed documents (position_ids)",
         "sliding window 256 (Mistral)", "GPT-2 eager + right padding")
MiB = 1 << 20
# Cells measured on real ranks only below this many bytes kept per rank (24 GiB machine).
REAL_LIMIT = 6 << 30


def _model(call: str, device: str = "cpu"):
    import transformers
    if call.startswith("GPT-2"):
        config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=1 << 17,
                                         attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         use_cache=False)
        return transformers.GPT2LMHeadModel(config)
    family = "Mistral" if "window" in call else "Llama"
    kwargs = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1 << 17, use_cache=False, attn_implementation="sdpa")
    if family == "Mistral":
        kwargs["sliding_window"] = 256
    return getattr(transformers, family + "ForCausalLM")(getattr(transformers, family + "Config")(**kwargs))


def _call_kwargs(call: str, ids: torch.Tensor) -> dict:
    """The call's keyword arguments besides input_ids and labels, for ids [1, S] (any device)."""
    seq, device = ids.shape[-1], ids.device
    if "packed" in call:
        return {"position_ids": (torch.arange(seq, device=device) % 1024)[None]}
    mask = torch.ones(1, seq, dtype=torch.long, device=device)
    if "padding" in call and device.type != "meta":
        mask[0, -seq // 4:] = 0
    return {"position_ids": torch.arange(seq, device=device)[None], "attention_mask": mask}


def _disable_recognition() -> None:
    """The compiler before it proved these masks: every mask kept, manual attention unfused."""
    from autosp.passes import causal_mask, fuse_attention
    original = causal_mask.prove_causal

    def causal_only(sdpa):
        proof = original(sdpa)
        if proof.causal:
            return proof
        return causal_mask.MaskProof(False, "disabled by the benchmark")
    causal_mask.prove_causal = causal_only
    fuse_attention.fuse_attention = lambda module: 0


def measure(rank, world, queue, call, seqs, before):
    import autosp
    from autosp.planning.memory import SavedTensors
    if before:
        _disable_recognition()
    torch.manual_seed(0)
    model = _model(call)
    compiled = autosp.compile(model)
    out = []
    for seq in seqs:
        ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(seq))
        with SavedTensors(list(model.parameters())) as counter:
            compiled(input_ids=ids, labels=ids, use_cache=False, **_call_kwargs(call, ids))
        out.append(counter.bytes)
    queue.put((rank, out))


def simulate(rank, world, queue, call, seqs, before, sp):
    from autosp.planning.estimate import MemoryModel
    if before:
        _disable_recognition()
    torch.manual_seed(0)
    model = MemoryModel(_model(call), sp_size=sp, dtype=torch.float32, rank=0,
                        inputs=lambda ids: _call_kwargs(call, ids))
    queue.put((rank, [model.estimate(seq).saved_bytes for seq in seqs]))


def _kept_before(call: str, seq: int, world: int) -> int:
    """A rough upper bound of the bytes a measured "before" run keeps (to route huge cells to
    the memory model): the [S, S] mask, and for eager attention the scores of its heads."""
    per_layer = seq * seq * (4 if call.startswith("GPT-2") else 1)
    if call.startswith("GPT-2"):
        per_layer *= 2 * 4 // world  # scores and probabilities of each rank's heads
    return 2 * per_layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=int, nargs="*", default=[4096, 16384])
    parser.add_argument("--simulated", type=int, nargs="*", default=[65536])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--calls", nargs="*", default=list(CALLS), help="a subset of the calls (by prefix)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    seqs = args.measured + args.simulated
    head = " | ".join(f"S={s // 1024}K{'' if s in args.measured else ' (sim)'}" for s in seqs)
    rows = [f"| call: MiB kept per rank, before -> after | {head} | growth x4 length, after |",
            "|---|" + "---|" * (len(seqs) + 1)]
    print(rows[0], flush=True)
    calls = [c for c in CALLS if any(c.startswith(p) for p in args.calls)]
    for call in calls:
        cells, after = [], []
        for seq in seqs:
            found, tags = {}, ""
            for before in (True, False):
                real = seq in args.measured and (not before or _kept_before(call, seq, args.world) < REAL_LIMIT)
                body = measure if real else simulate
                found[before] = run_ranks(body, args.world if real else 1,
                                          args=(call, [seq], before) + (() if real else (args.world,)),
                                          timeout=3600, fresh=True)[0][0]
                if not real and seq in args.measured:
                    tags = " (before: sim)"
            after.append(found[False])
            cells.append(f"{found[True] / MiB:.1f} -> {found[False] / MiB:.1f}{tags}")
        growth = " ".join(f"x{b / a:.2f}" for a, b in zip(after, after[1:]))
        rows.append(f"| {call} | {' | '.join(cells)} | {growth} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if not args.no_write:
        append_section("Attention masks of trainer calls: bytes kept for backward per rank, before -> after",
                       f"HF Llama/Mistral/GPT-2 hidden 64, 2 layers, fp32, batch 1, P={args.world}, rank 0; "
                       "(sim): the memory model on the meta device", table)


if __name__ == "__main__":
    main()
