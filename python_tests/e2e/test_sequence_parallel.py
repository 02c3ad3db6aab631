"""autosp.compile(model) on spawned gloo ranks against single-device eager PyTorch.

Every rank feeds the same full batch. Checked on every rank: the loss (the global,
single-device value), the gathered outputs and every parameter gradient (after autosp's
gradient synchronisation), all within 1e-5 relative. Negative controls sabotage one
piece (a rank slicing the wrong shard, no loss reduction, no gradient sync) and must fail.
"""
import copy

import pytest
import torch

from autosp.testing.distributed import run_ranks

TOL = 1e-5


def _model(name):
    from autosp.models import AttentionBlock, LlamaConfig, LlamaLike
    if name == "sdpa_block":
        return AttentionBlock(32, 4), 1
    if name == "sdpa_block_seq_first":
        return AttentionBlock(32, 4, seq_first=True), 0
    if name.startswith("sdpa_gqa"):  # sdpa_gqa1 / sdpa_gqa2: SDPA's enable_gqa with 1 or 2 KV heads
        return AttentionBlock(64, 8, kv_heads=int(name[-1])), 1
    if name.startswith("gpt2"):  # manual attention, causal mask from a buffer, learned positions
        from autosp.models import GPT2Config, GPT2Like
        return GPT2Like(GPT2Config(vocab=64, hidden=32, layers=2, heads=4)), 1
    if name.startswith("llama"):
        cfg = LlamaConfig(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2 if "gqa" in name else None,
                          shift_labels="shifted_outside" not in name)
        return LlamaLike(cfg), 1
    raise ValueError(name)


def _inputs(name, seq, gen):
    if name.startswith("sdpa"):
        shape = (seq, 2, 64 if "gqa" in name else 32) if "seq_first" in name else \
            (2, seq, 64 if "gqa" in name else 32)
        return (torch.randn(*shape, generator=gen),), {}
    ids = torch.randint(0, 64, (2, seq), generator=gen)
    labels = torch.randint(0, 64, (2, seq), generator=gen)
    labels[:, : seq // 2] = -100  # ignore_index concentrated on the first ranks' shards
    if "shifted_outside" in name:
        labels = torch.cat([labels[:, 1:], torch.full((2, 1), -100)], dim=1)
    kwargs = {"labels": labels}
    if "position_ids" in name:
        kwargs["position_ids"] = torch.arange(seq).expand(2, seq) + 5
    return (ids,), kwargs


def _body(rank, world, queue, name, seqs, seed, sabotage):
    import autosp
    from autosp.runtime import collectives
    from autosp.testing.parity import parity

    if sabotage == "wrong_shard":  # this rank slices its neighbour's part of the sequence
        real = collectives.shard
        collectives.shard = lambda x, seq_len, dim, lo, trim, group: real(
            x.roll(seq_len // world + 1, dims=dim % x.dim()) if x.shape[dim % x.dim()] == seq_len else x,
            seq_len, dim, lo, trim, group)
    if sabotage == "no_loss_reduce":
        collectives.all_reduce = lambda x, reduce_op, group: x
    torch.manual_seed(seed)
    model, seq_dim = _model(name)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, seq_dim=seq_dim, gather_outputs=True,
                              checkpointing=name.rsplit("_", 1)[1] if name.endswith(("_sac", "_full")) else "off")
    if sabotage == "no_grad_sync":
        compiled.grad_sync.enabled = False
    result = {}
    for seq in seqs:
        args, kwargs = _inputs(name, seq, torch.Generator().manual_seed(seed + seq))
        report = parity(reference, compiled, *args, **kwargs)
        result[seq] = (report.max_output_error, report.max_grad_error)
    program = compiled.programs[0]
    result["a2a"] = program.mlir["transformed"].count('"autosp.all_to_all"')
    result["programs"] = len(compiled.programs)
    result["grad_collectives"] = compiled.grad_sync.collectives_last_step
    queue.put((rank, result))


CASES = [
    ("sdpa_block", 2, (16, 15)), ("sdpa_block", 4, (16, 33)), ("sdpa_block_seq_first", 2, (15,)),
    ("sdpa_gqa1", 4, (16,)), ("sdpa_gqa2", 4, (15,)),
    ("llama", 2, (16, 15)), ("llama_gqa", 4, (33, 16)), ("llama_position_ids", 2, (15,)),
    ("llama_shifted_outside", 2, (16,)), ("llama_gqa_sac", 2, (15,)), ("llama_gqa_sac-min", 2, (15,)), ("llama_full", 2, (16,)), ("gpt2", 2, (16, 15)), ("gpt2", 4, (33,)),
    ("gpt2_sac", 2, (15,)),
]


@pytest.mark.parametrize("name, world, seqs", CASES, ids=[f"{n}-P{w}" for n, w, _ in CASES])
def test_matches_single_device(name, world, seqs, _fresh_seed):
    results = run_ranks(_body, world, args=(name, seqs, _fresh_seed % 10000, None), timeout=300)
    layers = 2 if name.startswith(("llama", "gpt2")) else 1
    for rank, r in results.items():
        for seq in seqs:
            out_err, grad_err = r[seq]
            assert out_err <= TOL and grad_err <= TOL, f"rank {rank} S={seq}: outputs {out_err:.2e} grads {grad_err:.2e}"
        assert r["a2a"] == 4 * layers, "Ulysses minimum: 4 all-to-alls per attention layer"
        assert r["programs"] == 1, "another sequence length must not recompile"
        assert r["grad_collectives"] == 1, "gradients are synchronised in one bucket here"


@pytest.mark.parametrize("sabotage", ["wrong_shard", "no_loss_reduce", "no_grad_sync"])
def test_negative_controls_fail(sabotage, _fresh_seed):
    # fresh=True: the sabotage patches the runtime before the emitter binds its functions
    results = run_ranks(_body, 2, args=("llama", (16,), _fresh_seed % 10000, sabotage), timeout=300, fresh=True)
    worst = max(max(r[16]) for r in results.values())
    assert worst > 1e-3, f"sabotage '{sabotage}' went unnoticed (max rel err {worst:.1e})"


def _dp_sp_body(rank, world, queue, seed):
    """World 4 = 2 data-parallel replicas x 2 sequence-parallel ranks (a DeviceMesh); each
    replica its own batch. Loss: the replica's own; gradients: averaged over replicas."""
    import autosp
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model, _ = _model("llama_gqa")
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, sp_size=2)
    batches = [_inputs("llama", 15, torch.Generator().manual_seed(seed + 100 * r)) for r in range(2)]
    replica = rank // 2
    args, kwargs = batches[replica]
    loss = compiled(*args, **kwargs)["loss"]
    loss.backward()
    ref_losses = []
    for a, k in batches:  # single device: the mean of the replicas' gradients
        ref_loss = reference(*a, **k)["loss"]
        (ref_loss / 2).backward()
        ref_losses.append(ref_loss.detach())
    grad_err = max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    queue.put((rank, (replica, relative_error(loss, ref_losses[replica]), grad_err, float(loss),
                      tuple(compiled.mesh.shape), compiled.mesh.mesh_dim_names)))


def test_sp_smaller_than_world_forms_dp_x_sp_mesh(_fresh_seed):
    results = run_ranks(_dp_sp_body, 4, args=(_fresh_seed % 10000,), timeout=300)
    for rank, (_replica, loss_err, grad_err, _, shape, names) in results.items():
        assert shape == (2, 2) and names == ("dp", "sp")
        assert loss_err <= TOL and grad_err <= TOL, f"rank {rank}: loss {loss_err:.2e} grads {grad_err:.2e}"
    assert results[0][3] == results[1][3] and results[2][3] == results[3][3]
    assert results[0][3] != results[2][3], "the two replicas saw different batches"


def _compiled_backend_body(rank, world, queue, seed):
    """torch.compile after SP: the emitted module compiles as one graph (fullgraph=True),
    with Ulysses and with ring attention. One layer: AOTAutograd's trace of the graph is the cost, and a second layer adds no new op."""
    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.testing.parity import parity
    torch.manual_seed(seed)
    model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=1, heads=4, kv_heads=2))
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True, backend="aot_eager")
    # One length, not divisible by P (uneven shards): each new length costs torch.compile a
    # recompilation of ~10 s per rank here, and every length runs the same emitted graph.
    args, kwargs = _inputs("llama", 15, torch.Generator().manual_seed(seed + 15))
    errors = [parity(reference, compiled, *args, **kwargs).max_error]
    # Ring attention in the one graph: the opaque ops autosp::ring_attention(_backward).
    ring = autosp.compile(model, gather_outputs=True, backend="aot_eager", sp_strategy="ring")
    errors.append(parity(reference, ring, *args, **kwargs).max_error)
    queue.put((rank, (errors, ring.programs[0].mlir["transformed"].count('"autosp.ring_attention"'))))


def test_torch_compile_after_sequence_parallelism(_fresh_seed):
    results = run_ranks(_compiled_backend_body, 2, args=(_fresh_seed % 10000,), timeout=600)
    for rank, (errors, rings) in results.items():
        assert max(errors) <= TOL and rings == 1, (rank, errors, rings)


def _ddp_body(rank, world, queue, seed):
    """DDP on the data-parallel dimension of the mesh, autosp on the sequence dimension."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import autosp
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model, _ = _model("llama_gqa")
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, sp_size=2, sync_data_parallel=False)
    ddp = DDP(compiled, process_group=compiled.mesh["dp"].get_group())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(2):
        batches = [_inputs("llama", 15, torch.Generator().manual_seed(seed + 100 * r + step)) for r in range(2)]
        args, kwargs = batches[rank // 2]
        opt.zero_grad()
        ddp(*args, **kwargs)["loss"].backward()
        opt.step()
        ref_opt.zero_grad()
        for a, k in batches:
            (reference(*a, **k)["loss"] / 2).backward()
        ref_opt.step()
    queue.put((rank, max(relative_error(p, q) for p, q in zip(model.parameters(), reference.parameters()))))


def test_composes_with_ddp_on_the_data_parallel_dimension(_fresh_seed):
    results = run_ranks(_ddp_body, 4, args=(_fresh_seed % 10000,), timeout=300)
    assert max(results.values()) <= TOL, results


class _MaxMinSizes(torch.nn.Module):
    """Sizes from ``max``/``min`` of the sequence length (torch.sym_max / sym_min under
    export): a position table of ``max(S, 4)`` entries cut to S, scaled by ``1 / min(S, 64)``
    (``paired``: the table cut to ``min(S, 64)`` instead, so its length is not one the
    compiler can relate to S, and it is added to the sequence)."""

    def __init__(self, paired=False):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 8)
        self.lin = torch.nn.Linear(8, 8)
        self.paired = paired

    def forward(self, ids):
        x = self.emb(ids)
        b, s, _ = x.shape
        n, m = max(s, 4), min(s, 64)
        pos = torch.arange(n)[:m if self.paired else s].float() / m
        q = (self.lin(x) + pos[:, None]).view(b, s, 4, 2).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def _max_min_body(rank, world, queue, seed, paired):
    import autosp
    from autosp.testing.parity import parity
    torch.manual_seed(seed)
    model = _MaxMinSizes(paired)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    out = {}
    for s in (15,) if paired else (15, 3, 70):  # one program (S = 3 < 4, S = 70 > 64)
        ids = torch.randint(0, 32, (2, s), generator=torch.Generator().manual_seed(seed + s))
        try:
            report = parity(reference, compiled, ids)
            out[s] = (report.max_output_error, report.max_grad_error)
        except autosp.AutospError as e:
            out[s] = str(e)
    queue.put((rank, dict(out=out, programs=len(compiled.programs))))


def test_sizes_from_max_and_min_of_the_sequence_length(_fresh_seed):
    """``max``/``min`` of sizes import (``prim.max.int``/``prim.min.int``) and run; where
    such a size meets the sequence the compiler cannot cut it to each rank's part and says
    so at the model's line, instead of a size mismatch at run time (the control)."""
    results = run_ranks(_max_min_body, 2, args=(_fresh_seed % 10000, False), timeout=300)
    for rank, r in results.items():
        assert all(isinstance(v, tuple) and max(v) <= 1e-5 for v in r["out"].values()), (rank, r)
        assert r["programs"] == 1, r
    results = run_ranks(_max_min_body, 2, args=(_fresh_seed % 10000, True), timeout=300)
    for rank, r in results.items():
        message = r["out"][15]
        assert isinstance(message, str) and "cannot relate to the sequence length" in message, (rank, r)
        assert "test_sequence_parallel.py" in message and "aten.add.Tensor" in message, message
