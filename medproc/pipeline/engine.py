"""The engine: the one door to DALI. Every connector (resample, convert, the MONAI transforms,
``PatchLoader``, the proxy, GPU decoding) runs its voxel work through it.

Contract
--------
- **Pipelines are built and cached here, per process and per thread.** A DALI pipeline is
  never used by two threads at once: each thread that calls the engine gets its own (built on
  first use, ~0.1 s, then reused). :class:`Engine` objects hold no pipelines and may be shared.
- **Fork-safe.** A pipeline built before a ``fork()`` is never touched in the child (DALI's
  worker threads do not survive a fork: using it hangs). A forked child (a PyTorch DataLoader
  worker) builds its own CPU pipelines. GPU pipelines cannot run in a child forked after CUDA
  was initialised in the parent: that fails at once with :class:`ForkError`, saying what to do.
- **Runs ahead.** :meth:`Engine.map` feeds batch n + 1 (its host -> device copy started on a
  side stream, from pinned memory) before it waits for batch n; :meth:`Engine.stream` does the
  host work (sampling, reading), feeding and DALI execution in a background thread, ``ahead``
  batches in advance, while the caller consumes.
- **One axis order.** Inputs and outputs are indexed ``(i, j, k[, C])`` (or ``(C, i, j, k)``
  with ``Graph(channels_first=True)``); DALI's DHWC layout is private to this package.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import check_device
from ..plan import Plan
from . import slabs
from ._dtypes import _astype, _dtype_name, _feed_dtype
from .cache import (
    INSTALL,
    ForkError,
    cached_pipeline,
    check_gpu_here,
    dali_available,
    drop_cached,
    gpu_available,
)
from .graphs import Graph
from .pace import TakeQueue
from .runner import Runner, _restored
from .threads import check_threads, default_threads

__all__ = [
    "Engine",
    "Job",
    "Graph",
    "ForkError",
    "dali_available",
    "gpu_available",
    "drop_cached",
    "default_threads",
    "cached_pipeline",
]


# --- jobs and runners -----------------------------------------------------------------------
@dataclass
class Job:
    """One sample for the engine: an image ``(i, j, k[, C])`` (numpy, or a torch tensor on the
    CPU or the GPU), its plan, and label maps on the same grid (nearest neighbour)."""

    image: object
    plan: Plan
    labels: Sequence = field(default_factory=tuple)


@dataclass
class _Batch:
    """A batch on its way through a runner: the jobs fed (slabs, where volumes were cut), the
    label dtypes to restore, how to join the slabs (None: nothing was cut), the caller's
    ``extra``, and how many samples were scheduled (None until fed)."""

    runner: Runner
    jobs: list
    graph: Graph
    restore: list
    parts: list | None
    extra: object
    n: int | None = None

    def start(self) -> None:
        self.n = self.runner.start(self.jobs)


# --- the public door ------------------------------------------------------------------------
class Engine:
    """Run resampling jobs through DALI (see the module doc for the contract).

    Parameters
    ----------
    device : {"cpu", "gpu"}
        DALI backend. ``"gpu"`` needs an NVIDIA GPU and PyTorch with CUDA.
    batch_size : int
        Jobs per batch; longer job lists are split. (On the CPU a pipeline takes
        ``batch_size * slabs.MAX_SLABS`` samples: big volumes run as slabs.)
    num_threads : int, optional
        DALI CPU threads, 1 to 1024 (default :func:`default_threads`:
        ``MEDPROC_DALI_THREADS``, else this process's share of the cores when several ranks
        share the machine).
    device_id : int, optional
        GPU ordinal; default the current CUDA device (``torch.cuda.set_device``), else 0.

    Examples
    --------
    >>> eng = Engine("cpu", batch_size=4)                                  # doctest: +SKIP
    >>> (img, lab), = eng.run([Job(image, plan, [label])], Graph(labels=1))  # doctest: +SKIP
    """

    def __init__(
        self,
        device: str = "cpu",
        batch_size: int = 8,
        num_threads: int | None = None,
        device_id: int | None = None,
    ):
        if not dali_available():
            raise ImportError(f"medproc's pipelines need NVIDIA DALI: {INSTALL}")
        device = check_device(device)
        if device == "gpu":
            check_gpu_here()  # before anything touches CUDA in a forked child
        if device == "gpu" and not gpu_available():
            from ..errors import DeviceError

            raise DeviceError("device='gpu' but DALI sees no NVIDIA GPU here; use device='cpu'")
        if device == "gpu":  # found, not imported: numpy in and out needs no PyTorch
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                raise ImportError("device='gpu' hands CUDA tensors to PyTorch: pip install torch")
        self.device = device
        self.batch_size = max(1, int(batch_size))
        self.num_threads = check_threads(num_threads)
        #: samples a pipeline takes: on the CPU a volume may be cut into slabs (:mod:`.slabs`)
        self.pipe_batch = self.batch_size * (1 if device == "gpu" else slabs.MAX_SLABS)
        if device_id is None:  # the current CUDA device (torch.cuda.set_device), else 0
            torch = sys.modules.get("torch")
            cuda = device == "gpu" and torch is not None and torch.cuda.is_available()
            device_id = torch.cuda.current_device() if cuda else 0
        self.device_id = int(device_id)
        self._stream = None  # stream()'s CUDA stream, made on first use

    def _runner(self, graph: Graph, jobs: list[Job]) -> Runner:
        mode = graph.mode_for([j.plan for j in jobs], self.device)
        intensity = any(j.plan.intensity is not None for j in jobs)
        dtypes = tuple(_dtype_name(a) for a in [jobs[0].image, *jobs[0].labels])
        key = (
            "resample",
            self.device,
            self.device_id,
            self.pipe_batch,
            self.num_threads,
            graph,
            mode,
            intensity,
            dtypes,
        )
        runner = cached_pipeline(key, lambda: Runner(self, graph, mode, intensity), self.device)
        if runner.broken:
            drop_cached(key)
            runner = cached_pipeline(key, lambda: Runner(self, graph, mode, intensity), self.device)
        return runner

    def _check(self, jobs: list[Job], graph: Graph) -> tuple[list[Job], list[str]]:
        """Jobs in dtypes DALI takes (one dtype per input across the batch), and the label
        dtypes to give back, per job (labels keep theirs)."""
        for j in jobs:
            if tuple(j.image.shape[:3]) != tuple(j.plan.in_shape):
                raise ValueError(
                    f"image shape {tuple(j.image.shape)} does not match its plan's "
                    f"input shape {j.plan.in_shape}"
                )
            if len(j.labels) != graph.labels:
                raise ValueError(
                    f"this graph resamples {graph.labels} label map(s) per sample, "
                    f"got {len(j.labels)}"
                )
        cols = [[j.image for j in jobs]] + [
            [j.labels[c] for j in jobs] for c in range(graph.labels)
        ]
        fed = []
        for c, col in enumerate(cols):
            names = {_feed_dtype(a, c > 0, graph.fill) for a in col}
            target = names.pop() if len(names) == 1 else "float32"
            fed.append([a if _dtype_name(a) == target else _astype(a, target) for a in col])
        out = [
            Job(fed[0][n], j.plan, tuple(fed[c][n] for c in range(1, len(fed))))
            for n, j in enumerate(jobs)
        ]
        restore = [  # per job: a batch may mix label dtypes (fed as one; each gets its own)
            [_dtype_name(lb) if _dtype_name(lb) != "bool" else "uint8" for lb in j.labels]
            for j in jobs
        ]
        return out, restore

    def run(
        self,
        jobs: Sequence[Job],
        graph: Graph = Graph(),
        as_torch: bool = False,
        into=None,
    ) -> list:
        """Resample ``jobs``; one ``(image, *labels)`` tuple per job, in order (``into``: see
        :meth:`map`)."""
        return [r for batch in self.map(jobs, graph, as_torch, into) for r in batch]

    def map(
        self,
        jobs: Iterable[Job],
        graph: Graph = Graph(),
        as_torch: bool = False,
        into=None,
    ) -> Iterator[list]:
        """Resample a stream of jobs in batches of ``batch_size``, feeding the next batch before
        waiting for the current one; yields one list of ``(image, *labels)`` per batch.

        Numpy out: ``into(shape, dtype)`` gives, for each output (DALI's ``(k, j, i, C)``
        shape), the C-ordered host array it is copied into (checked; a new one where it gives
        None), on the GPU straight from the device (page-locked: one DMA transfer; see
        :mod:`.hostmem`); the outputs are views of those arrays.

        On the CPU big volumes run as slabs of output slices, so that one volume keeps several
        threads busy (:mod:`.slabs`)."""

        def batches():
            chunk = []
            for j in jobs:
                chunk.append(j)
                if len(chunk) == self.batch_size:
                    yield chunk, graph
                    chunk = []
            if chunk:
                yield chunk, graph

        items = ((b, g, None) for b, g in batches())
        for res, _ in self._pipelined(items, as_torch, into=into):
            yield res

    def _pipelined(
        self,
        items: Iterable,
        as_torch: bool,
        stream=None,
        dense: bool = False,
        into=None,
    ) -> Iterator[tuple]:
        """(jobs, graph, extra) -> (results, extra), with batch n + 1 fed before n is waited on."""
        it = iter(items)
        cur = next(it, None)
        if cur is None:
            return
        batch = self._prepared(cur, into)
        batch.start()
        while True:
            nxt = next(it, None)
            ahead = None if nxt is None else self._prepared(nxt, into)
            if ahead is not None and ahead.runner is not batch.runner:
                ahead.start()  # another pipeline: fed before this batch is waited on
            joiner = None
            if batch.parts is not None:  # slabs: into their place in the outputs
                joiner = slabs.Joiner(batch.parts, batch.graph.channels_first, as_torch, into)
            sink = into if joiner is None else joiner.sink
            res = batch.runner.collect(batch.n, as_torch, stream, dense, sink)
            if ahead is not None and ahead.n is None:  # the same pipeline, free now
                ahead.start()
            if joiner is not None:
                res = joiner.join(res)
            yield _restored(res, batch.restore), batch.extra
            if ahead is None:
                return
            batch = ahead

    def _prepared(self, item: tuple, into) -> _Batch:
        """:meth:`_prepare` of a ``(jobs, graph, extra)`` item; an error (a dtype or value it
        refuses) carries the item's ``extra`` as ``batch_extra``, for the caller to say which
        samples it was."""
        try:
            return self._prepare(*item, into=into)
        except Exception as e:
            with contextlib.suppress(AttributeError, TypeError):  # (an exception without a dict)
                e.batch_extra = item[2]
            raise

    def _prepare(self, jobs, graph: Graph, extra, into=None) -> _Batch:
        """A batch ready to feed (checked and in DALI's dtypes); on the CPU with big volumes cut
        into slabs (:mod:`.slabs`; not for channels-first outputs into a caller's arrays)."""
        jobs, restore = self._check(list(jobs), graph)
        parts = None
        if self.device == "cpu" and not (graph.channels_first and into is not None):
            jobs, parts = slabs.split(jobs, graph)
        return _Batch(self._runner(graph, jobs), jobs, graph, restore, parts, extra)

    def _side_stream(self):
        """The CUDA stream :meth:`stream`'s threads work on: one per engine, for good.

        PyTorch's caching allocator keeps a freed block for the stream it was made on, so a new
        stream per call (per epoch of a loader) stranded every earlier stream's cached batches:
        on the H200 a training process's reserved memory grew by a batch per step, to 6.9 GiB
        for 1.7 GiB allocated (``bench/train.py``)."""
        import torch

        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device_id)
        return self._stream

    def stream(
        self, items: Iterable, as_torch: bool = True, ahead: int = 2, pacer=None
    ) -> Iterator[tuple]:
        """Run ``(jobs, graph, extra)`` items in a background thread, ``ahead`` batches in
        advance of the caller; yields ``(results, extra)`` in order.

        The iterable itself is consumed in the background thread too (put the per-batch host
        work, e.g. sampling and reading patches, in it). On the GPU the thread works on a stream
        of its own, which first waits for what the caller had queued on its current stream (CUDA
        inputs made before the call); the results are ready to use on the caller's current
        stream, and an output's samples may be the rows of one batch tensor
        (:func:`~medproc.pipeline.runner.stacked` gives it back without a copy). Errors are
        raised in the caller; closing the iterator stops the thread.

        ``pacer`` (a :class:`~medproc.pipeline.pace.Pacer`; None: off): while batches are
        ready, the thread starts the next one a fraction of the caller's interval after the
        caller took the last, so that its interpreter time falls in the caller's waits (for
        training loops).
        """
        q = TakeQueue(max(1, int(ahead)), pacer.took if pacer is not None else None)
        stop = threading.Event()
        end = object()
        gpu = self.device == "gpu"
        ready = None
        if gpu:
            import torch

            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device_id))

        def put(x) -> bool:
            while not stop.is_set():
                try:
                    q.put(x, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce():
            try:
                s, on_s = None, contextlib.nullcontext()
                if gpu:
                    import torch

                    s = self._side_stream()
                    # this thread's work (the items' host work too) goes on its own stream: on
                    # the default stream it would wait for the training loop's queued kernels
                    on_s = torch.cuda.stream(s)
                with on_s:
                    if ready is not None:  # CUDA inputs the caller queued before this call
                        s.wait_event(ready)
                    for res, extra in self._pipelined(items, as_torch, s, dense=True):
                        ev = None
                        if gpu and as_torch:
                            ev = torch.cuda.Event()
                            ev.record(s)
                        if not put((res, extra, ev)):
                            return
                        if pacer is not None:
                            pacer.wait(q.qsize(), stop)
                            if stop.is_set():
                                return
                put(end)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                put(e)

        t = threading.Thread(target=produce, name="medproc-engine", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is end:
                    return
                if isinstance(item, BaseException):
                    raise item
                res, extra, ev = item
                if ev is not None:
                    import torch

                    cur = torch.cuda.current_stream(self.device_id)
                    cur.wait_event(ev)
                    # once per memory block (a batch's samples are often the rows of one)
                    blocks = {x.untyped_storage().data_ptr(): x for row in res for x in row}
                    for x in blocks.values():
                        x.record_stream(cur)
                yield res, extra
        finally:
            stop.set()
            if t is not threading.current_thread():  # closed from its own thread: a loader
                t.join(timeout=30)  # collected there (it sees `stop` and ends)
