"""The proxy's transfer arena: one block of shared memory, made before the DataLoader workers
fork and page-locked for the GPU, from which workers take a piece of exactly the size of a
sample's input box (or, on the CPU, of its outputs).

Why: handing each box over as a new shared-memory tensor costs the main process a file
descriptor passed over a socket, a fresh mapping, page faults and a staging copy per sample: on
the H200 node that took a third of the main process's time and capped the proxy near 280
samples/s. From the arena the GPU copies a piece directly (it is pinned), so the main process
touches no voxel. Pieces have any size (crops and whole volumes alike): a worker takes the first
gap that fits, without waiting; when none does it falls back to a shared-memory tensor, so
nothing can deadlock. On DALI's CPU backend the workers resample and write their outputs
into the arena instead (:mod:`medproc._proxy_items`); :mod:`medproc._proxy_stream` is the main
process's side. A piece is read once: each take of an entry gets a new generation, and a
:class:`Slot` handed over again (a transform's output a dataset kept and returned twice) is
refused instead of reading another sample's data.
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np

__all__ = ["Arena", "Slot", "WithArena", "arena_bytes", "populate"]

_ALIGN = mmap.PAGESIZE  # pieces start on page boundaries (madvise needs them there)
#: madvise(2) advice that maps a range's pages now, in one call (Linux 5.14+; not in Python's
#: mmap module): for reading, and for writing (committing pages not yet in memory)
MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23


def populate(mm, start: int = 0, length: int = 0, write: bool = False) -> None:
    """Map the pages of ``mm`` (an ``mmap.mmap``) in ``[start, start + length)`` (0: to the
    end) into this process now, in one call; a no-op where the kernel cannot (before Linux
    5.14, other systems): the pages then fault in one by one as they are touched.

    Why: shared memory is mapped page by page, a fault per 4 KiB page per process. On the
    H200 node copying 100 MB into fresh shared memory took 94 ms (25,600 faults) and into pages
    another process had committed 61 ms; the same copy after this call 17 ms, the call itself
    3 ms for pages already committed and 65 ms for new ones."""
    if not sys.platform.startswith("linux"):
        return
    advice = MADV_POPULATE_WRITE if write else MADV_POPULATE_READ
    try:
        mm.madvise(advice, start, length) if length > 0 else mm.madvise(advice, start)
    except (OSError, ValueError):  # an older kernel
        pass


class Slot:
    """A reference to a filled piece: its entry in the table, byte offset, the ``shape`` and
    ``dtype`` of the C-ordered array in it (an input box's DHW[C], an output's (C, i, j, k)),
    and the entry's generation when it was taken."""

    __slots__ = ("index", "offset", "shape", "dtype", "gen")

    def __init__(self, index: int, offset: int, shape: tuple, dtype: str, gen: int = 0):
        self.index, self.offset, self.shape, self.dtype = index, offset, shape, dtype
        self.gen = gen


class Arena:
    """``nbytes`` of shared memory (pinned when CUDA is there) holding up to ``entries`` pieces.

    Parameters
    ----------
    nbytes : int
        The block's size: what the boxes in flight may take together.
    entries : int
        How many pieces can be taken at once (workers x prefetch x batch + what the engine
        holds).
    pin : bool
        Page-lock the block for fast direct host -> device copies (``cudaHostRegister``).
    """

    def __init__(self, nbytes: int, entries: int, pin: bool):
        import multiprocessing

        self.nbytes = int(nbytes)
        if pin:
            import torch

            pin = torch.cuda.is_available()
        self._map = None  # (pinned: a tensor's shared memory, page-locked whole)
        if pin:  # page-locked whole below: committed at once anyway
            self._tensor = torch.empty(self.nbytes, dtype=torch.uint8).share_memory_()
            self.bytes = self._tensor.numpy()
        else:  # anonymous shared memory, inherited by the forked workers and committed page by
            # page as pieces are first written (first fit keeps reusing the low pages); no
            # torch needed (``medproc convert``'s forked workers never import it)
            self._map = mmap.mmap(-1, max(1, self.nbytes))
            self.bytes = np.frombuffer(self._map, dtype=np.uint8)
        self.pinned = pin and self._pin()
        ctx = multiprocessing.get_context("fork")
        self._lock = ctx.Lock()
        # the pieces taken, shared with the workers: (offset, size); size 0 = a free entry
        self._start = ctx.RawArray("q", int(entries))
        self._size = ctx.RawArray("q", int(entries))
        self._gen = ctx.RawArray("q", int(entries))  # (taken how many times: see Slot)

    def _pin(self) -> bool:
        """Page-lock the block whole (one ``cudaHostRegister``, :mod:`medproc.pipeline.hostmem`)
        for this process's copies to the GPU, undone when the arena goes; True when it is."""
        import weakref

        from .pipeline import hostmem

        if not hostmem.available():
            return False
        pins = hostmem.Registered(self.bytes.ctypes.data, self.bytes.nbytes)
        if not pins.ensure(0, self.bytes.nbytes):
            return False
        weakref.finalize(self, pins.close)  # (before the memory goes back: it may be reused)
        return True

    def _take(self, size: int) -> tuple[int, int, int] | None:
        """(entry, offset, generation) of a free piece of ``size`` bytes (first fit), taken;
        None if none."""
        with self._lock:
            sizes = self._size[:]
            free = next((i for i, s in enumerate(sizes) if s == 0), None)
            if free is None:
                return None
            taken = sorted((self._start[i], s) for i, s in enumerate(sizes) if s)
            at = 0
            for start, s in taken:
                if start - at >= size:
                    break
                at = max(at, -(-(start + s) // _ALIGN) * _ALIGN)
            if at + size > self.nbytes:
                return None
            self._start[free], self._size[free] = at, size
            self._gen[free] += 1
            return free, at, self._gen[free]

    def _alloc(self, dhw_shape: tuple, dtype) -> Slot | None:
        """Take a free piece for a C-ordered array of ``dhw_shape`` and ``dtype``; None when
        none of its size is free right now."""
        dtype = np.dtype(dtype)
        got = self._take(max(1, int(np.prod(dhw_shape)) * dtype.itemsize))
        if got is None:
            return None
        return Slot(got[0], got[1], tuple(int(x) for x in dhw_shape), str(dtype), got[2])

    def take(self, dhw_shape: tuple, dtype) -> tuple[Slot, np.ndarray] | None:
        """A free piece for a C-ordered array of ``dhw_shape`` and ``dtype`` and that array (a
        view of the piece, its pages mapped for writing); None when none is free right now."""
        slot = self._alloc(dhw_shape, dtype)
        return None if slot is None else (slot, self._dhw(slot, write=True))

    def put(self, region: np.ndarray) -> Slot | None:
        """Copy an ``(i, j, k[, C])`` region into a free piece in DALI's layout (one copy, in
        a worker); None when no piece of its size is free right now."""
        return self.put_as_is(
            region.transpose(2, 1, 0) if region.ndim == 3 else region.transpose(2, 1, 0, 3)
        )

    def put_as_is(self, a: np.ndarray) -> Slot | None:
        """Copy ``a`` into a free piece, C-ordered in its own shape; None when no piece of its
        size is free right now."""
        got = self.take(a.shape, a.dtype)
        if got is None:
            return None
        np.copyto(got[1], a)
        return got[0]

    def _held(self, slot: Slot) -> None:
        """Refuse a slot whose piece was given back (or taken again) since it was filled."""
        if self._size[slot.index] == 0 or self._gen[slot.index] != slot.gen:
            raise RuntimeError(
                "an arena piece was handed over twice (a sample the dataset kept from the "
                "proxy's transform and returned again?): call the transform for every sample "
                "the loader delivers, and keep only what the loader gives back"
            )

    def _dhw(self, slot: Slot, write: bool = False) -> np.ndarray:
        self._held(slot)
        dt = np.dtype(slot.dtype)
        n = int(np.prod(slot.shape)) * dt.itemsize
        if self._map is not None:  # (a pinned arena is mapped whole)
            populate(self._map, slot.offset, n, write)
        return self.bytes[slot.offset : slot.offset + n].view(dt).reshape(slot.shape)

    def array(self, slot: Slot) -> np.ndarray:
        """The piece's data as an ``(i, j, k[, C])`` numpy view (no copy), its pages mapped
        into this process."""
        dhw = self._dhw(slot)
        return dhw.transpose(2, 1, 0) if dhw.ndim == 3 else dhw.transpose(2, 1, 0, 3)

    def tensor(self, slot: Slot):
        """The piece's data as an ``(i, j, k[, C])`` tensor view (no copy; pinned when the
        arena is)."""
        import torch

        self._held(slot)
        dt = getattr(torch, slot.dtype)
        size = int(np.prod(slot.shape)) * torch.empty(0, dtype=dt).element_size()
        t = torch.from_numpy(self.bytes[slot.offset : slot.offset + size])
        t = t.view(dt).view(slot.shape)
        return t.permute(2, 1, 0) if t.ndim == 3 else t.permute(2, 1, 0, 3)

    def commit(self, nbytes: int, threads: int = 8) -> None:
        """Commit the first ``nbytes`` of an unpinned arena now (``MADV_POPULATE_WRITE``,
        Linux 5.14+; a no-op elsewhere), split over ``threads`` threads (each call leaves
        the interpreter lock). First fit keeps reusing the low pages, so pieces taken later
        land on pages that exist: mapping them costs a worker ~3 ms per 100 MB, against
        65-94 ms for pages the kernel must first allocate and zero."""
        if self._map is None or not sys.platform.startswith("linux"):
            return
        import ctypes
        from concurrent.futures import ThreadPoolExecutor

        libc = ctypes.CDLL(None, use_errno=True)
        base, nbytes = self.bytes.ctypes.data, min(int(nbytes), self.nbytes)
        step = max(_ALIGN, -(-nbytes // max(1, threads) // _ALIGN) * _ALIGN)

        def one(at: int) -> None:
            n = ctypes.c_size_t(min(step, nbytes - at))
            libc.madvise(ctypes.c_void_p(base + at), n, MADV_POPULATE_WRITE)  # (errors: no-op)

        with ThreadPoolExecutor(max(1, threads)) as ex:
            list(ex.map(one, range(0, nbytes, step)))

    def release(self, slot: Slot) -> None:
        """Give a piece back once it has been copied (by the engine, or out)."""
        with self._lock:
            if self._gen[slot.index] == slot.gen:  # (not a piece taken again since)
                self._size[slot.index] = 0

    def take_out(self, slot: Slot):
        """The piece's array as a tensor of its own (a copy, in the slot's shape), the piece
        given back."""
        import torch

        t = torch.from_numpy(self._dhw(slot).copy())
        self.release(slot)
        return t

    def free_all(self) -> None:
        """Give every piece back, the lock kept: once an epoch has ended whole and no other is
        running (the workers idle), what is still taken was dropped unread (e.g. a sample the
        dataset drew and discarded)."""
        with self._lock:
            self._size[:] = [0] * len(self._size)

    def roomy(self) -> bool:
        """Whether at most half the entries and half the bytes are taken."""
        with self._lock:
            sizes = [s for s in self._size[:] if s]
        return len(sizes) * 2 <= len(self._size) and sum(sizes) * 2 <= self.nbytes

    def reset(self) -> None:
        """Give every piece back and renew the lock, once no other process uses the arena:
        the pieces of batches dropped unread would stay taken, and a worker terminated while
        it held the lock would hold it for ever (the next epoch's workers fork with the new)."""
        import multiprocessing

        self._lock = multiprocessing.get_context("fork").Lock()
        self._size[:] = [0] * len(self._size)


def arena_bytes(gb: float | None = None) -> int:
    """An arena's size: ``gb`` GiB, or by default 4 GiB at most (room for 16 workers' batches
    of 4 crops, or of whole CT volumes of ~30 MB) and an eighth of the host's memory shared by
    the ranks on it (``LOCAL_WORLD_SIZE``). On the CPU only the pages used are committed; on
    the GPU the whole arena is page-locked."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        ram = 16 * 2**30
    if gb is not None:
        if not 0 < gb * 2**30 <= ram:  # (more than the memory: a bare ENOMEM at loader())
            raise ValueError(
                f"arena_gb must be > 0 and at most the host's memory ({ram / 2**30:.0f} GiB), "
                f"got {gb}"
            )
        return int(gb * 2**30)
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1) or 1))
    return int(max(min(4 * 2**30, ram // 8 // ranks), 64 * 2**20))


class WithArena:
    """A DataLoader's ``worker_init_fn`` that points the transform at its loader's arena in
    each worker as it starts (then calls the user's ``then``). Set when the loader was made,
    the transform pointed at the arena of the server's last loader: a train loader's workers
    wrote into the val loader's arena, and the train batches came out zeros, without an error.
    In the main process the transform has no arena (an inline loader's samples stay tensors)."""

    def __init__(self, transform, arena: Arena, then=None):
        self.transform, self.arena, self.then = transform, arena, then

    def __call__(self, worker_id: int) -> None:
        self.transform.arena = self.arena
        if self.then is not None:
            self.then(worker_id)
