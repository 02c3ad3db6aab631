"""autosp.compile_log: a line per transformed model where AUTOSP_COMPILE_LOG names a file, and
the summary of a run's compile time (what scripts/test.sh prints after pytest)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from autosp import compile_log
from autosp.driver import transform
from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike


def test_each_transform_appends_its_phases_and_the_summary_adds_them_up(tmp_path, monkeypatch):
    log = tmp_path / "compiles.jsonl"
    monkeypatch.setenv(compile_log.COMPILE_LOG_ENV, str(log))
    model = LlamaLike(LlamaConfig(**LLAMA_PRESETS["tiny"]))
    ids = torch.randint(0, 128, (2, 16))
    first = transform(model, (ids,), {"labels": ids}, sp_size=2)
    again = transform(model, (ids,), {"labels": ids}, sp_size=4)  # the same export: the import cache serves it
    records = compile_log.read(log.read_text().splitlines())
    assert [(r["model"], r["sp_size"]) for r in records] == [("LlamaLike", 2), ("LlamaLike", 4)]
    for record, transformed in zip(records, (first, again)):
        for phase in compile_log.PHASES:
            assert record[phase] == pytest.approx(transformed.timings[phase], abs=1e-4), phase
    # (the first may be served too: another test of this process or run imported the same program)
    assert records[1]["import_cached"] == 1.0
    traced = sum(1 for r in records if not r["import_cached"])
    text = compile_log.summarize(records)
    total = sum(r["transform_s"] for r in records)
    assert text.startswith(f"compile log: 2 compilations in 1 processes, {total:.1f}s in all"), text
    assert f"({traced} traced and imported:" in text and f"{2 - traced} from the import cache" in text, text
    assert text.splitlines()[-1].split()[1:4] == ["2", "compilations", f"({traced}"], text
    assert all(r.get("import_fallback", 0.0) == 0.0 for r in records), records  # autosp's retrace decomposed it
    fell_back = [dict(r, import_cached=0.0, import_fallback=float(i == 0)) for i, r in enumerate(records)]
    assert "1 of the traced imports decomposed by torch's run_decompositions, 1 by autosp's retrace" in \
        compile_log.summarize(fell_back)


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(compile_log.COMPILE_LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    compile_log.record("M", 2, {"export_s": 1.0})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(compile_log.COMPILE_LOG_ENV, str(tmp_path / "log"))
    compile_log.record("M", 2, {"export_s": 1.0, "note": "not a number"})
    assert json.loads((tmp_path / "log").read_text()) == {"model": "M", "sp_size": 2, "pid": os.getpid(), "export_s": 1.0}


def test_an_unwritable_log_warns_and_the_cli_names_a_bad_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(compile_log.COMPILE_LOG_ENV, str(tmp_path / "missing" / "log"))
    compile_log.record("M", 2, {"export_s": 1.0})  # a warning, not an error
    assert "could not append to the compile log" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": "M", "transform_s": 1.0}\n\nnot json\n')
    run = subprocess.run([sys.executable, "-m", "autosp.compile_log", str(bad)], capture_output=True, text=True)
    assert run.returncode == 1 and "line 3 of the compile log is not JSON" in run.stderr, run
    assert compile_log.summarize([]) == "compile log: no compilation recorded"
