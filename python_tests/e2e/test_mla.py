"""MLA (DeepSeek-V3's multi-head latent attention), unmodified, sequence-parallel with the
cheapest tensor across ranks.

DeepSeek-V3 computes k and v per head from a compressed latent (``kv_b_proj`` of
``kv_lora_rank`` values per token) and one shared rope key, and q from its own latent
(``q_b_proj`` of ``q_lora_rank``). ``autosp-partition-attention`` proves from the IR that
each rank's heads of q, k and v can be computed from those latents over the whole sequence
(:mod:`autosp.passes.head_cut`), prices that against the all-to-alls
(:func:`autosp.cost.strategy.choose_cut`), and gathers the latents instead. Every rank
checks the loss, the gathered logits, every gradient and 3 AdamW steps against
single-device eager on the full sequence. Control: each rank computing the next rank's
heads from the gathered latents must fail."""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import families  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128


def _model():
    """2 layers (a dense MLP, then DeepSeek's group-limited MoE); 8 heads of q/k 8 + 4 (rope)
    and v 8 from an 8-value kv latent, q from a 12-value latent: each costs fewer bytes
    than its operands' all-to-alls at P = 2 and 4."""
    cfg = transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, q_lora_rank=12, kv_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
        n_group=2, topk_group=1, max_position_embeddings=128, use_cache=False, attn_implementation="sdpa")
    return transformers.DeepseekV3ForCausalLM(cfg)


def _body(rank, world, queue, seed, control=False):
    import autosp
    from autosp.testing.parity import adamw_steps, next_ranks_heads, parity
    out = {}
    with next_ranks_heads(control):
        cases = families.at("deepseek_v3", world)
        for i, case in enumerate(cases[:1] if control else cases):
            torch.manual_seed(seed + i)
            model = _model()
            reference = copy.deepcopy(model)
            compiled = autosp.compile(model, gather_outputs=True)
            gen = torch.Generator().manual_seed(seed + i)
            ids = torch.randint(0, VOCAB, (2, case.seq), generator=gen)
            loss_of = lambda m, x: m(input_ids=x, labels=x).loss  # noqa: E731
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = parity(reference, compiled, input_ids=ids, labels=ids)
                program = compiled.programs[0]
                ir = program.mlir["transformed"]
                r = {"outputs": report.max_output_error, "grads": report.max_grad_error,
                     "gathers": ir.count("split_dim = 0 : i64"), "all_to_alls": ir.count('"autosp.all_to_all"'),
                     "choice": "q, k, v computed from gathered" in ir}
                if not control:
                    r["steps"] = adamw_steps(reference, model, compiled, loss_of,
                                             [torch.randint(0, VOCAB, ids.shape, generator=gen) for _ in range(3)])
            out[case.id()] = r
    queue.put((rank, out))


@pytest.mark.parametrize("world", families.worlds("deepseek_v3"))
def test_mla_gathers_its_latents_and_matches_single_device(world, _fresh_seed):
    results = run_ranks(_body, world, args=(_fresh_seed % 10000,), timeout=600)
    for rank, by_case in results.items():
        for case, r in by_case.items():
            where = f"rank {rank}, {case}: {r}"
            assert r["outputs"] <= TOL and r["grads"] <= TOL, where
            assert all(g <= TOL and q <= TOL for g, q in r["steps"]), where
            # per layer: the q latent, the kv latent and the rope key gathered; the output back
            assert r["gathers"] == 6 and r["all_to_alls"] == 8, where
            assert r["choice"], where  # priced, and the reason recorded in autosp.sp_choice


def test_negative_control_the_next_ranks_heads_fail(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, True), timeout=600)
    assert min(max(r["outputs"], r["grads"]) for by_case in results.values() for r in by_case.values()) > 1e-3, \
        results


def _other_mla(name):
    """DeepSeek-V3 written out (eager attention, fused back by autosp-fuse-attention),
    DeepSeek-V2 and MiniCPM3: MLA as other families write it, at the test model's dims."""
    dims = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=8, q_lora_rank=12, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8,
                v_head_dim=8, max_position_embeddings=128, use_cache=False, attn_implementation="sdpa")
    if name == "deepseek_v3_eager":
        model = _model()
        model.config._attn_implementation = "eager"
        return model
    if name == "deepseek_v2":
        cfg = transformers.DeepseekV2Config(**dims, moe_intermediate_size=16, first_k_dense_replace=1,
                                            n_routed_experts=4, num_experts_per_tok=2)
        return transformers.DeepseekV2ForCausalLM(cfg)
    return transformers.MiniCPM3ForCausalLM(transformers.MiniCPM3Config(**dims))


def _others_body(rank, world, queue, seed, names, control):
    import autosp
    from autosp.testing.parity import next_ranks_heads, parity
    out = {}
    with next_ranks_heads(control):
        for i, name in enumerate(names):
            torch.manual_seed(seed + i)
            model = _other_mla(name)
            reference = copy.deepcopy(model)
            compiled = autosp.compile(model, gather_outputs=True)
            ids = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(seed + i))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = parity(reference, compiled, input_ids=ids, labels=ids)
            ir = compiled.programs[0].mlir["transformed"]
            out[name] = {"error": report.max_error, "gathers": ir.count("split_dim = 0 : i64")}
    queue.put((rank, out))


OTHERS = ["deepseek_v3_eager", "deepseek_v2", "minicpm3"]


def test_other_mla_families_gather_their_latents_and_match_single_device(_fresh_seed):
    """At P = 2, S = 17: each family's k and v (and q where its q path is proven: not
    DeepSeek-V2's) come from gathered latents, and the model matches one device. Control:
    the next rank's heads fail (checked on DeepSeek-V2, the family whose q is not cut)."""
    results = run_ranks(_others_body, 2, args=(_fresh_seed % 10000, OTHERS, False), timeout=600)
    for rank, by_family in results.items():
        for name, r in by_family.items():
            assert r["error"] <= TOL and r["gathers"] == (4 if name == "deepseek_v2" else 6), (rank, name, r)
    control = run_ranks(_others_body, 2, args=(_fresh_seed % 10000, ["deepseek_v2"], True), timeout=600)
    assert all(r["error"] > 1e-3 for by_family in control.values() for r in by_family.values()), control


def _fsdp_body(rank, world, queue, seed, control):
    """The test model (MLA, then DeepSeek's MoE) sharded with the FSDP2 recipe (fully_shard
    per layer, then the root), compiled, 3 AdamW steps against an unsharded copy."""
    from torch.distributed.fsdp import fully_shard

    import autosp
    from autosp.testing.parity import ADAM_EPS, next_ranks_heads, relative_error
    torch.manual_seed(seed)
    model = _model()
    reference = copy.deepcopy(model)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    out: dict = {"loss": []}
    with next_ranks_heads(control), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = autosp.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=ADAM_EPS)
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, eps=ADAM_EPS)
        gen = torch.Generator().manual_seed(seed + 1)
        for step in range(1 if control else 3):
            ids = torch.randint(0, VOCAB, (2, 15 + step % 2), generator=gen)
            loss = compiled(input_ids=ids, labels=ids).loss
            loss.backward()
            ref_loss = reference(input_ids=ids, labels=ids).loss
            ref_loss.backward()
            out["loss"].append(relative_error(loss, ref_loss))
            if step == 0:
                out["grad"] = max(relative_error(p.grad.full_tensor(), q.grad)
                                  for p, q in zip(model.parameters(), reference.parameters()) if q.grad is not None)
            opt.step(), ref_opt.step()
            opt.zero_grad(), ref_opt.zero_grad()
        out["params"] = max(relative_error(p.full_tensor(), q.detach())
                            for p, q in zip(model.parameters(), reference.parameters()))
        out["gathers"] = compiled.programs[0].mlir["transformed"].count("split_dim = 0 : i64")
    queue.put((rank, out))


def test_mla_and_moe_under_fsdp2_match_single_device(_fresh_seed):
    """FSDP2 shards the model state; inside its forward the experts' weights are plain
    tensors (not Parameters): the stated experts op reads them by attribute. Loss, every
    gradient (full_tensor) and the parameters after 3 AdamW steps match the unsharded
    model; the latents are gathered. Control: the next rank's heads."""
    results = run_ranks(_fsdp_body, 2, args=(_fresh_seed % 10000, False), timeout=600)
    for rank, r in results.items():
        assert max(r["loss"]) <= TOL and r["grad"] <= TOL and r["params"] <= TOL and r["gathers"] == 6, (rank, r)
    control = run_ranks(_fsdp_body, 2, args=(_fresh_seed % 10000, True), timeout=600)
    assert all(r["loss"][0] > 1e-3 or r["grad"] > 1e-3 for r in control.values()), control
