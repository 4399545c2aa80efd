"""Where the time goes in bench/train.py's loop: per-call wall and CPU time of the loader's
engine thread (drawing patches, slicing boxes, feeding DALI, collecting outputs) and of the
training loop (``next(loader)``, its ``Queue.get`` of a batch made ahead, ``Tensor.item``), with the same arguments as bench/train.py.

    python bench/train_profile.py --skip limit tuned --steps 150 [--cache host] [--out F.json]
    MEDPROC_SWITCH_INTERVAL=0.0005 python bench/train_profile.py ...   # sys.setswitchinterval

Wall minus CPU time of a call is time it spent blocked (on the GPU, on a lock, or waiting for
the interpreter lock). Every millisecond the engine thread holds the interpreter lock is one
the loop may wait for: on the H200 the loop lost about as much per step (docs/benchmarks.md).
The timers add a few microseconds per call.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

if os.environ.get("MEDPROC_SWITCH_INTERVAL"):
    sys.setswitchinterval(float(os.environ["MEDPROC_SWITCH_INTERVAL"]))

import torch  # noqa: E402
import train  # noqa: E402  (bench/train.py)

from medproc.monai import loader as _loader  # noqa: E402
from medproc.pipeline import engine as _engine  # noqa: E402
from medproc.pipeline import runner as _runner  # noqa: E402

#: (thread, what) -> [calls, wall s, cpu s]
STATS: dict = collections.defaultdict(lambda: [0, 0.0, 0.0])


def _add(what: str, wall: float, cpu: float) -> None:
    s = STATS[(threading.current_thread().name, what)]
    s[0] += 1
    s[1] += wall
    s[2] += cpu


def _timed(owner, name: str, what: str | None = None) -> None:
    fn = getattr(owner, name)
    what = what or f"{owner.__name__}.{name}"

    def timed(*a, **k):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            _add(what, time.perf_counter() - w, time.thread_time() - c)

    setattr(owner, name, timed)


def _timed_forever() -> None:
    """``next(loader)`` in the training loop (bench/loader.py's ``forever``)."""
    inner = train.bench_loader.forever

    def forever(loader):
        it = inner(loader)
        while True:
            w, c = time.perf_counter(), time.thread_time()
            b = next(it)
            _add("next(loader)", time.perf_counter() - w, time.thread_time() - c)
            yield b

    train.bench_loader.forever = forever


def main(argv: list[str]) -> None:
    out = None
    if "--out" in argv:  # ours: the timings (bench/train.py's results are printed)
        i = argv.index("--out")
        if i + 1 >= len(argv):
            sys.exit("--out needs a file name")
        out, argv = argv[i + 1], argv[:i] + argv[i + 2 :]
    for owner, name in [
        (_loader.PatchLoader, "_item"),
        (_loader.PatchLoader, "_boxes"),
        (_runner.Runner, "start"),
        (_runner.Runner, "_feed"),
        (_runner.Runner, "collect"),
        (_engine.Engine, "_check"),
    ]:
        _timed(owner, name)
    _timed(_loader, "draw_patches", "draw_patches")  # (the loader module's own name for it)
    _timed(torch.Tensor, "item", "Tensor.item")
    # the loop's wait for a batch the engine made ahead, apart from the rest of next(loader)
    _timed(queue.Queue, "get", "Queue.get")
    _timed_forever()
    train.main(argv)
    rows = []
    for (thread, what), (n, wall, cpu) in sorted(STATS.items()):
        if thread.startswith("ThreadPool"):  # the cache build's threads
            continue
        rows.append(
            {
                "thread": thread,
                "what": what,
                "calls": n,
                "wall_ms": 1e3 * wall / n,
                "cpu_ms": 1e3 * cpu / n,
            }
        )
        print(
            f"{thread:16s} {what:24s} calls {n:6d}  wall {1e3 * wall / n:7.3f} ms  "
            f"cpu {1e3 * cpu / n:7.3f} ms"
        )
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
