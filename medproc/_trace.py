"""An opt-in timeline of a run, to see where a whole process's time goes (``convert`` above
all: a main process, forked workers and the GPU service processes).

``MEDPROC_TRACE=<folder>``: every process appends its spans to ``<folder>/<pid>.jsonl``, one
JSON object per line: ``{"name", "t0", "t1", "pid", "thread", "cpu", "faults"}`` plus any
fields given (``case``: the input). Times are ``time.monotonic()`` seconds, one clock for every
process of the machine; ``cpu``: the seconds the thread ran on a core meanwhile (less than the
span's length: it waited, for I/O, another process or the interpreter lock); ``faults``: its
page faults meanwhile (Linux; touching new memory). ``medproc trace <folder> [--png FILE]`` (:mod:`medproc._trace_report`) sums them up and
draws the timeline.
Without the variable a span costs a dictionary lookup and nothing is written.

>>> with span("read", case="a.dcm"):
...     pass
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import warnings

__all__ = ["span", "enabled", "started"]

#: folder -> (pid, the open trace file of that process: a fork opens its own); None: the
#: folder cannot be written (said once, by the first process to try; forks inherit the None)
_FILES: dict[str, tuple | None] = {}


def _close_files() -> None:
    """The trace files still open (each process appends to its own, line by line)."""
    for got in _FILES.values():
        if got is not None and got[0] == os.getpid():
            got[1].close()
    _FILES.clear()


atexit.register(_close_files)
_LOCK = threading.Lock()


def _after_fork() -> None:  # a fork taken while another thread wrote: a fresh lock
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def enabled() -> bool:
    return bool(os.environ.get("MEDPROC_TRACE"))


def _faults() -> int:
    try:
        import resource  # (POSIX)

        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    except (ImportError, AttributeError, OSError):  # not Linux
        return 0


class _Span:
    __slots__ = ("name", "info", "t0", "cpu", "faults")

    def __init__(self, name: str, info: dict):
        self.name, self.info = name, info

    def __enter__(self):
        self.cpu, self.faults = time.thread_time(), _faults()
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        t1 = time.monotonic()
        cpu, faults = time.thread_time() - self.cpu, _faults() - self.faults
        _write(self.name, self.t0, t1, {"cpu": round(cpu, 4), "faults": faults, **self.info})


class _Off:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


_OFF = _Off()


def span(name: str, **info):
    """A context manager that records how long its block took under ``name`` (when tracing)."""
    return _Span(name, info) if enabled() else _OFF


def started() -> None:
    """Record ``start``: from this process's start (Linux: its start time in ``/proc``, on the
    same clock, 10 ms steps) until now (the interpreter and the imports so far)."""
    if not enabled():
        return
    folder = os.environ["MEDPROC_TRACE"]
    if os.path.isdir(folder) and any(n.endswith(".jsonl") for n in os.listdir(folder)):
        warnings.warn(
            f"MEDPROC_TRACE={folder} already holds a run's trace: this one is added to it, "
            "and medproc trace will not tell them apart (use a new folder)",
            stacklevel=2,
        )
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):  # not Linux
        return
    _write("start", ticks / os.sysconf("SC_CLK_TCK"), time.monotonic(), {})


def _write(name: str, t0: float, t1: float, info: dict) -> None:
    folder = os.environ.get("MEDPROC_TRACE")
    if not folder:
        return
    pid = os.getpid()
    line = json.dumps(
        {
            "name": name,
            "t0": round(t0, 6),
            "t1": round(t1, 6),
            "pid": pid,
            "thread": threading.current_thread().name,
            **{k: v if isinstance(v, (int, float)) else str(v) for k, v in info.items()},
        }
    )
    with _LOCK:
        got = _FILES.get(folder, ())
        if got == () or (got is not None and got[0] != pid):
            try:
                os.makedirs(folder, exist_ok=True)
                got = (pid, open(os.path.join(folder, f"{pid}.jsonl"), "a", buffering=1))
            except OSError as e:  # a file, not writable...: said once, the run goes on
                got = None
                why = "is a file, not a folder" if os.path.isfile(folder) else e.strerror or e
                warnings.warn(f"MEDPROC_TRACE={folder}: {why}; not traced", stacklevel=2)
            _FILES[folder] = got
        if got is not None:
            got[1].write(line + "\n")
