"""autosp as torchtitan's context parallelism (``autosp.titan``), with torchtitan's defaults.

torchtitan's llama3 ``debugmodel`` (2 of its layers), built the trainer's way: on the meta
device, torchtitan's own ``apply_fsdp_to_decoder`` (``[norm, lm_head]`` as one group), then
``autosp.titan.compile``, ``to_empty``, ``init_weights``, its ``ChunkedLossWrapper``
(``_skip_lm_head``: ``lm_head`` applied outside, chunk by chunk, from detached hidden
states) and FlexAttention with packed-document masks from ``positions``. Three AdamW steps
at P = 2 against the same model on one process. CPU FlexAttention has no backward in
torch 2.13, so the one-process run computes its attention with ``flex_as_dense`` (the same
mask and scores as ordinary ops); its forward is also checked against FlexAttention itself.
Losses and gradients match to 1e-5 at every step, each step judged at the same weights:
after each AdamW step the compiled model takes the one-process weights again, because
AdamW turns rounding-sized gradient differences into up to 2 lr per element (the step's
weights are checked to 1e-3 before that). test_titan_trainer runs the steps free.
Negative control: without the outside sum the ``lm_head`` gradient is half the right one.

Needs torchtitan (``pip install autosp[torchtitan]``; its import needs triton): skipped without.
"""
from __future__ import annotations

import copy

import families  # noqa: E402
import pytest
import torch

from autosp.testing.distributed import run_ranks

pytest.importorskip("triton", reason="torchtitan's model registry imports triton")
pytest.importorskip("torchtitan")

TOL = 1e-5
SEQ = 128
LR = 8e-4


def _config(family, flavor="debugmodel"):
    import importlib
    registry = importlib.import_module(f"torchtitan.models.{family}").model_registry
    cfg = registry(flavor, attn_backend="flex").model
    cfg.layers = cfg.layers[:2]
    return cfg


def _batch(seed, seq=SEQ):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 2048, (2, seq), generator=gen)
    labels = torch.randint(0, 2048, (2, seq), generator=gen)
    positions = torch.arange(seq).repeat(2, 1)
    cut = int(torch.randint(20, seq - 20, (1,), generator=gen))
    positions[0, cut:] -= cut  # two packed documents in the first row
    return tokens, labels, positions


def _loss_fn(lm_head):
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    fn = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=2048)).build()
    fn.set_lm_head(lm_head)
    return fn


def _body(rank, world, queue, seed, outside_sum, family="llama3"):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    import autosp.titan
    from autosp.frontend.flex import flex_as_dense
    from autosp.testing.parity import relative_error
    if family != "llama3":  # its forward asserts spmd_types on a mesh the trainer sets up; DTensor's path
        from torchtitan.distributed.utils import set_spmd_backend
        set_spmd_backend("partial_dtensor")
    torch.manual_seed(seed)
    reference = _config(family).build()
    reference.init_weights()
    reference._skip_lm_head = True
    with torch.device("meta"):
        model = _config(family).build()
    mesh = init_device_mesh("cpu", (world,))
    apply_fsdp_to_decoder(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    model = autosp.titan.compile(model)
    model.to_empty(device="cpu")
    model.init_weights()
    with torch.no_grad():  # the one-process model's weights, sharded
        for p, q in zip(model.parameters(), reference.parameters()):
            p.copy_(distribute_tensor(q.detach(), p.device_mesh, p.placements))
    model._skip_lm_head = True
    if not outside_sum:
        model.autosp.grad_sync.outside = None
        model.autosp._fsdp_outside.factor = float(world)  # FSDP2's own mean over the world for lm_head's group
    loss_fn, ref_loss_fn = _loss_fn(model.lm_head), _loss_fn(reference.lm_head)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=LR)
    losses, forward, params = [], None, 0.0
    for step in range(3):
        tokens, labels, positions = _batch(seed + step)
        count = (labels != -100).sum()
        if step == 0:
            with torch.no_grad():
                hidden = reference(tokens, positions, reference.get_attention_masks(positions))
            forward = hidden
        with flex_as_dense():
            h_ref = reference(tokens, positions, reference.get_attention_masks(positions))
            ref_loss, _ = ref_loss_fn(h_ref, labels, count)
            ref_loss.backward()
        masks = model.get_attention_masks(positions)  # the trainer's; rebuilt inside from positions
        h = model(tokens, positions=positions, attention_masks=masks)
        if step == 0:
            full = model.autosp.gather_sequence(h.detach())
            forward = relative_error(full, forward)
        loss, _ = loss_fn(h, model.autosp.shard_sequence(labels), count)
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        grads = {n: relative_error(p.grad.full_tensor(), q.grad) for (n, p), q in
                 zip(model.named_parameters(), reference.parameters())}
        losses.append(dict(loss=relative_error(total, ref_loss.detach()), grads=max(grads.values()),
                           head=grads["lm_head.weight"]))
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
        # One AdamW step from gradients equal to rounding moves the weights apart by up to
        # 2 lr per element where a gradient element is rounding-sized (its sign decides):
        # in the first 3 steps a bias-corrected Adam update is at most 1.004 lr in size
        # (Cauchy-Schwarz over its moments), and weight decay is the same at the same
        # weights. Checked as an absolute bound (relative to the largest weight it would
        # depend on the init scale), then the compiled model takes the one-process weights
        # again, so every step's gradients are judged at the same weights.
        params = max(params, max((p.full_tensor() - q).abs().max().item() / LR for p, q in
                                 zip(model.parameters(), reference.parameters())))
        with torch.no_grad():
            for p, q in zip(model.parameters(), reference.parameters()):
                p.copy_(distribute_tensor(q.detach(), p.device_mesh, p.placements))
    transformed = model.autosp.programs[0].mlir["transformed"]
    queue.put((rank, dict(steps=losses, forward=forward, params=params,
                          kept=transformed.count("autosp.mask_kept"), documents=transformed.count("autosp.documents"),
                          keys=sorted(model.state_dict())[:3])))


@pytest.mark.parametrize("family,case", families.params("titan_llama3", lambda c: not c.has("uneven"), ("llama3",)) +
                         families.params("titan_muse_glimmer", lambda c: not c.has("uneven"), ("muse_glimmer",)))
def test_torchtitan_models_train_like_one_process(family, case, _fresh_seed):
    world = case.world
    results = run_ranks(_body, world, args=(_fresh_seed % 10000, True, family), timeout=600)
    for rank, r in results.items():
        assert r["forward"] <= TOL, f"rank {rank}: the forward against FlexAttention: {r['forward']:.2e}"
        for step, s in enumerate(r["steps"]):  # (each step at the one-process weights: see _body)
            assert s["loss"] <= TOL and s["grads"] <= TOL, f"rank {rank}, step {step}: {s}"
        assert r["params"] <= 2.01, r  # one AdamW step apart (in lr), from rounding-sized gradient differences
        assert r["kept"] == 0 and r["documents"] > 0, f"the document mask should be proven: {r}"
        assert not any(k.startswith(("module.", "model.", "autosp")) for k in r["keys"]), r["keys"]


def test_negative_control_without_the_outside_sum_lm_head_is_wrong(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, False), timeout=600)
    assert min(r["steps"][0]["head"] for r in results.values()) > 0.1, results


def _moe_body(rank, world, queue, seed, cases):
    """Each case ``(name, fp32_experts, seq)`` in turn on one set of (pooled) ranks."""
    from torchtitan.models.common import moe
    original = moe.GroupedExperts.forward

    def fp32_experts_forward(self, x, num_tokens_per_expert):
        offs = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
        h = torch.nn.functional.silu(torch._grouped_mm(x, self.w1_EFD.transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x, self.w3_EFD.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, self.w2_EDF.transpose(-2, -1), offs=offs)
    out = {}
    try:
        for i, (name, fp32_experts, seq) in enumerate(cases):
            # torchtitan's experts without their bf16 casts: the split over ranks is then exact
            moe.GroupedExperts.forward = fp32_experts_forward if fp32_experts else original
            out[name] = _moe_case(seed + i, seq)
    finally:
        moe.GroupedExperts.forward = original
    queue.put((rank, out))


def _moe_case(seed, seq):
    import torch.distributed as dist

    import autosp.titan
    from autosp.frontend.flex import flex_as_dense
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    reference = _config("qwen3", "debugmodel_moe").build()
    reference.init_weights()
    model = copy.deepcopy(reference)
    model = autosp.titan.compile(model)
    tokens, labels, positions = _batch(seed, seq)
    count = (labels != -100).sum()
    with flex_as_dense():
        h_ref = reference(tokens, positions, reference.get_attention_masks(positions))
        ref_loss = torch.nn.functional.cross_entropy(h_ref.flatten(0, 1).float(), labels.flatten(),
                                                     reduction="sum") / count
        ref_loss.backward()
    logits = model(tokens, positions=positions)
    local = model.autosp.shard_sequence(labels)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), local.flatten(), reduction="sum") / count
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = {n: relative_error(p.grad, q.grad) for (n, p), q in zip(model.named_parameters(), reference.parameters())}
    experts = [v for n, v in grads.items() if "inner_experts" in n]
    others = [v for n, v in grads.items() if "inner_experts" not in n]
    counters = [(b, c) for (n, b), c in zip(model.named_buffers(), reference.buffers()) if "tokens_per_expert" in n]
    return dict(loss=relative_error(total, ref_loss.detach()), experts=max(experts), others=max(others),
                counts=max(float((b - c).abs().max()) for b, c in counters), n_counters=len(counters),
                total=float(counters[0][0].sum()))


@pytest.mark.parametrize("world", families.worlds("titan_qwen3_moe"))
def test_torchtitan_qwen3_moe_in_train_mode(world, _fresh_seed):
    """qwen3 ``debugmodel_moe`` (2 layers): router, token dispatcher (its sort), grouped
    experts, and the ``tokens_per_expert`` counters every rank holds for the whole batch.
    torchtitan runs its experts in bf16 in an fp32 model: the split over ranks changes the
    order its bf16 weight gradients are summed in, so there they are held to bf16's
    precision (2e-2); with the experts' matmuls in fp32 every gradient is held to 1e-5.
    The family's cases at this P run on one set of ranks."""
    cases = [(c.id(), c.has("fp32_experts"), c.seq) for c in families.at("titan_qwen3_moe", world)]
    results = run_ranks(_moe_body, world, args=(_fresh_seed % 10000, cases), timeout=600)
    for rank, by_case in results.items():
        for (name, fp32_experts, _), r in zip(cases, by_case.values()):
            where = f"rank {rank}, {name}: {r}"
            assert r["loss"] <= TOL, where
            assert max(r["experts"], r["others"]) <= (TOL if fp32_experts else 2e-2), where
            assert r["n_counters"] == 2 and r["counts"] == 0.0, f"counts differ from one device's: {where}"


def _uneven_body(rank, world, queue, seed, seq, family="llama3"):
    """S not divisible by P (nor by the chunked loss's chunks): the hidden states gathered,
    a plain loss, one step's gradients."""
    import autosp.titan
    from autosp.frontend.flex import flex_as_dense
    from autosp.testing.parity import relative_error
    if family != "llama3":  # (as in _body)
        from torchtitan.distributed.utils import set_spmd_backend
        set_spmd_backend("partial_dtensor")
    torch.manual_seed(seed)
    reference = _config(family).build()
    reference.init_weights()
    model = autosp.titan.compile(copy.deepcopy(reference), gather_outputs=True)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, 2048, (2, seq), generator=gen)
    positions = torch.arange(seq).repeat(2, 1)
    positions[1, seq // 3:] -= seq // 3  # packed documents
    with torch.no_grad():
        flex = reference(tokens, positions, reference.get_attention_masks(positions))
    with flex_as_dense():
        expected = reference(tokens, positions, reference.get_attention_masks(positions))
        expected.float().pow(2).mean().backward()
    out = model(tokens, positions=positions)
    out.float().pow(2).mean().backward()
    queue.put((rank, dict(forward=relative_error(out.detach(), flex),
                          grads=max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                                                  reference.parameters())))))


@pytest.mark.parametrize("family,case", families.params("titan_llama3", lambda c: c.has("uneven"), ("llama3",)) +
                         families.params("titan_muse_glimmer", lambda c: c.has("uneven"), ("muse_glimmer",)))
def test_torchtitan_models_with_a_length_the_ranks_do_not_divide(family, case, _fresh_seed):
    world, seq = case.world, case.seq
    results = run_ranks(_uneven_body, world, args=(_fresh_seed % 10000, seq, family), timeout=600)
    for rank, r in results.items():
        assert r["forward"] <= TOL and r["grads"] <= TOL, f"rank {rank}: {r}"
