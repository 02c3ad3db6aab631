"""Collectives per layer and bytes moved by autosp, against the analytical Ulysses volume.

    python bench/collectives.py [--seq 1024] [--world 2] [--bucket-mb 25]
    python bench/collectives.py --fsdp [--world 2]     # FSDP2-sharded model state
    python bench/collectives.py --strategies [--world 4]   # Ulysses, hybrid and ring meshes
    python bench/collectives.py --recurrences [--world 2]  # conv halo and state bytes (Mamba2, GDN)
    python bench/collectives.py --mla [--world 8] [--seq 16384]  # DeepSeek-V3's attention: latents gathered

Every collective a rank issues during one training step (forward, backward and the
gradient all-reduce) is seen by a dispatch mode: PyTorch's c10d and functional
collective ops. Bytes "moved" are what a rank sends to the other ranks (an all-to-all
keeps its own part). The analytical Ulysses minimum per attention layer and rank:
4 all-to-alls forward (q, k, v, output) and 4 backward, each sending (P-1)/P of a
[B, S/P, heads x head_dim] tensor, with k and v at the KV-head width. Prints a table and
appends it to bench/RESULTS.md.

Overlap of the gradient all-reduce with backward: autosp starts each bucket's all-reduce
(``--bucket-mb``, autosp's ``grad_bucket_bytes``) as soon as backward completes the
bucket. The table reports the share of gradient bytes whose all-reduce was issued before
the last backward compute op ran (the rest can only start after it), and the time from
the first issue to the end of ``loss.backward()`` against the whole backward.

With ``--fsdp`` the model is sharded with the FSDP2 recipe (``fully_shard`` per block, then
the root) over the world, and the table counts the parameter collectives per group (each
block, and the root): all-gathers in forward and in backward, reduce-scatters, and any
all-reduce of gradients (there must be none: the SP sum folds into the reduce-scatter).
Analytical volume per block and rank (ring algorithms): an all-gather and a reduce-scatter
each send (P-1)/P of the block's parameters (rows padded to a multiple of P), so a step
sends 3 x (P-1)/P x the block's bytes.

With ``--strategies`` each model runs under every mesh of P ranks its heads allow
(``sp_strategy`` ulysses, hybrid with each Ulysses degree, ring), and the table counts
per attention layer the all-to-alls and the ring's sends (forward + backward, counted
by :mod:`autosp.runtime.ring`) and the bytes a rank sends, against the analytical volume
of :func:`autosp.cost.strategy.price` (the model ``autosp.compile`` chooses with): Ulysses
2 x (U-1)/U of q, k, v, o at the rank's frame; ring (R-1) K/V hops forward, (R-1) K/V
and R dK/dV hops backward.

With ``--recurrences`` (issue 26) a Mamba2 hybrid (Granite-4) and a Gated DeltaNet hybrid
(Qwen3-Next), tiny configs, run one step, and the table gives per recurrent layer and
rank the bytes handed to the conv halo's collectives (forward: the rank's last k - 1
positions, B x C x (k - 1), to the all-gather; backward: the [P, B, C, k - 1] blocks to
the all-reduce) and to the state exchange, for both sharded methods (``sp_recurrence``):
the chain sends one state (B x H x d_k x d_v for Gated DeltaNet or B x H x head_dim x
d_state for Mamba2) forward to the next rank unless last and its gradient backward to the
previous unless first; the prefix hands its summary (that state plus the transition,
B x H x d_k x d_k or B x H x d_state x d_state) to one all-gather forward and its incoming
state's gradient (one state) to one all-gather backward. Measured by
:class:`autosp.runtime.collectives.observe`, against those formulas from the config.

With ``--mla`` (issue 42) DeepSeek-V3's attention shape (bench/configs/deepseek-v3-attention.json:
128 heads, q/k 128 + 64 rope, v 128, q latent 1536, kv latent 512) runs one training step
of one simulated rank on the fake-CUDA path (meta weights, :func:`autosp.planning.fake_cuda.cuda_step`:
no GPU, no memory), once as ``autosp.compile`` partitions it (q, k and v computed on each
rank's heads from gathered latents, :mod:`autosp.passes.head_cut`) and once with that cut
turned off (the per-head all-to-alls of q, k and v). The forward's collectives come in
program order: q's carrier, then k's and v's (the per-head tensors, or the kv latent and
the shared rope key), then the output's; bytes sent are the send buffer's (P - 1) / P.
Analytical, per layer and rank forward (backward mirrors it): an all-to-all of ``H x D``
values per token sends ``(P - 1) / P x S / P x H x D x e``; a latent of ``C`` values
gathered (P copies all-to-all'd) sends ``(P - 1) x S / P x C x e``.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results import append_section  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

MODELS = {  # name -> LlamaConfig kwargs (PEERS.md's model, and the same with GQA)
    "Llama-like, 8 heads / 8 KV": dict(vocab=1024, hidden=256, layers=4, heads=8, ffn=768),
    "Llama-like, 8 heads / 4 KV (GQA)": dict(vocab=1024, hidden=256, layers=4, heads=8, kv_heads=4, ffn=768),
}


def _rank_in(pg, rank: int, world: int) -> tuple[int, int]:
    """This rank's index and the size of the group a collective op ran on (a ProcessGroup
    or a functional collective's group name); the world's when it cannot be told."""
    try:
        if isinstance(pg, str):
            from torch.distributed.distributed_c10d import _resolve_process_group
            pg = _resolve_process_group(pg)
        elif isinstance(pg, torch.ScriptObject):
            pg = torch._C._distributed_c10d.ProcessGroup.unbox(pg)
        return pg.rank(), pg.size()
    except Exception:  # noqa: BLE001 - an unknown handle: count as the whole world
        return rank, world


class CollectiveCounter(TorchDispatchMode):
    """Counts collective ops and the bytes this rank sends to others."""

    def __init__(self, rank: int, world: int):
        super().__init__()
        self.rank, self.world = rank, world
        self.calls: Counter = Counter()
        self.sent: Counter = Counter()
        self.op_times: list[float] = []  # when each non-collective op finished

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        name = func._schema.name.split("::")[-1]
        if ns in ("c10d", "_c10d_functional") and name not in ("wait_tensor", "_wrap_tensor_autograd"):
            x = args[0]
            tensors = x if isinstance(x, (list, tuple)) else [x]
            nbytes = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
            kind = name.rstrip("_")
            if "all_to_all" in kind or "alltoall" in kind:
                if ns == "c10d":  # alltoall_base_(output, input, pg, output_splits, input_splits, ...)
                    flat, splits, pg = args[1], (args[4] or None), args[2]
                else:  # all_to_all_single(input, output_splits, input_splits, group)
                    flat, splits, pg = args[0], (args[2] or None), args[3]
                me, size = _rank_in(pg, self.rank, self.world)  # (a sub-group's, for hybrid meshes)
                nbytes = flat.numel() * flat.element_size()
                own = (splits[me] * flat[0].numel() * flat.element_size() if splits and flat.dim() > 1
                       else splits[me] * flat.element_size() if splits else nbytes // size)
                nbytes -= own
                kind = "all_to_all"
            elif "reduce" in kind and "scatter" not in kind:
                kind = "all_reduce"
                nbytes = nbytes * (self.world - 1) // self.world * 2  # ring all-reduce
            elif "gather" in kind:  # (output, input, ...): a ring sends this rank's input to P-1 others
                kind = "all_gather"
                nbytes = args[1].numel() * args[1].element_size() * (self.world - 1)
            elif "scatter" in kind:  # (output, input, ...): a ring sends (P-1)/P of the input
                kind = "reduce_scatter"
                nbytes = args[1].numel() * args[1].element_size() * (self.world - 1) // self.world
            self.calls[kind] += 1
            self.sent[kind] += nbytes
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        self.op_times.append(time.perf_counter())
        return out


def overlap(op_times: list[float], step: dict, end: float, start: float) -> dict:
    """Gradient all-reduce overlap of one backward from ``GradientSync.last_step``: the
    share of bytes issued before the last backward compute op (ops inside the sync's own
    issue windows and after its first wait do not count as compute), the time from the
    first issue to ``end`` and the whole backward (``start`` to ``end``)."""
    issues = step["issues"]
    first_wait = step["first_wait"] if step["first_wait"] is not None else end
    compute = [t for t in op_times if t < first_wait and not any(a <= t <= b for a, b, _ in issues)]
    last_op = max(compute, default=start)
    total = sum(n for _, _, n in issues)
    early = sum(n for a, _, n in issues if a < last_op)
    return dict(buckets=len(issues), fraction=early / total if total else 0.0,
                issue_to_end_s=end - min((a for a, _, _ in issues), default=end), backward_s=end - start)


def _body(rank, world, queue, cfg, seq, checkpointing, bucket_bytes):
    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(**cfg))
    ids = torch.randint(0, cfg["vocab"], (1, seq))
    compiled = autosp.compile(model, checkpointing=checkpointing, grad_bucket_bytes=bucket_bytes)
    compiled(ids, labels=ids)["loss"].backward()  # compile outside the count
    fwd, bwd = CollectiveCounter(rank, world), CollectiveCounter(rank, world)
    with fwd:
        loss = compiled(ids, labels=ids)["loss"]
    start = time.perf_counter()
    with bwd:
        loss.backward()
    end = time.perf_counter()
    ov = overlap(bwd.op_times, compiled.grad_sync.last_step, end, start)
    queue.put((rank, (dict(fwd.calls), dict(fwd.sent), dict(bwd.calls), dict(bwd.sent), ov)))


def _fsdp_body(rank, world, queue, cfg, seq, checkpointing):
    from torch.distributed.fsdp import fully_shard

    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(**cfg))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    ids = torch.randint(0, cfg["vocab"], (1, seq))
    compiled = autosp.compile(model, checkpointing=checkpointing)
    compiled(ids, labels=ids)["loss"].backward()  # compile outside the count
    fwd, bwd = CollectiveCounter(rank, world), CollectiveCounter(rank, world)
    with fwd:
        loss = compiled(ids, labels=ids)["loss"]
    with bwd:
        loss.backward()
    program = compiled.programs[0]
    log = program.last_unsharder.log
    groups = program.unshard_order
    per_group = {k: (log.count(("all_gather", "forward", k)), log.count(("all_gather", "backward", k)),
                     log.count(("reduce_scatter", "backward", k))) for k in groups}
    blocks = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in model.blocks]
    queue.put((rank, (dict(fwd.calls), dict(fwd.sent), dict(bwd.calls), dict(bwd.sent), per_group,
                      program.last_unsharder.max_unsharded, blocks)))


def fsdp_table(world: int, seq: int) -> list[str]:
    """Rows: the FSDP2 parameter collectives of one step, per group, against the analytical volume."""
    rows = ["| model | P | checkpointing | per group: all-gather fwd, bwd, reduce-scatter | all-reduces fwd (loss) + bwd | "
            "all-to-all fwd + bwd (SP) | parameter MiB sent / step / rank | analytical MiB | ratio | "
            "groups unsharded at once |", "|---|---|---|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for (name, cfg), checkpointing in [(m, c) for m in list(MODELS.items())[1:] for c in ("off", "sac")]:
        res = run_ranks(_fsdp_body, world, args=(cfg, seq, checkpointing), timeout=600)
        fc, fs, bc, bs, per_group, unsharded, blocks = res[0]
        counts = sorted(set(per_group.values()))
        sent = sum(d.get(k, 0) for d in (fs, bs) for k in ("all_gather", "reduce_scatter"))
        # Whole model, rows padded to a multiple of P: every group (blocks and root) 3 x (P-1)/P.
        from autosp.models import LlamaConfig, LlamaLike
        with torch.device("meta"):
            model = LlamaLike(LlamaConfig(**cfg))
        padded = sum(-(-p.shape[0] // world) * world * p[0].numel() * p.element_size() for p in model.parameters())
        ideal = 3 * (world - 1) / world * padded
        rows.append(f"| {name} | {world} | {checkpointing} | {len(per_group)} groups, each {' / '.join(map(str, counts))} | "
                    f"{fc.get('all_reduce', 0)} + {bc.get('all_reduce', 0)} | "
                    f"{fc.get('all_to_all', 0)} + {bc.get('all_to_all', 0)} | {sent / 2**20:.3f} | "
                    f"{ideal / 2**20:.3f} | {sent / ideal:.2f} | {unsharded} of {len(per_group)} |")
        print(rows[-1], flush=True)
    return rows


STRATEGY_MODELS = {  # name -> LlamaConfig kwargs
    "Llama-like, 8 heads / 4 KV (GQA)": dict(vocab=1024, hidden=256, layers=4, heads=8, kv_heads=4, ffn=768),
    "2 heads / 1 KV (MQA)": dict(vocab=1024, hidden=128, layers=4, heads=2, kv_heads=1, ffn=384),
}


def _strategy_body(rank, world, queue, cfg, seq, options):
    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.runtime import ring
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(**cfg))
    ids = torch.randint(0, cfg["vocab"], (1, seq))
    compiled = autosp.compile(model, **options)
    compiled(ids, labels=ids)["loss"].backward()  # compile outside the count
    compiled.grad_sync.enabled = False
    counts = []
    for phase in ("forward", "backward"):
        counter = CollectiveCounter(rank, world)
        ring.reset_stats()
        with counter:
            if phase == "forward":
                loss = compiled(ids, labels=ids)["loss"]
            else:
                loss.backward()
        sent = ring.stats()
        counts.append((counter.calls.get("all_to_all", 0), counter.sent.get("all_to_all", 0), sent["sends"],
                       sent["bytes"]))
    queue.put((rank, (compiled.layout.ulysses, compiled.layout.ring, counts)))


def strategy_table(world: int, seq: int) -> list[str]:
    """Rows: per mesh, collectives per layer and bytes per layer and rank against the model."""
    from autosp.cost.strategy import price, ulysses_feasible
    rows = ["| model | mesh (U x R) | all-to-all / layer fwd + bwd | ring sends / layer fwd + bwd | "
            "MiB sent / layer / rank | analytical MiB | ratio |", "|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for name, cfg in STRATEGY_MODELS.items():
        heads, kv = cfg["heads"], cfg.get("kv_heads") or cfg["heads"]
        for u in [d for d in range(world, 0, -1) if world % d == 0]:
            if u > 1 and ulysses_feasible(heads, kv, u):
                continue
            r = world // u
            options = dict(sp_strategy="ulysses" if r == 1 else "ring" if u == 1 else "hybrid", ulysses_degree=u)
            res = run_ranks(_strategy_body, world, args=(cfg, seq, options), timeout=600)
            sent = max(sum(c[1] + c[3] for c in counts) for _, _, counts in res.values())
            (fa, _, fs, _), (ba, _, bs, _) = res[0][2]
            layers = cfg["layers"]
            model = price(heads, kv, u, r, ranks_per_node=world, seq_len=seq, head_dim=cfg["hidden"] // heads,
                          elem_bytes=4)
            rows.append(f"| {name} | {u} x {r} | {fa / layers:g} + {ba / layers:g} | {fs / layers:g} + {bs / layers:g} | "
                        f"{sent / layers / 2**20:.3f} | {model.bytes / 2**20:.3f} | {sent / layers / model.bytes:.2f} |")
            print(rows[-1], flush=True)
    return rows


RECURRENT_MODELS = {  # name -> (config class, kwargs, recurrent layer kind)
    "Granite-4 hybrid (Mamba2)": ("GraniteMoeHybridConfig", dict(
        vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=32,
        shared_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=4, mamba_n_groups=1,
        mamba_d_state=16, mamba_d_head=32, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=64,
        layer_types=["mamba", "attention", "mamba", "attention"], use_cache=False, max_position_embeddings=4096,
        position_embedding_type="rope"), "mamba"),
    "Qwen3-Next (Gated DeltaNet)": ("Qwen3NextConfig", dict(
        vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, intermediate_size=64, use_cache=False,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        max_position_embeddings=4096), "linear_attention"),
}


def _recurrent_analytical(cfg: dict, batch: int, world: int, rank: int, method: str, elem: int = 4) -> dict:
    """Bytes one rank hands per recurrent layer: halo (fwd, bwd) and state (fwd, bwd).
    chain: one state to the next rank, its gradient to the previous one; prefix: the
    summary (transition + state) to the all-gather, the incoming state's gradient back
    (a ring all-gather then moves P - 1 such pieces per rank)."""
    if "mamba_n_heads" in cfg:
        channels = cfg["mamba_expand"] * cfg["hidden_size"] + 2 * cfg["mamba_n_groups"] * cfg["mamba_d_state"]
        kernel, state = cfg["mamba_d_conv"], cfg["mamba_n_heads"] * cfg["mamba_d_head"] * cfg["mamba_d_state"]
        transition = cfg["mamba_n_heads"] * cfg["mamba_d_state"] ** 2
    else:
        channels = 2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"] + \
            cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
        kernel = cfg["linear_conv_kernel_dim"]
        state = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"]
        transition = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] ** 2
    tail = batch * channels * (kernel - 1) * elem
    one = batch * state * elem
    if method == "prefix":
        return {"halo": (tail, world * tail), "state": (one + batch * transition * elem, one)}
    return {"halo": (tail, world * tail), "state": (one * (rank < world - 1), one * (rank > 0))}


def _recurrent_body(rank, world, queue, name, seq, method):
    import warnings

    import transformers

    import autosp
    from autosp.runtime import collectives
    config_class, cfg, kind = RECURRENT_MODELS[name]
    config = getattr(transformers, config_class)(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, config_class.replace("Config", "ForCausalLM"))(config)
    ids = torch.randint(0, cfg["vocab_size"], (1, seq))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = autosp.compile(model, sp_recurrence=method)
        compiled(input_ids=ids, labels=ids).loss.backward()  # compile outside the count
        with collectives.observe() as seen:
            compiled(input_ids=ids, labels=ids).loss.backward()
    sent: Counter = Counter()
    for rec in seen.records:
        if rec.kind in ("halo", "state"):
            sent[(rec.kind, rec.backward)] += rec.bytes
    layers = cfg["layer_types"].count(kind)
    measured = {k: (sent[(k, False)] / layers, sent[(k, True)] / layers) for k in ("halo", "state")}
    queue.put((rank, (measured, _recurrent_analytical(cfg, 1, world, rank, method))))


def recurrence_table(world: int, seq: int) -> list[str]:
    """Rows: per model, method (chain, prefix) and rank, halo and state bytes per recurrent
    layer against the formulas."""
    rows = ["| model | method | rank | halo B / layer fwd + bwd | analytical | state B / layer fwd + bwd | analytical |",
            "|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for name in RECURRENT_MODELS:
        for method in ("chain", "prefix"):
            res = run_ranks(_recurrent_body, world, args=(name, seq, method), timeout=900)
            for rank in sorted(res):
                measured, model = res[rank]
                cells = [f"{measured[k][0]:.0f} + {measured[k][1]:.0f} | {model[k][0]:.0f} + {model[k][1]:.0f}"
                         for k in ("halo", "state")]
                rows.append(f"| {name} | {method} | {rank} | {cells[0]} | {cells[1]} |")
                print(rows[-1], flush=True)
    return rows


MLA_CONFIG = Path(__file__).parent / "configs" / "deepseek-v3-attention.json"


def _mla_sent(config, world: int, seq: int, cut: bool) -> tuple[dict, dict]:
    """``(forward, backward)`` bytes one rank sends per layer, by carrier (q, kv, o)."""
    from autosp.passes import partition_attention

    from autosp.planning.fake_cuda import cuda_step
    original = partition_attention.cheaper_cut
    if not cut:  # the per-head all-to-alls: no operand computed from a gathered source
        partition_attention.cheaper_cut = lambda *args, **kwargs: ({}, "")
    try:
        step = cuda_step(config, seq, sp_size=world, ranks=[0])[0]
    finally:
        partition_attention.cheaper_cut = original
    step.check()
    share = (world - 1) / world
    out = []
    for backward in (False, True):
        sent = [w.bytes * share for w in step.wire if w.kind == "all_to_all" and w.backward == backward]
        if backward:
            sent = sent[::-1]
        out.append({"q": sent[0], "kv": sum(sent[1:-1]), "o": sent[-1]})
    return out[0], out[1]


def _mla_analytical(cfg, world: int, seq: int, cut: bool, elem: int = 2) -> dict:
    heads, qk = cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    per_rank = seq / world
    a2a = (world - 1) / world * per_rank * heads * elem
    gather = (world - 1) * per_rank * elem
    if not cut:
        return {"q": a2a * qk, "kv": a2a * (qk + cfg.v_head_dim), "o": a2a * cfg.v_head_dim}
    return {"q": gather * cfg.q_lora_rank, "kv": gather * (cfg.kv_lora_rank + cfg.qk_rope_head_dim),
            "o": a2a * cfg.v_head_dim}


def mla_table(world: int, seq: int) -> list[str]:
    """Rows: DeepSeek-V3's attention, per-head all-to-alls against autosp's gathered
    latents: bytes a rank sends per layer by carrier, measured against analytical."""
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(MLA_CONFIG)
    rows = ["| partition | q MiB fwd + bwd (analytical fwd) | k, v MiB fwd + bwd (analytical fwd) | "
            "output MiB fwd + bwd | layer MiB fwd + bwd | k, v fewer bytes | layer fewer bytes |",
            "|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    results = {}
    for cut in (False, True):
        fwd, bwd = _mla_sent(cfg, world, seq, cut)
        model = _mla_analytical(cfg, world, seq, cut)
        for k in fwd:
            assert abs(fwd[k] - model[k]) <= 1e-6 * model[k], (cut, k, fwd[k], model[k])
        results[cut] = (fwd, bwd)
        mib = 2.0 ** 20
        cells = [f"{fwd[k] / mib:.1f} + {bwd[k] / mib:.1f} ({model[k] / mib:.1f})" for k in ("q", "kv")]
        total = sum(fwd.values()) + sum(bwd.values())
        base_fwd, base_bwd = results[False]
        gain_kv = (base_fwd["kv"] + base_bwd["kv"]) / (fwd["kv"] + bwd["kv"])
        gain = (sum(base_fwd.values()) + sum(base_bwd.values())) / total
        label = "autosp: latents gathered (head_cut)" if cut else "per-head all-to-alls (cut off)"
        rows.append(f"| {label} | {cells[0]} | {cells[1]} | {fwd['o'] / mib:.1f} + {bwd['o'] / mib:.1f} | "
                    f"{total / mib:.1f} | {gain_kv:.2f}x | {gain:.2f}x |")
        print(rows[-1], flush=True)
    return rows


def analytical_bytes_per_layer(cfg: dict, seq: int, world: int, elem: int = 4) -> float:
    """Ulysses minimum, bytes a rank sends per attention layer (forward + backward)."""
    head_dim = cfg["hidden"] // cfg["heads"]
    kv = cfg.get("kv_heads") or cfg["heads"]
    per_token = (2 * cfg["heads"] + 2 * kv) * head_dim  # q + o at H heads, k + v at KV heads
    return 2 * (world - 1) / world * (seq / world) * per_token * elem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket size (MiB)")
    parser.add_argument("--fsdp", action="store_true", help="count FSDP2's parameter collectives instead")
    parser.add_argument("--strategies", action="store_true", help="Ulysses, hybrid and ring meshes (P=--world)")
    parser.add_argument("--recurrences", action="store_true", help="conv halo and state bytes (Mamba2, GDN)")
    parser.add_argument("--mla", action="store_true", help="DeepSeek-V3's attention: latents gathered vs all-to-alls")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    special = [(args.mla, mla_table, "MLA: bytes per attention layer, gathered latents against per-head all-to-alls",
                f"DeepSeek-V3's attention shape, P={args.world}, batch 1, one simulated rank on the fake-CUDA "
                "path (no GPU)"),
               (args.recurrences, recurrence_table, "Conv halo and recurrent state bytes per layer",
                f"P={args.world}, batch 1"),
               (args.strategies, strategy_table, "Collectives and bytes per mesh", f"P={args.world}, batch 1"),
               (args.fsdp, fsdp_table, "FSDP2 parameter collectives per step", "FSDP = SP over P ranks")]
    for wanted, make_table, title, context in special:
        if wanted:
            rows = make_table(args.world, args.seq)
            if not args.no_write:
                append_section(title, f"S={args.seq}, {'bf16' if args.mla else 'fp32'}, {context}", "\n".join(rows))
            return
    rows = ["| model | P | all-to-all / layer fwd + bwd (Ulysses min 4 + 4) | other collectives / step | "
            "all-to-all MiB sent / layer / rank | analytical Ulysses MiB | ratio | grad buckets | "
            "grad bytes issued before last bwd op | first issue to end of bwd / bwd (ms) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for (name, cfg), checkpointing in [(m, c) for m in MODELS.items() for c in ("off", "sac", "full")]:
        res = run_ranks(_body, args.world, args=(cfg, args.seq, checkpointing, int(args.bucket_mb * 2**20)),
                        timeout=600)
        fc, fs, bc, bs, ov = res[0]
        layers = cfg["layers"]
        a2a = f"{fc.get('all_to_all', 0) / layers:g} + {bc.get('all_to_all', 0) / layers:g}"
        other = Counter(fc) + Counter(bc)
        other.pop("all_to_all", None)
        other_text = ", ".join(f"{v} {k}" for k, v in sorted(other.items())) or "none"
        sent = (fs.get("all_to_all", 0) + bs.get("all_to_all", 0)) / layers
        ideal = analytical_bytes_per_layer(cfg, args.seq, args.world)
        label = name if checkpointing == "off" else f"{name}, checkpointing={checkpointing}"
        rows.append(f"| {label} | {args.world} | {a2a} | {other_text} | {sent / 2**20:.2f} | "
                    f"{ideal / 2**20:.2f} | {sent / ideal:.2f} | {ov['buckets']} | {100 * ov['fraction']:.0f}% | "
                    f"{1e3 * ov['issue_to_end_s']:.1f} / {1e3 * ov['backward_s']:.1f} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if not args.no_write:
        append_section("Collectives and bytes moved", f"S={args.seq}, fp32, gradient buckets of {args.bucket_mb:g} MiB",
                       table)


if __name__ == "__main__":
    main()
