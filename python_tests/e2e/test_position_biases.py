"""Per-head position biases inside attention: MPT's ALiBi (``[H, 1, S]`` added to the scores
it writes out), BLOOM's (``baddbmm(alibi, q, kᵀ)`` on ``[B * H, S, D]``, the heads folded
into the batch) and T5's bucketed relative bias (a learned table, ``[B, H, S, S]`` with the
padding mask, SDPA's ``attn_mask``; an encoder with a token-classification head),
unmodified, sequence-parallel.

Under Ulysses each rank holds its heads over the whole sequence; the bias, computed whole
on every rank, must be cut to the same heads (``autosp.local_heads``, inserted by
``autosp-partition-attention`` where a tensor from outside attention holds the heads). Every
rank checks the loss, the gathered logits, every gradient and 3 AdamW steps against
single-device eager on the full sequence. BLOOM's GeLU is its own autograd Function (kept
whole, no environment variable). Control: each rank taking the next rank's heads of the
bias must fail."""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import families  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128


def _model(family):
    if family == "mpt":
        cfg = transformers.MptConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, max_seq_len=128,
                                     expansion_ratio=2, use_cache=False)
        return transformers.MptForCausalLM(cfg)
    if family == "t5":  # (dropout off: the reference and the compiled model draw other masks)
        cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                    relative_attention_num_buckets=8, num_labels=3, dropout_rate=0.0)
        return transformers.T5ForTokenClassification(cfg)
    cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_head=4, n_layer=2, use_cache=False)
    return transformers.BloomForCausalLM(cfg)


def _labels(family, ids):
    return ids % 3 if family == "t5" else ids


def _body(rank, world, queue, seed, family, control=False):
    import autosp
    from autosp.planning.memory import SavedTensors
    from autosp.testing.parity import adamw_steps, next_ranks_heads, parity
    out = {}
    with next_ranks_heads(control):
        cases = families.at(family, world)
        for i, case in enumerate(cases[:1] if control else cases):
            torch.manual_seed(seed + i)
            model = _model(family)
            reference = copy.deepcopy(model)
            compiled = autosp.compile(model, gather_outputs=True)
            gen = torch.Generator().manual_seed(seed + i)
            ids = torch.randint(0, VOCAB, (2, case.seq), generator=gen)
            loss_of = lambda m, x: m(input_ids=x, labels=_labels(family, x)).loss  # noqa: E731
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = parity(reference, compiled, input_ids=ids, labels=_labels(family, ids))
                ir = compiled.programs[0].mlir["transformed"]
                r = {"outputs": report.max_output_error, "grads": report.max_grad_error,
                     "local_heads": ir.count('"autosp.local_heads"'), "functions": ir.count("autograd_function")}
                r["fused"] = ir.count('"torch.autosp.key_bias_attention"')
                r["relative"] = ir.count('"torch.autosp.relative_bias_attention"')
                if not control:
                    r["steps"] = adamw_steps(reference, model, compiled, loss_of,
                                             [torch.randint(0, VOCAB, ids.shape, generator=gen) for _ in range(3)])
                if not control and i == 0:  # bytes kept for backward on this rank at S = 64 and 128
                    r["saved"] = {}
                    for s in (64, 128):
                        x = torch.randint(0, VOCAB, (2, s), generator=gen)
                        with SavedTensors(list(model.parameters())) as kept:
                            loss = loss_of(compiled, x)
                        r["saved"][s] = kept.bytes
                        del loss
            out[case.id()] = r
    queue.put((rank, out))


@pytest.mark.parametrize("family,world", [("mpt", w) for w in families.worlds("mpt")] +
                         [("bloom", w) for w in families.worlds("bloom")] +
                         [("t5", w) for w in families.worlds("t5")])
def test_position_bias_models_match_single_device(family, world, _fresh_seed):
    results = run_ranks(_body, world, args=(_fresh_seed % 10000, family), timeout=600)
    for rank, by_case in results.items():
        for case, r in by_case.items():
            where = f"rank {rank}, {family} {case}: {r}"
            assert r["outputs"] <= TOL and r["grads"] <= TOL, where
            assert all(g <= TOL and q <= TOL for g, q in r["steps"]), where
            assert r["local_heads"] == 2, where  # one bias per layer (T5: per layer's attn_mask), cut to the heads
            if family == "bloom":
                assert r["functions"] > 0, where  # its GeLU: its own autograd Function, kept
            if family in ("mpt", "bloom"):  # ALiBi: a key bias, fused with attention (no S x S scores)
                assert r["fused"] == 2, where
            if family == "t5":  # buckets of k - q: the bias rebuilt block by block (no S x S mask)
                assert r["relative"] == 2, where
            if "saved" in r:
                assert r["saved"][128] / r["saved"][64] <= 2.3, where


@pytest.mark.parametrize("family", ["mpt", "bloom", "t5"])
def test_negative_control_the_next_ranks_heads_of_the_bias_fail(family, _fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, family, True), timeout=600)
    assert min(max(r["outputs"], r["grads"]) for by_case in results.values() for r in by_case.values()) > 1e-3, \
        results


def _padded_body(rank, world, queue, seed, control=False):
    """Each family called with a padded batch, as a collator pads: MPT and BLOOM left-padded
    (BLOOM's ALiBi counts positions with a cumsum over the mask), T5 right-padded (the
    encoder's padding joins its bias in one ``attn_mask``); padded labels -100. Loss,
    gathered logits and every gradient against the padded single-device call.
    ``control``: the compiled model called without the mask (BLOOM only)."""
    import autosp
    from autosp.testing.parity import padded_parity
    seq = 15 if world == 2 else 19
    out = {}
    for i, family in enumerate(["bloom"] if control else ["mpt", "bloom", "t5"]):
        torch.manual_seed(seed + i)
        model = _model(family)
        reference = copy.deepcopy(model)
        compiled = autosp.compile(model, gather_outputs=True)
        ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(seed + i))
        mask = torch.ones(2, seq, dtype=torch.long)
        mask[1, -4:] = 0 if family == "t5" else 1
        mask[1, :4] = 1 if family == "t5" else 0
        labels = _labels(family, ids).masked_fill(mask == 0, -100)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[family] = padded_parity(reference, compiled, ids, mask, labels, control=control)
    queue.put((rank, out))


@pytest.mark.parametrize("world", [2, 4])
def test_padded_batches_match_single_device(world, _fresh_seed):
    """MPT, BLOOM and T5 with padding at P = 2 (S = 15) and P = 4 (S = 19). Control: BLOOM's
    batch without its mask gives other logits."""
    results = run_ranks(_padded_body, world, args=(_fresh_seed % 10000,), timeout=600)
    for rank, by_family in results.items():
        for family, r in by_family.items():
            assert r["outputs"] <= TOL and r["grads"] <= TOL, f"rank {rank}, {family}: {r}"
    if world == 2:
        control = run_ranks(_padded_body, 2, args=(_fresh_seed % 10000, True), timeout=600)
        assert min(r["bloom"] for r in control.values()) > 1e-3, control


def _narrowed_bias(attention):
    """The control: the key bias rounded to q's dtype (what fusing without the upcast would do)."""
    original = attention.key_bias_attention

    def narrow(q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, gqa=False, bias=None, **kw):
        return original(q, k, v, mask, dropout_p, is_causal, scale, gqa, bias.to(q.dtype), **kw)
    return narrow


def _half_body(rank, world, queue, seed, control=False):
    """MPT in bf16 (its fp32 ALiBi table added to bf16 scores: the kernel runs in fp32) and
    BLOOM in bf16 and under autocast (an fp32 mask over bf16 scores), S = 1001: the loss
    against eager in the same precision and in fp32, and the logits against eager.
    ``control``: MPT with the bias rounded to bf16 inside the kernel."""
    import contextlib

    import autosp
    from autosp.runtime import attention
    original = attention.key_bias_attention
    if control:
        attention.key_bias_attention = _narrowed_bias(attention)
    out = {}
    try:
        cases = [("mpt", "bf16")] if control else [("mpt", "bf16"), ("bloom", "bf16"), ("bloom", "autocast")]
        for family, mode in cases:
            torch.manual_seed(seed)
            if family == "mpt":
                cfg = transformers.MptConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2, max_seq_len=2048,
                                             expansion_ratio=2, use_cache=False)
                model = transformers.MptForCausalLM(cfg)
            else:
                model = _model("bloom")
            if mode == "bf16":
                model = model.to(torch.bfloat16)
            fp32, reference = copy.deepcopy(model).float(), copy.deepcopy(model)
            compiled = autosp.compile(model, gather_outputs=True)
            ids = torch.randint(0, VOCAB, (2, 1001), generator=torch.Generator().manual_seed(seed))
            autocast = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else contextlib.nullcontext()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with autocast, torch.no_grad():
                    mine, theirs = compiled(input_ids=ids, labels=ids), reference(input_ids=ids, labels=ids)
                exact = fp32(input_ids=ids, labels=ids).loss.item()
            ir = compiled.programs[0].mlir["transformed"]
            out[(family, mode)] = {"fused": ir.count('"torch.autosp.key_bias_attention"'),
                                   "loss_vs_fp32": abs(mine.loss.item() - exact),
                                   "eager_vs_fp32": abs(theirs.loss.item() - exact),
                                   "logits": (mine.logits.float() - theirs.logits.float()).abs().max().item()}
    finally:
        attention.key_bias_attention = original
    queue.put((rank, out))


def test_half_precision_alibi_matches_eager(_fresh_seed):
    """bf16 and autocast at P = 2: both families fused, as close to fp32 as eager is, logits
    within bf16 rounding of eager's. Control: MPT's bias rounded to bf16 misses by 10x more."""
    results = run_ranks(_half_body, 2, args=(_fresh_seed % 10000,), timeout=600)
    for rank, by_case in results.items():
        for case, r in by_case.items():
            where = f"rank {rank}, {case}: {r}"
            assert r["fused"] == 2, where
            assert r["loss_vs_fp32"] <= max(5e-5, 2 * r["eager_vs_fp32"]) and r["logits"] <= 0.03, where
    control = run_ranks(_half_body, 2, args=(_fresh_seed % 10000, True), timeout=600)
    assert min(r[("mpt", "bf16")]["logits"] for r in control.values()) > 0.05, control


def _mesh_model(family, heads):
    if family == "mpt":
        return transformers.MptForCausalLM(transformers.MptConfig(
            vocab_size=VOCAB, d_model=8 * heads, n_heads=heads, n_layers=2, max_seq_len=128, expansion_ratio=2,
            use_cache=False))
    return transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=VOCAB, hidden_size=8 * heads,
                                                                  n_head=heads, n_layer=2, use_cache=False))


# (family, heads, options) per world: a ring at P = 2, a hybrid mesh and fewer heads than
# ranks at P = 4 (Ulysses alone cannot split 2 heads over 4 ranks: auto picks the ring).
_MESHES = {2: [("mpt", 4, {"sp_strategy": "ring"}), ("bloom", 4, {"sp_strategy": "ring"}),
               ("mpt", 4, {"sp_strategy": "ring", "backend": "aot_eager"})],  # (the ring's custom ops)
           4: [("mpt", 4, {"sp_strategy": "hybrid", "ulysses_degree": 2}), ("mpt", 2, {}),
               ("bloom", 2, {"sp_strategy": "ring"})]}


def _mesh_body(rank, world, queue, seed, control=False):
    """ALiBi models on ring and hybrid meshes: every pair of blocks adds its keys' slice of
    the whole bias. Loss, gathered logits, gradients and 3 AdamW steps against one device,
    at an S the ranks do not divide. (A left-padded batch is refused on the ring with the
    reason: eager gives its fully masked rows the mean of the values, the ring zeros.)
    ``control``: the pairs without the bias."""
    import autosp
    from autosp.runtime import ring
    from autosp.testing.parity import adamw_steps, parity
    original = ring._pair_mask
    if control:
        ring._pair_mask = lambda vis, bias, dtype: original(vis, None, dtype)
    seq = 15 if world == 2 else 19
    out = {}
    try:
        for i, (family, heads, options) in enumerate(_MESHES[world][:1] if control else _MESHES[world]):
            torch.manual_seed(seed + i)
            model = _mesh_model(family, heads)
            reference = copy.deepcopy(model)
            compiled = autosp.compile(model, gather_outputs=True, **options)
            gen = torch.Generator().manual_seed(seed + i)
            ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = parity(reference, compiled, input_ids=ids, labels=ids)
                r = {"outputs": report.max_output_error, "grads": report.max_grad_error}
                ir = compiled.programs[0].mlir["transformed"]
                r["ring_with_bias"] = ir.count("array<i32: 1, 1, 1, 1, 0, 0, 1>")
                if not control:
                    r["steps"] = adamw_steps(reference, model, compiled,
                                             lambda m, x: m(input_ids=x, labels=x).loss,
                                             [torch.randint(0, VOCAB, ids.shape, generator=gen) for _ in range(3)])
            out[f"{family}-H{heads}-{options.get('sp_strategy', 'auto')}-{options.get('backend', 'eager')}"] = r
    finally:
        ring._pair_mask = original
    queue.put((rank, out))


@pytest.mark.parametrize("world", [2, 4])
def test_alibi_on_ring_and_hybrid_meshes_matches_single_device(world, _fresh_seed):
    results = run_ranks(_mesh_body, world, args=(_fresh_seed % 10000,), timeout=600)
    for rank, by_case in results.items():
        for case, r in by_case.items():
            where = f"rank {rank}, P={world} {case}: {r}"
            assert r["ring_with_bias"] == 2, where  # both layers: ring attention carrying the key bias
            assert r["outputs"] <= TOL and r["grads"] <= TOL, where
            assert all(g <= TOL and q <= TOL for g, q in r["steps"]), where
    if world == 2:
        control = run_ranks(_mesh_body, 2, args=(_fresh_seed % 10000, True), timeout=600)
        assert min(max(r["outputs"], r["grads"]) for by_case in control.values() for r in by_case.values()) > 1e-3, \
            control


class _SharedKeyBiasLM(torch.nn.Module):
    """A hand-written causal LM (nobody's family): 2 heads, attention written out with one
    head-shared bias of the key position (``slope * j`` as a ``[S]`` vector: ALiBi with one
    slope for every head) added to the scores, then the causal masked_fill."""

    def __init__(self, hidden=16, heads=2, layers=2, slope=0.25):
        super().__init__()
        self.heads, self.slope = heads, slope
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(hidden, 3 * hidden) for _ in range(layers))
        self.outs = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, VOCAB)

    def forward(self, input_ids, labels):
        x = self.embed(input_ids)
        b, s, d = x.shape
        bias = self.slope * torch.arange(s, dtype=x.dtype)  # [S]: every head, every query
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        for qkv, out in zip(self.blocks, self.outs):
            q, k, v = qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5 + bias
            weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            x = x + out((weights @ v).transpose(1, 2).reshape(b, s, d))
        logits = self.head(x)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
        return {"loss": loss, "logits": logits}


def _shared_body(rank, world, queue, seed, control=False):
    """The head-shared key bias model with 2 heads at P = 4 (fewer heads than ranks: auto
    takes the ring), S = 19 and 20: parity and 3 AdamW steps. ``control``: the ring's pairs
    without the bias."""
    import autosp
    from autosp.planning.memory import SavedTensors
    from autosp.runtime import ring
    from autosp.testing.parity import adamw_steps, parity
    original = ring._pair_mask
    if control:
        ring._pair_mask = lambda vis, bias, dtype: original(vis, None, dtype)
    out = {}
    try:
        torch.manual_seed(seed)
        model = _SharedKeyBiasLM()
        reference = copy.deepcopy(model)
        compiled = autosp.compile(model, gather_outputs=True)
        gen = torch.Generator().manual_seed(seed)
        for seq in (19,) if control else (19, 20):
            ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
            report = parity(reference, compiled, input_ids=ids, labels=ids)
            r = {"outputs": report.max_output_error, "grads": report.max_grad_error}
            if not control:
                r["steps"] = adamw_steps(reference, model, compiled, lambda m, x: m(input_ids=x, labels=x)["loss"],
                                         [torch.randint(0, VOCAB, ids.shape, generator=gen) for _ in range(3)])
            out[seq] = r
        ir = compiled.programs[0].mlir["transformed"]
        out["ring_with_bias"] = ir.count("array<i32: 1, 1, 1, 1, 0, 0, 1>")
        if not control:
            saved = {}
            for s in (64, 128):
                x = torch.randint(0, VOCAB, (2, s), generator=gen)
                with SavedTensors(list(model.parameters())) as kept:
                    loss = compiled(input_ids=x, labels=x)["loss"]
                saved[s] = kept.bytes
                del loss
            out["saved"] = saved
    finally:
        ring._pair_mask = original
    queue.put((rank, out))


def test_head_shared_key_bias_with_two_heads_at_four_ranks(_fresh_seed):
    results = run_ranks(_shared_body, 4, args=(_fresh_seed % 10000,), timeout=600)
    for rank, r in results.items():
        where = f"rank {rank}: {r}"
        assert r["ring_with_bias"] == 2, where
        for seq in (19, 20):
            assert r[seq]["outputs"] <= TOL and r[seq]["grads"] <= TOL, where
            assert all(g <= TOL and q <= TOL for g, q in r[seq]["steps"]), where
        assert r["saved"][128] / r["saved"][64] <= 2.3, where
    control = run_ranks(_shared_body, 4, args=(_fresh_seed % 10000, True), timeout=600)
    assert min(max(r[19]["outputs"], r[19]["grads"]) for r in control.values()) > 1e-3, control
