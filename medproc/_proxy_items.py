"""What a proxy worker hands over for a sample: its input box, for the server's pipeline to
resample (:class:`Pending`), or, on DALI's CPU backend, the sample already resampled in the
worker (:class:`Finished`).

Private to :mod:`medproc.proxy`. Where the voxel work runs (``ProxyServer(resample_in=...)``):
on the GPU one pipeline in the main process serves every worker; on the CPU, with workers,
each worker resamples its own samples with a DALI CPU pipeline of its own (the cores shared
out as its threads), as a plain DataLoader would. One pipeline in the main process on the CPU
had every batch wait for its threads while the workers' cores stood by (``bench/proxy.py
--device cpu``: docs/benchmarks.md, "Without a GPU").
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = [
    "Pending",
    "Finished",
    "ResampleInWorkers",
    "here",
    "fetch_boxes",
    "shareable",
    "collate",
]


class Pending:
    """The voxels a worker hands over (tensors: shared memory across processes) and the plan."""

    __slots__ = ("array", "labels", "plan")

    def __init__(self, array, labels, plan):
        self.array, self.labels, self.plan = array, labels, plan


class Finished:
    """A sample resampled in its worker: ``(image, *labels)``, ``(C, i, j, k)``, each an arena
    piece (:class:`~medproc._proxy_arena.Slot`) or a tensor."""

    __slots__ = ("outputs",)

    def __init__(self, outputs):
        self.outputs = tuple(outputs)


def _note(e: BaseException, text: str) -> None:
    """Add ``text`` to an exception's notes (Python 3.11+; before, said in its arguments)."""
    if hasattr(e, "add_note"):
        e.add_note(text)
    else:  # pragma: no cover - Python 3.10
        e.args = (*e.args, text)


def shareable(a):
    """A copy of an ``(i, j, k)`` array region as a torch tensor whose memory is DALI's layout
    (k, j, i contiguous), so the main process feeds it without another copy; a DataLoader moves
    it through shared memory."""
    import torch

    c = np.ascontiguousarray(a.transpose(2, 1, 0) if a.ndim == 3 else a.transpose(2, 1, 0, 3))
    t = torch.from_numpy(c)
    return t.permute(2, 1, 0) if a.ndim == 3 else t.permute(2, 1, 0, 3)


#: in a DataLoader worker that resamples (set as it starts): its :class:`ResampleInWorkers`
_HERE = None
#: per thread: whether the samples fetched now go to an engine's pipeline (an inline loader's
#: fetch, in its engine's thread: the transforms it runs hand their boxes over, even inside a
#: worker that resamples)
_FETCH = threading.local()


def here():
    """This worker's resampler, or None (the main process; workers that hand boxes over; an
    inline loader's fetch)."""
    return None if getattr(_FETCH, "boxes", False) else _HERE


def fetch_boxes(it):
    """``next(it)`` (an inline loader's DataLoader iterator), its transforms handing their
    boxes over whatever :func:`here` would say; StopIteration at the end."""
    before = getattr(_FETCH, "boxes", False)
    _FETCH.boxes = True
    try:
        return next(it)
    finally:
        _FETCH.boxes = before


class ResampleInWorkers:
    """A DataLoader's ``worker_init_fn`` that makes each worker, as it starts, resample the
    samples of every :class:`~medproc.proxy.ProxyTransform` it runs (the server's, a copy of
    it, or one made apart: plans from the transform's spec, voxels by the server's ``graph``,
    as the server's own pipeline would) on an engine of its own (DALI's CPU backend,
    ``threads`` threads, None: the worker's share of the cores; built in the worker, never
    inherited through the fork), then calls the user's ``then``. Outputs go back in pieces of
    the loader's ``arena`` (anonymous shared memory: no ``/dev/shm`` file and no file
    descriptor per output; a shared-memory tensor, copied by the main process, only when no
    piece is free)."""

    def __init__(self, arena, graph, threads: int | None = None, then=None):
        self.arena, self.graph, self.threads, self.then = arena, graph, threads, then
        self._engine = None

    def __call__(self, worker_id: int) -> None:
        global _HERE
        from ._malloc import keep_scratch

        keep_scratch()  # (this worker's DALI scratch reused sample after sample)
        self._engine, _HERE = None, self
        if self.then is not None:
            self.then(worker_id)

    def resample(self, array, labels, plan) -> Finished:
        """One sample through this worker's pipeline, its outputs in arena pieces."""
        from .pipeline import Engine, Job

        if self._engine is None:
            self._engine = Engine("cpu", batch_size=1, num_threads=self.threads)
        (res,) = self._engine.run([Job(array, plan, tuple(labels))], self.graph)
        return Finished(self._ship(np.asarray(a)) for a in res)

    def _ship(self, a: np.ndarray):
        slot = self.arena.put_as_is(a) if self.arena is not None else None
        if slot is None:
            import torch

            return torch.from_numpy(np.ascontiguousarray(a))
        return slot


_BOXES = ("boxes", "boxes_world", "box_labels", "box_lesion")
_PER_SAMPLE = ("lesions", "meta", *_BOXES)


def collate(samples: list[dict]) -> dict:
    """Batch dicts: tensors and DALI proxy references via torch's default_collate; lesions,
    boxes (their number varies per sample) and meta as per-sample lists."""
    import torch
    from torch.utils.data import default_collate

    out = {}
    for key in samples[0]:
        vals = [s[key] for s in samples]
        if key in _PER_SAMPLE or isinstance(vals[0], (Pending, Finished)):
            if key in _BOXES:
                vals = [torch.from_numpy(np.asarray(v)) for v in vals]
            out[key] = vals
        elif key == "affine":
            out[key] = torch.from_numpy(np.stack(vals))
        else:
            out[key] = default_collate(vals)
    return out
