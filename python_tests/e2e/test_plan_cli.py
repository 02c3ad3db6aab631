"""``autosp-plan``: a model directory / config.json / preset in, the CUDA plan out (text or
JSON); bad input is one line and exit status 2."""
from __future__ import annotations

import json

import pytest
import transformers

from autosp.tools import plan as cli


def _model_dir(tmp_path, **extra):
    cfg = transformers.LlamaConfig(**{**dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=1 << 16), **extra})
    cfg.save_pretrained(tmp_path)
    return tmp_path


def _run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("call,kernel", [("position_ids", "varlen flash"), ("plain", "flash")])
def test_json_report_from_a_model_directory(tmp_path, capsys, call, kernel):
    search = ["--max-context", "--granularity", "1024"] if call == "position_ids" else []
    rc, out, _ = _run(capsys, _model_dir(tmp_path), "--seq", "3000", "--world", "4", "--gpu-mem", "16MiB",
                      "--call", call, "--json", *search)
    assert rc == 0
    r = json.loads(out)
    peak = r["peak_bytes"]
    assert peak["total"] == peak["state"] + peak["gradients"] + peak["activations"] + peak["transient"]
    assert peak["activations"] > 0 and peak["gradients"] >= 0
    assert r["fits"] and r["kernel_set"] == "cuda" and not r["problems"]
    assert r["kernels"] == {kernel: 2, kernel + " backward": 2}, r["kernels"]
    assert [a["kernel"] for a in r["attention"]] == [kernel] * 2
    assert r["mesh"]["ulysses"] * r["mesh"]["ring"] == 4 and r["mesh"]["why"]
    assert r["collective_bytes"]["all_to_all"] > 0
    assert 1.8 <= r["activation_growth"] <= 2.3, r["activation_growth"]
    if not search:
        assert r["max_context"] is None
        return
    assert 3000 <= r["max_context"] < 64 * 1024 and r["max_context"] % 1024 == 0
    # The longest sequence that fits: one granule more does not.
    rc, out, _ = _run(capsys, tmp_path, "--seq", r["max_context"] + 1024, "--world", "4", "--gpu-mem", "16MiB",
                      "--call", call, "--json")
    assert rc == 0 and not json.loads(out)["fits"]


def test_text_report_for_a_preset_with_a_memory_budget(capsys):
    rc, out, err = _run(capsys, "tiny", "--seq", "2K", "--world", "2", "--memory-budget", "6MiB", "--gpu-mem", "6MiB")
    assert rc == 0, err
    assert "plan (memory_budget)" in out and "peak per rank" in out and "varlen flash" in out
    assert "costed on CUDA's kernels" in out


@pytest.mark.parametrize("argv,message", [
    (["/nonexistent/model"], "no such file"),
    (["{dir}", "--seq", "4K", "--world", "3", "--fsdp", "2"], "must divide"),
    (["{bad}"], "unknown architecture"),
    (["tiny", "--seq", "2K", "--world", "2", "--memory-budget", "1KiB"], "smallest feasible budget"),
    (["tiny", "--seq", "lots"], "token count"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    model = _model_dir(tmp_path / "m")
    argv = [a.format(dir=model, bad=tmp_path / "bad") for a in argv]
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and not out
    last = err.strip().splitlines()[-1]
    assert message in last, err
    assert "Traceback" not in err


def test_parse_tokens():
    assert cli.parse_tokens("128K") == 131072 and cli.parse_tokens("1M") == 1 << 20 and cli.parse_tokens("3000") == 3000


def test_drop_logits_flag_is_named_in_the_error_and_drops_the_logits(tmp_path, capsys):
    # A budget nothing fits: the error names the CLI's flag, not the Python keyword.
    rc, _, err = _run(capsys, "tiny", "--seq", "2K", "--world", "2", "--memory-budget", "1KiB")
    assert rc == 2 and "--drop-logits removes them" in err and "drop_logits=True" not in err, err
    rc, _, err = _run(capsys, "tiny", "--seq", "2K", "--world", "2", "--memory-budget", "1KiB", "--drop-logits")
    assert rc == 2 and "smallest feasible budget" in err and "--drop-logits" not in err, err
    # The flag reaches the plan: the [S, vocab] logits a Hugging Face model returns are not
    # materialised (control: without it; a budget every layer's "keep" fits, so both plans
    # differ in the logits alone).
    model = _model_dir(tmp_path, vocab_size=8192)
    peaks = {}
    for flag in ([], ["--drop-logits"]):
        rc, out, err = _run(capsys, model, "--seq", "2K", "--world", "2", "--memory-budget", "256MiB", "--json", *flag)
        assert rc == 0, err
        r = json.loads(out)
        assert r["drop_logits"] == bool(flag) and set(r["plan"]["layers"]) == {"keep"}, r["plan"]
        peaks[bool(flag)] = r["peak_bytes"]["total"]
    # One rank's logits are 1024 x 8192 (16 MiB in bf16); the forward's end, the peak here,
    # holds 6 MiB more with them.
    assert peaks[False] - peaks[True] >= 4 << 20, peaks


def test_compose_counts_is_exact_for_per_layer_sums():
    """compose_counts puts a deep plan's additive figures together from shallow plans: exact
    when each layer adds its own choice's amount (the first layers and the last, with the
    head, may differ: they are in every shallow plan)."""
    from autosp.planning.depth import compose_counts, shallow_plan
    add = {"full": {"bytes": 7, "calls": 2}, "full+offload": {"bytes": 3, "calls": 2, "h2d": 5}, "sac": {"bytes": 11}}
    seen = []

    def counts(layers):
        seen.append(layers)
        out = {"bytes": 100 + 13 * (layers[0] == "sac"), "head": 1}  # the first layer and the head differ
        for c in layers:
            for k, v in add[c].items():
                out[k] = out.get(k, 0) + v
        return out
    for layers in [("full+offload",) * 80, ("full+offload",) * 70 + ("full",) * 10,
                   ("sac",) * 5 + ("full",) * 30 + ("full+offload",) * 45, ("full",) * 3]:
        seen.clear()
        got = compose_counts(layers, counts)
        assert {k: v for k, v in got.items() if v} == counts(layers), layers
        assert max(len(s) for s in seen[:-1]) <= len(shallow_plan(layers)[0]) + 1  # shallow copies only
        assert len(seen[:-1]) == len(set(seen[:-1]))  # each shallow plan counted once


def test_composed_report_matches_the_whole_model(tmp_path, capsys):
    """A model whose layers repeat is reported from shallow copies: the same kernels,
    attention ops and collective bytes as compiling every layer (--whole), peaks within 2%."""
    model = _model_dir(tmp_path, num_hidden_layers=9)
    reports = {}
    for flag in ([], ["--whole"]):
        rc, out, err = _run(capsys, model, "--seq", "1024", "--world", "2", "--checkpointing", "full", "--json", *flag)
        assert rc == 0, err
        reports[bool(flag)] = json.loads(out)
    composed, whole = reports[False], reports[True]
    assert composed["composed"] == {"layers": "model.layers", "depth": 9} and "whole" in whole["composed"]
    assert composed["kernels"] == whole["kernels"] and composed["kernels"]["varlen flash backward"] == 9
    assert composed["collective_bytes"] == whole["collective_bytes"]
    key = lambda a: (a["kernel"], a["q"], a["k"])  # noqa: E731
    assert sorted(map(key, composed["attention"])) == sorted(map(key, whole["attention"]))
    for part in ("total", "activations"):
        a, b = composed["peak_bytes"][part], whole["peak_bytes"][part]
        assert abs(a - b) <= 0.02 * b, (part, a, b)
    assert composed["peak_bytes"]["state"] == whole["peak_bytes"]["state"]
