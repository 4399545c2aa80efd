"""How ``medproc convert --device gpu``'s workers share the work with the GPU service
(:mod:`medproc._gpu_service`): the counters the processes share and the decision a worker makes
for each case, to hand it to the service or resample it on its own CPU.

A worker resamples the case itself when the requests ahead of it would take the service longer
than resampling it here: the service publishes its seconds per case, each worker times its own
resampling. A worker that has not resampled yet has not imported DALI nor built a pipeline: its
first resampling costs :data:`FIRST_LOCAL_S` (0.5-1.2 s on the H200 node, against ~0.15 s
later), so it waits for the service unless the backlog is longer than that; while the service
warms up (it starts before the workers' first case) such a worker waits too, a worker with a
pipeline of its own resamples. ``MEDPROC_GPU_SHARE=0`` (or ``share=False``) sends every case to
the service, to measure the GPU alone.

Traced on the H200 node (32 series, ``MEDPROC_TRACE``): with the first resampling counted like
any other, 10-14 of the 32 cases were resampled by workers that first had to import DALI, and
those cases took 0.39-0.45 s on average (up to 0.59 s) while the service was idle 43% of the
batch.
"""

from __future__ import annotations

import os
import time

__all__ = ["SharePolicy", "FIRST_LOCAL_S", "service_wanted", "service_count", "env_count"]

#: seconds a worker's first resampling is taken to cost (importing DALI, building its pipeline)
FIRST_LOCAL_S = 0.8
#: a worker without DALI waits for a service's warm-up (0.5-0.7 s on the H200 node) at most
#: this long after the services started; then it resamples on its own
WARM_WAIT_S = 5.0


class SharePolicy:
    """Made in the main process before the workers fork (the counters are shared memory)."""

    def __init__(self, ctx, share: bool | None = None, services: int = 1):
        #: whether workers resample on their CPUs when that is sooner
        self.share = os.environ.get("MEDPROC_GPU_SHARE", "1") != "0" if share is None else share
        self.services = services  # service processes taking requests side by side
        self.warm = ctx.Value("b", 0, lock=False)  # 1 once a service's warm-up is over
        self.since = ctx.Value("d", 0.0, lock=False)  # time.monotonic() the services started
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
        fresh = not self._first_done  # no DALI here yet
        if not self.warm.value:  # the service imports DALI: as long as this worker would
            return fresh and time.monotonic() - self.since.value < WARM_WAIT_S
        per = self.per_case.value / self.services  # (the backlog's seconds per case)
        if fresh:  # the backlog against FIRST_LOCAL_S (unknown before its first batch: wait)
            return not per or (self.pending.value + 1) * per < FIRST_LOCAL_S
        if self.local_s is None or not per:  # DALI here, not timed yet: only an idle service
            return self.pending.value == 0
        return (self.pending.value + 1) * per < self.local_s

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


def service_wanted(device: str, executor, dask, dry_run: bool) -> bool:
    """Whether a batch uses the GPU service (:mod:`medproc._gpu_service`): ``--device gpu`` on
    Linux, with medproc's own pool, from a process that has neither DALI nor CUDA yet (so
    that it can fork the workers and the service)."""
    from ._procs import can_fork

    return (
        device == "gpu"
        and executor is None
        and not dask
        and not dry_run
        and can_fork("cpu")
        and os.environ.get("MEDPROC_GPU_SERVICE", "1") != "0"
    )


def service_count(cores: int) -> int:
    """How many GPU service processes a batch runs: ``MEDPROC_GPU_SERVICES``, else 1 when
    the services page-lock their arena (:func:`pinned_copies`: their copies to and from the
    GPU are DMA transfers; on the H200 node two such services were busy 21-25% of a 32-series
    batch each, and one service with a 15th worker took 3.17 and 3.46 s against 3.66 and 3.48
    s for two), else 2 on a machine of 8 cores or more (copies through pageable memory are
    the CPU's work: with DALI's host copies, one service was the batch's serial stage there,
    busy ~80% of it at ~50 ms per 512 x 512 x 200 series), else 1."""
    default = 2 if cores >= 8 and not pinned_copies() else 1
    return env_count("MEDPROC_GPU_SERVICES", default, low=1)


def pinned_copies() -> bool:
    """Whether the GPU services will page-lock their arena: ``MEDPROC_GPU_PIN`` is not 0 and
    NVIDIA's CUDA Python bindings are installed (found, not imported)."""
    import importlib.util

    if env_count("MEDPROC_GPU_PIN", 1) == 0:
        return False
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError):  # no "cuda" package at all
        return False


def env_count(name: str, default: int, low: int = 0) -> int:
    """The whole number in the environment variable ``name`` (``default`` when unset or
    empty); a :class:`~medproc.errors.UsageError` naming it when it is not one, or below
    ``low``."""
    from .errors import UsageError

    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or n < low:
        raise UsageError(f"{name}={text!r}: a whole number >= {low} is needed")
    return n
