"""Notes a batch's cases share, printed once: a note that many cases get word for word (the
label-tie note of a common grid, an integer ``--dtype`` that clips) is printed for its first case
only, and the command's summary counts the repeats; every case's manifest row and sidecar still
record it. A run of 500 cases on a tying grid printed the same 400-character note 500 times.

The batch's processes share one small table of the notes' hashes in shared memory (pool workers,
forked or spawned, get it through their initializer; Dask workers print every note).
"""

from __future__ import annotations

import hashlib
import multiprocessing

__all__ = ["Said"]


class Said:
    """Which notes this batch has printed (``SIZE`` distinct ones at most; more are printed
    every time)."""

    SIZE = 256

    def __init__(self):
        # (a spawn context's lock may go to forked and spawned workers alike; a fork context's
        # is refused by spawned ones, and the batch's pool may be either)
        ctx = multiprocessing.get_context("spawn")
        self._lock = ctx.Lock()
        self._keys = ctx.RawArray("Q", self.SIZE)  # 0: free
        self._repeats = ctx.RawValue("q", 0)

    def first(self, note: str) -> bool:
        """True the first time ``note`` is offered in this batch (print it); False after (the
        repeat is counted)."""
        digest = hashlib.blake2b(note.encode("utf-8", "replace"), digest_size=8).digest()
        key = int.from_bytes(digest, "little") or 1
        if not self._lock.acquire(timeout=1):  # (a worker killed holding it: say it)
            return True
        try:
            for n in range(self.SIZE):
                if self._keys[n] == key:
                    self._repeats.value += 1
                    return False
                if self._keys[n] == 0:
                    self._keys[n] = key
                    return True
            return True
        finally:
            self._lock.release()

    @property
    def repeats(self) -> int:
        """How many times a note was not printed again."""
        return self._repeats.value
