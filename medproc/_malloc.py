"""DALI's CPU scratch memory kept between runs, in the processes medproc owns (glibc only).

DALI's CPU resize takes each sample's scratch from ``malloc`` in blocks of 32 MiB + 4 bytes,
above glibc's largest dynamic mmap threshold (32 MiB): every block is a fresh mapping, unmapped
when freed, whose pages fault again on every run. A 256 x 256 x 200 CT resampled to 1.5 mm RAS
(3 slabs, one thread, the 2-core machine) took 77-104 ms and ~11,000 page faults per run, and
50-61 ms and ~500 faults with such blocks taken from the heap (higher thresholds than these;
these measured alike); the same volume uncut, 43-45 ms either way. The thresholds are raised just past those blocks: a volume-sized array (larger)
is still a mapping of its own, given back when freed, and at most :data:`TRIM_THRESHOLD` of
free heap is kept. Set in the ``medproc`` command's process (the workers it forks inherit it;
the GPU route's spawned workers do no DALI CPU work) and in the proxy's CPU workers; a library
user's own process is left alone, and so is a process whose user set ``GLIBC_TUNABLES`` or
``MALLOC_*`` variables.
"""

from __future__ import annotations

import os

__all__ = ["keep_scratch"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
#: allocations below this come from the heap and are reused (DALI's blocks are 32 MiB + 4 B)
MMAP_THRESHOLD = 48 << 20
#: free memory at the heap's top kept for the next run, at most (a few such blocks)
TRIM_THRESHOLD = 160 << 20


def keep_scratch() -> bool:
    """Raise glibc's mmap and trim thresholds in this process (and those it forks later);
    False where this is not glibc, or the user tuned malloc (nothing changed then)."""
    import ctypes

    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # pragma: no cover - not glibc (or Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = [mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD), mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    return all(done)
