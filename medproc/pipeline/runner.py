"""A runner: one DALI pipeline of the engine with its staging buffers, used by one thread.

Private to :mod:`medproc.pipeline`; the engine (:mod:`.engine`) creates runners through the
per-thread cache (:mod:`.cache`).
"""

from __future__ import annotations

import sys

import numpy as np

from ._dtypes import _astype, _dtype_name, _is_torch
from .graphs import Graph, build_resample, plan_inputs, to_dhwc

__all__ = ["Runner", "stacked"]


class Runner:
    """One DALI pipeline with its staging buffers; used by one thread only."""

    def __init__(self, engine, graph: Graph, mode: str, intensity: bool):
        self.device, self.device_id = engine.device, engine.device_id
        self.graph, self.mode, self.intensity = graph, mode, intensity
        self.pipe = build_resample(
            graph,
            mode,
            intensity,
            engine.device,
            engine.pipe_batch,
            engine.num_threads,
            engine.device_id,
        )
        self._stream = None
        self._rings: list[dict] = [{}, {}, {}]  # pinned staging, one set per batch in flight
        self._ring = 0
        #: batches scheduled and not collected (a consumer that stopped early leaves some)
        self.pending = 0
        #: a feed or run failed: the pipeline's queues are in an unknown state, build anew
        self.broken = False
        #: the host arrays DALI's CPU backend reads in place (``no_copy``), per batch in flight:
        #: each is kept alive until its batch's outputs are collected
        self._held: list[list] = []

    def start(self, jobs: list) -> int:
        """Feed ``jobs`` and schedule their run; returns how many."""
        while self.pending:  # outputs nobody collected must not be handed to this batch
            self.pipe.outputs()
            self.pending -= 1
            self._held.pop(0)
        try:
            self._feed(jobs)
            self.pipe.schedule_run()
        except BaseException:
            self.broken = True
            raise
        self.pending += 1
        return len(jobs)

    def _feed(self, jobs: list) -> None:
        held: list = []
        self._held.append(held)  # (a failed feed leaves the runner broken: never reused)
        arrays = [[j.image, *j.labels] for j in jobs]
        names = ["img"] + [f"lab{n}" for n in range(self.graph.labels)]
        staged = self.device == "gpu" and _torch_here(arrays)
        # host arrays staged in a pinned block are copied there from a DHWC view: a contiguous
        # DHWC copy first would copy each (strided) box twice
        dhwc = [[to_dhwc(a, contiguous=not staged) for a in row] for row in arrays]
        if staged:
            import torch

            ring = self._rings[self._ring]
            self._ring = (self._ring + 1) % len(self._rings)
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device_id)
            # CUDA inputs (and their DHWC copies) were made on the caller's stream: the side
            # stream DALI reads on waits for them, and their memory is not reused before
            self._stream.wait_stream(torch.cuda.current_stream(self.device_id))
            for row in dhwc:
                for a in row:
                    if isinstance(a, torch.Tensor) and a.is_cuda:
                        a.record_stream(self._stream)
            # column by column: a column's host boxes of one size may lie back to back (see
            # _stage_offsets)
            flat = self._to_device([row[c] for c in range(len(names)) for row in dhwc], ring)
            b = len(dhwc)
            for c, name in enumerate(names):
                self.pipe.feed_input(
                    name,
                    _dense(flat[c * b : (c + 1) * b]),
                    layout="DHWC",
                    cuda_stream=self._stream.cuda_stream,
                )
        else:  # numpy: DALI's CPU backend reads it in place (kept alive until collected);
            # on the GPU (a process without PyTorch, ``medproc convert --device gpu``'s
            # service) DALI copies it to the GPU itself
            cpu = self.device == "cpu"
            for c, name in enumerate(names):
                col = [np.asarray(row[c]) for row in dhwc]
                self.pipe.feed_input(name, col, layout="DHWC")
                held.extend(col if cpu else ())
        for name, vals in plan_inputs(
            [j.plan for j in jobs], self.mode, self.intensity, self.graph
        ).items():
            self.pipe.feed_input(name, np.stack(vals))  # one (B, ...) array: one conversion

    def _to_device(self, arrays: list, ring: dict) -> list:
        """Inputs -> CUDA tensors on this runner's side stream. Host arrays of the batch are
        staged together in one pinned block (numpy copies) and cross in one copy, then are
        viewed apart: a few tensor calls per array instead of a copy each (each tensor call of
        the engine's background thread waits for the interpreter lock, which a training loop
        holds most of the time). The block is reused every third batch, once the copy that
        read it has finished."""
        import torch

        dev = f"cuda:{self.device_id}"
        out: list = [None] * len(arrays)
        host = []
        with torch.cuda.stream(self._stream):
            for n, a in enumerate(arrays):
                if isinstance(a, torch.Tensor) and (a.is_cuda or a.is_pinned()):
                    on = a.is_cuda and a.device.index == self.device_id
                    out[n] = a if on else a.to(dev, non_blocking=True)
                else:  # in native byte order: the engine's _check converted the others
                    host.append((n, a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)))
            if not host:
                return out
            offsets, total = _stage_offsets([a for _, a in host])
            block, copied = ring.get("block"), ring.get("copied")
            if copied is not None:  # the copy that last read this block (long done, normally)
                copied.synchronize()
            if block is None or block.numel() < total:
                block = ring["block"] = torch.empty(
                    max(total, 1 << 20), dtype=torch.uint8, pin_memory=True
                )
            staged = block.numpy()
            for (_, a), at in zip(host, offsets):
                np.copyto(staged[at : at + a.nbytes].view(a.dtype).reshape(a.shape), a)
            on_dev = block[:total].to(dev, non_blocking=True)
            ring["copied"] = torch.cuda.Event()
            ring["copied"].record(self._stream)
            for (n, a), at in zip(host, offsets):
                dt = getattr(torch, a.dtype.name)  # numpy's and torch's names agree
                out[n] = on_dev[at : at + a.nbytes].view(dt).view(a.shape)
        return out

    def collect(
        self,
        n: int,
        as_torch: bool,
        stream=None,
        dense: bool = False,
        into=None,
    ) -> list[tuple]:
        """The outputs of the oldest scheduled batch of ``n`` samples. ``dense`` (GPU, torch):
        the samples of an output may be the rows of one batch tensor (see :func:`stacked`).
        ``into`` (numpy out): each DALI output sample (DHWC) is copied into the array
        ``into(shape, dtype)`` gives (a new one where it gives None); from the GPU straight,
        with the CUDA bindings (:func:`.hostmem.copy_out`)."""
        try:
            outs = self.pipe.outputs()
        except BaseException:
            self.broken = True
            raise
        self.pending -= 1
        self._held.pop(0)
        if into is not None and not as_torch:
            cols = _into(self.device, outs, n, into)
        elif self.device == "gpu" and not as_torch and "torch" not in sys.modules:
            outs = [o.as_cpu() for o in outs]  # numpy out: one copy per output column
            cols = [[np.array(o[i]) for i in range(n)] for o in outs]
        elif self.device == "gpu" and as_torch and dense:
            cols = [self._out_batch(o, n, stream) for o in outs]
        else:
            cols = [[self._out(o[i], as_torch, stream) for i in range(n)] for o in outs]
        res = []
        for arrs in zip(*cols):
            if not self.graph.channels_first:  # DHWC -> (i, j, k[, C]), a view
                arrs = [_from_dhwc(a) for a in arrs]
            res.append(tuple(arrs))
        return res

    def _out_batch(self, tl, n: int, stream) -> list:
        """A GPU output column as CUDA tensors: when every sample has one shape, one copy into
        a ``(n, ...)`` tensor whose rows are the samples (views; one call instead of ``n``),
        else one tensor per sample."""
        shapes = {tuple(x) for x in tl.shape()}
        dense = None
        if len(shapes) == 1:
            try:
                dense = tl.as_tensor()
            except RuntimeError:  # not contiguous in memory: sample by sample
                pass
        if dense is None:
            return [self._out(tl[i], True, stream) for i in range(n)]
        import torch
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        (shape,) = shapes
        dst = torch.empty(
            (n, *shape), dtype=to_torch_type[dense.dtype], device=f"cuda:{self.device_id}"
        )
        feed_ndarray(dense, dst, cuda_stream=stream or torch.cuda.current_stream(self.device_id))
        return list(dst.unbind(0))

    def _out(self, t, as_torch: bool, stream):
        if self.device == "cpu":
            a = np.array(t)
            if as_torch:
                import torch

                return torch.from_numpy(a)
            return a
        import torch
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        dst = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=f"cuda:{self.device_id}")
        s = stream or torch.cuda.current_stream(self.device_id)
        feed_ndarray(t, dst, cuda_stream=s)
        if as_torch:
            return dst
        s.synchronize()
        return dst.cpu().numpy()


def _stage_offsets(arrays: list) -> tuple[list[int], int]:
    """Byte offsets of host arrays in one staging block (each on a 256-byte boundary), and the
    block's size. Arrays of one shape whose size is a multiple of 256 bytes lie back to back:
    the rows of one batch tensor, which :func:`_dense` feeds to DALI in one piece; others
    (e.g. 98^3 boxes: 96^3 patches and their interpolation margin) go sample by sample.

    >>> _stage_offsets([np.zeros(128, np.int16)] * 2 + [np.zeros(3, np.float32)])
    ([0, 256, 512], 524)
    """
    offsets, total = [], 0
    for a in arrays:
        total = -(-total // 256) * 256
        offsets.append(total)
        total += a.nbytes
    return offsets, total


def _dense(tensors: list):
    """A column of CUDA samples as one ``(B, ...)`` tensor when they are back-to-back rows of one
    memory block (equal shapes and dtypes, contiguous, in order: as :func:`medproc.monai._columns.gathered` boxes lie,
    and staged host boxes of a multiple of 256 bytes), so that DALI takes the batch in one piece
    instead of converting sample by sample (each conversion is interpreter time in the engine's
    thread, time a training loop waits for); else the list as it is."""
    first = tensors[0]
    step = first.numel()
    base = first.untyped_storage().data_ptr()
    for b, t in enumerate(tensors):
        if (
            t.shape != first.shape
            or t.dtype != first.dtype
            or not t.is_contiguous()
            or t.untyped_storage().data_ptr() != base
            or t.storage_offset() != first.storage_offset() + b * step
        ):
            return tensors
    return first.as_strided(
        (len(tensors), *first.shape), (step, *first.stride()), first.storage_offset()
    )


def stacked(tensors: list):
    """The tensors stacked into one ``(n, ...)`` tensor. Without a copy when they are the rows,
    in order, of one contiguous batch tensor (as a GPU batch comes out of
    :meth:`Engine.stream <medproc.pipeline.engine.Engine.stream>`); on the CPU with numpy's
    single-threaded stack (torch's OpenMP threads would spin against DALI's for the same cores:
    20-90 ms per batch on 2 cores)."""
    import torch

    first = tensors[0]
    base = getattr(first, "_base", None)
    if (
        base is not None
        and base.is_contiguous()
        and base.dtype == first.dtype
        and tuple(base.shape) == (len(tensors), *first.shape)
        and all(
            t._base is base
            and t.dtype == base.dtype
            and tuple(t.shape) == tuple(first.shape)
            and t.is_contiguous()
            and t.storage_offset() == base.storage_offset() + i * base.stride(0)
            for i, t in enumerate(tensors)
        )
    ):
        return base
    if not first.is_cuda:
        return torch.from_numpy(np.stack([t.numpy() for t in tensors]))
    return torch.stack(tensors)


def _torch_here(dhwc: list) -> bool:
    """Whether the feed goes through PyTorch: some input is a tensor, or PyTorch is loaded
    (then host inputs are staged in one pinned block, see :meth:`Runner._to_device`)."""
    return "torch" in sys.modules or any(_is_torch(a) for row in dhwc for a in row)


def _into(device: str, outs, n: int, into) -> list[list]:
    """The output columns copied into the arrays ``into`` gives (see :meth:`Runner.collect`)."""
    from . import hostmem

    if device == "gpu" and hostmem.available():
        return hostmem.copy_out(outs, n, into)
    host = [o.as_cpu() for o in outs] if device == "gpu" else outs
    cols = []
    for h in host:
        col = []
        for i in range(n):
            src = np.asarray(h[i])
            dst = hostmem.destination(into, src.shape, src.dtype)
            np.copyto(dst, src)
            col.append(dst)
        cols.append(col)
    return cols


def _from_dhwc(a):
    """DALI's (k, j, i, C) output as (i, j, k) or (i, j, k, C): a view."""
    if a.shape[-1] == 1:
        a = a[..., 0]
        return a.permute(2, 1, 0) if _is_torch(a) else a.transpose(2, 1, 0)
    return a.permute(2, 1, 0, 3) if _is_torch(a) else a.transpose(2, 1, 0, 3)


def _restored(res: list[tuple], restore: list[list[str]]) -> list[tuple]:
    """Each job's labels back in the dtypes they came in (``restore``: per job; they were fed
    in one dtype DALI resamples exactly, the batch's: a uint8 label beside an int16 one came
    back int16, or an int16 one beside a uint8 one wrapped, 300 -> 44)."""
    if not any(
        _dtype_name(x) != d for row, want in zip(res, restore) for x, d in zip(row[1:], want)
    ):
        return res
    return [
        (row[0], *(_astype(x, d) for x, d in zip(row[1:], want))) for row, want in zip(res, restore)
    ]
