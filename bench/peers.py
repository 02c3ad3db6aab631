"""Peer systems for the benchmarks: single device, hand-written Ulysses, DeepSpeed AutoSP.

Runs the systems autosp is compared with on the same Hugging Face ``LlamaForCausalLM``
(transformers 5.24.0, fp32, SDPA), on CPU under gloo, following /work/shared/PEERS.md.
Install the peers first with ``bash bench/setup.sh``.

Every runner is called inside an initialised gloo process group of world size P (a
:func:`autosp.testing.distributed.run_ranks` body); the sequence-parallel degree is the
whole world. Every rank passes the same full batch ``ids`` ([1, S], int64) and ``labels``
(normally ``ids``). Runners:

* :func:`run_single`: plain eager fwd+bwd of the full sequence on one device.
* :func:`run_ulysses_deepspeed`: hand-written Ulysses, attention wrapped in DeepSpeed's
  ``DistributedAttention`` (registered as an HF attention function).
* :func:`run_ulysses_yunchang`: the same with yunchang's ``SeqAllToAll4D`` around SDPA.
* :func:`run_ring_handwritten`: a hand-written zigzag ring (the project's own, see its
  docstring: the public ring implementations need CUDA), applied by hand.
* :func:`run_deepspeed_autosp`: DeepSpeed AutoSP's compiler pass without its engine
  (``apply_autosp`` inside a ``torch.compile`` backend), with or without its SAC.

Each returns ``{"name", "step_s", "first_step_s", "saved_bytes", "peak_bytes",
"retained_bytes", "loss", "grads"}``: ``first_step_s`` is the first call (compilation
included), ``step_s`` the median of ``steps`` timed steps after ``warmup`` warm-up
calls (the first call counts as one of them); a step is forward, backward and the
gradient all-reduce where the system needs one. Memory is one extra step measured with
:func:`autosp.planning.memory.measure_step` (saved tensors once per storage, parameters
excluded; allocator peak of forward+backward), the gradient all-reduce outside it.
``loss`` is the measured step's global loss; ``grads`` ({name: tensor}, after the
gradient all-reduce) only with ``return_grads=True``.

Self-check (2 ranks; tiny model by default)::

    python bench/peers.py --check
    python bench/peers.py --check --seq 1024 --hidden 256 --layers 4 --heads 8 \\
        --ffn 768 --vocab 1024 --steps 10 --warmup 3
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# DeepSpeed JIT-builds its CPU comm extension on first use: keep it in the bench cache.
# (Must be set before deepspeed is imported; deepspeed is imported lazily below.)
os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(__file__).resolve().parent / ".cache" / "torch_extensions")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autosp.planning.memory import MiB, measure_step  # noqa: E402

IGNORE = -100


# --------------------------------------------------------------------------- model

def build_llama(seed: int, hidden=256, layers=4, heads=8, kv_heads=8, ffn=768, vocab=1024,
                max_pos=65536):
    """A fresh fp32 ``LlamaForCausalLM`` with SDPA attention; identical weights for the same seed."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                         attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    model.train()
    return model


# --------------------------------------------------------------------------- helpers

def _zero_grads(model) -> None:
    for p in model.parameters():
        p.grad = None


def _allreduce_grads(model, average: bool, group=None) -> None:
    """All-reduce every parameter gradient in one flat buffer (sum, or mean over the group)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    if average:
        flat /= dist.get_world_size(group)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def _grads(model) -> dict:
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters()}


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _time_steps(step, steps: int, warmup: int) -> tuple[float, float]:
    """(first call's seconds, median of ``steps`` timed calls after ``warmup`` warm-up calls)."""
    _barrier()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(max(warmup - 1, 0)):
        step()
    times = []
    for _ in range(steps):
        _barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return first, (statistics.median(times) if times else float("nan"))


def _measure(model, forward, sync) -> tuple:
    """One more step under :func:`measure_step`; then ``sync()`` (gradient all-reduce)."""
    _zero_grads(model)
    _barrier()
    holder = {}

    def fwd():
        holder["loss"] = forward()
        return holder["loss"]

    report = measure_step(fwd, exclude=list(model.parameters()))
    sync()
    return report, holder["loss"].detach()


def _result(name, first, step_s, report, loss, model, return_grads, **extra) -> dict:
    out = {"name": name, "step_s": step_s, "first_step_s": first,
           "saved_bytes": report.saved_bytes, "peak_bytes": report.peak_bytes,
           "retained_bytes": report.retained_bytes, "loss": float(loss),
           "grads": _grads(model) if return_grads else None}
    out.update(extra)
    return out


_DS_READY = False


def _init_deepspeed():
    """Import deepspeed and attach its comm layer to the existing torch process group.

    The first call on a machine JIT-builds DeepSpeed's shared-memory comm extension
    (~30 s, into bench/.cache/torch_extensions)."""
    global _DS_READY
    import deepspeed
    if not _DS_READY:
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        _DS_READY = True
    return deepspeed


# --------------------------------------------------------------------------- single device

def run_single(model, ids, labels, steps: int, warmup: int, return_grads: bool = False) -> dict:
    """Plain eager fwd+bwd of the full sequence on this rank (HF's own loss: mean over S-1 pairs)."""
    def forward():
        return model(input_ids=ids, labels=labels).loss

    def step():
        _zero_grads(model)
        forward().backward()

    first, step_s = _time_steps(step, steps, warmup)
    report, loss = _measure(model, forward, lambda: None)
    return _result("single, eager", first, step_s, report, loss, model, return_grads)


# --------------------------------------------------------------------------- hand-written Ulysses

def _local_shard(ids, labels):
    """This rank's contiguous chunk: ids, explicit position_ids and globally shifted labels."""
    P, r = dist.get_world_size(), dist.get_rank()
    B, S = ids.shape
    if S % P:
        raise ValueError(f"sequence length {S} must be divisible by the number of ranks {P}")
    lo, hi = r * S // P, (r + 1) * S // P
    # Shift before slicing, so the pair (last token of chunk r, first token of chunk r+1) is kept.
    shifted = torch.cat([labels[:, 1:], torch.full((B, 1), IGNORE, dtype=labels.dtype)], dim=1)
    n_tokens = int((shifted != IGNORE).sum())
    position_ids = torch.arange(S, dtype=torch.long).unsqueeze(0).expand(B, S)[:, lo:hi]
    return ids[:, lo:hi].contiguous(), position_ids.contiguous(), shifted[:, lo:hi].contiguous(), n_tokens


def _sdpa_bshd(q, k, v, scaling=None):
    """Causal SDPA on [B, S, h, D] tensors holding the full sequence (GQA kept grouped)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True, scale=scaling,
                                         enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def _run_hand_applied(model, ids, labels, steps, warmup, name, attn_name, attn_fn, return_grads, shard=None):
    """Shared body of the hand-applied runners (hand-written Ulysses and ring): ``attn_fn``
    is an HF attention function, ``shard`` slices this rank's rows (default: contiguous)."""
    from transformers import AttentionInterface
    AttentionInterface.register(attn_name, attn_fn)
    ids_loc, pos_loc, labels_loc, n_tokens = (shard or _local_shard)(ids, labels)
    previous = model.config._attn_implementation
    try:
        model.set_attn_implementation(attn_name)
    except Exception:  # older/newer HF without the check for custom names
        model.config._attn_implementation = attn_name
    try:
        def forward():
            logits = model(input_ids=ids_loc, position_ids=pos_loc).logits
            local_sum = F.cross_entropy(logits.float().flatten(0, 1), labels_loc.flatten(),
                                        ignore_index=IGNORE, reduction="sum")
            # Each rank backprops its share of the global mean; the parameter gradients of the
            # global loss are then the SUM of the ranks' gradients.
            return local_sum / n_tokens

        def sync():
            _allreduce_grads(model, average=False)

        def step():
            _zero_grads(model)
            forward().backward()
            sync()

        first, step_s = _time_steps(step, steps, warmup)
        report, loss = _measure(model, forward, sync)
        dist.all_reduce(loss)  # global mean loss, as a value
        return _result(name, first, step_s, report, loss, model, return_grads)
    finally:
        try:
            model.set_attn_implementation(previous)
        except Exception:
            model.config._attn_implementation = previous


def run_ulysses_deepspeed(model, ids, labels, steps: int, warmup: int, return_grads: bool = False) -> dict:
    """Hand-written Ulysses with DeepSpeed's ``DistributedAttention`` (all-to-all over the world).

    Each rank runs the model on its contiguous chunk [r*S/P, (r+1)*S/P) with explicit
    ``position_ids``; labels are shifted globally before slicing; attention is an HF
    attention function ("ulysses_ds") that calls ``DistributedAttention`` around causal
    SDPA on the gathered full sequence. Loss: local token-loss sum / global token count,
    values all-reduced; parameter gradients all-reduced (summed) after backward. The
    model's attention implementation is restored afterwards.
    """
    _init_deepspeed()
    from deepspeed.sequence.layer import DistributedAttention
    dist_attn = DistributedAttention(_sdpa_bshd, dist.group.WORLD, scatter_idx=2, gather_idx=1)

    def ulysses_ds(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # HF hands [B, H, S/P, D]; DistributedAttention works on [B, S, H, D] (batch_dim_idx=0).
        if attention_mask is not None:
            raise ValueError("hand-written Ulysses supports causal attention without a mask only")
        out = dist_attn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), 0,
                        None, scaling=scaling)
        return out, None

    return _run_hand_applied(model, ids, labels, steps, warmup, "Ulysses, DeepSpeed DistributedAttention",
                        "ulysses_ds", ulysses_ds, return_grads)


def run_ulysses_yunchang(model, ids, labels, steps: int, warmup: int, return_grads: bool = False) -> dict:
    """Hand-written Ulysses with yunchang's ``SeqAllToAll4D`` around ``F.scaled_dot_product_attention``.

    Same slicing, loss and gradient handling as :func:`run_ulysses_deepspeed`; attention is
    all-to-all (scatter heads, gather sequence), causal SDPA, all-to-all back.
    """
    from yunchang.comm.all_to_all import SeqAllToAll4D
    group = dist.group.WORLD

    def ulysses_yc(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if attention_mask is not None:
            raise ValueError("hand-written Ulysses supports causal attention without a mask only")
        q, k, v = (SeqAllToAll4D.apply(group, t.transpose(1, 2), 2, 1) for t in (query, key, value))
        out = _sdpa_bshd(q, k, v, scaling=scaling)
        return SeqAllToAll4D.apply(group, out, 1, 2), None

    return _run_hand_applied(model, ids, labels, steps, warmup, "Ulysses, yunchang SeqAllToAll4D",
                        "ulysses_yc", ulysses_yc, return_grads)


# --------------------------------------------------------------------------- hand-written ring

class _HandZigzagRing(torch.autograd.Function):
    """Hand-written zigzag ring attention (the project's own baseline, written for these
    benchmarks apart from autosp's runtime, in the manner of ring-flash-attention's
    ``zigzag_ring_flash_attn``, which needs CUDA). Rank r holds sequence chunks r and
    2P-1-r of 2P equal chunks, concatenated; K/V travel the ring, one packed send per hop.

    Per step with the K/V of rank s: s == r: causal over the local rows (they are in
    position order); s < r: every local query sees the first half of the block (chunk s)
    and none of its second; s > r: the second half of the queries (chunk 2P-1-r) sees the
    whole block, the first half nothing. Each part is one fused CPU flash-attention call
    returning its log-sum-exp; parts are merged in fp32. Backward: K/V go round again and
    each block's dK/dV travel with it, home after P hops."""

    @staticmethod
    def _parts(r, s, n):
        """(query slice, key slice, causal) of the step with rank s's block; n = chunk length."""
        if s == r:
            return slice(0, 2 * n), slice(0, 2 * n), True
        if s < r:
            return slice(0, 2 * n), slice(0, n), False
        return slice(n, 2 * n), slice(0, 2 * n), False

    @staticmethod
    def _exchange(send, recv):
        world, rank = dist.get_world_size(), dist.get_rank()
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        return dist.batch_isend_irecv(ops)

    @staticmethod
    def forward(ctx, q, k, v, scale):
        world, rank = dist.get_world_size(), dist.get_rank()
        n = q.shape[2] // 2
        out = torch.zeros(q.shape, dtype=torch.float32)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32)
        kv = torch.stack([k, v])
        for step in range(world):
            src = (rank - step) % world
            works, nxt = [], None
            if step < world - 1:
                nxt = torch.empty_like(kv)
                works = _HandZigzagRing._exchange(kv, nxt)
            qs, ks, causal = _HandZigzagRing._parts(rank, src, n)
            o, o_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], 0.0, causal, scale=scale)[:2]
            old = lse[:, :, qs]
            new = torch.logaddexp(old, o_lse)
            out[:, :, qs] = out[:, :, qs] * torch.exp(old - new)[..., None] + o * torch.exp(o_lse - new)[..., None]
            lse[:, :, qs] = new
            for w in works:
                w.wait()
            if nxt is not None:
                kv = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        world, rank = dist.get_world_size(), dist.get_rank()
        n = q.shape[2] // 2
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv = torch.stack([k, v])
        dkv_in, dkv_works = None, []
        for step in range(world):
            src = (rank - step) % world
            works, nxt = [], None
            if step < world - 1:
                nxt = torch.empty_like(kv)
                works = _HandZigzagRing._exchange(kv, nxt)
            qs, ks, causal = _HandZigzagRing._parts(rank, src, n)
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout[:, :, qs], q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], out[:, :, qs],
                lse[:, :, qs].contiguous(), 0.0, causal, scale=ctx.scale)
            dq[:, :, qs] += gq
            dkv = torch.zeros(kv.shape, dtype=torch.float32)
            dkv[0][:, :, ks] += gk
            dkv[1][:, :, ks] += gv
            if step > 0:
                for w in dkv_works:
                    w.wait()
                dkv += dkv_in
            dkv_in = torch.empty_like(dkv)
            dkv_works = _HandZigzagRing._exchange(dkv, dkv_in)
            for w in works:
                w.wait()
            if nxt is not None:
                kv = nxt
        for w in dkv_works:
            w.wait()
        return dq.to(q.dtype), dkv_in[0].to(k.dtype), dkv_in[1].to(v.dtype), None


def _zigzag_shard(ids, labels):
    """This rank's zigzag rows (chunks r and 2P-1-r of 2P): ids, positions, shifted labels."""
    P, r = dist.get_world_size(), dist.get_rank()
    B, S = ids.shape
    if S % (2 * P):
        raise ValueError(f"the hand-written zigzag ring needs S ({S}) divisible by 2 x ranks ({2 * P})")
    n = S // (2 * P)
    rows = torch.cat([torch.arange(r * n, (r + 1) * n), torch.arange((2 * P - 1 - r) * n, (2 * P - r) * n)])
    shifted = torch.cat([labels[:, 1:], torch.full((B, 1), IGNORE, dtype=labels.dtype)], dim=1)
    n_tokens = int((shifted != IGNORE).sum())
    return (ids[:, rows].contiguous(), rows[None].expand(B, -1).contiguous(), shifted[:, rows].contiguous(),
            n_tokens)


def run_ring_handwritten(model, ids, labels, steps: int, warmup: int, return_grads: bool = False) -> dict:
    """The project's own hand-written zigzag ring (:class:`_HandZigzagRing`), applied by
    hand to the HF model: each rank runs its zigzag rows with explicit ``position_ids``,
    attention is an HF attention function ("ring_hand"), the loss and gradient sums are
    those of :func:`run_ulysses_deepspeed`. Labelled as the project's own: neither
    ring-flash-attention nor yunchang's ring runs without CUDA (flash_attn), and PyTorch's
    context parallel has no sharding rule for the CPU flash kernel."""

    def ring_hand(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if attention_mask is not None:
            raise ValueError("the hand-written ring supports causal attention without a mask only")
        out = _HandZigzagRing.apply(query, key, value, scaling)
        return out.transpose(1, 2), None

    return _run_hand_applied(model, ids, labels, steps, warmup, "ring, hand-written zigzag (the project's own)",
                        "ring_hand", ring_hand, return_grads, shard=_zigzag_shard)


# --------------------------------------------------------------------------- DeepSpeed AutoSP

def run_deepspeed_autosp(model, ids, labels, steps: int, warmup: int, sac: bool,
                         backend: str = "inductor", return_grads: bool = False) -> dict:
    """DeepSpeed AutoSP without its engine, as PEERS.md describes (sp_size = world, dp_size = 1).

    ``sac=True`` first calls ``register_long_context_checkpointing()``: DeepSpeed's SAC is a
    *global, irreversible* patch of PyTorch's min-cut partitioner, so the SAC and non-SAC
    variants must run in separate processes (separate ``run_ranks`` spawns), and nothing
    compiled after a SAC run in the same process is unaffected by it.

    Every rank passes the full sequence, tagged with ``prepare_autosp_inputs``; the model is
    ``torch.compile(model, backend=f, fullgraph=True, dynamic=True)`` where ``f`` runs
    ``apply_autosp`` then ``torch._inductor.compile`` (``backend="inductor"``, what the
    engine does) or AOT autograd with no-op compilers and the min-cut partitioner
    (``backend="aot_eager"``, so the SAC patch still applies). Gradients are all-reduced and
    averaged over the world after backward (the engine without an mpu). The loss is the
    model's own per-rank loss: HF shifts labels inside each shard, so boundary pairs are
    dropped and local means are averaged (PEERS.md); ``loss`` is the mean over ranks and
    ``loss_ranks`` the per-rank values.
    """
    _init_deepspeed()
    from deepspeed.compile.passes.sp_compile import apply_autosp, prepare_autosp_inputs
    if sac:
        from deepspeed.compile.passes.long_context_checkpointing import register_long_context_checkpointing
        register_long_context_checkpointing()
    world = dist.get_world_size()
    sp_size, dp_size = world, 1
    B, S = ids.shape
    # Distinct tensor objects: prepare_autosp_inputs tags each one (labels is often ids itself).
    ids_c, labels_c = ids.clone(), labels.clone()
    position_ids = torch.arange(S, dtype=torch.long).unsqueeze(0).expand(B, S).contiguous()
    prepare_autosp_inputs(ids_c, labels_c, position_ids)

    def autosp_backend(gm, example_inputs):
        apply_autosp(gm, example_inputs, debug=False, sp_size=sp_size, dp_size=dp_size)
        if backend == "inductor":
            return torch._inductor.compile(gm, example_inputs)
        if backend == "aot_eager":
            from functorch.compile import min_cut_rematerialization_partition
            from torch._dynamo.backends.common import aot_autograd

            def nop(g, _):
                return g
            return aot_autograd(fw_compiler=nop, bw_compiler=nop,
                                partition_fn=min_cut_rematerialization_partition)(gm, example_inputs)
        raise ValueError(f"unknown backend {backend!r}")

    compiled = torch.compile(model, backend=autosp_backend, fullgraph=True, dynamic=True)

    def forward():
        return compiled(input_ids=ids_c, labels=labels_c, position_ids=position_ids).loss

    def sync():
        _allreduce_grads(model, average=True)

    def step():
        _zero_grads(model)
        forward().backward()
        sync()

    first, step_s = _time_steps(step, steps, warmup)
    report, loss = _measure(model, forward, sync)
    gathered = [torch.zeros_like(loss) for _ in range(world)]
    dist.all_gather(gathered, loss)
    loss_ranks = [float(t) for t in gathered]
    name = f"DeepSpeed AutoSP, {'with' if sac else 'without'} SAC ({backend})"
    return _result(name, first, step_s, report, sum(loss_ranks) / world, model, return_grads,
                   loss_ranks=loss_ranks)


# --------------------------------------------------------------------------- parity

def grad_rel_error(grads: dict, ref: dict) -> tuple[float, float]:
    """(max over parameters of ||g - g_ref|| / ||g_ref||, same over all parameters as one vector)."""
    worst, num, den = 0.0, 0.0, 0.0
    for n, g_ref in ref.items():
        diff = (grads[n].double() - g_ref.double()).norm()
        norm = g_ref.double().norm()
        num += float(diff) ** 2
        den += float(norm) ** 2
        worst = max(worst, float(diff / norm) if norm > 0 else float(diff))
    return worst, (num ** 0.5) / (den ** 0.5 if den > 0 else 1.0)


# --------------------------------------------------------------------------- self-check CLI

def _check_body(rank, world, queue, cfg: dict, which: str):
    torch.manual_seed(1234)
    ids = torch.randint(0, cfg["vocab"], (1, cfg["seq"]),
                        generator=torch.Generator().manual_seed(cfg["seed"] + 1))
    labels = ids
    model = build_llama(cfg["seed"], hidden=cfg["hidden"], layers=cfg["layers"], heads=cfg["heads"],
                        kv_heads=cfg["kv_heads"], ffn=cfg["ffn"], vocab=cfg["vocab"])
    kw = dict(steps=cfg["steps"], warmup=cfg["warmup"], return_grads=True)
    if which == "eager":
        results = [run_single(model, ids, labels, **kw),
                   run_ulysses_deepspeed(model, ids, labels, **kw),
                   run_ulysses_yunchang(model, ids, labels, **kw)]
    elif which in ("autosp_sac", "autosp_nosac"):
        results = [run_deepspeed_autosp(model, ids, labels, sac=which == "autosp_sac",
                                        backend=cfg["backend"], **kw)]
    else:
        raise ValueError(which)
    # Gradients go through a file: run_ranks' queue is a pipe drained only after the ranks
    # exit (large items would block), and tensors sent through it are shared by fd passing,
    # which fails once the sending rank has exited.
    for i, r in enumerate(results):
        grads, r["grads"] = r["grads"], None
        if rank == 0:
            r["grads"] = os.path.join(cfg["work_dir"], f"{which}_{i}.pt")
            torch.save(grads, r["grads"])
    queue.put((rank, results))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="run every peer on 2 ranks and compare")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    ap.add_argument("--ffn", type=int, default=None, help="default: 3 * hidden")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager"])
    ap.add_argument("--skip-autosp", action="store_true", help="hand-written peers only")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--warm-cache", action="store_true",
                    help="reuse Inductor's on-disk cache (default: a fresh one per spawn, so "
                         "first_s is a cold compile)")
    args = ap.parse_args(argv)
    if not args.check:
        ap.print_help()
        return 0
    cfg = dict(seq=args.seq, hidden=args.hidden, layers=args.layers, heads=args.heads,
               kv_heads=args.kv_heads or args.heads, ffn=args.ffn or 3 * args.hidden,
               vocab=args.vocab, steps=args.steps, warmup=args.warmup, seed=args.seed,
               backend=args.backend)
    from autosp.testing.distributed import run_ranks
    print(f"peers check: {args.ranks} ranks, {cfg}", flush=True)
    cfg["work_dir"] = tempfile.mkdtemp(prefix="peers_check_")
    phases = ["eager"] + ([] if args.skip_autosp else ["autosp_sac", "autosp_nosac"])
    rows = []
    for phase in phases:  # one spawn each: DeepSpeed's SAC patch is process-global
        if not args.warm_cache:  # the ranks inherit it: first_step_s is then a cold compile
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cfg["work_dir"], f"inductor_{phase}")
        t0 = time.perf_counter()
        try:
            out = run_ranks(_check_body, world_size=args.ranks, args=(cfg, phase),
                            timeout=args.timeout, collective_timeout=args.timeout)
        except Exception as e:  # report and go on with the other phases
            print(f"[{phase}] FAILED after {time.perf_counter() - t0:.0f}s:\n{e}", flush=True)
            continue
        print(f"[{phase}] done in {time.perf_counter() - t0:.0f}s", flush=True)
        for r in out[0]:
            r["grads"] = torch.load(r["grads"])
            rows.append(r)
    shutil.rmtree(cfg["work_dir"], ignore_errors=True)
    ref = next((r for r in rows if r["name"].startswith("single")), None)
    print()
    head = f"{'runner':<44} {'loss':>10} {'loss - single':>13} {'grad rel (max/all)':>19} " \
           f"{'step_s':>8} {'first_s':>8} {'saved MiB':>10} {'peak MiB':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        dloss = r["loss"] - ref["loss"] if ref else float("nan")
        gmax, gall = grad_rel_error(r["grads"], ref["grads"]) if ref and r["grads"] else (float("nan"),) * 2
        print(f"{r['name']:<44} {r['loss']:>10.6f} {dloss:>13.2e} {gmax:>9.1e}/{gall:<9.1e} "
              f"{r['step_s']:>8.3f} {r['first_step_s']:>8.2f} {r['saved_bytes'] / MiB:>10.1f} "
              f"{r['peak_bytes'] / MiB:>9.1f}")
        if "loss_ranks" in r:
            print(f"{'':<4}loss per rank: {', '.join(f'{x:.6f}' for x in r['loss_ranks'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
