"""autosp side by side with single device, hand-written Ulysses and DeepSpeed AutoSP.

    bash bench/setup.sh                                   # once: installs the peers
    .venv/bin/python bench/sidebyside.py                  # PEERS.md's model, S=1K: step time
    .venv/bin/python bench/sidebyside.py --preset long    # tiny widths, S=1K/4K/16K: memory
    .venv/bin/python bench/sidebyside.py --fingerprint --seqs 4096   # the input check's cost

Every system trains the same Hugging Face ``LlamaForCausalLM`` (same seed, same weights,
fp32, SDPA) on the same batch, P=2 gloo ranks on CPU with one thread each, one system
after the other (DeepSpeed AutoSP with and without its SAC each in its own process
group, as its SAC patches PyTorch globally). Per system and length: step time (fwd+bwd
and gradient all-reduce; median of ``--steps`` after ``--warmup``), bytes saved for
backward and peak bytes per rank (:func:`autosp.planning.memory.measure_step`: saved tensors once
per storage, parameters excluded; allocator peak), and the loss against single device.
autosp runs eager (``off``), with SAC and with full recompute, and, with ``--inductor``,
compiled by Inductor like DeepSpeed AutoSP. Ratios are taken within one run. Prints the
tables and appends them to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import peers  # noqa: E402
from results import append_section  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

PRESETS = {
    # PEERS.md's model: Llama-like, hidden 256, 4 layers, 8 heads, SwiGLU 768, vocab 1024.
    "peers": dict(model=dict(hidden=256, layers=4, heads=8, kv_heads=8, ffn=768, vocab=1024), seqs=[1024]),
    # Narrow, so that 16K tokens run on this CPU in minutes.
    "long": dict(model=dict(hidden=64, layers=2, heads=4, kv_heads=4, ffn=172, vocab=1024),
                 seqs=[1024, 4096, 16384]),
}


def run_autosp(model, ids, labels, steps: int, warmup: int, checkpointing: str = "off",
               backend: str | None = None) -> dict:
    """autosp.compile(model) as a user runs it: every rank passes the full batch."""
    import autosp
    compiled = autosp.compile(model, checkpointing=checkpointing, backend=backend)

    def forward():
        return compiled(input_ids=ids, labels=labels, use_cache=False).loss

    def step():
        peers._zero_grads(model)
        forward().backward()  # autosp's gradient sum runs at the end of backward

    first, step_s = peers._time_steps(step, steps, warmup)
    compiled.grad_sync.enabled = False  # measure the step without the gradient all-reduce, as for the peers
    report, loss = peers._measure(model, forward, compiled.grad_sync.synchronize)
    compiled.grad_sync.enabled = True
    name = f"autosp{'' if checkpointing == 'off' else ' + ' + checkpointing.upper().replace('SAC-MIN', 'SAC-min')}" + \
        (f" ({backend})" if backend else " (eager)")
    return peers._result(name, first, step_s, report, loss, model, False)


def _body(rank, world, queue, cfg, seq, systems, steps, warmup, seed):
    torch.manual_seed(seed)
    ids = torch.randint(0, cfg["vocab"], (1, seq))
    results = []
    for system in systems:
        model = peers.build_llama(seed, **cfg)
        if system == "single":
            r = peers.run_single(model, ids, ids, steps, warmup)
        elif system == "ulysses_ds":
            r = peers.run_ulysses_deepspeed(model, ids, ids, steps, warmup)
        elif system == "ulysses_yunchang":
            r = peers.run_ulysses_yunchang(model, ids, ids, steps, warmup)
        elif system in ("ds_autosp", "ds_autosp_sac"):
            r = peers.run_deepspeed_autosp(model, ids, ids, steps, warmup, sac=system.endswith("sac"))
        elif system.startswith("autosp"):
            parts = system.split(":")  # autosp:<checkpointing>[:<backend>]
            r = run_autosp(model, ids, ids, steps, warmup, parts[1], parts[2] if len(parts) > 2 else None)
        else:
            raise ValueError(system)
        r.pop("grads", None)
        r["system"] = system
        results.append(r)
        del model
    queue.put((rank, results))


def _fingerprint_body(rank, world, queue, cfg, seq, steps, warmup, seed):
    """One model compiled twice, with the per-call input check and without
    (``check_inputs=False``), stepped in alternation (ABBA) so both see the same machine;
    then the check alone, timed over 50 calls."""
    import statistics
    import time

    from torch.utils import _pytree as pytree

    import autosp
    from autosp.frontend.importer import input_paths
    from autosp.inputs import check_inputs_agree
    torch.manual_seed(seed)
    model = peers.build_llama(seed, **cfg)
    ids = torch.randint(0, cfg["vocab"], (1, seq))
    systems = {True: autosp.compile(model), False: autosp.compile(model, check_inputs=False)}

    def step(check: bool) -> float:
        peers._zero_grads(model)
        peers._barrier()
        t0 = time.perf_counter()
        systems[check](input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return time.perf_counter() - t0

    for _ in range(warmup):
        step(True), step(False)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(steps):
        for check in ((True, False) if i % 2 == 0 else (False, True)):
            times[check].append(step(check))
    leaves, spec = pytree.tree_flatten(((), dict(input_ids=ids, labels=ids, use_cache=False)))
    paths = input_paths(spec, leaves)
    group = systems[True].sp_group
    peers._barrier()
    t0 = time.perf_counter()
    for _ in range(50):
        check_inputs_agree(leaves, spec, paths, group, modes=(True,))
    check_s = (time.perf_counter() - t0) / 50
    queue.put((rank, dict(checked=statistics.median(times[True]), unchecked=statistics.median(times[False]),
                          check_s=check_s)))


def fingerprint_cost(cfg: dict, seqs: list[int], steps: int, warmup: int, seed: int, write: bool) -> None:
    """The per-call input check (autosp/inputs.py) side by side with check_inputs=False."""
    lines = ["| S | step s, checked | step s, check_inputs=False | checked / unchecked | the check alone ms | "
             "check / step |", "|---|---|---|---|---|---|"]
    for seq in seqs:
        res = run_ranks(_fingerprint_body, 2, args=(cfg, seq, steps, warmup, seed), timeout=7200,
                        collective_timeout=1800)
        checked = max(r["checked"] for r in res.values())
        unchecked = max(r["unchecked"] for r in res.values())
        check = max(r["check_s"] for r in res.values())
        lines.append(f"| {seq} | {checked:.3f} | {unchecked:.3f} | {checked / unchecked:.3f} | {check * 1e3:.2f} | "
                     f"{check / unchecked:.2%} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    print("\n" + text)
    if write:
        append_section("The per-call input check (fingerprint) against check_inputs=False",
                       f"CPU, P=2 gloo, 1 thread/rank, fp32, HF LlamaForCausalLM {cfg}, batch 1; {steps} steps of "
                       f"each, alternating, after {warmup} warm-up; the check alone over 50 calls", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="peers")
    parser.add_argument("--seqs", type=int, nargs="+")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--inductor", action="store_true", help="also autosp compiled by Inductor")
    parser.add_argument("--no-peers", action="store_true", help="autosp and single device only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--fingerprint", action="store_true",
                        help="only the per-call input check's cost, against check_inputs=False")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    cfg, seqs = preset["model"], args.seqs or preset["seqs"]
    if args.fingerprint:
        fingerprint_cost(cfg, seqs, args.steps, args.warmup, args.seed, not args.no_write)
        return
    eager = ["single"] + ([] if args.no_peers else ["ulysses_ds", "ulysses_yunchang"]) + \
        ["autosp:off", "autosp:sac", "autosp:sac-min", "autosp:full"] + (["autosp:off:inductor", "autosp:sac:inductor"]
                                                      if args.inductor else [])
    groups = [eager] + ([] if args.no_peers else [["ds_autosp"], ["ds_autosp_sac"]])
    rows = {}
    for seq in seqs:
        for systems in groups:
            res = run_ranks(_body, 2, args=(cfg, seq, systems, args.steps, args.warmup, args.seed),
                            timeout=7200, collective_timeout=1800)
            for i, r0 in enumerate(res[0]):
                r1 = res[1][i]
                rows[(seq, r0["system"])] = dict(
                    name=r0["name"], step=max(r0["step_s"], r1["step_s"]), first=max(r0["first_step_s"], r1["first_step_s"]),
                    saved=max(r0["saved_bytes"], r1["saved_bytes"]) / 2**20,
                    peak=max(r0["peak_bytes"], r1["peak_bytes"]) / 2**20, loss=r0["loss"])
                r = rows[(seq, r0["system"])]
                print(f"S={seq} {r['name']}: {r['step']:.3f} s/step, saved {r['saved']:.1f} MiB, "
                      f"peak {r['peak']:.1f} MiB, loss {r['loss']:.6f} (first step {r['first']:.1f} s)", flush=True)

    def ratio(a, b, key):
        return f"{rows[a][key] / rows[b][key]:.2f}" if a in rows and b in rows and rows[b][key] else "n/a"

    lines = ["| S | system | step s | first step s | saved MiB/rank | peak MiB/rank | loss - single |",
             "|---|---|---|---|---|---|---|"]
    for (seq, _system), r in rows.items():
        single = rows.get((seq, "single"))
        dloss = f"{r['loss'] - single['loss']:+.1e}" if single else "n/a"
        lines.append(f"| {seq} | {r['name']} | {r['step']:.3f} | {r['first']:.1f} | {r['saved']:.1f} | "
                     f"{r['peak']:.1f} | {dloss} |")
    ratios = ["| S | autosp / Ulysses (DS) time | autosp / Ulysses (yunchang) time | autosp / DS AutoSP time | "
              "autosp+SAC / DS AutoSP+SAC time | autosp saved / single | autosp+SAC saved / Ulysses | "
              "autosp+SAC saved / DS AutoSP+SAC | autosp+SAC time / autosp |", "|---|---|---|---|---|---|---|---|---|"]
    for seq in seqs:
        a, s = (seq, "autosp:off"), (seq, "autosp:sac")
        # DeepSpeed AutoSP runs Inductor-compiled: compare with autosp under Inductor when measured.
        ai = (seq, "autosp:off:inductor") if (seq, "autosp:off:inductor") in rows else a
        si = (seq, "autosp:sac:inductor") if (seq, "autosp:sac:inductor") in rows else s
        tag = " (both Inductor)" if ai != a else " (autosp eager)"
        ratios.append(f"| {seq} | {ratio(a, (seq, 'ulysses_ds'), 'step')} | {ratio(a, (seq, 'ulysses_yunchang'), 'step')} | "
                      f"{ratio(ai, (seq, 'ds_autosp'), 'step')}{tag} | {ratio(si, (seq, 'ds_autosp_sac'), 'step')}{tag} | "
                      f"{ratio(a, (seq, 'single'), 'saved')} | {ratio(s, (seq, 'ulysses_ds'), 'saved')} | "
                      f"{ratio(s, (seq, 'ds_autosp_sac'), 'saved')} | {ratio(s, a, 'step')} |")
    text = "\n".join(lines) + "\n\nRatios (same run):\n\n" + "\n".join(ratios)
    print("\n" + text)
    if not args.no_write:
        append_section(f"Side by side, preset '{args.preset}'",
                       f"CPU, P=2, 1 thread/rank, fp32, HF LlamaForCausalLM {cfg}; {args.steps} steps after "
                       f"{args.warmup} warm-up", text)


if __name__ == "__main__":
    main()
