"""PatchLoader's cache build: every case decoded, resampled to the spec, indexed and placed
(see :mod:`._cache_entry` for what an entry holds), in parallel.

Private to :mod:`medproc.monai`. The files are decoded in forked worker processes (nibabel's
and pydicom's decoders hold the GIL), which hand the voxels over as ``.npy`` files on
``/dev/shm``. On the CPU each worker builds its cases whole (DALI's CPU backend) and this
process memory-maps them. On the GPU, threads here move each decoded volume to the GPU once,
resample it in the engine there and keep it (in int16 / uint8, within a memory budget), or
place it on the host; ``cache_dir`` entries are written for later runs and read back first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import replace

import numpy as np

from ._cache_disk import _read, _scratch, _unlink, _writable, _write, cache_key
from ._cache_entry import (
    Entry,
    _check_sampling,
    _clip_bounds,
    _indices,
    _indices_np,
    _plan,
)

__all__ = ["Builder", "build_entries", "cpu_case", "gpu_budget", "GPU_CACHE_FRACTION"]

#: ``cache="auto"`` keeps volumes on the GPU while they take at most this share of its memory
#: (and at most half of what is free when the loader is built); the rest stay on the host
GPU_CACHE_FRACTION = 0.25
#: files to decode (bytes on disk) from which worker processes pay for their start (~0.5 s)
PARALLEL_BYTES = 48 << 20


# --- decoding in worker processes -----------------------------------------------------------
def _decode(path, out_dir: str) -> tuple[str, np.ndarray, dict]:
    """Worker: ``medproc.load(path)`` on the CPU, voxels written to a ``.npy`` in ``out_dir``."""
    from ..io import load

    vol = load(path, workers=1)
    fd, npy = tempfile.mkstemp(suffix=".npy", dir=out_dir)
    os.close(fd)
    np.save(npy, np.asarray(vol.array))
    return npy, np.asarray(vol.affine), dict(vol.meta)


def _decode_pool(n: int):
    """Forked workers (as medproc's DICOM pool and PyTorch's DataLoader workers): no re-import
    of the user's script. They run the readers, and on the CPU route (``device="cpu"`` or
    ``cache="host"``) DALI's CPU backend, never CUDA (the engine refuses GPU pipelines in a
    child forked after CUDA). None where forking is not possible (a daemonic process, no
    fork)."""
    import multiprocessing

    if n < 2 or multiprocessing.current_process().daemon:
        return None
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    from .._procs import die_with_parent

    return ProcessPoolExecutor(
        n,
        mp_context=multiprocessing.get_context("fork"),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )


def cpu_case(case: dict, spec, image_threshold, base: str) -> str:
    """Decode, resample (DALI's CPU backend) and index one case, written as the entry
    ``base`` (see :func:`_write`); returns ``base``. Runs in a forked worker (or here)."""
    from ..io import load
    from ..pipeline import Engine, Job

    img = load(case["image"], workers=1)
    lab = load(case["label"], workers=1) if case.get("label") is not None else None
    arr, lab, plan, intensity, graph = _plan(case, img, lab, spec)
    del img
    job = Job(arr, plan, () if lab is None else (lab,))
    out = Engine("cpu", batch_size=1, num_threads=1).run([job], graph)[0]
    del arr, lab, job
    bounds = _clip_bounds(intensity, graph.dtype)
    if bounds is not None:
        lo, hi = (np.asarray(b, dtype=out[0].dtype) for b in bounds)
        np.clip(out[0], lo, hi, out=out[0])
    out_lab = out[1] if len(out) > 1 else None
    fg, bits, bg_index, n_bg = _indices_np(out_lab, out[0], intensity, image_threshold)
    entry = Entry(
        case=case,
        shape=tuple(int(x) for x in plan.out_shape),
        affine=plan.out_affine,
        intensity=intensity,
        image=out[0],
        label=out_lab,
        fg=fg,
        bg_bits=bits,
        bg_index=bg_index,
        n_bg=n_bg,
    )
    _check_sampling(entry, image_threshold)
    _write(entry, base)
    return base


# --- the build ------------------------------------------------------------------------------
class _Budget:
    """Bytes of GPU memory the cache may still take (thread-safe)."""

    def __init__(self, nbytes: float):
        self.left = float(nbytes)
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if n > self.left:
                return False
            self.left -= n
            return True


def gpu_budget(where: str, device_id: int) -> float:
    """Bytes the cache may keep on the GPU for ``cache=where``."""
    if where == "host":
        return 0.0
    if where == "gpu":
        return float("inf")
    import torch

    free, total = torch.cuda.mem_get_info(device_id)
    return min(GPU_CACHE_FRACTION * total, 0.5 * free)


class Builder:
    """Builds (or reads) the entries of a list of cases; see the module doc.

    On the CPU (``device="cpu"``, or ``where="host"``: nothing of the build on the GPU) each
    case is built whole (decoded, resampled, indexed, written) in a forked worker and
    memory-mapped here. On the GPU the workers decode, and threads here move each volume to the
    GPU once, resample it there and keep it (or place it on the host when over the budget).
    """

    def __init__(
        self,
        spec,
        device: str,
        device_id: int,
        where: str,
        cache_dir: str | None,
        image_threshold: float | None,
        workers: int,
    ):
        self.spec, self.device, self.device_id = spec, device, device_id
        self.where, self.cache_dir = where, cache_dir
        self.keep = cache_dir is not None  # (whether entries are written there: build says)
        self.image_threshold = image_threshold
        self.workers = max(1, int(workers))
        # cache="host": built on the CPU cores too, so that the GPU never holds a whole volume
        # (the build's peak, not only the cache, counts against a model's memory)
        self.gpu = device == "gpu" and where != "host"
        self.budget = _Budget(gpu_budget(where, device_id) if self.gpu else 0.0)
        self._gpu_slots = threading.Semaphore(4)  # raw volumes on the GPU at once
        #: on the CPU, build through :meth:`finish` and keep torch tensors, as the GPU route
        #: does (tests run the GPU route's code here)
        self.torch_route = False

    def _base(self, case, scratch: str | None, read: bool = False) -> str:
        """Where a case's entry is (``read``) or goes: ``cache_dir`` when it keeps entries,
        else ``scratch``."""
        key = cache_key(case, self.spec, self.image_threshold)
        kept = self.cache_dir is not None and (read or self.keep)
        return os.path.join(self.cache_dir if kept else scratch, key)

    # -- GPU: one decoded case, finished here ------------------------------------------------
    def finish(self, case, img_vol, lab_vol) -> Entry:
        """Move one decoded case to the GPU, resample and index it there, then place it.
        (With ``device="cpu"`` and ``torch_route``, the same steps on CPU tensors: tests.)"""
        import torch

        from ..pipeline import Engine, Job

        arr, lab, plan, intensity, graph = _plan(case, img_vol, lab_vol, self.spec)
        dev = f"cuda:{self.device_id}" if self.gpu else "cpu"
        engine = Engine(self.device, batch_size=1, num_threads=1, device_id=self.device_id)
        with self._gpu_slots:
            img_t = arr if torch.is_tensor(arr) else torch.from_numpy(np.asarray(arr))
            # i fastest in memory, as DALI is fed: the engine's layout step is then a view,
            # and every kernel that touches the data ran on this thread's stream before the sync
            img_t = _i_fastest(img_t.to(dev))
            lab_t = None if lab is None else _i_fastest(torch.from_numpy(lab).to(dev))
            if self.gpu:  # DALI reads these on the engine's own stream: copies must be done
                torch.cuda.current_stream(self.device_id).synchronize()
            job = Job(img_t, plan, () if lab_t is None else (lab_t,))
            out = engine.run([job], graph, as_torch=True)[0]
            del img_t, lab_t, job, arr, lab
            img_kji = out[0].permute(2, 1, 0)  # contiguous (k, j, i)
            lab_kji = out[1].permute(2, 1, 0) if len(out) > 1 else None
            bounds = _clip_bounds(intensity, graph.dtype)
            if bounds is not None:
                integer = np.dtype(graph.dtype).kind in "iu"
                img_kji.clamp_(*((int(b) for b in bounds) if integer else bounds))
            fg, bits, bg_index, n_bg = _indices(lab_kji, img_kji, intensity, self.image_threshold)
            if self.gpu:
                torch.cuda.current_stream(self.device_id).synchronize()
        entry = Entry(
            case=case,
            shape=tuple(int(x) for x in plan.out_shape),
            affine=plan.out_affine,
            intensity=intensity,
            image=img_kji,
            label=lab_kji,
            fg=fg,
            bg_bits=bits,
            bg_index=bg_index,
            n_bg=n_bg,
        )
        _check_sampling(entry, self.image_threshold)
        if self.keep:
            _write(entry.on_host(), self._base(case, None))
        return self._place(entry)

    def _place(self, e: Entry) -> Entry:
        """On the GPU while the budget lasts (GPU device), else on the host."""
        import warnings

        if not self.gpu:
            return e if self.torch_route else e.on_host()
        want_gpu = self.budget.take(e.nbytes)
        if want_gpu and not e.on_device:
            import torch

            dev = f"cuda:{self.device_id}"

            def up(a):  # (i, j, k) host -> (k, j, i) contiguous on the GPU (read-only source)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    kji = np.ascontiguousarray(np.asarray(a).transpose(2, 1, 0))
                    return torch.from_numpy(kji).to(dev)

            e = replace(e, image=up(e.image), label=None if e.label is None else up(e.label))
            torch.cuda.current_stream(self.device_id).synchronize()
        elif not want_gpu:
            e = e.on_host()
        return e

    def _gpu_case(self, case, futures) -> Entry:
        """Thread: the decoded volumes (from the workers, or loaded here), finished."""
        from ..io import load
        from ..volume import Volume

        if self.gpu:
            torch_set_device(self.device_id)  # a new thread starts on cuda:0
        paths = [case["image"]] + ([case["label"]] if case.get("label") is not None else [])
        vols = []
        for n, (p, fut) in enumerate(zip(paths, futures or [None] * len(paths))):
            if fut is None:  # a DICOM series may decode on the GPU
                vols.append(load(p, device="gpu" if n == 0 and self.gpu else "cpu"))
                continue
            npy, affine, meta = fut.result()
            arr = np.load(npy, mmap_mode="c")
            os.unlink(npy)  # the mapping stays valid; its memory goes with it
            vols.append(Volume(arr, affine, meta))
        return self.finish(case, vols[0], vols[1] if len(vols) > 1 else None)

    # -- all cases --------------------------------------------------------------------------
    def build(self, cases: list[dict]) -> list[Entry]:
        """Every case's entry, in order; built in parallel. A case listed twice (the same
        image and label: oversampling) is built once and shares its entry."""
        from ..io import kind_of

        keys = [(str(c.get("image")), str(c.get("label"))) for c in cases]
        if len(set(keys)) < len(keys):
            first = {k: n for n, k in reversed(list(enumerate(keys)))}
            once = sorted(first.values())
            built = dict(zip(once, self.build([cases[n] for n in once])))
            return [built[first[k]] for k in keys]

        self.keep = self.cache_dir is not None and _writable(self.cache_dir)
        found = {}
        if self.cache_dir is not None:
            for n, c in enumerate(cases):
                e = _read(c, self._base(c, None, read=True))
                if e is not None:
                    found[n] = e
        todo = [n for n in range(len(cases)) if n not in found]
        n_files = sum(1 + (cases[n].get("label") is not None) for n in todo)
        pool = None
        if sum(_size(cases[n]["image"]) for n in todo) >= PARALLEL_BYTES:
            pool = _decode_pool(min(self.workers, n_files if self.gpu else len(todo)))
        scratch = _scratch() if todo and (pool is not None or not self.keep) else None
        out: list = [None] * len(cases)
        try:
            if not self.gpu and not self.torch_route:
                run = pool.submit if pool is not None else _now
                futs = {
                    n: run(
                        cpu_case,
                        cases[n],
                        self.spec,
                        self.image_threshold,
                        self._base(cases[n], scratch),
                    )
                    for n in todo
                }
                for n, f in futs.items():
                    base = f.result()
                    e = _read(cases[n], base)
                    if e is None:
                        raise RuntimeError(
                            f"the cache entry of {cases[n]['image']} was not written"
                        )
                    if not self.keep:
                        _unlink(base)  # memory-mapped: the memory goes when the loader does
                        if base.startswith("/dev/shm/"):  # in memory: map its pages now
                            e.prefault()
                    found[n] = e
                return [self._place(found[n]) for n in range(len(cases))]
            futures = {}
            for n in todo:
                c = cases[n]
                if pool is None or kind_of(c["image"]) == "dicom":
                    futures[n] = None
                else:
                    paths = [c["image"]] + ([c["label"]] if c.get("label") is not None else [])
                    futures[n] = [pool.submit(_decode, p, scratch) for p in paths]
            with ThreadPoolExecutor(max(1, min(4, len(todo)))) as ex:
                futs = {ex.submit(self._gpu_case, cases[n], futures[n]): n for n in todo}
                for n, e in found.items():
                    out[n] = self._place(e)
                for f in as_completed(futs):
                    out[futs[f]] = f.result()
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        if self.gpu:  # the build's pipelines and whole-volume buffers are not needed again
            from ..pipeline.cache import release_unused

            release_unused(self.device_id)
        return out


def _size(path) -> int:
    """Bytes on disk of a file, or of the files directly in a folder (a DICOM series)."""
    try:
        if os.path.isdir(path):
            return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        return os.path.getsize(path)
    except OSError:
        return 0


class _Done:
    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


def _now(fn, *args):
    """Run ``fn`` here, as a finished future."""
    return _Done(fn(*args))


def _i_fastest(t):
    """An (i, j, k) tensor with i fastest in memory (a copy only when it is not)."""
    return t.permute(2, 1, 0).contiguous().permute(2, 1, 0)


def torch_set_device(device_id: int) -> None:
    import torch

    torch.cuda.set_device(device_id)


def build_entries(cases, spec, **kw) -> list[Entry]:
    """The cache entries of ``cases`` (see :class:`Builder`)."""
    return Builder(spec, **kw).build(list(cases))
