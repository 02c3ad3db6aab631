"""``autosp-plan``: a model directory / config.json / preset in, the CUDA plan out (text or
JSON); bad input is one line and exit status 2."""
from __future__ import annotations

import json

import pytest
import transformers

from autosp.tools import plan as cli


def _model_dir(tmp_path, **extra):
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1 << 16,
                                   **extra)
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
    assert peak["total"] == peak["state"] + peak["activations"] + peak["transient"] and peak["activations"] > 0
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
