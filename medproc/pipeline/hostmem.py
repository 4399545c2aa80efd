"""Page-locked host memory for a process that feeds DALI GPU pipelines from numpy and takes their
outputs back into memory it owns (``medproc convert --device gpu``'s service processes), through
NVIDIA's CUDA Python bindings (``cuda-bindings``; no PyTorch).

- :class:`Registered` page-locks the parts of an existing block (the service's shared arena) as
  they are used, each piece a registration of its own: DALI's host -> device copy of a volume
  read from there is then a DMA transfer, not a copy through the driver's staging buffers.
  (The proxy's arena is page-locked whole, with one call of it.)
- :func:`copy_out` copies GPU outputs straight into host arrays (one DMA transfer each when
  they are registered), instead of DALI's host copy followed by a copy into the arena.

Measured on the H200 node (``scripts/probe_pin.py``), a batch of 4 CT volumes (4 x 100 MB
int16 in, 4 x 42 MB float32 out) through a GPU resize: feeding from pageable memory took 53-64
ms of the process's CPU, from registered memory 11 ms; the outputs through DALI's host copy and
a copy into shared memory 42 ms, copied there straight from the GPU by one ``cudaMemcpyAsync``
each 13 ms (into pageable memory in that probe; the service registers its output pieces too).
Registering pages already in memory costs ~4 ms per 128 MiB, undoing it ~2 ms; pages never
touched ~0.4 ms per MB (they are committed).

Without ``cuda-bindings`` (or when CUDA refuses a registration) everything still works, through
pageable memory.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["available", "Registered", "copy_out", "destination"]

PAGE = mmap.PAGESIZE


def _rt():
    from cuda.bindings import runtime

    return runtime


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether the CUDA Python bindings can be loaded here (asked once per process)."""
    try:
        _rt()
    except Exception:  # noqa: BLE001 - not installed, or no driver library to bind to
        return False
    return True


def _ok(res) -> bool:
    err = res[0] if isinstance(res, tuple) else res
    return int(err) == 0


def _check(res, what: str) -> None:
    if not _ok(res):
        err = res[0] if isinstance(res, tuple) else res
        raise RuntimeError(f"{what}: CUDA error {int(err)} ({getattr(err, 'name', err)})")


class Registered:
    """Page-locks the pieces of ``[base, base + nbytes)`` (this process's memory) that
    :meth:`ensure` asks for, each piece a registration of its own, pages rounded out: a copy to
    or from the GPU must lie within one registration (CUDA refuses one spanning two, e.g. slabs
    registered apart: invalid argument). Registrations a new piece overlaps (of pieces given
    back since, whose room was taken again) are undone first, once the GPU is idle. After a
    refusal it stops trying (a WARNING): copies then go through pageable memory, as without
    it."""

    def __init__(self, base: int, nbytes: int):
        self.base, self.nbytes = int(base), int(nbytes)
        self.ranges: dict[int, int] = {}  # registered: start -> end (offsets, page-rounded)
        self.off = False
        self.pid = os.getpid()

    @property
    def locked(self) -> int:
        """Bytes page-locked now."""
        return sum(e - s for s, e in self.ranges.items())

    def ensure(self, offset: int, nbytes: int) -> bool:
        """Page-lock ``[offset, offset + nbytes)`` of the block (pages rounded out) as one
        registration, unless it is one already; True when it is page-locked."""
        if self.off:
            return False
        start = offset // PAGE * PAGE
        end = min(self.nbytes, -(-(offset + max(1, nbytes)) // PAGE) * PAGE)
        if self.ranges.get(start) == end:
            return True
        rt = _rt()
        stale = [s for s, e in self.ranges.items() if s < end and start < e]
        if stale:  # no copy may still read or write them
            _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        for s in stale:
            del self.ranges[s]
            if not _ok(rt.cudaHostUnregister(self.base + s)):
                rt.cudaGetLastError()
        if not _ok(rt.cudaHostRegister(self.base + start, end - start, 0)):
            rt.cudaGetLastError()  # not left behind as CUDA's last error for DALI to see
            self.off = True
            log.warning(
                "page-locking memory for the GPU was refused: copies go through pageable "
                "memory (with medproc convert --device gpu, MEDPROC_GPU_SERVICES=2 may be faster)"
            )
            return False
        self.ranges[start] = end
        return True

    def close(self) -> None:
        """Undo every registration (in the process that made them; a no-op elsewhere)."""
        if os.getpid() != self.pid or not self.ranges:
            return
        rt = _rt()
        rt.cudaDeviceSynchronize()
        for s in list(self.ranges):
            if not _ok(rt.cudaHostUnregister(self.base + s)):
                rt.cudaGetLastError()
        self.ranges.clear()


def destination(dest, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The array ``dest`` gives for an output of ``shape`` and ``dtype`` (checked: the copy
    writes its bytes blindly), or a new one where it gives None."""
    a = dest(shape, dtype)
    if a is None:
        return np.empty(shape, dtype)
    if not isinstance(a, np.ndarray):
        raise TypeError(f"into() must give a numpy array or None, got {type(a).__name__}")
    if a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(
            f"into() gave a {a.dtype} array of shape {a.shape} "
            f"(C-contiguous: {a.flags.c_contiguous}) for a {dtype} output of shape {shape}"
        )
    return a


def copy_out(tensor_lists, n: int, dest) -> list[list]:
    """Copy the first ``n`` samples of each DALI GPU output column (``TensorListGPU``) into
    the host arrays ``dest(shape, dtype)`` gives (C-ordered, of that shape and dtype; a new
    array where it gives None), on the columns' streams, and wait for the copies. Every
    destination is asked for before the first copy starts (asking may page-lock memory, which
    must not happen under a running copy), and the copies started are waited for whatever
    happens. Returns the columns' arrays."""
    from nvidia.dali.types import to_numpy_type

    rt = _rt()
    plan = []
    for tl in tensor_lists:
        samples = [tl[i] for i in range(n)]
        plan.append(
            (
                tl,
                [
                    (t, destination(dest, tuple(t.shape()), np.dtype(to_numpy_type(t.dtype))))
                    for t in samples
                ],
            )
        )
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    streams: set[int] = set()
    done = False
    try:
        for tl, col in plan:
            stream = int(getattr(tl, "stream", 0) or 0)
            if stream == 0:  # outputs not tied to a stream DALI names: wait for all its work
                _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
            for t, dst in col:
                streams.add(stream)
                _check(
                    rt.cudaMemcpyAsync(dst.ctypes.data, t.data_ptr(), dst.nbytes, kind, stream),
                    "cudaMemcpyAsync (device to host)",
                )
        done = True
    finally:
        for s in streams:
            res = rt.cudaStreamSynchronize(s)
            if done:
                _check(res, "cudaStreamSynchronize")
    return [[dst for _, dst in col] for _, col in plan]
