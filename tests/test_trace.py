"""``MEDPROC_TRACE`` (:mod:`medproc._trace`) and ``medproc trace``: a traced
``medproc convert`` records, process by process, the spans that make up each case, on one clock,
inside the batch; the report sums them up per lane; without the variable nothing is written."""

import json
import os
import subprocess
import sys

import pytest

from medproc import _trace
from medproc import _trace_report as trace_report


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
    png = tmp_path / "timeline.png"
    files = sorted(os.listdir(folder))
    r = subprocess.run(  # (with MEDPROC_TRACE still set, as after `export`: adds nothing)
        [sys.executable, "-m", "medproc", "trace", str(folder), "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MEDPROC_TRACE": str(folder)},
    )
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(folder)) == files
    assert "worker  1" in r.stdout and "resample_here" in r.stdout and "find_cases" in r.stdout
    assert os.path.getsize(png) > 10_000
    r = subprocess.run(
        [sys.executable, "-m", "medproc", "trace", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "no trace" in r.stderr  # a folder without one: said


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


def test_a_trace_folder_that_cannot_be_used_is_said_once_and_q_silences_it(sample_data, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("not a folder")
    env = {**os.environ, "MEDPROC_TRACE": str(target)}
    base = [sys.executable, "-m", "medproc", "convert", os.path.join(sample_data, "dicom")]
    for quiet in (False, True):
        out = tmp_path / f"out{quiet}"
        cmd = [*base, "-o", str(out), "--spacing", "2.0", "-j", "2"] + (["-q"] if quiet else [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr  # the run goes on, untraced
        said = r.stderr.count("is a file, not a folder; not traced")
        assert said == (0 if quiet else 1), r.stderr
        assert "Traceback" not in r.stderr
    assert target.read_text() == "not a folder"


def test_trace_files_that_are_not_traces_are_refused_or_left_out(tmp_path, capsys):
    """A FIFO named like a trace file would block the reader forever; undecodable bytes and
    lines that are not spans are not "a bug in medproc"."""
    from medproc.errors import UsageError

    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "1.jsonl")
    with pytest.raises(UsageError, match="FIFO"):
        trace_report.load(str(fifo))
    junk = tmp_path / "junk"
    junk.mkdir()
    span = {"name": "start", "t0": 0.0, "t1": 0.5, "pid": 7, "thread": "MainThread"}
    deep = "[" * 100_000 + "]" * 100_000  # (json.loads: RecursionError)
    lines = ["[1, 2, 3]", '{"foo": 1}', json.dumps({**span, "t1": 1e300}), deep, json.dumps(span)]
    # spans whose cpu or faults are no numbers, or whose name would reach the terminal as an
    # escape sequence, crashed the report or printed raw (a prober's findings)
    timed = {**span, "name": "read", "cpu": 0.1, "faults": 3}
    lines += [json.dumps({**timed, "cpu": "abc"}), json.dumps({**timed, "cpu": None}),
              json.dumps({**timed, "faults": 1.5}), json.dumps({**timed, "name": "\x1b[31mred"}),
              json.dumps(timed)]  # fmt: skip
    (junk / "1.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="8 line"):
        assert trace_report.load(str(junk)) == [span, timed]
    (junk / "2.jsonl").write_bytes(b"\xff\xfe\n")
    with pytest.raises(UsageError, match="2.jsonl: cannot be read as a trace"):
        trace_report.load(str(junk))


@pytest.mark.parametrize("second", ["program", "python"])
def test_a_folder_holding_two_runs_is_refused_whichever_started_them(tmp_path, second):
    """Two runs traced into one folder are refused; a Python run (``medproc.convert``, no
    ``start`` span) beside a program's run was read as one run, its main process as a worker
    (a prober's finding)."""
    from medproc.errors import UsageError

    def span(name, pid, t0):
        return json.dumps({"name": name, "t0": t0, "t1": t0 + 0.1, "pid": pid, "thread": "M"})

    one = [span("start", 1, 0.0), span("find_cases", 1, 0.2), span("read", 3, 0.4)]
    two = [span("find_cases", 2, 5.0), span("read", 4, 5.2)]
    if second == "program":
        two.insert(0, span("start", 2, 4.8))
    (tmp_path / "1.jsonl").write_text("\n".join(one) + "\n")
    (tmp_path / "2.jsonl").write_text("\n".join(two) + "\n")
    with pytest.raises(UsageError, match="holds 2 runs' traces"):
        trace_report.lanes(trace_report.load(str(tmp_path)))
    (tmp_path / "2.jsonl").unlink()
    assert set(trace_report.lanes(trace_report.load(str(tmp_path)))) == {"main", "worker  0"}
