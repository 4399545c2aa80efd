"""Pacing: when :meth:`Engine.stream <medproc.pipeline.engine.Engine.stream>`'s background
thread makes its next batch, so that its interpreter time falls where the consumer does not need
the interpreter.

Why: a training loop and the engine's thread share one interpreter lock. A loop step is a burst
of Python that launches the step's kernels (~12 ms of a ~45 ms step on the H200 with the
benchmark's UNet), then a wait with the lock released (``loss.item()``: the GPU runs). A
producer woken the moment the loop takes a batch (the queue has room again) starts its own burst
(drawing patches, feeding DALI, collecting: ~4-8 ms holding the lock) exactly during the loop's
launch burst: every millisecond the loop waits for the lock there is a millisecond the GPU
runs dry, and the training loop ran below its limit by about the thread's lock time
(``docs/benchmarks.md``).

So, while the queue holds at least :data:`MIN_READY` batches (the loop cannot run dry), the
producer starts a batch no sooner than ``fraction`` of the consumer's typical interval (the
median of its last :data:`WINDOW` intervals, the first one left out) after the consumer took the
last one, and never waits more than :data:`MAX_WAIT`. For the benchmark's model that is in the
loop's wait, after its launch burst; a loop whose launch burst is longer than that fraction of
its step gains less. When the producer falls behind (fewer batches ready: a loader-bound loop,
or ``prefetch=1``) it works at once. ``MEDPROC_PACE`` sets the fraction (in [0, 0.9]; ``0`` turns
it off).
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from collections import deque

__all__ = ["Pacer", "TakeQueue", "pace_fraction"]

#: fraction of the consumer's interval the producer waits after each take (see the docs above)
FRACTION = 0.35
#: batches ready in the queue for pacing to apply (fewer: the producer works at once)
MIN_READY = 2
#: longest wait (seconds), whatever the consumer's interval
MAX_WAIT = 0.1
#: the consumer's intervals its typical interval is the median of
WINDOW = 8


def _checked(f: float, what: str) -> float:
    if not 0.0 <= f <= 0.9:
        raise ValueError(f"{what} must lie in [0, 0.9] (0 turns pacing off), got {f!r}")
    return f


def pace_fraction(default: float = FRACTION) -> float:
    """``MEDPROC_PACE`` if set (a fraction in [0, 0.9]), else ``default``."""
    env = os.environ.get("MEDPROC_PACE", "").strip()
    if not env:
        return default
    try:
        f = float(env)
    except ValueError:
        raise ValueError(
            f"MEDPROC_PACE={env!r} is not a number (a fraction, 0 turns pacing off)"
        ) from None
    return _checked(f, f"MEDPROC_PACE={env!r}")


class Pacer:
    """The consumer's side calls :meth:`took` for each batch taken (the engine does it inside
    the queue's ``get``, before the producer can wake); the producer calls :meth:`wait` before
    it makes the next batch.

    ``clock`` (seconds) is for tests. ``waited`` is the time the producer slept (benchmarks)."""

    def __init__(self, fraction: float, clock=time.perf_counter):
        self.fraction = _checked(float(fraction), "pace")
        self.clock = clock
        self.last: float | None = None  # when the consumer last took a batch
        self.takes = 0
        self._intervals: deque = deque(maxlen=WINDOW)
        self.waited = 0.0

    @property
    def interval(self) -> float | None:
        """The consumer's typical interval (seconds); None until its second interval (the
        first is left out)."""
        return statistics.median(self._intervals) if self._intervals else None

    def took(self) -> None:
        now = self.clock()
        if self.last is not None and self.takes >= 2:  # the first interval: start-up
            self._intervals.append(now - self.last)
        self.last = now
        self.takes += 1

    def delay(self, ready: int) -> float:
        """Seconds the producer should wait now, with ``ready`` batches in the queue."""
        interval = self.interval
        if not self.fraction or ready < MIN_READY or interval is None or self.last is None:
            return 0.0
        wait = self.last + min(self.fraction * interval, MAX_WAIT) - self.clock()
        return max(wait, 0.0)

    def wait(self, ready: int, stop: threading.Event) -> None:
        """Wait (the lock released) until the producer should go on, or ``stop`` is set."""
        d = self.delay(ready)
        if d > 0:
            t = self.clock()
            stop.wait(d)
            self.waited += self.clock() - t


class TakeQueue(queue.Queue):
    """A queue that calls ``on_take`` as an item is taken, under the queue's lock: before the
    producer blocked on a full queue can wake (a pacer's :meth:`~.pace.Pacer.took`)."""

    def __init__(self, maxsize: int, on_take=None):
        super().__init__(maxsize)
        self._on_take = on_take

    def _get(self):
        if self._on_take is not None:
            self._on_take()
        return super()._get()
