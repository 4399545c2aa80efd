"""``MEDPROC_TRACE`` (:mod:`medproc._trace`) and ``scripts/trace_report.py``: a traced
``medproc convert`` records, process by process, the spans that make up each case, on one clock,
inside the batch; the report sums them up per lane; without the variable nothing is written."""

import json
import os
import subprocess
import sys

import pytest

from medproc import _trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import trace_report  # noqa: E402


def _convert(sample_data, out, env):
    cmd = [sys.executable, "-m", "medproc", "convert", "-q", "-j", "2"]
    cmd += [os.path.join(sample_data, "dicom"), os.path.join(sample_data, "nifti", "images")]
    cmd += ["-o", str(out), "--spacing", "2.0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers: Linux")
def test_a_traced_convert_records_every_case_in_its_worker_inside_the_batch(sample_data, tmp_path):
    folder = tmp_path / "trace"
    _convert(sample_data, tmp_path / "out", {**os.environ, "MEDPROC_TRACE": str(folder)})
    events = trace_report.load(str(folder))
    by = trace_report.lanes(events)
    main = {e["name"]: e for e in by["main"]}
    assert {"start", "find_cases", "batch", "close"} <= set(main)
    workers = [lane for lane in by if lane.startswith("worker")]
    assert len(workers) == 2
    with open(tmp_path / "out" / "manifest.csv") as f:
        n_cases = sum(1 for _ in f) - 1
    batch = main["batch"]
    for name in ("read", "resample_here", "write"):
        spans = [e for lane in workers for e in by[lane] if e["name"] == name]
        assert len(spans) == n_cases, name  # one per case, in the workers
        assert len({e["case"] for e in spans}) == n_cases
        for e in spans:
            assert batch["t0"] <= e["t0"] <= e["t1"] <= batch["t1"]  # one clock for all
            assert 0 <= e["cpu"] <= (e["t1"] - e["t0"]) + 0.02  # one thread's CPU time
    assert main["start"]["t0"] <= main["find_cases"]["t0"] < batch["t0"]
    text = trace_report.report(events)
    assert "worker  1" in text and "resample_here" in text
    trace_report.draw(events, str(tmp_path / "timeline.png"))
    assert os.path.getsize(tmp_path / "timeline.png") > 10_000


def test_without_the_variable_nothing_is_recorded(monkeypatch, tmp_path):
    monkeypatch.delenv("MEDPROC_TRACE", raising=False)
    with _trace.span("x", case="a") as s:
        pass
    assert s is _trace._OFF
    monkeypatch.setenv("MEDPROC_TRACE", str(tmp_path / "t"))
    with _trace.span("x", case="a"):
        sum(range(10000))
    (path,) = (tmp_path / "t").iterdir()
    (line,) = path.read_text().splitlines()
    e = json.loads(line)
    assert e["name"] == "x" and e["case"] == "a" and e["pid"] == os.getpid()
    assert e["t1"] >= e["t0"] and e["cpu"] >= 0


def test_busy_time_counts_overlapping_spans_once():
    assert trace_report._covered([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4
