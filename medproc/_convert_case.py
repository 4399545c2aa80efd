"""One case of a batch, as a worker process runs it: load, check, resample, write the outputs
(the volume, its label, ``<name>.json`` with the options and geometry, the annotations and the
QC picture), and return the manifest row's fields or the error."""

from __future__ import annotations

import os
import time
import warnings

import numpy as np

from .cases import Case
from .errors import MedprocError
from .io import atomic_write
from .spec import Spec

__all__ = ["annotations_path", "sidecar_path", "plain_warning"]

#: in the forked workers of a ``--device gpu`` batch: the main process's GPU service
#: (:mod:`medproc._gpu_service`); these workers read and write on the CPU
_SERVICE = None


def _fmt(v) -> str:
    return "x".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v)


def _convert_one(
    case: Case,
    out_path: str,
    label_path: str | None,
    spec: Spec,
    device: str,
    qc_path: str | None = None,
    dali_threads: int | None = None,
    lesions=None,
    nan: str = "error",
    decode_workers: int | None = None,
    record: dict | None = None,
    say: list | None = None,
) -> dict:
    """Load, resample, write one case (runs in a worker process). ``record``: the options to
    write into the ``<name>.json`` sidecar (none without it); ``say``: gets the notes for the
    main process to print (also when the case fails later)."""
    from ._trace import span
    from .io import load
    from .io.dicom_read import read_series
    from .resample import check_label_grid, check_label_values, resample_batch

    t = time.perf_counter()
    say = [] if say is None else say  # notes for the main process to print
    # with --device gpu the voxels go to the GPU once, decoded there where it is proven; in a
    # worker of the GPU service they are read here and resampled by the main process
    here = "cpu" if _SERVICE is not None else device
    with span("read", case=case.source):
        lab = load(case.label, nan=nan, device=here) if case.label else None
        if case.dicom is not None:
            vol = read_series(case.dicom, workers=decode_workers, device=here, nan=nan)
        else:
            vol = load(case.source, series=case.series, nan=nan, device=here)
    if lab is not None:
        check_label_grid(vol, lab, f"the label map {case.label}", case.source)
        check_label_values(lab, case.label)
    got = None
    if _SERVICE is not None:
        with span("to_service", case=case.source):
            got = _SERVICE.resample(vol, lab)
    if got is None:  # here (or the service's arena had no room, or it would be later)
        t_here = time.perf_counter()
        with span("resample_here", case=case.source):
            (res,) = resample_batch(
                [vol],
                spec,
                device=here,
                labels=None if lab is None else [lab],
                num_threads=dali_threads,
                warn=False,
            )
        if _SERVICE is not None:
            _SERVICE.policy.resampled_here(time.perf_counter() - t_here)
        out, out_lab = res if lab is not None else (res, None)
        release = None
    else:
        out, out_lab, release = got
    for note in out.meta.get("warnings") or []:  # planning's notes (the input's are there)
        _note(vol, note, say)
    if lesions is not None:  # (on the input: an LPS table read as RAS lies off it; printed)
        _note(vol, lesions.off_image(vol.affine, vol.shape), say)
    try:
        if spec.interp == "cubic" and nan != "keep":  # (linear and nearest stay in range)
            _finite_after_cubic(out, case)
        with span("write", case=case.source):
            n_les = _write_case(
                case,
                vol,
                lab,
                out,
                out_lab,
                out_path,
                label_path,
                record,
                lesions,
                qc_path,
                dali_threads,
            )
    finally:
        if release is not None:  # the arena's pieces holding the outputs
            release()
    return {
        "series_uid": vol.meta.get("series_uid", ""),
        "decode": vol.meta.get("decode", ""),
        "in_shape": _fmt(vol.array.shape),  # (with the channels of a 4-D image)
        "in_spacing": _fmt([float(x) for x in vol.spacing]),
        "out_shape": _fmt(out.array.shape),
        "out_spacing": _fmt([float(x) for x in out.spacing]),
        "seconds": f"{time.perf_counter() - t:.3f}",
        "worker": _worker_id(),
        "lesions": n_les,
        "warnings": " | ".join(str(w) for w in vol.meta.get("warnings") or []),
        "notes": say,  # (not a manifest column: the main process prints them)
    }


def _finite_after_cubic(out, case) -> None:
    """Cubic interpolation overshoots: near float32's limits it makes inf. No output holds
    NaN or inf unless --nan keep asked for them."""
    a = np.asarray(out.array)
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise MedprocError(
            "cubic interpolation overshot float32's range (the input holds values near "
            "+-3.4e38): use --interp linear, or rescale the input",
            case.source,
        )


def _note(vol, note, say: list | None = None) -> None:
    """A note about this case: in its warnings (the manifest, the sidecar), once, and added to
    ``say``: the notes the main process prints (each word for word once per batch: the
    label-tie note of a common grid is the same for every case)."""
    if note and note not in (vol.meta.get("warnings") or []):
        vol.meta["warnings"] = [*(vol.meta.get("warnings") or []), note]
        if say is not None:
            say.append(note)


def _write_case(
    case, vol, lab, out, out_lab, out_path, label_path, record, lesions, qc_path, threads
) -> str:
    """Write a resampled case's files; returns the number of lesions written ("" if none)."""
    from .io import save

    save(out, out_path, threads=threads)  # gzip threads: this case's share of the cores
    if out_lab is not None:
        save(out_lab, label_path, threads=threads)
    n_les = ""
    if lesions is not None:
        off = _write_annotations(out_path, out, lesions)
        n_les = str(len(lesions))
        if off:  # (the manifest's count is of every lesion written; say which are off)
            note = f'{off} of {n_les} lesion(s) lie outside the output grid ("inside": false)'
            _note(vol, note)
    if record is not None:  # (after the notes above: the sidecar lists them too)
        _write_sidecar(out_path, case, vol, out, label_path, record)
    if qc_path:
        from .qc import qc_figure

        shown = list(zip(lesions.centers, lesions.diameters)) if lesions is not None else []
        qc_figure(
            vol.numpy(),
            out.numpy(),
            qc_path,
            lab,
            out_lab,
            lesions=shown,
            title=os.path.basename(out_path),
        )
    return n_les


def _beside(out_path: str, suffix: str) -> str:
    """``out_path`` with its volume extension (.nii.gz, .nii, .npy) replaced by ``suffix``."""
    for ext in (".nii.gz", ".nii", ".npy"):
        if out_path.endswith(ext):
            return out_path[: -len(ext)] + suffix
    return out_path + suffix


def annotations_path(out_path: str) -> str:
    """``<output name>.annotations.json`` beside an output volume."""
    return _beside(out_path, ".annotations.json")


def sidecar_path(out_path: str) -> str:
    """``<output name>.json`` beside an output volume (for ``.npy`` the file that also holds
    the cache's affine and shape)."""
    return _beside(out_path, ".json")


def _geometry(v) -> dict:
    return {
        "shape": list(v.shape),
        **({"channels": v.channels} if v.channels > 1 else {}),  # (shape: i, j, k)
        "spacing": [round(float(x), 6) for x in v.spacing],
        "orientation": v.orientation,
        "affine": v.affine.tolist(),
        "dtype": str(v.dtype),
    }


def _write_sidecar(out_path: str, case: Case, vol, out, label_path, record: dict) -> None:
    """What made this output: medproc version, source, options, input and output geometry.

    For ``.npy`` the writer's ``<name>.json`` (affine, shape, dtype, axes) is kept and extended."""
    import json

    from . import __version__

    path = sidecar_path(out_path)
    doc = {}
    if out_path.endswith(".npy") and os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    doc.update(
        {
            "medproc_version": __version__,
            "source": os.path.abspath(case.source),
            "series_uid": vol.meta.get("series_uid", "") or "",
            "label_source": os.path.abspath(case.label) if case.label else None,
            "label_output": os.path.basename(label_path) if label_path else None,
            **record,
            "input": _geometry(vol),
            "output": _geometry(out),
            "warnings": [str(w) for w in vol.meta.get("warnings") or []],
        }
    )
    with atomic_write(path) as tmp, open(tmp, "w") as f:
        json.dump(doc, f, indent=1)


def _write_annotations(out_path: str, out, lesions) -> int:
    """Write ``<name>.annotations.json``; returns how many lesions lie outside the output."""
    import json

    doc = {
        "image": os.path.basename(out_path),
        "coordinate_system": "RAS",
        "center_voxel_convention": "voxel index (i, j, k) of the image as nibabel and medproc "
        "load it; affine @ [i, j, k, 1] = center_world_ras",
        "affine": out.affine.tolist(),
        "shape": list(out.shape),
        "lesions": lesions.on_grid(out.affine, out.shape),
    }
    with atomic_write(annotations_path(out_path)) as tmp, open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    return sum(not les["inside"] for les in doc["lesions"])


def _worker_id() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _init_worker(parent: int, service=None) -> None:
    """Pool initializer: end with the parent (even on kill -9); warnings as one plain line;
    attach to the main process's GPU service when there is one."""

    global _SERVICE

    from ._procs import die_with_parent, ignore_sigint

    ignore_sigint()  # Ctrl-C reaches the whole process group: the main process decides
    die_with_parent(parent, pdeathsig=True)
    warnings.showwarning = plain_warning
    if service is not None:
        service.attach()
        _SERVICE = service


def _warm_up(spec: Spec | None = None, threads: int | None = None) -> None:
    """Pool task: import DALI and the readers now (~0.15 s) and, given the batch's ``spec``,
    build the DALI pipeline of its usual case (an int16 volume, no label map, on axes: a tiny
    one resampled with ``threads`` DALI threads), while the main process is still reading or
    grouping headers, so that this worker's first case starts sooner. Best effort: other
    cases (float or unsigned voxels, label maps, oblique grids, another thread count) build
    their own pipeline in their first case, as before."""
    from isal import isal_zlib  # noqa: F401

    from ._trace import span
    from .io import dicom_read  # noqa: F401
    from .pipeline import dali_available

    with span("import_dali"):
        ok = dali_available()
    if spec is None or not ok:
        return
    from .resample import resample_batch, tiny_volume

    with span("build_pipeline"):
        try:
            resample_batch([tiny_volume()], spec, num_threads=threads)
        except Exception:  # noqa: BLE001 - the first case builds it (and says what fails)
            pass


class _WarmAfter:
    """A pool for the header scan that queues one warm-up per worker after the scan's tasks:
    a worker takes one once no scan task is left (on the H200 node the workers stood idle
    0.2-0.4 s between their last scan task and their first case)."""

    def __init__(self, pool, n: int, args: tuple):
        self.pool, self.n, self.args = pool, n, args
        self._max_workers = pool._max_workers  # (how scan_dicom sizes its tasks)

    def map(self, fn, *iterables):
        results = self.pool.map(fn, *iterables)  # every task queued now
        for _ in range(self.n):
            self.pool.submit(_warm_up, *self.args)
        return results


def plain_warning(message, category, filename, lineno, file=None, line=None):
    """``warnings.showwarning`` for the command line: ``medproc: warning: <message>``."""
    import sys

    from .errors import printable

    print(f"medproc: warning: {printable(str(message))}", file=sys.stderr if file is None else file)


def _worker(args):
    case, say = args[0], []  # (the notes a case made before it failed are said too)
    failed = {"worker": _worker_id(), "notes": say}
    try:
        return case, "ok", _convert_one(*args, say=say), ""
    except MedprocError as e:  # (one that names no file is about this case's input)
        return case, "failed", failed, str(e) if e.path else f"{case.source}: {e}"
    except MemoryError:
        msg = f"{case.source}: not enough memory for this case; free memory or use fewer -j"
        return case, "failed", failed, msg
    except Exception as e:  # noqa: BLE001 - one bad case never stops the batch
        import traceback

        # a bug, not bad input: its traceback goes to the main process, for -v (the row keeps
        # one line); a worker's own log may be lost (spawned workers, Dask)
        failed["traceback"] = traceback.format_exc()
        return case, "failed", failed, f"{case.source}: {type(e).__name__}: {e}"
