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
producer starts a batch no sooner than ``fraction`` of the consumer's typical interval after the
consumer took the last one: in its wait, not in its launch. When the producer falls behind (fewer
batches ready) it works at once. ``MEDPROC_PACE`` sets the fraction (``0`` turns pacing off).
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["Pacer", "pace_fraction"]

#: fraction of the consumer's interval the producer waits after each take (see the docs above)
FRACTION = 0.35
#: batches ready in the queue for pacing to apply (fewer: the producer works at once)
MIN_READY = 2
#: longest wait (seconds), whatever the consumer's interval
MAX_WAIT = 0.1


def pace_fraction(default: float = FRACTION) -> float:
    """``MEDPROC_PACE`` if set (a fraction in [0, 0.9]), else ``default``."""
    env = os.environ.get("MEDPROC_PACE", "").strip()
    if not env:
        return default
    try:
        f = float(env)
    except ValueError:
        raise ValueError(
            f"MEDPROC_PACE={env!r} is not a number (a fraction, 0 turns it off)"
        ) from None
    if not 0.0 <= f <= 0.9:
        raise ValueError(f"MEDPROC_PACE={env!r} must lie in [0, 0.9] (0 turns pacing off)")
    return f


class Pacer:
    """The consumer calls :meth:`took` after each batch it takes; the producer calls
    :meth:`wait` before it makes the next one.

    The consumer's interval is a running estimate robust to pauses (an interval over four times
    the estimate, e.g. an epoch's validation, is not counted)."""

    def __init__(self, fraction: float):
        self.fraction = float(fraction)
        self.last: float | None = None  # when the consumer last took a batch
        self.interval: float | None = None  # its typical interval (seconds)
        self.waited = 0.0  # seconds the producer waited (for benchmarks)

    def took(self) -> None:
        now = time.perf_counter()
        if self.last is not None:
            dt = now - self.last
            if self.interval is None:
                self.interval = dt
            elif dt < 4 * self.interval:
                self.interval += 0.2 * (dt - self.interval)
        self.last = now

    def delay(self, ready: int) -> float:
        """Seconds the producer should wait now, with ``ready`` batches in the queue."""
        if not self.fraction or ready < MIN_READY or self.interval is None or self.last is None:
            return 0.0
        wait = self.last + min(self.fraction * self.interval, MAX_WAIT) - time.perf_counter()
        return max(wait, 0.0)

    def wait(self, ready: int, stop: threading.Event) -> None:
        """Wait (the lock released) until the producer should go on, or ``stop`` is set."""
        d = self.delay(ready)
        if d > 0:
            self.waited += d
            stop.wait(d)
