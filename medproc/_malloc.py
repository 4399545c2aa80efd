"""DALI's CPU scratch memory kept between runs, in the processes medproc owns (glibc only).

DALI's CPU resize takes each sample's scratch from ``malloc`` in blocks of 32 MiB + 4 bytes,
above glibc's largest dynamic mmap threshold (32 MiB): every block is a fresh mapping, unmapped
when freed, whose pages fault again on every run. A 256 x 256 x 200 CT resampled to 1.5 mm RAS
(3 slabs, one thread, the 2-core machine) took 77-104 ms and ~11,000 page faults per run, and
50-61 ms and ~500 faults with the thresholds below; the same volume uncut, 43-45 ms either
way. Set in the ``medproc`` command's process (its forked workers inherit it) and in the
proxy's CPU workers; a library user's own process is left alone.
"""

from __future__ import annotations

__all__ = ["keep_scratch"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
#: allocations below this come from the heap and are reused (DALI's scratch blocks are 32 MiB)
MMAP_THRESHOLD = 256 << 20
#: free memory at the heap's top kept for the next run, at most
TRIM_THRESHOLD = 512 << 20


def keep_scratch() -> bool:
    """Raise glibc's mmap and trim thresholds in this process (and those it forks later);
    False where this is not glibc (nothing changed)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc (macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
