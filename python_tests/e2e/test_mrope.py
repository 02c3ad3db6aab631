"""3-D mrope positions (Qwen2.5-VL's language model): ``position_ids`` of shape [3, B, S].

An input's sequence dimension is ``seq_dim`` where that has size S; an input whose
``seq_dim`` does not, but whose later dims hold S exactly once, has it there, kept only
where the export ties it to the sequence (one symbol with S): mrope's [3, B, S] position
ids then carry the symbol S: every rank computes the rope tables from them whole (no
parameter is involved) and each section's cos and sin is sliced where it meets the
rank's queries and keys (``autosp.shard``), with the text. A size that merely equals S
stays static.

Checked: a tiny Qwen2.5-VL (mrope sections 2/3/3, text with an image-like block whose
temporal/height/width positions differ) against single-device eager at P = 2 (S = 15) and
P = 4 (S = 20), loss, gathered logits and every gradient <= 1e-5, and at P = 2 three AdamW
steps; the program keeps S symbolic (a second length, one program). Negative control:
every rank reading the first rank's positions must fail. Unit: the inference rule, and a
size that only equals S (not tied) stays static and the model still runs exact.

Not covered (the closing note says why): Qwen2.5-VL *with* pixel values. Its vision tower
reads ``image_grid_thw``'s values in Python and, outside flash attention, splits its
packed patches by ``cu_seqlens.tolist()``; torch.export cannot trace that.
"""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen2_5_VLForConditionalGeneration"):  # pragma: no cover
    pytest.skip("transformers without Qwen2.5-VL", allow_module_level=True)

from autosp.frontend.importer import input_sequence_dims  # noqa: E402
from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 256
SECTIONS = (2, 3)  # mrope_section [2, 3, 3]: the per-section cos / sin widths


def _model():
    cfg = transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, use_cache=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=64,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2, window_size=16, in_chans=3),
        image_token_id=250, video_token_id=251, vision_start_token_id=252, vision_end_token_id=253)
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    return transformers.Qwen2_5_VLForConditionalGeneration(cfg).float()


def _positions(seq: int, batch: int = 2) -> torch.Tensor:
    """Text 0..4, a 2 x 2 image block at 5 (t fixed, h and w over the grid), text after it."""
    pos = torch.arange(seq).expand(3, batch, seq).clone()
    pos[0, :, 5:9] = 5
    pos[1, :, 5:9] = torch.tensor([5, 5, 6, 6])
    pos[2, :, 5:9] = torch.tensor([5, 6, 5, 6])
    pos[:, :, 9:] = torch.arange(7, 7 + seq - 9)
    return pos


def _body(rank, world, queue, seed, control):
    import autosp
    from autosp.runtime import collectives
    from autosp.testing.parity import adamw_steps, parity
    original = collectives._narrow_pieces
    if control:  # every rank takes the first rank's part of the mrope sections' cos and sin
        def first_part(x, dim, offset, pieces):
            if x.dim() == 3 and x.shape[-1] in SECTIONS and x.is_floating_point():
                pieces = [(0, sum(b - a for a, b in pieces))]
            return original(x, dim, offset, pieces)
        collectives._narrow_pieces = first_part
    seq = 15 if world == 2 else 20
    torch.manual_seed(seed)
    model = _model()
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    gen = torch.Generator().manual_seed(seed)

    def batch(s):
        ids = torch.randint(0, 200, (2, s), generator=gen)
        return {"input_ids": ids, "position_ids": _positions(s), "labels": ids}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = parity(reference, compiled, **batch(seq))
        ir = compiled.programs[0].mlir["transformed"]
        out = {"outputs": report.outputs, "grads": report.max_grad_error,
               "sections": sum(1 for line in ir.splitlines() if '"autosp.shard"' in line and any(
                                   line.endswith(f"-> !torch.vtensor<[2,?,{k}],f32>") for k in SECTIONS))}
        if world == 2 and not control:
            out["steps"] = adamw_steps(reference, model, compiled, lambda m, kw: m(**kw).loss,
                                       [batch(seq + 1) for _ in range(3)])
            out["programs"] = len(compiled.programs)
    queue.put((rank, out))


@pytest.mark.parametrize("world", [2, 4])
def test_mrope_positions_shard_with_the_text(world, _fresh_seed):
    results = run_ranks(_body, world, args=(_fresh_seed % 10000, False), timeout=600)
    for rank, r in results.items():
        where = f"rank {rank}, P={world}: {r}"
        assert max(r["outputs"].values()) <= TOL and r["grads"] <= TOL, where
        assert r["sections"] >= 6, where  # each section's cos and sin, made whole, sliced per rank
        if world == 2:
            for grads, params in r["steps"]:
                assert grads <= TOL and params <= TOL, where
            assert r["programs"] == 1, where  # S = 15 and 16: one program


def test_negative_control_positions_of_another_rank_fail(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, True), timeout=600)
    assert results[1]["outputs"]["['logits']"] > 1e-3, results


def test_sequence_dims_are_inferred_only_where_unambiguous():
    ids, mrope, mask, other = torch.zeros(2, 9), torch.zeros(3, 2, 9), torch.zeros(2, 1, 9, 9), torch.zeros(2, 5)
    dims, inferred = input_sequence_dims([ids, mrope, mask, other], 1)
    assert dims == [1, 2, None, None] and inferred == {1}
    assert input_sequence_dims([ids, mrope], None) == ([None, None], set())


class _TiedAndNot(torch.nn.Module):
    """Ids [B, S], positions [3, B, S] added to the embeddings (tied to S), and a table
    [2, 3, T] with T == S in the example that is only summed (not tied)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, ids, positions, table):
        h = self.embed(ids) + positions.float().sum(0)[..., None]
        return self.proj(h).sum() + table.sum()


def test_a_size_that_only_equals_s_stays_static():
    from autosp.frontend.importer import import_model
    ids, pos, table = torch.randint(0, 32, (2, 7)), torch.randint(0, 7, (3, 2, 7)), torch.randn(2, 3, 7)
    imported = import_model(_TiedAndNot(), ids, pos, table)
    by_input = [a.seq_dim for a in imported.args if a.kind == "input"]
    assert by_input == [1, 2, None], by_input


def test_a_later_call_with_another_size_there_compiles_again():
    """The call signature frees every dim the inference names; where the export kept one
    static (the table's T), a later call with another T must not reuse that program."""
    import autosp
    model = _TiedAndNot()
    compiled = autosp.compile(model, sp_size=1)
    for seq in (7, 9):
        ids, pos, table = torch.randint(0, 32, (2, seq)), torch.randint(0, seq, (3, 2, seq)), torch.randn(2, 3, seq)
        with torch.no_grad():
            assert torch.allclose(compiled(ids, pos, table), model(ids, pos, table))
    assert len(compiled.programs) == 2  # the table's size is part of the second program's key
