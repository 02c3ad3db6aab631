"""Parity and communication of autosp's sequence parallelism, per model, at P = 2 and 4.

    python bench/parity_table.py            # prints a markdown table, appends it to bench/RESULTS.md

For each reference model: max relative error (vs single-device eager, fp32, gathered
outputs) of the loss and of all parameter gradients on any rank, the all-to-alls per
attention layer in the compiled IR (Ulysses minimum: 4), and the other collectives per
step (the loss reduction, the bucketed gradient all-reduce).
"""
from __future__ import annotations

import copy
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autosp.testing.distributed import run_ranks  # noqa: E402

MODELS = {
    "SDPA block (S=16, seq dim 1)": ("attention", 16),
    "SDPA block, seq dim 0 (S=15)": ("attention-seq-first", 15),
    "Llama-style, GQA, RoPE, loss inside (S=33)": ("llama", 33),
    "GPT-2-style, manual attention (S=15)": ("gpt2", 15),
}


def _body(rank, world, queue, name, seq):
    import autosp
    from autosp.models import reference_model
    from autosp.testing.parity import parity, relative_error

    torch.manual_seed(0)
    model, args, kwargs, seq_dim = reference_model(name, layers=2, seq=seq)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, seq_dim=seq_dim, gather_outputs=True)
    report = parity(reference, compiled, *args, **kwargs)
    out, ref = compiled(*args, **kwargs), reference(*args, **kwargs)
    loss_err = None
    if isinstance(out, (dict, tuple)):
        o = out["loss"] if isinstance(out, dict) and "loss" in out else out[0] if isinstance(out, tuple) else None
        r = ref["loss"] if isinstance(ref, dict) and "loss" in ref else ref[0] if isinstance(ref, tuple) else None
        if o is not None and o.dim() == 0:
            loss_err = relative_error(o, r)
    ir = compiled.programs[0].mlir["transformed"]
    layers = max(1, ir.count("scaled_dot_product_attention") + ir.count("torch.aten.softmax.int"))
    queue.put((rank, dict(loss=loss_err, grads=report.max_grad_error, outputs=report.max_output_error,
                          a2a_per_layer=ir.count('"autosp.all_to_all"') / layers,
                          other=ir.count('"autosp.all_reduce"') + ir.count('"autosp.all_gather"'),
                          grad_buckets=compiled.grad_sync.collectives_last_step)))


def main() -> None:
    rows = ["| model | P | loss rel. err | max grad rel. err | all-to-all / layer (min 4) | other collectives / step |",
            "|---|---|---|---|---|---|"]
    for label, (name, seq) in MODELS.items():
        for world in (2, 4):
            res = run_ranks(_body, world, args=(name, seq), timeout=600)
            loss = max((r["loss"] for r in res.values() if r["loss"] is not None), default=None)
            grads = max(r["grads"] for r in res.values())
            r0 = res[0]
            other = f"{r0['other']} in graph (loss sum, output gathers) + {r0['grad_buckets']} gradient bucket"
            rows.append(f"| {label} | {world} | {'n/a' if loss is None else f'{loss:.1e}'} | {grads:.1e} | "
                        f"{r0['a2a_per_layer']:.0f} | {other} |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    print("\n" + table)
    out = Path(__file__).with_name("RESULTS.md")
    stamp = datetime.date.today().isoformat()
    with out.open("a") as f:
        f.write(f"\n## Sequence-parallel parity ({stamp}, CPU, gloo, fp32)\n\n{table}\n")


if __name__ == "__main__":
    main()
