"""``medproc trace DIR [--png FILE]``: where a traced run's time went
(``MEDPROC_TRACE=DIR medproc convert ...``, see :mod:`medproc._trace`).

Prints the milestones of the main process (start-up, inputs listed and headers read, the batch,
the GPU services ready), the seconds per span name in the main process, the GPU service
processes and the workers, how busy each was over the batch, and, with ``--png``, draws every
process on one time axis (matplotlib on a private ``Figure``: no pyplot, no global state).
Trace each run into a folder of its own: a folder holding two runs is refused."""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict


def _event(line: str):
    """One span from a trace line; None for a line that is not one (the last line of a process
    killed as it wrote it, or a file medproc did not write)."""
    try:
        e = json.loads(line)
    except (ValueError, RecursionError):  # (RecursionError: nested too deeply for Python)
        return None
    if not isinstance(e, dict) or not isinstance(e.get("name"), str):
        return None
    t0, t1 = e.get("t0"), e.get("t1")
    ok = all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (t0, t1))
    if not ok or not (0 <= t0 <= t1 < 1e12) or not isinstance(e.get("pid"), int):
        return None
    if "cpu" in e or "faults" in e:  # (both or neither, numbers: "abc" was a crash)
        cpu, faults = e.get("cpu"), e.get("faults")
        good = isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and 0 <= cpu < 1e12
        if not (good and type(faults) is int and faults >= 0):
            return None
    name = e["name"]
    if not name.isprintable() or len(name) > 64:  # (escape sequences reached the terminal)
        return None
    return e if isinstance(e.get("thread"), str) else None


def load(folder: str) -> list[dict]:
    """Every span recorded under ``folder`` (lines that are not spans are left out, and
    counted in a warning); a file that is not a regular UTF-8 text file is an error naming it."""
    import warnings

    from .errors import MedprocWarning, ReadError, UsageError
    from .io.safety import check_file

    events, bad = [], 0
    for path in sorted(glob.glob(os.path.join(glob.escape(folder), "*.jsonl"))):
        try:
            check_file(path)  # (never a pipe or a device: they could block or never end)
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
        except ReadError as e:
            raise UsageError(f"not a trace file: {e.message}", path) from None
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot be read as a trace ({type(e).__name__}: {e})", path) from None
        got = [_event(line) for line in lines if line.strip()]
        events += [e for e in got if e is not None]
        bad += sum(e is None for e in got)
    if not events:
        raise UsageError(
            f"{folder}: holds no trace (*.jsonl; trace a run with MEDPROC_TRACE={folder})"
        )
    if bad:
        warnings.warn(
            f"{folder}: {bad} line(s) are not trace spans (left out)", MedprocWarning, stacklevel=2
        )
    return events


def lanes(events: list[dict]) -> dict[str, list[dict]]:
    """Events by lane: ``main``, ``service K`` (the GPU service processes; ``service``: the
    thread of the main process that was the service before commit 51dfebc, in older traces),
    ``commit`` (the process committing the services' arena) and ``worker N``. The main process is the one that recorded its start (the ``medproc``
    program), or listed the inputs (``medproc.convert`` called from Python)."""
    main = {e["pid"] for e in events if e["name"] == "start"}
    # (a Python run's main process records no start: with a command's run in the folder too,
    # it was counted as a worker)
    main |= {e["pid"] for e in events if e["name"] == "find_cases"}
    if len(main) > 1:
        from .errors import UsageError

        raise UsageError(
            f"this folder holds {len(main)} runs' traces (MEDPROC_TRACE adds to a folder): trace "
            "each run into a new folder"
        )
    service = sorted({e["pid"] for e in events if e["name"] == "service_warm_up"} - main)
    commit = {e["pid"] for e in events if e["name"] == "arena_commit"} - main - set(service)
    workers = sorted({e["pid"] for e in events} - main - set(service) - commit)
    out: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        if e["pid"] in service:
            out[f"service {service.index(e['pid'])}"].append(e)
        elif e["pid"] in commit:  # the arena's committer process
            out["commit"].append(e)
        elif e["thread"] == "medproc-gpu":
            out["service"].append(e)
        elif e["pid"] in main:
            out["main"].append(e)
        else:
            out[f"worker {workers.index(e['pid']):2d}"].append(e)
    return dict(sorted(out.items()))


def report(events: list[dict]) -> str:
    t0 = min(e["t0"] for e in events)
    by = lanes(events)
    main = {e["name"]: e for e in by.get("main", [])}
    lines = ["milestones (s from the main process's start):"]
    for name in ("start", "find_cases", "batch"):
        if name in main:
            e = main[name]
            lines.append(f"  {name:12s} {e['t0'] - t0:6.3f} -> {e['t1'] - t0:6.3f}")
    warm = [e for lane, evs in by.items() if lane.startswith("service") for e in evs]
    warm = [e["t1"] for e in warm if e["name"] == "service_warm_up"]
    if warm:
        lines.append(f"  {'GPU ready':12s} {min(warm) - t0:6.3f}")
    end = max(e["t1"] for e in events)
    lines.append(f"  {'last event':12s} {end - t0:6.3f}")
    b = main.get("batch")
    lo, hi = (b["t0"], b["t1"]) if b else (t0, end)
    window = "batch" if b else "run (no batch: it failed before one, or had no case to do)"
    lines.append(f"\nseconds per span ({hi - lo:.3f} s of the {window}):")
    lines.append(
        f"  {'lane':10s} {'span':16s} {'n':>4s} {'total':>7s} {'mean':>7s} {'max':>7s} "
        f"{'on cpu':>7s} {'faults':>8s}"
    )
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for lane, evs in by.items():
        kind = lane.split()[0] + "s" if lane[-1].isdigit() else lane
        for e in evs:
            groups[(kind, e["name"])].append(e)
    for (kind, name), es in sorted(groups.items()):
        d = [e["t1"] - e["t0"] for e in es]
        measured = all("cpu" in e for e in es)  # (not for ``start``: the interpreter's)
        cpu = f"{sum(e['cpu'] for e in es):7.3f}" if measured else f"{'-':>7s}"
        faults = f"{sum(e['faults'] for e in es):8d}" if measured else f"{'-':>8s}"
        lines.append(
            f"  {kind:10s} {name:16s} {len(d):4d} {sum(d):7.3f} {sum(d) / len(d):7.3f} "
            f"{max(d):7.3f} {cpu} {faults}"
        )
    lines.append(f"\nbusy over the {window.split()[0]} (time inside any span of the process):")
    for lane, evs in by.items():
        busy = _covered([(max(e["t0"], lo), min(e["t1"], hi)) for e in evs if e["name"] != "batch"])
        lines.append(f"  {lane:10s} {busy:6.3f} s ({100 * busy / max(hi - lo, 1e-9):3.0f}%)")
    return "\n".join(lines)


def _covered(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def draw(events: list[dict], path: str) -> None:
    """Every lane's spans on one time axis, into the picture ``path`` (PNG)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    t0 = min(e["t0"] for e in events)
    by = lanes(events)
    names = sorted({e["name"] for e in events} - {"batch"})
    colour = {n: colormaps["tab20"](i % 20) for i, n in enumerate(names)}
    fig = Figure(figsize=(12, 0.3 * len(by) + 1.5))
    ax = fig.subplots()
    for row, evs in enumerate(by.values()):
        for e in sorted(evs, key=lambda e: e["t0"] - e["t1"]):  # the longest first, below
            if e["name"] != "batch":
                ax.barh(row, e["t1"] - e["t0"], left=e["t0"] - t0, color=colour[e["name"]])
    ax.set_yticks(range(len(by)), list(by))
    ax.invert_yaxis()
    ax.set_xlabel("s from the main process's start")
    handles = [Rectangle((0, 0), 1, 1, color=colour[n]) for n in names]
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")


def run(folder: str, png: str | None = None) -> int:
    """``medproc trace``: print the report of ``folder``, draw it into ``png`` if given."""
    import os

    from .errors import UsageError

    if not os.path.exists(folder):
        raise UsageError(f"{folder}: does not exist (trace a run with MEDPROC_TRACE=<a folder>)")
    if not os.path.isdir(folder):
        raise UsageError(f"{folder}: is a file, not the folder MEDPROC_TRACE named")
    if png:
        where = os.path.dirname(os.path.abspath(png))
        if os.path.isdir(png):
            raise UsageError(f"--png {png}: is a folder; give the picture's file name")
        if not os.path.isdir(where):
            raise UsageError(f"--png {png}: the folder {where} does not exist")
    events = load(folder)
    try:
        text = report(events)
    except UsageError as e:  # (two runs in it)
        raise UsageError(e.message, folder) from None
    print(text)
    if png:
        try:
            draw(events, png)
        except OSError as e:
            raise UsageError(f"--png {png}: cannot be written ({e.strerror or e})") from None
        print(f"timeline: {png}")
    return 0
