"""The service processes' side of :mod:`medproc._gpu_service`: warm up (DALI, the CUDA context,
the pipeline), then take the waiting requests batch by batch, resample them straight from the
arena, copy each output into a piece of it and answer each worker exactly once; and the body of
the process that commits the arena's first pieces (:func:`commit_arena`)."""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from . import _gpu_service as config  # its constants (read at use: tests may set them)
from ._trace import span

log = logging.getLogger("medproc.convert")

__all__ = ["Server"]


class Server:
    """Service process number ``k`` of ``service`` (a :class:`~medproc._gpu_service.GpuService`
    whose shared state it was forked with)."""

    def __init__(self, service, k: int):
        self.s, self.k = service, k
        self.served = 0  # cases this process answered (the shared counters count all)
        #: seconds of the busy time spent resampling (host -> device, DALI, device -> host) and
        #: copying outputs into the arena (``-v`` reports them)
        self.seconds = {"resample": 0.0, "out": 0.0}
        #: the arena page-locked in this process as it is used (``medproc.pipeline.hostmem``;
        #: None: copies through pageable memory), and the pieces outputs were copied into
        #: straight from the GPU, by their address, not yet handed to a worker
        self.pins = None
        self.pins_stopped: str | None = None  # why page-locking was turned off, if it was
        self.made: dict[int, object] = {}

    def serve(self, parent: int) -> None:
        """The service process's body."""
        from ._procs import die_with_parent, ignore_sigint

        ignore_sigint()
        die_with_parent(parent, pdeathsig=True)
        try:
            self.loop()
        except BaseException:  # noqa: BLE001 - said here; the workers resample themselves
            log.exception("GPU service stopped; the workers resample on their CPUs from now")
        finally:
            self.s._up[self.k] = 0  # waiting workers fail their case instead of hanging
            _leave()

    def loop(self) -> None:
        s, error = self.s, None
        try:
            self.warm_up()
        except Exception as e:  # noqa: BLE001 - answered to every request below
            error = f"--device gpu: the GPU could not be used ({type(e).__name__}: {e})"
        s._warm[self.k] = 1  # (after a failed warm-up too: answered its error)
        s.policy.warm.value = 1
        busy = 0.0
        while True:
            first = s.requests.get()
            if first is None:
                pinned = self.pins.locked if self.pins else 0
                log.info(
                    "GPU service%s: %d case(s), %.2f s busy (%.2f resampling, %.2f copying "
                    "out), %s; %d case(s) resampled by the workers so far",
                    f" {self.k + 1} of {s.n_services}" if s.n_services > 1 else "",
                    self.served,
                    busy,
                    self.seconds["resample"],
                    self.seconds["out"],
                    f"page-locking stopped ({self.pins_stopped})"
                    if self.pins_stopped
                    else f"{pinned >> 20} MiB of the arena page-locked",
                    s.policy.here.value + s.no_room,
                )
                return
            batch, stop, ran = [first], False, False
            t = time.perf_counter()
            try:
                self._take(first)
                stop = _gather(s.requests, batch, config.BATCH, self._take)
                ran = True
                if error is not None:
                    self.refuse(batch, error)
                else:
                    self.run(batch)  # (answers its batch whatever happens)
            except BaseException as e:
                if not ran:  # taken off the queue, not yet answered
                    self.refuse(batch, f"{type(e).__name__}: {e}")
                raise
            finally:
                took = time.perf_counter() - t
                s.policy.done(len(batch), took)
            busy += took
            if stop:
                return

    def _take(self, req) -> None:
        """This process owns ``req`` from now on: its number and this service's, in one
        store (a worker reads them together)."""
        self.s._taken[req[0]] = req[1] * config.TAKER + self.k

    def refuse(self, batch, message: str) -> None:
        """Answer every request of ``batch`` with an error, their pieces given back first."""
        for r in batch:
            self.s._give_back(r[2])
        for r in batch:
            try:
                self.s._send(r, message)
            except OSError:  # that worker is gone
                pass

    def warm_up(self) -> None:
        """DALI, the CUDA context and the pipeline, before any case (no PyTorch: numpy in and
        out, DALI copies to and from the GPU itself)."""
        from .resample import tiny_volume

        t = time.perf_counter()
        with span("service_warm_up"):
            try:
                self.resample([tiny_volume()], None)
            finally:
                self.give_back_made()  # (its output went to an arena piece too)
            if self.s.device == "gpu" and self.s.pin:
                from .pipeline import hostmem

                if hostmem.available():
                    a = self.s.arena
                    self.pins = hostmem.Registered(a.bytes.ctypes.data, a.nbytes)
        log.info("GPU service ready in %.2f s (DALI, CUDA, pipeline)", time.perf_counter() - t)

    def resample(self, vols, labs):
        from .resample import resample_batch

        # one pipeline for every batch size; outputs copied from the GPU straight into arena
        # pieces (``into``), page-locked ones unless page-locking is off
        s = self.s
        # (planning's notes come back with each output: the worker says them, naming its case)
        return resample_batch(
            vols,
            s.spec,
            device=s.device,
            labels=labs,
            batch_size=config.BATCH,
            into=self.into,
            warn=False,
        )

    def into(self, dhw_shape: tuple, dtype):
        """An arena piece an output is copied into from the GPU (page-locked unless that is
        off), no copy in this process (None: no room right now; the output then goes to a new
        array, copied into the arena by :meth:`to_host`, which waits for room)."""
        got = self.s.arena.take(dhw_shape, dtype)
        if got is None:
            return None
        slot, view = got
        if self.pins is not None:
            self.pins.ensure(slot.offset, view.nbytes)
        self.made[view.ctypes.data] = slot
        return view

    def run(self, batch) -> None:
        """Resample a batch's pieces in place (those with labels apart from those without),
        answer every request exactly once, then give the input pieces back."""
        tell = self._tell
        answered: set[int] = set()  # requests replied to
        given: set[int] = set()  # requests whose input pieces are back already
        try:
            for with_label in (False, True):
                part = [r for r in batch if (len(r[2]) > 1) == with_label]
                try:
                    self.answer(part, with_label, answered, given)
                except Exception as e:  # noqa: BLE001 - find the case(s) that fail, one by one
                    for r in part:
                        if id(r) in answered:
                            continue
                        if id(r) in given:  # its input is gone: cannot be tried alone
                            tell(r, f"{type(e).__name__}: {e}")
                            answered.add(id(r))
                            continue
                        try:
                            self.answer_alone(r, with_label, answered, given)
                        except Exception as e:  # noqa: BLE001
                            tell(r, f"{type(e).__name__}: {e}")
                            answered.add(id(r))
        except BaseException as e:
            for r in batch:  # never leave a worker waiting
                if id(r) not in answered:
                    tell(r, f"{type(e).__name__}: {e}")
            raise
        finally:
            for r in batch:
                if id(r) not in given:
                    self.s._give_back(r[2])

    def answer_alone(self, r, with_label: bool, answered: set, given: set) -> None:
        """Answer one request of a batch that failed. If it fails with page-locked copies
        and then not without them, they stay off for the rest of the run (said once); if it
        fails either way, the case is at fault and they stay on."""
        try:
            self.answer([r], with_label, answered, given)
            return
        except Exception as e:
            if self.pins is None or id(r) in given or id(r) in answered:
                raise
            first = e
        pins, self.pins = self.pins, None
        try:
            self.answer([r], with_label, answered, given)
        except Exception:
            self.pins = pins
            raise
        self.pins_stopped = f"{type(first).__name__}: {first}"
        log.warning(
            "GPU service: a case failed with page-locked copies and not without them; they "
            "stay off (%s)",
            self.pins_stopped,
        )

    def _tell(self, r, message) -> bool:
        """Send ``message`` (an error, or None: resample it yourself) to ``r``'s worker;
        False if that worker is gone."""
        try:
            self.s._send(r, message)
        except OSError:
            return False
        return True

    def answer(self, part, with_label: bool, answered: set, given: set) -> None:
        from .volume import Volume

        if not part:
            return
        s = self.s
        vols, labs = [], [] if with_label else None
        for r in part:
            arrays = [s.arena.array(x) for x in r[2]]
            if self.pins is not None:  # DALI's copy to the GPU: one DMA transfer
                for a in arrays:
                    self.pins.ensure(a.ctypes.data - self.pins.base, a.nbytes)
            vols.append(Volume(arrays[0], r[3]))
            if with_label:
                labs.append(Volume(arrays[1], r[3]))
        try:  # the pieces outputs were copied into and no worker was handed go back
            self._resample_answer(part, with_label, vols, labs, answered, given)
        finally:
            self.give_back_made()

    def give_back_made(self) -> None:
        """Give back the pieces outputs were copied into that no worker was handed (outputs
        converted after the copy: a label map's dtype restored)."""
        if self.made:
            self.s._give_back(list(self.made.values()))
            self.made.clear()

    def _resample_answer(self, part, with_label, vols, labs, answered, given) -> None:
        s = self.s
        t = time.perf_counter()
        with span("gpu_resample", n=len(vols)):
            results = self.resample(vols, labs)
        self.seconds["resample"] += time.perf_counter() - t
        del vols[:]
        if labs:
            del labs[:]
        t = time.perf_counter()
        for r in part:  # read: their room goes to the outputs
            s._give_back(r[2])
            given.add(id(r))
        if len(results) != len(part):
            raise RuntimeError(f"{len(part)} volumes resampled into {len(results)}")
        for r, res in zip(part, results):
            outs = res if with_label else (res,)
            slots: list = []
            try:
                with span("copy_out"):
                    for o in outs:
                        slots.append(self.to_host(np.asarray(o.array)))
                if any(x is None for x in slots):  # no room: the worker resamples it itself
                    s._give_back([x for x in slots if x is not None])
                    slots = []
                    self._tell(r, None)
                    with s._no_room.get_lock():
                        s._no_room.value += 1
                else:
                    s._send(r, (slots, outs[0].affine, outs[0].meta.get("warnings") or []))
                    self.served += 1
                    with s._served.get_lock():
                        s._served.value += 1
            except BaseException as e:  # its pieces go back, unless its worker has them
                s._give_back([x for x in slots if x is not None])
                if isinstance(e, OSError):  # that worker is gone: no one to answer
                    answered.add(id(r))
                    continue
                raise
            answered.add(id(r))
        self.seconds["out"] += time.perf_counter() - t

    def to_host(self, t: np.ndarray):
        """The arena piece of an output: the one it was copied into from the GPU, else a
        piece it is copied into (waiting a while for room); None if none."""
        slot = self.made.pop(t.ctypes.data, None)
        if slot is not None:
            size = int(np.prod(slot.shape)) * np.dtype(slot.dtype).itemsize
            if t.dtype == np.dtype(slot.dtype) and t.nbytes == size:
                slot.shape = t.shape[2::-1] + t.shape[3:]  # (i, j, k[, C]) -> DHW[C]
                return slot
            self.s._give_back([slot])
        deadline = time.monotonic() + config.ROOM_WAIT_S
        slot = self.s.arena.put(t)
        while slot is None and time.monotonic() < deadline:
            time.sleep(0.002)  # workers are writing and will give pieces back
            slot = self.s.arena.put(t)
        return slot


def commit_arena(service, parent: int) -> None:
    """The body of the process that commits the arena pieces the workers' first cases will
    take: ~150 MB (a CT and its output) for each worker that will have a case
    (``GpuService.planned``: a guess from the inputs listed, set before the services start;
    every worker if it has not said within 5 s), from the start, while the headers are read
    and the services warm up. On the H200 node, begun after a service's warm-up, it ended
    after the workers' first copies, which faulted page by page (0.13 s per case on average,
    against 0.04 s); in a thread of a service, it slowed that service's warm-up (DALI, CUDA)
    from ~0.5 to 0.85 s: the kernel's page work and the warm-up's mappings share the
    process's memory map."""
    from ._procs import die_with_parent, ignore_sigint

    ignore_sigint()
    die_with_parent(parent, pdeathsig=True)
    try:
        s, deadline = service, time.monotonic() + 5
        while s._cases.value < 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        cases = s._cases.value if s._cases.value >= 0 else len(s.replies)
        nbytes = min(len(s.replies), cases) * config.PER_WORKER // 3
        with span("arena_commit", bytes=nbytes):
            s.arena.commit(nbytes, s.commit_threads)
    finally:
        os._exit(0)


def _gather(requests, batch: list, limit: int, take) -> bool:
    """Add to ``batch`` (taking each with ``take``) the requests waiting, up to ``limit``,
    without ever blocking: another service may be waiting in ``get()`` for the same queue, and
    a blocking read here could then wait for the next request while holding those taken.
    True if a stop request came (one per service: this one's)."""
    import queue

    while len(batch) < limit:
        try:
            req = requests.get(block=False)
        except queue.Empty:
            return False
        if req is None:
            return True
        take(req)
        batch.append(req)
    return False


def _leave() -> None:
    """End the service process now, without making anyone wait for its exit: its output
    flushed, its standard streams let go (a caller reading the command's output through a pipe
    would otherwise wait for them), then ``os._exit``. The driver tears down the CUDA context
    as the process exits: on the H200 node the command took 0.2-0.4 s longer after its last
    case while the main process waited for the service processes to end."""
    import sys

    for h in logging.getLogger().handlers + log.handlers:
        h.flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os._exit(0)
