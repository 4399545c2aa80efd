"""``medproc convert --device gpu``: one GPU service in the main process, fed by forked CPU
workers.

Why: a conversion is mostly CPU work (header scan, reading, gzip); the GPU removes the
resampling (0.16 s of ~0.47 s per 512x512x153 series on the H200 node). Spawned GPU workers,
each importing torch and DALI and making its own CUDA context, cost more than that (the GPU
route was 3x slower than the CPU route). So the workers are forked CPU workers (milliseconds;
they import neither DALI nor PyTorch), and the main process, right after forking them,
imports DALI, makes the one CUDA context and builds the pipeline in a thread of its own while
the workers scan and read. PyTorch is not used at all: DALI copies numpy to and from the GPU
itself (importing torch alone took 1.8 s there, the whole CPU route 3.7 s). Then:

1. a worker reads a case and copies its voxels into a piece of a shared arena (the proxy's
   :class:`medproc._proxy_arena.Arena`, anonymous shared memory) and sends a small request;
2. the service thread takes every request waiting (up to ``BATCH``), resamples them as one
   DALI batch straight from the arena, copies each output into a piece it takes, answers each
   worker with a reference to its output, and gives the input pieces back;
3. the worker compresses and writes the output straight from the arena, then gives it back.

When the arena has no room for a case (or, after ``ROOM_WAIT_S``, for its output), its worker
resamples it on its own CPU (DALI's CPU backend): the output agrees within float rounding.
An error of the service (no usable GPU after all) fails the cases with its message.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np

log = logging.getLogger("medproc.convert")

__all__ = ["GpuService", "BATCH", "PER_WORKER"]

#: requests resampled together at most
BATCH = 8
#: arena bytes per worker: a 512x512x300 int16 series and its float32 output at 1 mm
PER_WORKER = 448 * 2**20
#: how long the service waits for room for an output before the worker is told to resample it
ROOM_WAIT_S = 10.0


class GpuService:
    """Made in the main process *before* the workers fork (they inherit the arena, the request
    queue and one reply pipe each); :meth:`start` after they forked; :meth:`attach` in each
    worker (pool initializer); :meth:`resample` in a worker; :meth:`close` at the end."""

    def __init__(self, workers: int, spec, nbytes: int | None = None, device: str = "gpu"):
        import multiprocessing

        from ._proxy_arena import Arena, arena_bytes

        ctx = multiprocessing.get_context("fork")
        self.spec, self.device = spec, device  # "cpu": the same protocol on DALI's CPU backend
        nbytes = nbytes or min(max(arena_bytes(), 64 * 2**20), workers * PER_WORKER)
        self.arena = Arena(nbytes, entries=4 * workers + 2 * BATCH, pin=False)
        self.requests = ctx.SimpleQueue()
        self.replies = [ctx.Pipe(duplex=False) for _ in range(workers)]
        self._claimed = ctx.Value("i", 0)
        self._thread: threading.Thread | None = None
        self.index: int | None = None  # in a worker: which reply pipe is its own
        self.ready_s: float | None = None  # seconds until the GPU was ready (main process)

    # --- in a worker -------------------------------------------------------------------------
    def attach(self) -> None:
        """Pool initializer's part: claim a reply pipe."""
        with self._claimed.get_lock():
            self.index = self._claimed.value
            self._claimed.value += 1
        if self.index >= len(self.replies):
            raise RuntimeError("more workers than the GPU service has reply pipes")

    def resample(self, vol, lab=None):
        """Resample ``vol`` (and its label map ``lab``) with the service's spec on the GPU.

        Returns ``(out, out_lab, release)``: volumes whose voxels are views of the arena, and
        the function that gives them back (call it once they are written); or None when the
        arena has no room now (resample here instead)."""
        from .errors import MedprocError

        arrays = [np.asarray(vol.array)] + ([np.asarray(lab.array)] if lab is not None else [])
        slots = []
        for a in arrays:
            s = self.arena.put(a)
            if s is None:
                for t in slots:
                    self.arena.release(t)
                return None
            slots.append(s)
        self.requests.put((self.index, slots, np.asarray(vol.affine)))
        reply = self.replies[self.index][0].recv()
        if reply is None:  # no room for the output: resample here
            return None
        if isinstance(reply, str):
            raise MedprocError(reply, vol.meta.get("source", ""))
        kept, affine = reply
        views = [self.arena.array(s) for s in kept]
        meta = {"resampled_from": vol.meta.get("source"), "device": "gpu"}
        out = vol.with_array(views[0], affine, **meta)
        out_lab = lab.with_array(views[1], affine, **meta) if lab is not None else None

        def release() -> None:
            while kept:
                self.arena.release(kept.pop())

        return out, out_lab, release

    # --- in the main process -----------------------------------------------------------------
    def start(self) -> None:
        """Start the service thread (after the workers forked: it imports DALI and CUDA)."""
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._serve, name="medproc-gpu", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the service thread (every case is settled)."""
        if self._thread is not None and self._thread.is_alive():
            self.requests.put(None)
            self._thread.join(timeout=30)
        self._thread = None

    def _serve(self) -> None:
        error = None
        try:
            self._warm_up()
        except Exception as e:  # noqa: BLE001 - answered to every request below
            error = f"--device gpu: the GPU could not be used ({type(e).__name__}: {e})"
        self.ready_s = time.perf_counter() - self._t0
        served, busy = 0, 0.0
        while True:
            first = self.requests.get()
            if first is None:
                log.info("GPU service: %d case(s), %.2f s busy", served, busy)
                return
            batch, stop = [first], False
            while len(batch) < BATCH and not self.requests.empty():
                req = self.requests.get()
                if req is None:
                    stop = True
                    break
                batch.append(req)
            t = time.perf_counter()
            served += len(batch)
            if error is not None:
                for idx, slots, _ in batch:
                    self._give_back(slots)
                    self.replies[idx][1].send(error)
            else:
                try:
                    self._run(batch)
                except Exception as e:  # noqa: BLE001 - never leave a worker waiting
                    for idx, _, _ in batch:
                        self.replies[idx][1].send(f"{type(e).__name__}: {e}")
            busy += time.perf_counter() - t
            if stop:
                return

    def _warm_up(self) -> None:
        """DALI, the CUDA context and the pipeline, before any case (no PyTorch: numpy in and
        out, DALI copies to and from the GPU itself)."""
        from .volume import Volume

        t = time.perf_counter()
        tiny = Volume(np.zeros((8, 8, 8), np.int16), np.diag([2.0, 2.0, 2.0, 1.0]))
        self._resample([tiny], None)
        log.info("GPU service ready in %.2f s (DALI, CUDA, pipeline)", time.perf_counter() - t)

    def _resample(self, vols, labs):
        from .resample import resample_batch

        return resample_batch(vols, self.spec, device=self.device, labels=labs)

    def _give_back(self, slots) -> None:
        for s in slots:
            self.arena.release(s)

    def _run(self, batch) -> None:
        """Resample a batch's pieces in place (those with labels apart from those without),
        answer every request, then give the pieces back."""
        items = [(r[0], [self.arena.array(s) for s in r[1]], r[2]) for r in batch]
        try:
            for with_label in (False, True):
                part = [it for it in items if (len(it[1]) > 1) == with_label]
                try:
                    self._answer(part, with_label)
                except Exception:  # noqa: BLE001 - find the case(s) that fail, one by one
                    for it in part:
                        try:
                            self._answer([it], with_label)
                        except Exception as e:  # noqa: BLE001
                            self.replies[it[0]][1].send(f"{type(e).__name__}: {e}")
        finally:
            for r in batch:
                self._give_back(r[1])

    def _answer(self, part, with_label: bool) -> None:
        from .volume import Volume

        if not part:
            return
        vols = [Volume(g[0], affine) for _, g, affine in part]
        labs = [Volume(g[1], affine) for _, g, affine in part] if with_label else None
        results = self._resample(vols, labs)
        for (idx, _, _), res in zip(part, results):
            outs = res if with_label else (res,)
            slots = [self._to_host(np.asarray(o.array)) for o in outs]
            if any(s is None for s in slots):  # no room: the worker resamples it itself
                self._give_back([s for s in slots if s is not None])
                self.replies[idx][1].send(None)
            else:
                self.replies[idx][1].send((slots, outs[0].affine))

    def _to_host(self, t: np.ndarray):
        """Copy an output into an arena piece (waiting a while for room); None if none."""
        dhw = tuple(t.shape[::-1]) if t.ndim == 3 else (*t.shape[2::-1], t.shape[3])
        dtype = t.dtype
        deadline = time.monotonic() + ROOM_WAIT_S
        slot = self.arena.alloc(dhw, dtype)
        while slot is None and time.monotonic() < deadline:
            time.sleep(0.002)  # workers are writing and will give pieces back
            slot = self.arena.alloc(dhw, dtype)
        if slot is not None:
            np.copyto(self.arena.array(slot), t)
        return slot


def service_wanted(device: str, executor, dask, dry_run: bool) -> bool:
    """Whether a batch uses the GPU service: ``--device gpu`` on Linux, with medproc's own
    pool, from a process that has neither DALI nor CUDA yet (so that it can fork)."""
    from ._procs import can_fork

    return (
        device == "gpu"
        and executor is None
        and not dask
        and not dry_run
        and can_fork("cpu")
        and os.environ.get("MEDPROC_GPU_SERVICE", "1") != "0"
    )
