"""How ``medproc convert --device gpu``'s workers share the work with the GPU service
(:mod:`medproc._gpu_service`): the counters the processes share and the decision a worker makes
for each case, to hand it to the service or resample it on its own CPU.

A worker resamples the case itself while the service warms up, and when the requests ahead of
it would take the service longer than the worker's own last resampling took (the service
publishes its seconds per case, each worker times itself; its first resampling, which includes
importing DALI and building its pipeline, is not counted). A worker without a time of its own
yet, or a service whose time per case is not known yet, gets a case only when it is idle: on the
H200 node the service was warm before the first request, and workers without a time of their
own all queued for it. ``MEDPROC_GPU_SHARE=0`` (or ``share=False``) sends every case to the
service, to measure the GPU alone.
"""

from __future__ import annotations

import os

__all__ = ["SharePolicy"]


class SharePolicy:
    """Made in the main process before the workers fork (the counters are shared memory)."""

    def __init__(self, ctx, share: bool | None = None):
        #: whether workers resample on their CPUs when that is sooner
        self.share = os.environ.get("MEDPROC_GPU_SHARE", "1") != "0" if share is None else share
        self.warm = ctx.Value("b", 0, lock=False)  # 1 once the service's warm-up is over
        self.pending = ctx.Value("i", 0)  # requests queued and not yet done by the service
        self.per_case = ctx.Value("d", 0.0, lock=False)  # the service's seconds per case
        self.here = ctx.Value("i", 0)  # cases the workers resampled themselves
        self.local_s: float | None = None  # in a worker: its resampling's seconds (mean)
        self._first_done = False  # in a worker: resampled once (the warm-up, not counted)

    # --- in a worker -----------------------------------------------------------------------
    def worth_waiting(self) -> bool:
        """Whether the service would answer sooner than this worker resamples on its own."""
        if not self.share:
            return True
        if not self.warm.value:
            return False
        if self.local_s is None or not self.per_case.value:
            return self.pending.value == 0
        return (self.pending.value + 1) * self.per_case.value < self.local_s

    def resampled_here(self, seconds: float) -> None:
        """This worker resampled a case itself in ``seconds`` (what waiting is compared with).
        The first time is not counted: it includes importing DALI and building the worker's
        pipeline (0.5-1.2 s on the H200 node against ~0.15 s per series; counted, it made the
        workers queue for the GPU behind a backlog they would have resampled sooner)."""
        if not self._first_done:
            self._first_done = True
            return
        self.local_s = seconds if self.local_s is None else 0.5 * (self.local_s + seconds)

    def here_instead(self) -> None:
        """This worker resamples the case itself (counted for ``-v``)."""
        with self.here.get_lock():
            self.here.value += 1

    def sent(self) -> None:
        with self.pending.get_lock():
            self.pending.value += 1

    # --- in the service ----------------------------------------------------------------------
    def done(self, cases: int, seconds: float) -> None:
        """The service finished ``cases`` requests in ``seconds``."""
        with self.pending.get_lock():
            self.pending.value -= cases
        if cases:
            per, old = seconds / cases, self.per_case.value
            self.per_case.value = per if old == 0 else 0.5 * (old + per)
