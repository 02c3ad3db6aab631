"""GPU check: parity on CUDA at sp_size=1, then step time and peak memory with and
without checkpointing for a ~1B Llama at long context. Run through bench/gpu_check.sh.

    python bench/gpu_check.py [--device cuda] [--size 1b] [--seqs 16384 32768 65536] [--steps 5]

0. Attention kinds on CUDA's kernels: every CUDA branch of ``autosp.runtime.attention``
   and ``ring`` (plain causal: flash; key padding left / right / inside a row: varlen
   flash, its second launch, the efficient kernel with the broadcast mask; sliding window,
   with and without padding; packed documents: one varlen launch; ring pairs: flash /
   efficient with the log-sum-exp, the explicit backward) in bf16 and fp32, forward and
   backward, against eager attention in fp64 with the dense mask, and the kernel each ran
   (``autosp.planning.fake_cuda.ATTENTION_KERNELS``, recorded by a dispatch mode).

1. Parity: a small Llama-like model (fp32, GQA, RoPE, loss inside), ``autosp.compile``
   with checkpointing off / sac / full against eager PyTorch on the same device: loss and
   every gradient within 1e-4 relative (TF32 off).
2. Memory and speed (bf16, batch 1): eager PyTorch, autosp, autosp + SAC, autosp + full at
   each sequence length; median step time (fwd+bwd) of ``--steps`` after one warm-up,
   ``torch.cuda.max_memory_allocated`` of a step (parameters included, no optimizer), and
   the memory model's prediction of the same (parameters + step peak). Out-of-memory is
   reported as OOM, not a failure.

Prints one table (markdown) and writes it to ``--out`` if given. Exit status 1 if parity
fails.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import autosp  # noqa: E402
from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike, RotaryEmbedding  # noqa: E402

MODES = ("off", "sac", "full")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def parity(device) -> list[str]:
    from autosp.testing.parity import relative_error
    lines = []
    ok = True
    for mode in MODES:
        torch.manual_seed(0)
        model = LlamaLike(LlamaConfig(vocab=256, hidden=128, layers=2, heads=4, kv_heads=2, ffn=344)).to(device)
        reference = copy.deepcopy(model)
        ids = torch.randint(0, 256, (2, 257), device=device)
        ref_loss = reference(ids, labels=ids)["loss"]
        ref_loss.backward()
        loss = autosp.compile(model, sp_size=1, checkpointing=mode)(ids, labels=ids)["loss"]
        loss.backward()
        loss_err = relative_error(loss.detach(), ref_loss.detach())
        grad_err = max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
        good = loss_err <= 1e-4 and grad_err <= 1e-4
        ok &= good
        lines.append(f"| parity {mode} | loss rel. err {loss_err:.1e} | max grad rel. err {grad_err:.1e} | "
                     f"{'ok' if good else 'FAIL'} |")
    ring_lines, ring_ok = ring_kernel_parity(device)
    return lines + ring_lines, ok and ring_ok


def attention_kinds_parity(device) -> tuple[list[str], bool]:
    """Each attention kind's CUDA branch (see the module docstring, item 0) against fp64
    eager attention with the dense mask: the largest error of out, dq, dk, dv relative to
    the reference's largest value; bf16 within 3e-2, fp32 within 2e-3 (fp32 runs the
    efficient kernel or falls back, warned)."""
    import warnings

    from torch.utils._python_dispatch import TorchDispatchMode

    from autosp.planning.fake_cuda import ATTENTION_KERNELS
    from autosp.runtime import attention, ring

    class Kernels(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in ATTENTION_KERNELS and ATTENTION_KERNELS[func] not in self.seen:
                self.seen.append(ATTENTION_KERNELS[func])
            return func(*args, **(kwargs or {}))

    b, hq, hkv, s, d = 2, 8, 2, 1000, 64
    i = torch.arange(s, device=device)
    causal = (i[None, :] <= i[:, None])[None, None]
    pads = {}
    for kind in ("left", "right", "middle"):
        m = torch.ones(b, s, dtype=torch.bool, device=device)
        if kind == "left":
            m[1, :100] = False
        elif kind == "right":
            m[0, -150:] = False
        else:
            m[0, 300:340] = False
        pads[kind] = m
    window = 128
    band = (i[:, None] - i[None, :] < window)[None, None]
    docs = torch.stack([(i >= 300).long() + (i >= 700).long(), (i >= 50).long()])
    same = (docs[:, None, :, None] == docs[:, None, None, :])
    pieces = [[(0, 250), (750, 1000), (250, 750)]]
    rows = torch.cat([torch.arange(a, z) for a, z in pieces[0]]).to(device)

    def kp(name):
        return lambda q, k, v: attention.key_padded_causal_attention(
            q, k, v, pads[name][:, None, None, :], enable_gqa=True, empty_rows="uniform")

    def ring_call(**kw):
        def run(q, k, v):
            local = [x[:, :, rows] for x in (q, k, v)]
            out = ring.ring_attention(*local, pieces=pieces, group="gpu_check", is_causal=True, **kw)
            return out.new_zeros(out.shape[0], out.shape[1], s, out.shape[3]).index_copy(2, rows, out)
        return run
    kinds = [
        ("causal (flash)", lambda q, k, v: attention.sdpa(q, k, v, is_causal=True, enable_gqa=True), causal, None),
        ("position_ids + all-ones mask", lambda q, k, v: attention.key_padded_causal_attention(
            q, k, v, torch.ones(b, 1, 1, s, dtype=torch.bool, device=device), enable_gqa=True), causal, None),
        ("left padding", kp("left"), causal & pads["left"][:, None, None, :], "uniform"),
        ("right padding", kp("right"), causal & pads["right"][:, None, None, :], "uniform"),
        ("padding inside a row", kp("middle"), causal & pads["middle"][:, None, None, :], "uniform"),
        ("sliding window", lambda q, k, v: attention.sliding_window_attention(q, k, v, enable_gqa=True,
                                                                             window=window), causal & band, None),
        ("window + left padding", lambda q, k, v: attention.sliding_window_attention(
            q, k, v, pads["left"][:, None, None, :], enable_gqa=True, window=window, empty_rows="uniform"),
         causal & band & pads["left"][:, None, None, :], "uniform"),
        ("packed documents", lambda q, k, v: attention.document_attention(q, k, v, docs[:, None, None, :],
                                                                          enable_gqa=True), causal & same, None),
        ("ring pairs, causal", ring_call(), causal, None),
        ("ring pairs, documents", ring_call(doc_ids=docs), causal & same, None),
    ]
    lines, ok = [], True
    for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float32, 2e-3)):
        for name, fn, allowed, empty in kinds:
            torch.manual_seed(0)
            q, k, v = (torch.randn(b, h, s, d, device=device, dtype=torch.float64) for h in (hq, hkv, hkv))
            g = torch.randn(b, hq, s, d, device=device, dtype=torch.float64)
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            kr, vr = (x.repeat_interleave(hq // hkv, 1) for x in leaves[1:])
            scores = leaves[0] @ kr.transpose(-1, -2) / d ** 0.5
            if empty == "uniform":
                scores = scores + torch.where(allowed, 0.0, torch.tensor(torch.finfo(torch.float64).min,
                                                                          dtype=torch.float64, device=device))
                ref = torch.softmax(scores, -1) @ vr
            else:
                ref = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0) @ vr
            (ref * g).sum().backward()
            mine = [x.to(dtype).requires_grad_() for x in (q, k, v)]
            mode = Kernels()
            try:
                with warnings.catch_warnings(record=True) as caught, mode:
                    warnings.simplefilter("always")
                    out = fn(*mine)
                    (out.double() * g).sum().backward()
                errs = [float((a.detach().double() - e).abs().max() / e.abs().max())
                        for a, e in zip([out] + [x.grad for x in mine], [ref] + [x.grad for x in leaves])]
                err = max(errs)
                good = err <= tol
                note = "; ".join(sorted({str(w.message).split(";")[0][8:] for w in caught
                                         if str(w.message).startswith("autosp:")}))
            except Exception as e:  # a kernel that refuses: a failure with its message
                err, good, note = float("nan"), False, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            ok &= good
            lines.append(f"| {name} {str(dtype)[6:]} | max rel err {err:.1e} (out, dq, dk, dv) | "
                         f"{', '.join(mode.seen)}{' (' + note + ')' if note else ''} | {'ok' if good else 'FAIL'} |")
            print(lines[-1], flush=True)
    return lines, ok


def ring_kernel_parity(device) -> tuple[list[str], bool]:
    """The ring attention kernel's device path (one ring rank: no sends) against SDPA with
    the dense mask: zigzag pieces, GQA, causal / window / documents, forward and backward."""
    import torch.nn.functional as F

    from autosp.runtime import ring
    torch.manual_seed(0)
    b, hq, hkv, s, d = 2, 4, 2, 96, 32
    pieces = [[(0, 24), (72, 96), (24, 72)]]  # one rank holding every position, out of order
    rows = torch.cat([torch.arange(a, z) for a, z in pieces[0]]).to(device)
    lines, ok = [], True
    docs = (torch.arange(s, device=device) >= 40).long()[None] + (torch.arange(s, device=device) >= 70).long()[None]
    for name, kw in (("causal", {}), ("window 16", dict(window=16)), ("documents", dict(doc_ids=docs))):
        q, k, v = (torch.randn(b, h, s, d, device=device, requires_grad=True) for h in (hq, hkv, hkv))
        i, j = torch.arange(s, device=device)[:, None], torch.arange(s, device=device)[None]
        mask = (j <= i) & ((i - j < kw["window"]) if "window" in kw else True) & \
            ((docs[0][:, None] == docs[0][None]) if "doc_ids" in kw else True)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)[:, :, rows]
        w = torch.randn_like(ref)
        (ref * w).sum().backward()
        ref_grads = [x.grad[:, :, rows].clone() for x in (q, k, v)]
        ql, kl, vl = (x.detach()[:, :, rows].clone().requires_grad_() for x in (q, k, v))
        out = ring.ring_attention(ql, kl, vl, pieces=pieces, group="gpu_check", is_causal=True, **kw)
        (out * w).sum().backward()
        err = max([float((out - ref).detach().abs().max())] + [float((x.grad - g).abs().max())
                                                       for x, g in zip((ql, kl, vl), ref_grads)])
        good = err <= 1e-4
        ok &= good
        lines.append(f"| ring kernel {name} | max abs err {err:.1e} (out, dq, dk, dv) | {device.type} path | "
                     f"{'ok' if good else 'FAIL'} |")
    return lines, ok


def step_stats(run, device, steps: int):
    try:
        run()  # warm-up (and compile)
        _sync(device)
        times = []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(steps):
            start = time.perf_counter()
            run()
            _sync(device)
            times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else float("nan")
        return statistics.median(times), peak
    except torch.OutOfMemoryError:
        return None, None
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def budget_check(device, size: str, seqs, tiles: int) -> list[str]:
    """An ``size``-shaped Llama (random weights, bf16) at each of ``seqs`` tokens on one
    device with every mechanism of ``memory_budget`` (tiled loss with dropped logits, full
    recompute, ``tiles`` token-wise tiles, every layer's input offloaded to pinned host
    memory): the memory model's prediction on CUDA's kernels against
    ``torch.cuda.max_memory_allocated``, step time and tokens/s."""
    from autosp.cost.plan import MemoryPlan
    from autosp.planning.estimate import MemoryModel
    cfg = LlamaConfig(**LLAMA_PRESETS[size], max_positions=max(seqs))
    plan = MemoryPlan(layers=("full+offload",) * cfg.layers, tiles=tiles, loss_chunk=4096, drop_logits=True)
    rows = ["", f"Llama '{size}', bf16, one device, plan: tiled loss (logits dropped), full recompute, "
            f"{tiles} tiles, offload of every layer's input; fwd+bwd, no optimizer; memory model on "
            f"{device.type}'s kernels", "",
            "| S | step s | tokens/s | max_memory_allocated GiB | memory model GiB (params + step peak) | "
            "host GiB offloaded |", "|---|---|---|---|---|---|"]
    print("\n".join(rows), flush=True)
    t0 = time.perf_counter()
    estimator = MemoryModel(cfg, 1, torch.bfloat16, plan=plan, optimizer="none", device=device.type)
    predicted = {}
    for seq in seqs:
        est = estimator.estimate(seq)
        predicted[seq] = (est.param_bytes + est.peak_bytes) / 2**30
    print(f"(memory model: {time.perf_counter() - t0:.0f}s)", flush=True)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaLike(cfg)
    model = model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.02)
        # RoPE's inverse frequencies are computed at construction: to_empty lost them.
        model.rope.inv_freq.copy_(RotaryEmbedding(cfg.head_dim, cfg.rope_theta).inv_freq)
    model = model.to(torch.bfloat16)
    compiled = autosp.compile(model, sp_size=1, memory_plan=plan)
    for seq in seqs:
        ids = torch.randint(0, cfg.vocab, (1, seq), device=device)

        def run(ids=ids):
            for p in model.parameters():
                p.grad = None
            compiled(ids, labels=ids)["loss"].backward()
        t, peak = step_stats(run, device, 2)
        offloader = compiled.programs[0].runner.meta.get("autosp_offloader") if compiled.programs else None
        host = offloader.peak_host_bytes / 2**30 if offloader is not None else float("nan")
        row = (f"| {seq} | OOM | | OOM | {predicted[seq]:.1f} | |" if t is None else
               f"| {seq} | {t:.2f} | {seq / t:.0f} | {peak / 2**30:.1f} | {predicted[seq]:.1f} | {host:.1f} |")
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="1b", choices=sorted(LLAMA_PRESETS))
    parser.add_argument("--seqs", type=int, nargs="*", default=[16384, 32768, 65536])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--budget-size", default="8b", choices=sorted(LLAMA_PRESETS),
                        help="model of the memory_budget check (default 8b)")
    parser.add_argument("--budget-seqs", type=int, nargs="*", default=[],
                        help="run the memory_budget check at these lengths (none: skip)")
    parser.add_argument("--budget-tiles", type=int, default=16)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("error: no CUDA device visible to PyTorch", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    header = [f"# autosp GPU check, {datetime.datetime.now().isoformat(timespec='minutes')}, {name}, "
              f"torch {torch.__version__}", ""]
    lines, ok = parity(device)
    if device.type == "cuda":
        kind_lines, kinds_ok = attention_kinds_parity(device)
        lines, ok = kind_lines + lines, ok and kinds_ok
    table = ["| check | | | |", "|---|---|---|---|"] + lines
    print("\n".join(header + table), flush=True)

    rows = [] if not args.seqs else sizes_table(args, device)
    if args.budget_seqs:
        rows += budget_check(device, args.budget_size, args.budget_seqs, args.budget_tiles)
    text = "\n".join(header + table + rows) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    return 0 if ok else 1


def sizes_table(args, device) -> list[str]:
    """Step time and peak of eager / autosp / SAC / full at each of ``args.seqs``."""
    from autosp.planning.estimate import MemoryModel
    rows = ["", f"Llama '{args.size}' ({LLAMA_PRESETS[args.size]}), bf16, batch 1, fwd+bwd, no optimizer", "",
            "| S | mode | step s | max_memory_allocated GiB | memory model GiB | vs eager time |",
            "|---|---|---|---|---|---|"]
    print("\n".join(rows), flush=True)
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(**LLAMA_PRESETS[args.size], max_positions=max(args.seqs))).to(device, torch.bfloat16)
    params = {p.untyped_storage()._cdata: p for p in model.parameters()}.values()
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    estimators = {mode: MemoryModel(LlamaConfig(**LLAMA_PRESETS[args.size]), 1, torch.bfloat16, mode,
                                    device=device.type) for mode in MODES}
    for seq in args.seqs:
        ids = torch.randint(0, LLAMA_PRESETS[args.size]["vocab"], (1, seq), device=device)
        eager_time = None
        for mode in ("eager",) + MODES:
            for p in model.parameters():
                p.grad = None
            runner = model if mode == "eager" else autosp.compile(model, sp_size=1, checkpointing=mode)

            def run(runner=runner, ids=ids):
                for p in model.parameters():
                    p.grad = None
                runner(ids, labels=ids)["loss"].backward()
            t, peak = step_stats(run, device, args.steps)
            est = estimators["off" if mode == "eager" else mode].estimate(seq)
            predicted = (param_bytes + est.peak_bytes) / 2**30
            if t is None:
                row = f"| {seq} | {mode} | OOM | OOM | {predicted:.1f} | |"
            else:
                eager_time = t if mode == "eager" else eager_time
                rel = f"{t / eager_time:.2f}x" if eager_time else ""
                row = f"| {seq} | {mode} | {t:.3f} | {peak / 2**30:.1f} | {predicted:.1f} | {rel} |"
            rows.append(row)
            print(row, flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
