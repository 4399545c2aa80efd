"""Worker processes: how many, started cheaply, deaf to Ctrl-C, never outliving their parent.

- :func:`auto_workers`: the default ``-j``. A worker runs DALI's threads and a gzip stream, so
  on 2 cores, or for 2 cases or fewer, one process is fastest (no pool is started at all).
- :func:`start_pool`: on Linux, for CPU work, workers are *forked* from a main process that has
  not imported DALI: they start in milliseconds with medproc, pydicom and nibabel already
  imported (a spawned worker pays ~0.5 s of interpreter start and imports). ``convert
  --device gpu`` forks CPU workers too and keeps the GPU in the main process
  (:mod:`medproc._gpu_service`). GPU work in the workers themselves (CUDA does not survive
  ``fork()``; ``MEDPROC_GPU_SERVICE=0``) and a main process that already holds DALI or CUDA
  get spawned workers.
- Ctrl-C: the terminal sends SIGINT to the whole process group. Workers ignore it (SIGINT is
  blocked while they start, so none is lost in between); the main process decides: finish the
  running cases, start no new one (:func:`kill_pool` on a second Ctrl-C).
- ``kill -9`` of the main process (by a user, an OOM killer or a scheduler) must not leave
  workers behind, writing outputs nobody records: :func:`die_with_parent` runs in every worker,
  a daemon thread that watches the parent's pid and ends the worker when it changes, and on
  Linux also ``PR_SET_PDEATHSIG`` (the kernel kills the worker with its parent).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

__all__ = [
    "die_with_parent",
    "dask_executor",
    "auto_workers",
    "can_fork",
    "start_pool",
    "kill_pool",
    "ignore_sigint",
    "in_rerun_script",
    "drop_pool",
    "early_sigterm",
    "Terminated",
    "sigint_blocked",
    "Interrupts",
]

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
    h = signal.getsignal(signal.SIGTERM)  # (a fork copies the command's SIGTERM handlers)
    if h is _early_term or getattr(h, "__func__", None) is Interrupts._term:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
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


def auto_workers(n_cases: int | None = None, cores: int | None = None, fork: bool = False) -> int:
    """The default number of worker processes.

    With forked CPU workers (``fork``: they start in milliseconds, each with one DALI thread):
    one per core, at most the number of cases. Otherwise (spawned or GPU workers, which pay a
    start-up and a CUDA context each): 1 on a machine of 2 cores or fewer, or for 2 cases or
    fewer; else half the cores, at most the number of cases.

    >>> auto_workers(4, cores=2), auto_workers(2, cores=16), auto_workers(100, cores=16)
    (1, 1, 8)
    >>> auto_workers(4, cores=2, fork=True), auto_workers(1, cores=2, fork=True)
    (2, 1)
    """
    cores = cores or _cores()
    if fork:
        return max(1, min(cores, n_cases) if n_cases is not None else cores)
    if cores <= 2 or (n_cases is not None and n_cases <= 2):
        return 1
    n = cores // 2
    return max(1, min(n, n_cases) if n_cases is not None else n)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def ignore_sigint() -> None:
    """In a worker: ignore SIGINT (the main process handles Ctrl-C), then unblock it; SIGTERM
    ends the worker (not the main process's handlers, which a fork copies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _noop() -> None:
    return None


def start_pool(workers: int, initializer, initargs=(), device: str = "cpu"):
    """A ``ProcessPoolExecutor`` of ``workers`` processes, all started before it returns.

    Forked (Linux, ``device="cpu"``, DALI not imported here: nothing to inherit but Python
    modules) or spawned. SIGINT is blocked in this thread while the processes start, so they
    inherit it blocked until ``initializer`` (which must call :func:`ignore_sigint`) runs.
    """
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    ctx = get_context("fork" if can_fork(device) else "spawn")
    with sigint_blocked():
        ex = ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=initializer, initargs=initargs
        )
        for _ in range(workers):  # forked: all at once; spawned: one per call until `workers`
            ex.submit(_noop)
    ex.medproc_start_method = ctx.get_start_method()
    return ex


@contextlib.contextmanager
def sigint_blocked():
    """SIGINT blocked in this thread meanwhile: processes started in the block inherit it
    blocked (none is lost before they call :func:`ignore_sigint`)."""
    masked = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if masked else None
    try:
        yield
    finally:
        if masked:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def can_fork(device: str = "cpu") -> bool:
    """Whether :func:`start_pool` forks its workers (cheap) rather than spawning them."""
    return (
        sys.platform.startswith("linux")
        and device == "cpu"
        and "nvidia.dali" not in sys.modules
        and not _cuda_initialised()
    )


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except AttributeError:  # pragma: no cover - a torch stub
        return False


def kill_pool(ex) -> None:
    """End a ``ProcessPoolExecutor``'s processes now (a second Ctrl-C) and wait for them."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    for p in procs:
        try:
            p.kill()
        except (OSError, ValueError):
            pass
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        p.join(5)


def check_dask(address: str) -> None:
    """A UsageError (before any work) when dask.distributed is not installed, or ``local:N``
    does not give a number of workers >= 1."""
    import importlib.util

    from .errors import UsageError

    if importlib.util.find_spec("distributed") is None:
        raise UsageError("--dask needs dask.distributed: pip install 'dask[distributed]'")
    if address.startswith("local:"):  # ("localhost:8786" is a scheduler's address)
        n = address.split(":", 1)[1]
        if not (n.isdigit() and int(n) >= 1):
            raise UsageError(
                f"--dask {address}: give a scheduler address, 'local' (a cluster of -j workers "
                "here) or 'local:N' with N >= 1"
            )


def dask_executor(address: str, workers: int):
    """An executor on a dask.distributed cluster (``local[:N]``: one started here) and the
    calls that close it. The executor's ``medproc_workers`` is the cluster's number of worker
    threads (``local:N``: N), the cases it runs at once.

    A local cluster starts no dashboard: distributed's scheduler always serves HTTP (its
    ``dashboard_address=None`` means the default port, 8787, on every ``-v`` run), so it gets
    ``dashboard=False`` and a free port on 127.0.0.1 instead."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ImportError(
            "--dask needs dask.distributed: pip install 'dask[distributed]'"
        ) from None
    if address == "local" or address.startswith("local:"):
        n = int(address.split(":", 1)[1]) if ":" in address else max(1, workers)
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
        )
        client = Client(cluster)
        ex = client.get_executor()
        ex.medproc_workers, ex.medproc_start_method = n, "dask"
        return ex, [client.close, cluster.close]
    try:
        client = Client(address)
    except (ValueError, TypeError, OSError) as e:  # (a bad address; none listening: timed out)
        from .errors import UsageError

        raise UsageError(
            f"--dask {address}: no dask scheduler reached there ({type(e).__name__}: {e}); give "
            "the address of a running scheduler (tcp://host:8786 or host:8786), 'local' or "
            "'local:N'"
        ) from None
    ex = client.get_executor()
    ex.medproc_start_method = "dask"
    try:
        info = client.scheduler_info()["workers"].values()
        ex.medproc_workers = max(1, sum(int(w.get("nthreads") or 1) for w in info))
    except Exception:  # noqa: BLE001 - a scheduler that does not say: one case at a time
        ex.medproc_workers = 1
    return ex, [client.close]


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the medproc command before its batch ran (listing inputs, reading
    headers): it ends as a Ctrl-C would, releasing the output folder, with status 143."""


def _early_term(signum, frame):
    raise Terminated


@contextlib.contextmanager
def early_sigterm():
    """In the command's main thread, where nobody handles SIGTERM: it raises
    :class:`Terminated` meanwhile (the batch's :class:`Interrupts` takes over while it runs)."""
    mine = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    old = signal.signal(signal.SIGTERM, _early_term) if mine else None
    try:
        yield
    finally:
        if mine:
            signal.signal(signal.SIGTERM, old)


class Interrupts:
    """SIGINT in the main thread: the first sets ``requested`` (and calls ``on_first``), the
    second raises ``KeyboardInterrupt``. SIGTERM (``timeout``, ``docker stop``, a scheduler
    ending a job), unless the process handles it itself, stops at once, as a second Ctrl-C
    does, and sets ``terminated``. The previous handlers come back on exit."""

    def __init__(self, on_first=None):
        self.requested, self.terminated, self.on_first, self.old = False, False, on_first, {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        # (SIGINT ignored by whoever started us, e.g. `medproc convert &` in a script: kept
        # so; SIGTERM only where nobody handles it: an application's own handler is kept)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self.old[signal.SIGINT] = signal.signal(signal.SIGINT, self._handler)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _early_term):
            self.old[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._term)
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.on_first:
            self.on_first()

    def _term(self, signum, frame):
        self.requested = self.terminated = True
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, old in self.old.items():
            signal.signal(sig, old)


def in_rerun_script() -> bool:
    """Whether this call comes from a script's top level that a spawned worker is running
    again (Python runs the main script as ``__mp_main__`` in each spawned process)."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "<module>" and f.f_globals.get("__name__") == "__mp_main__":
            return True
        f = f.f_back
    return False


def drop_pool(pool, warm: bool) -> None:
    """Stop a pool that is not used after all. Workers that may still be importing DALI
    (``warm``: nothing else was handed to them) are ended at once rather than waited for;
    either way its thread is joined (no thread runs when this process forks again)."""
    if warm:
        kill_pool(pool)
    pool.shutdown()
