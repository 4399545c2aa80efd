"""The proxy's transfer arena: one block of shared memory, made before the DataLoader workers
fork and page-locked for the GPU, cut into slots that workers fill with a sample's input box.

Why: handing each box over as a new shared-memory tensor costs the main process a fresh mapping,
page faults and a staging copy per sample, and capped the proxy at about 1 GB/s of input on the
H200 node. From the arena the GPU copies a slot directly (it is pinned), so the main process
touches no voxel. A worker takes a free slot without waiting; when none is free (or the box does
not fit) it falls back to a shared-memory tensor, so nothing can deadlock.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["Arena", "Slot"]


def _unregister(cudart, ptr: int, pid: int) -> None:
    if os.getpid() == pid:  # never in a forked worker: CUDA does not exist there
        cudart.cudaHostUnregister(ptr)


class Slot:
    """A reference to a filled slot: ``(index, shape, dtype)`` of a C-ordered DHW[C] array."""

    __slots__ = ("index", "shape", "dtype")

    def __init__(self, index: int, shape: tuple, dtype: str):
        self.index, self.shape, self.dtype = index, shape, dtype


class Arena:
    """``slots`` slots of ``slot_bytes`` bytes in shared memory (pinned when CUDA is there).

    Parameters
    ----------
    slots : int
        How many boxes can be in flight (workers x prefetch x batch + what the engine holds).
    slot_bytes : int
        The largest box a slot takes; larger ones go through a shared-memory tensor.
    pin : bool
        Page-lock the block for fast direct host -> device copies (``cudaHostRegister``).
    """

    def __init__(self, slots: int, slot_bytes: int, pin: bool):
        import multiprocessing

        import torch

        self.slot_bytes = int(slot_bytes)
        self.block = torch.zeros(int(slots) * self.slot_bytes, dtype=torch.uint8).share_memory_()
        self.pinned = False
        if pin and torch.cuda.is_available():
            import weakref

            cudart = torch.cuda.cudart()
            ptr = self.block.data_ptr()
            rc = cudart.cudaHostRegister(ptr, self.block.numel(), 0)
            self.pinned = int(rc) == 0
            if self.pinned:  # unregistered before the memory goes back (it may be reused)
                weakref.finalize(self, _unregister, cudart, ptr, os.getpid())
            else:  # a failed registration must not linger as CUDA's last error
                cudart.cudaGetLastError()
        ctx = multiprocessing.get_context("fork")
        self._lock = ctx.Lock()
        self._used = ctx.RawArray("b", int(slots))  # 1 = taken; shared with the workers

    def put(self, region: np.ndarray) -> Slot | None:
        """Copy an ``(i, j, k[, C])`` region into a free slot in DALI's layout (one copy, in a
        worker); None when no slot is free right now or the region does not fit."""
        dhw = region.transpose(2, 1, 0) if region.ndim == 3 else region.transpose(2, 1, 0, 3)
        if dhw.nbytes > self.slot_bytes:
            return None
        with self._lock:
            n = next((i for i, u in enumerate(self._used) if not u), None)
            if n is None:
                return None
            self._used[n] = 1
        view = self.block.numpy()[n * self.slot_bytes : n * self.slot_bytes + dhw.nbytes]
        np.copyto(view.view(dhw.dtype).reshape(dhw.shape), dhw)
        return Slot(n, tuple(dhw.shape), str(dhw.dtype))

    def tensor(self, slot: Slot):
        """The slot's data as an ``(i, j, k[, C])`` tensor view (no copy; pinned when the arena
        is)."""
        import torch

        dt = getattr(torch, slot.dtype)
        size = int(np.prod(slot.shape)) * torch.empty(0, dtype=dt).element_size()
        start = slot.index * self.slot_bytes
        t = self.block[start : start + size].view(dt).view(slot.shape)
        return t.permute(2, 1, 0) if t.ndim == 3 else t.permute(2, 1, 0, 3)

    def release(self, slot: Slot) -> None:
        """Give a slot back once the engine has copied it."""
        with self._lock:
            self._used[slot.index] = 0
