"""The engine's pipeline cache: per process and per thread, safe across ``fork()``.

A DALI pipeline is never used by two threads at once, and never touched in a forked child
(DALI's worker threads do not survive a fork: using an inherited pipeline hangs, destroying it
may wait forever). See :mod:`medproc.pipeline.engine` for the contract.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = [
    "INSTALL",
    "ForkError",
    "cached_pipeline",
    "drop_cached",
    "release_unused",
    "dali_available",
    "gpu_available",
    "gpu_visible",
]
INSTALL = "pip install nvidia-dali-cuda120"


class ForkError(RuntimeError):
    """A GPU pipeline was asked for in a process forked after CUDA was initialised."""


def dali_available() -> bool:
    """Whether NVIDIA DALI can be imported here."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


_GPU: dict[int, bool] = {}


def gpu_available() -> bool:
    """Whether DALI sees an NVIDIA GPU (cached per process)."""
    pid = os.getpid()
    if pid not in _GPU:
        ok = False
        if dali_available():
            try:
                from nvidia.dali.backend import GetCUDADeviceCount

                ok = GetCUDADeviceCount() > 0
            except Exception:  # noqa: BLE001
                ok = False
        _GPU[pid] = ok
    return _GPU[pid]


def gpu_visible() -> bool:
    """Whether DALI is installed and an NVIDIA GPU is visible, found *without* importing DALI
    or making a CUDA context (NVML), so that the process can still fork cheap workers
    (``medproc convert --device gpu``). Once DALI is imported: :func:`gpu_available`."""
    if "nvidia.dali" in sys.modules:
        return gpu_available()
    import importlib.util

    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None and vis.strip() in ("", "-1"):
        return False
    try:
        if importlib.util.find_spec("nvidia.dali") is None:
            return False
    except (ImportError, ValueError):
        return False
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:  # no NVIDIA driver
        return False
    if nvml.nvmlInit_v2() != 0:
        return False
    try:
        n = ctypes.c_uint(0)
        return nvml.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0 and n.value > 0
    finally:
        nvml.nvmlShutdown()


# --- the per-process, per-thread pipeline cache ---------------------------------------------
_LOCK = threading.Lock()
_CACHE: dict[tuple, object] = {}  # (thread ident, key) -> pipeline or runner, this process only
_GRAVE: list = []  # objects inherited through fork: kept alive, never used or destroyed
_STATE = {"pid": os.getpid(), "cuda_parent": False, "cuda_here": False}


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(_STATE["cuda_here"] or (torch is not None and torch.cuda.is_initialized()))


def _before_fork():
    _STATE["cuda_at_fork"] = _cuda_initialised()


def _after_fork_child():
    _GRAVE.append(dict(_CACHE))  # destroying them here could wait on threads that do not exist
    _CACHE.clear()
    _GPU.clear()
    _STATE.update(pid=os.getpid(), cuda_parent=_STATE.get("cuda_at_fork", False), cuda_here=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_child)


def check_gpu_here() -> None:
    """Raise :class:`ForkError` when this process was forked after CUDA was initialised in its
    parent (checked before anything touches CUDA here, whose own error would be obscure)."""
    if _STATE["cuda_parent"]:
        raise ForkError(
            "medproc: a GPU pipeline was requested in a process forked after CUDA was "
            "initialised in its parent (e.g. a DataLoader worker with the default 'fork' "
            "start method); CUDA cannot run here. Keep the GPU work in the main process "
            "(PatchLoader and the proxy do), use device='cpu' in workers, or start the "
            "workers with multiprocessing_context='spawn'"
        )


def cached_pipeline(key: tuple, build, device: str = "cpu"):
    """The calling thread's object for ``key`` in this process, built by ``build()`` on first
    use. Objects of threads that have ended are dropped; nothing crosses a fork."""
    if device == "gpu":
        check_gpu_here()
        _STATE["cuda_here"] = True
    ident = threading.get_ident()
    _purge()
    with _LOCK:
        obj = _CACHE.get((ident, key))
    if obj is None:
        obj = build()
        with _LOCK:
            _CACHE[(ident, key)] = obj
    return obj


def _purge() -> None:
    """Drop the pipelines of threads that have ended (destroyed outside the lock)."""
    alive = {t.ident for t in threading.enumerate()}
    with _LOCK:
        dead = [_CACHE.pop(k) for k in list(_CACHE) if k[0] not in alive]
    del dead


def release_unused(device_id: int | None = None) -> None:
    """Give back the GPU memory that finished work left behind: the pipelines of threads that
    have ended, then the free blocks of DALI's memory pools and of PyTorch's caching allocator
    (e.g. after building a cache of whole volumes, before training starts)."""
    _purge()
    if "nvidia.dali" in sys.modules:
        from nvidia.dali.backend import ReleaseUnusedMemory

        ReleaseUnusedMemory()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        if device_id is not None:
            torch.cuda.synchronize(device_id)
        torch.cuda.empty_cache()


def drop_cached(key: tuple) -> None:
    """Forget the calling thread's object for ``key`` (e.g. a pipeline that failed)."""
    with _LOCK:
        obj = _CACHE.pop((threading.get_ident(), key), None)
    del obj
