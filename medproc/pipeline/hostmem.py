"""Page-locked host memory for a process that feeds DALI GPU pipelines from numpy and takes their
outputs back into memory it owns (``medproc convert --device gpu``'s service processes), through
NVIDIA's CUDA Python bindings (``cuda-bindings``; no PyTorch).

- :class:`Registered` page-locks the parts of an existing block (the service's shared arena) as
  they are used, each piece a registration of its own: DALI's host -> device copy of a volume
  read from there is then a DMA transfer, not a copy through the driver's staging buffers.
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

import logging
import mmap

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["available", "Registered", "copy_out"]

PAGE = mmap.PAGESIZE


def _rt():
    from cuda.bindings import runtime

    return runtime


def available() -> bool:
    """Whether the CUDA Python bindings can be loaded here."""
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
    """Page-locks the parts of ``[base, base + nbytes)`` (this process's memory) that
    :meth:`ensure` asks for, each as a registration of its own: a copy to or from the GPU must
    lie within one registration (one spanning two, e.g. slabs registered apart, is refused by
    CUDA: invalid argument). A range not inside a registered one is registered after the
    registrations it overlaps (pieces given back since, whose room was taken again) are undone.
    After a refusal it stops trying (said once at INFO): copies then go through pageable memory,
    as without it."""

    def __init__(self, base: int, nbytes: int):
        self.base, self.nbytes = int(base), int(nbytes)
        self.ranges: dict[int, int] = {}  # registered: start -> end (offsets, page-rounded)
        self.off = False

    @property
    def locked(self) -> int:
        """Bytes page-locked now."""
        return sum(e - s for s, e in self.ranges.items())

    def ensure(self, offset: int, nbytes: int) -> bool:
        """Page-lock ``[offset, offset + nbytes)`` of the block (pages rounded out) unless it
        lies inside a registered range; True when it is page-locked."""
        if self.off:
            return False
        start = offset // PAGE * PAGE
        end = min(self.nbytes, -(-(offset + max(1, nbytes)) // PAGE) * PAGE)
        if any(s <= start and end <= e for s, e in self.ranges.items()):
            return True
        rt = _rt()
        for s in [s for s, e in self.ranges.items() if s < end and start < e]:
            del self.ranges[s]
            if not _ok(rt.cudaHostUnregister(self.base + s)):
                rt.cudaGetLastError()
        if not _ok(rt.cudaHostRegister(self.base + start, end - start, 0)):
            rt.cudaGetLastError()  # not left behind as CUDA's last error for DALI to see
            self.off = True
            log.info("page-locking the arena was refused: copies through pageable memory")
            return False
        self.ranges[start] = end
        return True


def copy_out(tensor_lists, n: int, dest) -> list[list]:
    """Copy the first ``n`` samples of each DALI GPU output column (``TensorListGPU``) into
    host arrays ``dest(shape, dtype)`` gives (C-ordered, of that shape and dtype, or None for
    a sample it has no room for), on the columns' streams, and wait for the copies. Returns
    the columns' arrays, None where ``dest`` gave none."""
    from nvidia.dali.types import to_numpy_type

    rt = _rt()
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    cols, streams = [], set()
    for tl in tensor_lists:
        stream = int(tl.stream or 0) if hasattr(tl, "stream") else 0
        if stream == 0:  # outputs not tied to a stream DALI names: wait for all its work
            _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        col = []
        for i in range(n):
            t = tl[i]
            dst = dest(tuple(t.shape()), np.dtype(to_numpy_type(t.dtype)))
            if dst is not None:
                _check(
                    rt.cudaMemcpyAsync(dst.ctypes.data, t.data_ptr(), dst.nbytes, kind, stream),
                    "cudaMemcpyAsync (device to host)",
                )
                streams.add(stream)
            col.append(dst)
        cols.append(col)
    for s in streams:
        _check(rt.cudaStreamSynchronize(s), "cudaStreamSynchronize")
    return cols
