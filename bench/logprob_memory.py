"""TRL's ``fused_lm_head=True`` call under SP: peak bytes per rank of the tiled LM head on each
rank's positions (autosp.hf.logprobs) against the gathered-logits path it replaced, side by
side in the same processes (P=2 gloo ranks, CPU, fp32).

    python bench/logprob_memory.py                 # S=4096 and 8192, the table below
    python bench/logprob_memory.py --append        # ... and append it to bench/RESULTS.md

Model: HF ``LlamaForCausalLM``, vocabulary 32768, hidden 64, 2 layers (so the vocabulary,
not the backbone, is what the paths differ in). Each row is one training call of
``SequenceParallelModel(..., fused_lm_head=True)`` and its backward, with the fields the
trainer reads (TRL 1.16):

- SFT: ``loss`` (-sum log_probs / tokens) with ``entropy`` and ``is_top1`` as metrics;
  batch 1 x S, the first eighth of the labels -100;
- DPO: ``log_probs`` summed per sequence into the sigmoid loss against fixed reference
  log-probs, ``mean_logits`` / ``is_top1`` / ``entropy`` as metrics; batch 2 x S/2 (chosen,
  rejected), prompts of S/8 masked;
- GRPO: per-token ``exp(log_probs - old) * advantage`` and ``entropy``; batch 1 x S, the
  prompt (first quarter) masked.

Peak: ``autosp.planning.memory.measure_step`` (the profiler's allocator events, forward then
backward; parameters and inputs excluded, gradients included), after a warm-up call of
each path (compilation is not counted). "today" is the previous answer of the same call:
the gathered-outputs program (every rank holds [B, S, V] logits) and log-softmax over it.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autosp.testing.distributed import run_ranks  # noqa: E402

VOCAB, HIDDEN, LAYERS = 32768, 64, 2
MiB = 1 << 20


def _model():
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=172,
                                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=1 << 16, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config)


def _batch(workload: str, seq: int):
    gen = torch.Generator().manual_seed(seq)
    rows, length = (2, seq // 2) if workload == "DPO" else (1, seq)
    ids = torch.randint(0, VOCAB, (rows, length), generator=gen)
    labels = ids.clone()
    labels[:, :{"SFT": length // 8, "DPO": length // 8, "GRPO": length // 4}[workload]] = -100
    return ids, labels


def _objective(workload: str, out, num_items):
    """The loss the trainer builds from the fused call (and the metrics it reads, detached)."""
    metrics = [out.entropy.detach().sum(), out.is_top1.sum()]
    if workload == "SFT":
        return out.log_probs.neg().sum() / num_items, metrics
    if workload == "DPO":
        logps = out.log_probs.sum(1)
        chosen, rejected = logps.chunk(2)
        loss = -torch.nn.functional.logsigmoid(0.1 * ((chosen + 1.0) - (rejected + 2.0))).mean()
        return loss, metrics + [out.mean_logits.sum()]
    old = out.log_probs.detach() + 0.01
    advantage = torch.linspace(-1.0, 1.0, out.log_probs.shape[1])
    per_token = -torch.exp(out.log_probs - old) * advantage
    return (per_token * out.label_mask).sum() / out.label_mask.sum(), metrics + [out.entropy.mean()]


def _measure(rank, world, queue, seqs):
    from autosp.hf.trainer import SequenceParallelModel
    from autosp.planning.memory import measure_step
    model = _model()
    wrapped = SequenceParallelModel(model, sp_size=world)
    exclude = list(model.parameters())
    rows, head = [], None
    for seq in seqs:
        for workload in ("SFT", "DPO", "GRPO"):
            ids, labels = _batch(workload, seq)
            num_items = (labels[:, 1:] != -100).sum()
            for path in ("today", "tiled"):
                if path == "today":
                    wrapped._logprob_head = False  # the gathered-logits answer
                elif head is None:
                    del wrapped._logprob_head  # the tiled head, built at its first call
                else:
                    wrapped._logprob_head = head

                def step(ids=ids, labels=labels, workload=workload, num_items=num_items):
                    out = wrapped(input_ids=ids, labels=labels, fused_lm_head=True)
                    loss, metrics = _objective(workload, out, num_items)
                    return (loss, *metrics)

                step()[0].backward()  # warm-up: compilation outside the measurement
                model.zero_grad(set_to_none=True)
                report = measure_step(step, exclude=exclude)
                model.zero_grad(set_to_none=True)
                rows.append((seq, workload, path, report.peak_bytes))
                if path == "tiled":
                    head = wrapped._logprob_head
    queue.put((rank, rows))


def measure(seqs) -> tuple[str, dict]:
    results = run_ranks(_measure, 2, args=(tuple(seqs),), timeout=3000, fresh=True)
    peak: dict = {}
    for rows in results.values():  # the larger rank
        for seq, workload, path, nbytes in rows:
            peak[seq, workload, path] = max(peak.get((seq, workload, path), 0), nbytes)
    s, s2 = seqs[0], seqs[-1]
    lines = [f"| workload | S | today: gathered logits (MiB) | tiled head (MiB) | tiled / today | "
             f"tiled {s2} / {s} |", "|---|---|---|---|---|---|"]
    for workload in ("SFT", "DPO", "GRPO"):
        for seq in seqs:
            today, tiled = peak[seq, workload, "today"], peak[seq, workload, "tiled"]
            growth = f"x{peak[s2, workload, 'tiled'] / peak[s, workload, 'tiled']:.2f}" if seq == s2 else ""
            lines.append(f"| {workload} | {seq} | {today / MiB:.1f} | {tiled / MiB:.1f} | {tiled / today:.3f} | "
                         f"{growth} |")
    return "\n".join(lines), peak


def costed_8b(seq: int = 131072, vocab: int = 131072, hidden: int = 4096, sp: int = 8) -> str:
    """Bytes per rank of the log-prob path for Llama-3-8B at ``seq`` tokens with a ``vocab``
    vocabulary over ``sp`` ranks, from the shapes (costed, not measured). The multipliers are
    the CPU table's: today's peak is 5.0x its gathered logits' bytes (2584 MiB at S = 4096,
    V = 32K, where the logits are 512 MiB); the tiled head's is about 6.5 chunks (415 MiB with
    64 MiB chunks, backbone and gradients included), 7 taken here."""
    from autosp.hf.logprobs import LOGITS_CHUNK_BYTES, chunk_rows
    GiB = 1 << 30
    logits = seq * vocab * 4  # fp32 [S, V]: the gathered logits every rank holds today
    today = 5 * logits  # the logits, their temperature-scaled copy, log_softmax, its exp, their product
    rows = chunk_rows(vocab)
    chunk = rows * vocab * 4
    # tiled: about seven chunk-sized tensors (recomputed logits, softmax terms and their gradients), the fp32
    # accumulator of the head's weight gradient [V, H], the labelled rows' hidden state [S/P, H] (bf16) and the
    # five gathered [S] vectors (fp32, with their gradients)
    accumulator = vocab * hidden * 4
    tiled = 7 * chunk + accumulator + seq // sp * hidden * 2 + 5 * seq * 4 * 2
    return (f"Llama-3-8B at S = {seq // 1024}K, V = {vocab // 1024}K, P = {sp} (**costed** from the shapes with the "
            f"CPU table's multipliers, not measured on a GPU): today every rank holds the gathered fp32 logits, "
            f"{logits / GiB:.0f} GiB, and the path peaks at about 5x that, {today / GiB:.0f} GiB, whatever P; the "
            f"tiled head works on one chunk of {rows} rows ({chunk / (1 << 20):.0f} MiB of fp32 logits, "
            f"LOGITS_CHUNK_BYTES = {LOGITS_CHUNK_BYTES >> 20} MiB) and peaks at about {tiled / GiB:.1f} GiB, of "
            f"which {accumulator / GiB:.0f} GiB is the fp32 accumulator of the LM head's gradient (as in TRL's own "
            f"chunked head; independent of S): {today / tiled:.0f}x less.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--append", action="store_true", help="append the table to bench/RESULTS.md")
    a = parser.parse_args()
    table, peak = measure(a.seqs)
    costed = costed_8b()
    from autosp.hf.logprobs import LOGITS_CHUNK_BYTES as LOGITS_CHUNK
    print(table, flush=True)
    print("\n" + costed, flush=True)
    s, s2 = a.seqs[0], a.seqs[-1]
    worst_ratio = max(peak[s, w, "tiled"] / peak[s, w, "today"] for w in ("SFT", "DPO", "GRPO"))
    worst_growth = max(peak[s2, w, "tiled"] / peak[s, w, "tiled"] for w in ("SFT", "DPO", "GRPO"))
    verdict = (f"At S = {s}: tiled / today <= {worst_ratio:.3f} (target <= 0.25: "
               f"{'met' if worst_ratio <= 0.25 else 'NOT met'}); tiled from S = {s} to {s2}: x{worst_growth:.2f} "
               f"(target <= 2.3: {'met' if worst_growth <= 2.3 else 'NOT met'}). Today's peak is "
               f"{peak[s, 'SFT', 'today'] / (s * VOCAB * 4):.1f}x its gathered logits ({s * VOCAB * 4 / MiB:.0f} MiB at "
               f"S = {s}) and doubles with S; the tiled head's is about "
               f"{peak[s, 'SFT', 'tiled'] / LOGITS_CHUNK:.1f} chunks of {LOGITS_CHUNK / MiB:.0f} MiB, the backbone "
               f"included (a chunk is at most the rank's rows: below S = 2 x {LOGITS_CHUNK // (4 * VOCAB)} it is "
               f"the whole shard).")
    print(verdict, flush=True)
    if a.append:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from results import append_section
        append_section("Log-probabilities without full-vocabulary logits: peak bytes per rank of the fused LM head call",
                       f"CPU, P=2 gloo, HF Llama V={VOCAB} hidden {HIDDEN} {LAYERS} layers, fp32, forward + backward, "
                       "the larger rank; `python bench/logprob_memory.py --append`",
                       f"{table}\n\n{verdict}\n\n{costed}")
