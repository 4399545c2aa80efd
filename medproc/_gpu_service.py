"""``medproc convert --device gpu``: GPU service processes, fed by forked CPU workers.

Why: a conversion is mostly CPU work (header scan, reading, gzip); the GPU removes the
resampling (~0.17 s of ~0.45 s per 512x512x153 series on the H200 node). Spawned GPU workers,
each importing torch and DALI and making its own CUDA context, cost more than that (the GPU
route was 3x slower than the CPU route). So the workers are forked CPU workers (milliseconds;
they import neither DALI nor PyTorch), and right after them the main process forks the
services (1, or 2 on 8 cores or more without page-locked copies, see
:func:`medproc._gpu_share.service_count`), each of which
imports DALI, makes its own CUDA context and builds its pipeline while the workers scan and
read (their loop: :mod:`medproc._gpu_serve`). A thread of the main process did it until the
node's trace (``MEDPROC_TRACE``, 32 series) showed the cost of sharing that process's
interpreter lock: the header scan's tasks and results waited behind the service's warm-up (the
scan ended 0.3-0.45 s later than on the CPU route), and the main thread's bookkeeping of a
finished case took up to 0.3 s against 0.03-0.08 s; one service was then the batch's serial
stage (busy ~80% of it). No PyTorch: DALI copies numpy to and from the GPU itself (importing
torch alone took 1.8-2.5 s on the node). Then:

1. a worker reads a case and copies its voxels into a piece of a shared arena (the proxy's
   :class:`medproc._proxy_arena.Arena`, anonymous shared memory) and puts a small request on
   the one queue;
2. a service takes every request waiting (up to ``BATCH``, never blocking for more), resamples
   them as one DALI batch straight from the arena, copies each output into a piece it takes,
   answers each worker with a reference to its output, and gives the input pieces back;
3. the worker compresses and writes the output straight from the arena, then gives it back.

The work is shared (:mod:`medproc._gpu_share`): a worker resamples a case on its own CPU (DALI's
CPU backend; the output agrees within float rounding) when the services' backlog would keep
it waiting longer than its own resampling takes (its first includes importing DALI), and when
the arena has no room for the case (or, after ``ROOM_WAIT_S``, for its output).
An error of a service (no usable GPU after all) fails the cases it takes with its message; a
worker waiting on a request knows which service took it and fails the case if that one ended;
once every service has ended the workers resample on their own. Known gap: a service killed
(SIGKILL, the OOM killer) after taking a request leaves that request's arena pieces taken for
the rest of the run (no one can tell whether it gave them back before it died).
``MEDPROC_GPU_SERVICE=0`` turns the services off: spawned GPU workers, each with its own CUDA
context (the route before this one, kept for comparison).
"""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np

from ._gpu_share import SharePolicy, env_count, pinned_copies
from ._trace import span

log = logging.getLogger("medproc.convert")

__all__ = ["GpuService", "BATCH", "PER_WORKER"]

#: requests resampled together at most: a worker's reply waits for its whole batch, and
#: batching saves little per case (a service's time per case is mostly copies), so a burst of
#: requests (every worker's first case) is answered in a few small batches
BATCH = 4
#: arena bytes per worker: a 512x512x300 int16 series and its float32 output at 1 mm
PER_WORKER = 448 * 2**20
#: how long the service waits for room for an output before the worker is told to resample it
ROOM_WAIT_S = 10.0
#: a worker's ``_taken`` entry: the number of its last request taken x TAKER + the service's
TAKER = 256


class GpuService:
    """Made in the main process *before* the workers fork (they inherit the arena, the request
    queue and one reply pipe each); :meth:`start` after they forked (forks the service
    processes); :meth:`attach` in each worker (pool initializer); :meth:`resample` in a worker;
    :meth:`close` at the end.

    Every request carries a number its reply repeats: a worker takes only the reply to its own
    last request (a stale one is dropped, its pieces given back). A worker waiting for a reply
    looks every second whether the service is still alive, and fails its case with a
    clear error if it is not, instead of waiting for ever."""

    def __init__(
        self,
        workers: int,
        spec,
        nbytes: int | None = None,
        device: str = "gpu",
        share: bool | None = None,
        services: int = 1,
    ):
        import multiprocessing

        from ._proxy_arena import Arena, arena_bytes

        #: threads committing the arena's first pieces from the start, in a process of its
        #: own (``_gpu_serve.commit_arena``; 0: none)
        self.commit_threads = env_count("MEDPROC_ARENA_COMMIT", 8)
        #: the services page-lock the arena as they use it (``medproc.pipeline.hostmem``;
        #: ``MEDPROC_GPU_PIN=0``: copies through pageable memory, for comparison)
        self.pin = pinned_copies()

        ctx = self._ctx = multiprocessing.get_context("fork")
        self.spec, self.device = spec, device  # "cpu": the same protocol on DALI's CPU backend
        nbytes = nbytes or min(max(arena_bytes(), 64 * 2**20), workers * PER_WORKER)
        self.arena = Arena(nbytes, entries=4 * workers + 2 * BATCH, pin=False)
        self.requests = ctx.Queue()  # (its get(block=False) never waits for another reader)
        self._committer = None  # the process committing the arena (see start)
        self.replies = [ctx.Pipe(duplex=False) for _ in range(workers)]
        self._claimed = ctx.Value("i", 0)
        self.n_services = max(1, int(services))
        self._up = ctx.RawArray("b", [1] * self.n_services)  # per service: 0 once it ended
        self._warm = ctx.RawArray("b", self.n_services)  # per service: 1 once warm
        self._cases = ctx.Value("i", -1, lock=False)  # cases planned (-1: not known yet)
        # per worker: the number of its last request a service took off the queue (from then
        # on that service owns the request's input pieces and gives them back) x TAKER + the
        # number of that service (one store: read together)
        self._taken = ctx.RawArray("q", workers)
        self._processes: list = []  # the service processes (main process: after start())
        #: who resamples what: the services or the worker (:mod:`medproc._gpu_share`)
        self.policy = SharePolicy(ctx, share, self.n_services)
        self.index: int | None = None  # in a worker: which reply pipe is its own
        self._seq = 0  # in a worker: the number of its last request
        #: cases answered with an output, and told to resample themselves (shared counters)
        self._served = ctx.Value("i", 0)
        self._no_room = ctx.Value("i", 0)

    # --- in a worker -------------------------------------------------------------------------
    def attach(self) -> None:
        """Pool initializer's part: claim a reply pipe."""
        with self._claimed.get_lock():
            self.index = self._claimed.value
            self._claimed.value += 1
        if self.index >= len(self.replies):
            raise RuntimeError("more workers than the GPU service has reply pipes")

    def resample(self, vol, lab=None):
        """Resample ``vol`` (and its label map ``lab``) with the service's spec, on the
        service's device.

        Returns ``(out, out_lab, release)``: volumes whose voxels are views of the arena, and
        the function that gives them back (call it once they are written); or None: resample
        it here (the service has ended, is warming up or would answer later than this worker
        resamples, or the arena has no room for the case or its output)."""
        from .errors import MedprocError

        if not self.alive:  # the services have ended (their log says why)
            return self.policy.here_instead()
        if not self.policy.worth_waiting():
            return self.policy.here_instead()
        arrays = [np.asarray(vol.array)] + ([np.asarray(lab.array)] if lab is not None else [])
        slots = []
        with span("arena_put"):
            for a in arrays:
                s = self.arena.put(a)
                if s is None:
                    self._give_back(slots)
                    return self.policy.here_instead()
                slots.append(s)
        self._seq += 1
        self.requests.put((self.index, self._seq, slots, np.asarray(vol.affine)))
        self.policy.sent()  # (taken off again by the service, batch by batch)
        with span("wait_reply"):
            reply = self._reply(vol.meta.get("source", ""), slots)
        if reply is None:  # no room for the output (counted by the service)
            return None
        if isinstance(reply, str):
            raise MedprocError(reply, vol.meta.get("source", ""))
        kept, affine, notes = reply
        try:
            views = [self.arena.array(s) for s in kept]
            meta = {"resampled_from": vol.meta.get("source"), "device": self.device}
            if notes:  # planning's, in the service (e.g. crop_foreground found nothing)
                meta["warnings"] = [*(vol.meta.get("warnings") or []), *notes]
            out = vol.with_array(views[0], affine, **meta)
            out_lab = lab.with_array(views[1], affine, **meta) if lab is not None else None
        except BaseException:
            self._give_back(kept)
            raise

        def release() -> None:  # once, however often it is called
            while kept:
                self.arena.release(kept.pop())

        return out, out_lab, release

    def _reply(self, source: str, inputs: list):
        """The reply to this worker's last request (stale ones dropped). If the service has
        ended without taking the request, its ``inputs`` pieces are given back here (a request
        it took, it gave back itself)."""
        from .errors import MedprocError

        pipe = self.replies[self.index][0]
        while True:
            while not pipe.poll(1.0):
                seq, by = divmod(self._taken[self.index], TAKER)
                taken = seq == self._seq
                gone = not self._up[by] if taken else not self.alive
                if gone and not pipe.poll(0):
                    if not taken:
                        self._give_back(inputs)
                    raise MedprocError(
                        "the GPU service stopped; run the same command again "
                        "to convert the cases it did not",
                        source,
                    )
            seq, reply = pipe.recv()
            if seq == self._seq:
                return reply
            if isinstance(reply, tuple):  # a reply to an earlier request: never used
                self._give_back(reply[0])

    def _give_back(self, slots) -> None:
        for s in slots:
            self.arena.release(s)

    # --- in the main process -----------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Whether a service process is still there."""
        return any(self._up)

    @property
    def served(self) -> int:
        """Cases the service answered with an output."""
        return self._served.value

    @property
    def no_room(self) -> int:
        """Cases the service told to resample themselves (no room in the arena)."""
        return self._no_room.value

    def start(self) -> None:
        """Fork the service processes (after the workers forked: they import DALI and CUDA).
        SIGINT stays blocked until they ignore it (Ctrl-C is the main process's to handle);
        they end with the main process. A thread of this process notes when one ends, however
        it ends, so that no worker waits for a reply from a service that is gone."""
        from ._gpu_serve import Server, commit_arena
        from ._procs import sigint_blocked

        if self.pin and self.device == "gpu":  # imported once here, not in every service
            from .pipeline import hostmem

            hostmem.available()
        self.policy.since.value = time.monotonic()
        with sigint_blocked():
            for k in range(self.n_services):
                p = self._ctx.Process(
                    target=Server(self, k).serve,
                    args=(os.getpid(),),
                    name=f"medproc-gpu-{k}",
                    daemon=True,
                )
                p.start()
                self._processes.append(p)
            if self.commit_threads > 0:  # a process of its own (see commit_arena)
                c = self._ctx.Process(
                    target=commit_arena,
                    args=(self, os.getpid()),
                    name="medproc-arena-commit",
                    daemon=True,
                )
                c.start()
                self._committer = c

        def watch(k: int, sentinel) -> None:  # (readable once it has ended; close() reaps it)
            from multiprocessing.connection import wait

            wait([sentinel])
            self._up[k] = 0

        for k, p in enumerate(self._processes):
            threading.Thread(
                target=watch, args=(k, p.sentinel), name="medproc-gpu-watch", daemon=True
            ).start()

    def planned(self, cases: int) -> None:
        """How many cases the batch will send, or a guess before the services start (the
        arena's commit is sized by the value it finds when it starts)."""
        self._cases.value = int(cases)

    def close(self) -> None:
        """Stop the services (every case is settled): once each has said it is done (it
        logged its summary and let its standard streams go), this returns; their exit, in
        which the driver tears down the CUDA context, is reaped by a thread of this process,
        waited for by no one. Services still warming up (no case reached them: e.g. a rerun
        with nothing to do) are not waited for: they are terminated."""
        committer, self._committer = self._committer, None
        if committer is not None and committer.is_alive():  # (e.g. nothing to do after all)
            committer.terminate()
        if committer is not None:
            threading.Thread(target=committer.join, name="medproc-reap", daemon=True).start()
        processes, self._processes = self._processes, []
        alive = [p for p in processes if p.is_alive()]
        warm = [k for k, p in enumerate(processes) if self._warm[k] and p.is_alive()]
        for _ in alive:  # one stop request each (a service takes one, then ends; one still
            self.requests.put(None)  # warming up may become warm and take one meanwhile)
        deadline = time.monotonic() + 30
        while any(self._up[k] for k in warm) and time.monotonic() < deadline:
            time.sleep(0.002)
        for k, p in enumerate(processes):
            if self._up[k] and p.is_alive():  # warming up (or stuck): ended now
                p.terminate()
                p.join(timeout=10)
            else:
                threading.Thread(target=p.join, name="medproc-gpu-reap", daemon=True).start()
        for k in range(self.n_services):
            self._up[k] = 0

    def _send(self, req, reply) -> None:
        self.replies[req[0]][1].send((req[1], reply))
