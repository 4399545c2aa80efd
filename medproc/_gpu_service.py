"""``medproc convert --device gpu``: one GPU service process, fed by forked CPU workers.

Why: a conversion is mostly CPU work (header scan, reading, gzip); the GPU removes the
resampling (0.16 s of ~0.47 s per 512x512x153 series on the H200 node). Spawned GPU workers,
each importing torch and DALI and making its own CUDA context, cost more than that (the GPU
route was 3x slower than the CPU route). So the workers are forked CPU workers (milliseconds;
they import neither DALI nor PyTorch), and right after them the main process forks one more
process, the service, which imports DALI, makes the one CUDA context and builds the pipeline
while the workers scan and read. A thread of the main process did it until the node's trace
(``MEDPROC_TRACE``, 32 series) showed the cost of sharing that process's interpreter lock:
the header scan's tasks and results waited behind the service's warm-up (the scan ended
0.15-0.3 s later than on the CPU route), and the main thread's bookkeeping of a finished case
took up to 0.2 s against 0.05 s. No PyTorch: DALI copies numpy to and from the GPU itself
(importing torch alone took 1.8-2.5 s on the node). Then:

1. a worker reads a case and copies its voxels into a piece of a shared arena (the proxy's
   :class:`medproc._proxy_arena.Arena`, anonymous shared memory) and sends a small request;
2. the service takes every request waiting (up to ``BATCH``), resamples them as one
   DALI batch straight from the arena, copies each output into a piece it takes, answers each
   worker with a reference to its output, and gives the input pieces back;
3. the worker compresses and writes the output straight from the arena, then gives it back.

The work is shared (:mod:`medproc._gpu_share`): a worker resamples a case on its own CPU (DALI's
CPU backend; the output agrees within float rounding) when the service's backlog would keep
it waiting longer than its own resampling takes (its first includes importing DALI), and when
the arena has no room for the case (or, after ``ROOM_WAIT_S``, for its output).
An error of the service (no usable GPU after all) fails the cases with its message; a service
that ends (or is killed) makes the workers resample on their own.
``MEDPROC_GPU_SERVICE=0`` turns the service off: spawned GPU workers, each with its own CUDA
context (the route before this one, kept for comparison).
"""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np

from ._gpu_share import SharePolicy
from ._trace import span

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
    queue and one reply pipe each); :meth:`start` after they forked (forks the service
    process); :meth:`attach` in each worker (pool initializer); :meth:`resample` in a worker;
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
    ):
        import multiprocessing

        from ._proxy_arena import Arena, arena_bytes

        ctx = self._ctx = multiprocessing.get_context("fork")
        self.spec, self.device = spec, device  # "cpu": the same protocol on DALI's CPU backend
        nbytes = nbytes or min(max(arena_bytes(), 64 * 2**20), workers * PER_WORKER)
        self.arena = Arena(nbytes, entries=4 * workers + 2 * BATCH, pin=False)
        self.requests = ctx.SimpleQueue()
        self.replies = [ctx.Pipe(duplex=False) for _ in range(workers)]
        self._claimed = ctx.Value("i", 0)
        self._alive = ctx.Value("b", 1, lock=False)  # 0 once the service has ended
        # per worker: the number of its last request the service took off the queue (from
        # then on the service owns that request's input pieces and gives them back)
        self._taken = ctx.RawArray("q", workers)
        self._process = None  # the service process (main process: after start())
        #: who resamples what: the service or the worker (:mod:`medproc._gpu_share`)
        self.policy = SharePolicy(ctx, share)
        self.index: int | None = None  # in a worker: which reply pipe is its own
        self._seq = 0  # in a worker: the number of its last request
        #: cases answered with an output, and told to resample themselves (shared counters)
        self._served = ctx.Value("i", 0, lock=False)  # (the service alone writes them)
        self._no_room = ctx.Value("i", 0, lock=False)
        #: (in the service) seconds of its busy time spent resampling (host -> device, DALI,
        #: device -> host) and copying outputs into the arena (``-v`` reports them)
        self.seconds = {"resample": 0.0, "out": 0.0}

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

        if not self._alive.value:  # the service has ended (its log says why)
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
        kept, affine = reply
        try:
            views = [self.arena.array(s) for s in kept]
            meta = {"resampled_from": vol.meta.get("source"), "device": self.device}
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
                if not self._alive.value and not pipe.poll(0):
                    if self._taken[self.index] != self._seq:
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
    def served(self) -> int:
        """Cases the service answered with an output."""
        return self._served.value

    @property
    def no_room(self) -> int:
        """Cases the service told to resample themselves (no room in the arena)."""
        return self._no_room.value

    def start(self) -> None:
        """Fork the service process (after the workers forked: it imports DALI and CUDA).
        SIGINT stays blocked until it ignores it (Ctrl-C is the main process's to handle); it
        ends with the main process. A thread of this process notes when it ends, however it
        ends, so that no worker waits for a reply from a service that is gone."""
        import signal

        masked = hasattr(signal, "pthread_sigmask")
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if masked else None
        try:
            self._process = self._ctx.Process(
                target=self._serve, args=(os.getpid(),), name="medproc-gpu", daemon=True
            )
            self._process.start()
        finally:
            if masked:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)

        def watch(sentinel=self._process.sentinel) -> None:  # (readable once it has ended;
            from multiprocessing.connection import wait  # close() reaps it)

            wait([sentinel])
            self._alive.value = 0

        threading.Thread(target=watch, name="medproc-gpu-watch", daemon=True).start()

    def close(self) -> None:
        """Stop the service (every case is settled). A service still warming up (no case
        reached it: e.g. a rerun with nothing to do) is not waited for: it is terminated."""
        process, self._process = self._process, None
        if process is not None and process.is_alive():
            if self.policy.warm.value:
                self.requests.put(None)
                process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)
        self._alive.value = 0

    def _send(self, req, reply) -> None:
        self.replies[req[0]][1].send((req[1], reply))

    def _serve(self, parent: int) -> None:
        """The service process's body."""
        from ._procs import die_with_parent, ignore_sigint

        ignore_sigint()
        die_with_parent(parent, pdeathsig=True)
        try:
            self._loop()
        except BaseException:  # noqa: BLE001 - said here; the workers resample themselves
            log.exception("GPU service stopped; the workers resample on their CPUs from now")
        finally:
            self._alive.value = 0  # waiting workers fail their case instead of hanging

    def _loop(self) -> None:
        error = None
        try:
            self._warm_up()
            threads = int(os.environ.get("MEDPROC_ARENA_COMMIT", "8"))
            if threads > 0:  # the pieces the workers' first cases will take, committed now
                size = len(self.replies) * PER_WORKER // 3  # (~150 MB: a CT and its output)
                threading.Thread(
                    target=self._commit, args=(size, threads), name="commit", daemon=True
                ).start()
        except Exception as e:  # noqa: BLE001 - answered to every request below
            error = f"--device gpu: the GPU could not be used ({type(e).__name__}: {e})"
        self.policy.warm.value = 1  # (after a failed warm-up too: answered its error)
        busy = 0.0
        while True:
            first = self.requests.get()
            if first is None:
                log.info(
                    "GPU service: %d case(s), %.2f s busy (%.2f resampling, %.2f copying out); "
                    "%d case(s) resampled by the workers",
                    self.served,
                    busy,
                    self.seconds["resample"],
                    self.seconds["out"],
                    self.policy.here.value + self.no_room,
                )
                return
            batch, stop, ran = [first], False, False
            t = time.perf_counter()
            try:
                self._taken[first[0]] = first[1]
                while len(batch) < BATCH and not self.requests.empty():
                    req = self.requests.get()
                    if req is None:
                        stop = True
                        break
                    self._taken[req[0]] = req[1]
                    batch.append(req)
                ran = True
                if error is not None:
                    self._refuse(batch, error)
                else:
                    self._run(batch)  # (answers its batch whatever happens)
            except BaseException as e:
                if not ran:  # taken off the queue, not yet answered
                    self._refuse(batch, f"{type(e).__name__}: {e}")
                raise
            finally:
                took = time.perf_counter() - t
                self.policy.done(len(batch), took)
            busy += took
            if stop:
                return

    def _refuse(self, batch, message: str) -> None:
        """Answer every request of ``batch`` with an error, their pieces given back first."""
        for r in batch:
            self._give_back(r[2])
        for r in batch:
            try:
                self._send(r, message)
            except OSError:  # that worker is gone
                pass

    def _commit(self, nbytes: int, threads: int) -> None:
        with span("arena_commit", bytes=nbytes):
            self.arena.commit(nbytes, threads)

    def _warm_up(self) -> None:
        """DALI, the CUDA context and the pipeline, before any case (no PyTorch: numpy in and
        out, DALI copies to and from the GPU itself)."""
        from .volume import Volume

        t = time.perf_counter()
        tiny = Volume(np.zeros((8, 8, 8), np.int16), np.diag([2.0, 2.0, 2.0, 1.0]))
        with span("service_warm_up"):
            self._resample([tiny], None)
        log.info("GPU service ready in %.2f s (DALI, CUDA, pipeline)", time.perf_counter() - t)

    def _resample(self, vols, labs):
        from .resample import resample_batch

        return resample_batch(vols, self.spec, device=self.device, labels=labs)

    def _run(self, batch) -> None:
        """Resample a batch's pieces in place (those with labels apart from those without),
        answer every request exactly once, then give the input pieces back."""
        answered: set[int] = set()  # requests replied to
        given: set[int] = set()  # requests whose input pieces are back already
        try:
            for with_label in (False, True):
                part = [r for r in batch if (len(r[2]) > 1) == with_label]
                try:
                    self._answer(part, with_label, answered, given)
                except Exception as e:  # noqa: BLE001 - find the case(s) that fail, one by one
                    for r in part:
                        if id(r) in answered:
                            continue
                        if id(r) in given:  # its input is gone: cannot be tried alone
                            self._send(r, f"{type(e).__name__}: {e}")
                            answered.add(id(r))
                            continue
                        try:
                            self._answer([r], with_label, answered, given)
                        except Exception as e:  # noqa: BLE001
                            self._send(r, f"{type(e).__name__}: {e}")
                            answered.add(id(r))
        except BaseException as e:
            for r in batch:  # never leave a worker waiting
                if id(r) not in answered:
                    self._send(r, f"{type(e).__name__}: {e}")
            raise
        finally:
            for r in batch:
                if id(r) not in given:
                    self._give_back(r[2])

    def _answer(self, part, with_label: bool, answered: set, given: set) -> None:
        from .volume import Volume

        if not part:
            return
        vols, labs = [], [] if with_label else None
        for r in part:
            arrays = [self.arena.array(s) for s in r[2]]
            vols.append(Volume(arrays[0], r[3]))
            if with_label:
                labs.append(Volume(arrays[1], r[3]))
        t = time.perf_counter()
        with span("gpu_resample", n=len(vols)):
            results = self._resample(vols, labs)
        self.seconds["resample"] += time.perf_counter() - t
        del vols, labs
        t = time.perf_counter()
        for r in part:  # read: their room goes to the outputs
            self._give_back(r[2])
            given.add(id(r))
        if len(results) != len(part):
            raise RuntimeError(f"{len(part)} volumes resampled into {len(results)}")
        for r, res in zip(part, results):
            outs = res if with_label else (res,)
            with span("copy_out"):
                slots = [self._to_host(np.asarray(o.array)) for o in outs]
            if any(s is None for s in slots):  # no room: the worker resamples it itself
                self._give_back([s for s in slots if s is not None])
                self._send(r, None)
                self._no_room.value += 1
            else:
                self._send(r, (slots, outs[0].affine))
                self._served.value += 1
            answered.add(id(r))
        self.seconds["out"] += time.perf_counter() - t

    def _to_host(self, t: np.ndarray):
        """Copy an output into an arena piece (waiting a while for room); None if none."""
        deadline = time.monotonic() + ROOM_WAIT_S
        slot = self.arena.put(t)
        while slot is None and time.monotonic() < deadline:
            time.sleep(0.002)  # workers are writing and will give pieces back
            slot = self.arena.put(t)
        return slot
