"""Worker processes that never outlive their parent.

``kill -9`` of a batch's main process (by a user, an OOM killer or a scheduler) must not leave
pool workers behind, writing outputs nobody records. Every pool medproc starts runs
:func:`die_with_parent` in its workers: a daemon thread that watches the parent's pid and ends
the worker at once when it changes, and on Linux also ``PR_SET_PDEATHSIG`` (the kernel kills
the worker with its parent).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

__all__ = ["die_with_parent"]

#: seconds between two looks at the parent
POLL_S = 0.25


def _watch(parent: int) -> None:
    while True:
        time.sleep(POLL_S)
        if os.getppid() != parent:
            os._exit(1)  # the parent died: stop now, whatever this worker was doing


def die_with_parent(parent: int | None = None, pdeathsig: bool = False) -> None:
    """Pool initializer: end this process when its parent (pid ``parent``) dies.

    Parameters
    ----------
    parent : int, optional
        The parent's pid, taken before the worker started (default: the current parent).
    pdeathsig : bool
        Also ask Linux to send SIGKILL when the parent dies. Only for pools that the creating
        thread outlives: the kernel fires it when that *thread* ends.
    """
    parent = os.getppid() if parent is None else int(parent)
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl
            pass
    if os.getppid() != parent:  # the parent died before we looked
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="medproc-watch").start()
