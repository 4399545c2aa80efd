"""How many DALI CPU threads a process takes by default: its share of the cores."""

from __future__ import annotations

import os
import sys

__all__ = ["default_threads", "check_threads", "MAX_THREADS"]

#: DALI CPU threads a pipeline may be given (10^9 was taken, and failed in DALI with
#: std::bad_alloc at the first batch)
MAX_THREADS = 1024


def default_threads() -> int:
    """DALI CPU threads per process: ``MEDPROC_DALI_THREADS`` if set, else the cores this
    process may use divided by the processes on this machine that each take a share: ranks
    (``LOCAL_WORLD_SIZE``, set by torchrun; 1 otherwise) and, in a PyTorch DataLoader worker,
    its loader's workers; at most 16. Ranks that each took every core starved each other (0.22x
    on two GPUs); a volume alone in a batch runs on all of a process's threads (:mod:`.slabs`),
    so each worker keeps to its share."""
    raw = os.environ.get("MEDPROC_DALI_THREADS", "").strip()
    env = int(raw) if raw.isdigit() else raw  # ("4_0", "1e3", "-1": refused below, named)
    if env not in ("", 0):  # (it was not capped, and "abc" was int()'s bare ValueError)
        return check_threads(env, f"MEDPROC_DALI_THREADS={raw!r}:")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1) or 1))
    return max(1, min(cores // (ranks * _loader_workers()), 16))


def _loader_workers() -> int:
    """The number of workers of the PyTorch DataLoader whose worker this process is (1 in any
    other process)."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return max(1, int(info.num_workers)) if info is not None else 1


def check_threads(num_threads, who: str = "") -> int:
    """``num_threads`` (None: :func:`default_threads`) as an int from 1 to :data:`MAX_THREADS`,
    else a UsageError naming it (and ``who`` passed it)."""
    from ..errors import UsageError
    from ..spec import whole_number

    if num_threads is None:
        return default_threads()
    if not whole_number(num_threads) or not 1 <= num_threads <= MAX_THREADS:
        raise UsageError(
            f"{who + ' ' if who else ''}num_threads must be a whole number from 1 to "
            f"{MAX_THREADS} (DALI starts one thread each), got {num_threads!r}"
        )
    return int(num_threads)
