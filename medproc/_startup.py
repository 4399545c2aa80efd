"""Start-up of the ``medproc`` command: what its own process does not import.

pydicom imports ``requests`` (0.14 s on 2 cores, 0.24 s on a 16-core node, measured with
``python -X importtime``) for one purpose: downloading pydicom's own test files, which medproc
never does (without it pydicom falls back to ``urllib``). nibabel imports pydicom, and medproc
imports both, so every ``medproc`` command and every worker it forks paid for it. In the
command's own process (``medproc ...`` or ``python -m medproc ...``) the readers are imported
with ``requests`` marked absent; afterwards it imports normally again. A library user's process
is left alone.
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["is_command", "without_unused_imports", "quiet_early_interrupt", "python_interrupt"]

#: imported by our dependencies, never used by medproc
UNUSED = ("requests",)


def is_command() -> bool:
    """Whether this process is the ``medproc`` command (the console script, or ``python -m
    medproc``)."""
    mp = sys.modules.get("multiprocessing")  # (a spawned child re-runs the parent's main)
    if mp is not None and mp.parent_process() is not None:
        return False
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    if name in ("medproc", "medproc.exe"):
        return True
    argv = sys.orig_argv
    return any(a == "-m" and b == "medproc" for a, b in zip(argv, argv[1:]))


@contextlib.contextmanager
def without_unused_imports(command: bool | None = None, names: tuple = UNUSED):
    """Inside, in the command's own process, the modules ``names`` not yet imported are absent
    (``import`` raises ImportError, which their importers handle); afterwards they import
    normally. ``command``: the answer of :func:`is_command` (for tests)."""
    if command is None:
        command = is_command()
    marked = [m for m in names if command and m not in sys.modules]
    for m in marked:
        sys.modules[m] = None  # the import system's "not available"
    try:
        yield
    finally:
        for m in marked:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]


_PREVIOUS: list = []  # the Ctrl-C handler quiet_early_interrupt replaced


def _interrupted(signum, frame) -> None:  # pragma: no cover - runs in the command's process
    os.write(2, b"medproc: interrupted\n")
    os._exit(130)


def quiet_early_interrupt(command: bool | None = None) -> None:
    """In the command's own process, a Ctrl-C while its modules still import ends it at once,
    status 130, with one line instead of an import traceback; the command puts the handler it
    replaced back as it starts (:func:`python_interrupt`). Only Python's own handler is
    replaced: a process started with Ctrl-C ignored (a background job of a script) keeps
    ignoring it. ``command``: as :func:`is_command`."""
    if not (is_command() if command is None else command):
        return
    import signal

    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            _PREVIOUS[:] = [signal.signal(signal.SIGINT, _interrupted)]
    except ValueError:  # (not the main thread)
        pass


def python_interrupt() -> None:
    """The Ctrl-C handler :func:`quiet_early_interrupt` replaced back (Python's own:
    KeyboardInterrupt), if it had set the early one."""
    import signal

    try:
        if _PREVIOUS and signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, _PREVIOUS.pop())
    except ValueError:  # (not the main thread)
        pass
