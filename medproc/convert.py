"""Batch conversion: find cases, resample each with one spec, write outputs and a manifest.

Guarantees: inputs are only read; every output (and the manifest) is written to a temporary
name and renamed, so a crash or kill -9 never leaves a half-written file under its final name;
a rerun skips cases whose output exists (``force`` redoes them); a failing case is recorded in
the manifest with its reason and the batch goes on.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

import numpy as np

from .cases import DEFAULT_NAME, Case, find_cases, lesions_for, read_annotation_table
from .errors import MedprocError
from .io import atomic_write
from .spec import Spec

log = logging.getLogger(__name__)

__all__ = [
    "Case",
    "find_cases",
    "convert",
    "summary",
    "annotations_path",
    "MANIFEST_FIELDS",
    "DEFAULT_NAME",
]
MANIFEST_FIELDS = [
    "case",
    "source",
    "output",
    "label_output",
    "status",
    "error",
    "series_uid",
    "decode",
    "in_shape",
    "in_spacing",
    "out_shape",
    "out_spacing",
    "lesions",
    "seconds",
    "worker",
]


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
) -> dict:
    """Load, resample, write one case (runs in a worker process)."""
    from .io import load, save
    from .io.dicom_read import read_series
    from .resample import resample_batch

    t = time.perf_counter()
    lab = load(case.label, nan=nan, device=device) if case.label else None
    # with --device gpu the voxels go to the GPU once, decoded there where it is proven
    if case.dicom is not None:
        vol = read_series(case.dicom, workers=decode_workers, device=device)
    else:
        vol = load(case.source, series=case.series, nan=nan, device=device)
    (res,) = resample_batch(
        [vol], spec, device=device, labels=None if lab is None else [lab], num_threads=dali_threads
    )
    out, out_lab = res if lab is not None else (res, None)
    save(out, out_path)
    if out_lab is not None:
        save(out_lab, label_path)
    n_les = ""
    if lesions is not None:
        _write_annotations(out_path, out, lesions)
        n_les = str(len(lesions))
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
    return {
        "series_uid": vol.meta.get("series_uid", ""),
        "decode": vol.meta.get("decode", ""),
        "in_shape": _fmt(vol.shape),
        "in_spacing": _fmt([float(x) for x in vol.spacing]),
        "out_shape": _fmt(out.shape),
        "out_spacing": _fmt([float(x) for x in out.spacing]),
        "seconds": f"{time.perf_counter() - t:.3f}",
        "worker": _worker_id(),
        "lesions": n_les,
    }


def annotations_path(out_path: str) -> str:
    """``<output name>.annotations.json`` beside an output volume."""
    for ext in (".nii.gz", ".nii", ".npy"):
        if out_path.endswith(ext):
            return out_path[: -len(ext)] + ".annotations.json"
    return out_path + ".annotations.json"


def _write_annotations(out_path: str, out, lesions) -> None:
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


def _worker_id() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _worker(args):
    case, out_path, label_path, spec, device, qc_path, threads, lesions, nan, decode_workers = args
    try:
        return (
            case,
            "ok",
            _convert_one(
                case,
                out_path,
                label_path,
                spec,
                device,
                qc_path,
                threads,
                lesions,
                nan,
                decode_workers,
            ),
            "",
        )
    except MedprocError as e:
        return case, "failed", {"worker": _worker_id()}, str(e)
    except Exception as e:  # noqa: BLE001 - one bad case never stops the batch
        return case, "failed", {"worker": _worker_id()}, f"{case.source}: {type(e).__name__}: {e}"


def _write_manifest(path: str, rows: list[dict]) -> None:
    with atomic_write(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=MANIFEST_FIELDS)
        w.writeheader()
        for r in sorted(rows, key=lambda r: r["case"]):
            w.writerow({k: r.get(k, "") for k in MANIFEST_FIELDS})


def convert(
    inputs,
    outdir: str,
    spec: Spec,
    *,
    fmt: str = "nii.gz",
    labels_dir: str | None = None,
    name: str = DEFAULT_NAME,
    device: str = "cpu",
    workers: int = 1,
    force: bool = False,
    qc: bool = False,
    dask: str | None = None,
    annotations: str | None = None,
    progress=None,
    executor=None,
    nan: str = "error",
) -> list[dict]:
    """Convert every case under ``inputs`` into ``outdir``; returns this run's manifest rows.

    Parameters
    ----------
    workers : int
        Worker processes (cases run in parallel; each worker's DALI pipeline gets one thread).
    qc : bool
        Also write ``OUTDIR/qc/<name>.png``: mid-slices before/after with labels overlaid.
    dask : str, optional
        Run the cases on dask.distributed: a scheduler address (``tcp://host:8786``), or
        ``"local"`` / ``"local:N"`` for a LocalCluster of ``N`` (default ``workers``) processes.
        Workers must have medproc installed and see the input and output paths.
    annotations : str, optional
        A lesion file (LUNA16-style CSV or medproc JSON); each case's lesions (matched by
        SeriesInstanceUID or file stem) are written to ``<output name>.annotations.json``.
    progress : callable, optional
        Called with each manifest row as its case finishes (the CLI draws its bar with it).
    nan : {"error", "zero", "keep"}
        NaN/inf voxels in float inputs: fail the case (default), set them to 0, or keep them.
    executor : concurrent.futures.Executor, optional
        A pool to run on (kept open: reuse it across calls; its processes must be spawned).
    """
    from .io import FORMATS

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    closers = []
    ex = executor
    if ex is not None:
        pass
    elif dask:
        ex, closers = _dask_executor(dask, workers)
    elif workers > 1:
        ex = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
        closers = [ex.shutdown]
    threads = 1 if ex is not None and device == "cpu" else None
    table = read_annotation_table(annotations) if annotations else None
    try:
        return _convert(
            ex,
            inputs,
            outdir,
            spec,
            fmt,
            labels_dir,
            name,
            device,
            force,
            progress,
            qc,
            threads,
            table,
            nan,
        )
    finally:
        for close in closers:
            close()


def _dask_executor(address: str, workers: int):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ImportError(
            "--dask needs dask.distributed: pip install 'dask[distributed]'"
        ) from None
    if address.startswith("local"):
        n = int(address.split(":", 1)[1]) if ":" in address else max(1, workers)
        cluster = LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = Client(cluster)
        return client.get_executor(), [client.close, cluster.close]
    client = Client(address)
    return client.get_executor(), [client.close]


def _convert(
    ex,
    inputs,
    outdir,
    spec,
    fmt,
    labels_dir,
    name,
    device,
    force,
    progress,
    qc,
    threads,
    table=None,
    nan="error",
):
    cases, skipped = find_cases(inputs, labels_dir, executor=ex)  # headers read by the pool too
    os.makedirs(outdir, exist_ok=True)
    manifest = os.path.join(outdir, "manifest.csv")
    prior = _read_manifest(manifest)
    rows: list[dict] = []
    todo = []
    seen: dict[str, str] = {}
    for c in cases:
        nm = c.name(name)
        if nm in seen:
            nm = f"{nm}-{c.fields['uid_hash']}"
        seen[nm] = c.source
        out_path = os.path.join(outdir, f"{nm}.{fmt}")
        label_path = os.path.join(outdir, f"{nm}_label.{fmt}") if c.label else None
        row = {"case": nm, "source": c.source, "output": out_path, "label_output": label_path or ""}
        if os.path.abspath(out_path) == os.path.abspath(c.source):
            row.update(status="failed", error="output would overwrite the input; choose another -o")
            rows.append(row)
            continue
        done = (
            os.path.exists(out_path)
            and (label_path is None or os.path.exists(label_path))
            and (table is None or os.path.exists(annotations_path(out_path)))
        )
        if done and not force:
            old = prior.get(nm, {})
            row = {
                **old,
                **row,
                "status": "skipped",
                "error": "output exists (use --force to redo)",
            }
            rows.append(row)
            if progress:
                progress(row)
            continue
        qc_path = os.path.join(outdir, "qc", f"{nm}.png") if qc else None
        if qc_path:
            os.makedirs(os.path.dirname(qc_path), exist_ok=True)
        todo.append(
            (
                (
                    c,
                    out_path,
                    label_path,
                    spec,
                    device,
                    qc_path,
                    threads,
                    lesions_for(c, table),
                    nan,
                    1 if ex is not None else None,
                ),
                row,
            )
        )  # a pool already spreads cases over the cores
    this_run = {r["case"] for r in rows} | {t[-1]["case"] for t in todo}
    kept = [r for c, r in prior.items() if c not in this_run]  # cases of earlier runs stay listed
    rows = kept + rows
    _write_manifest(manifest, rows)

    def finish(res, row):
        case, status, info, err = res
        row.update(info, status=status, error=err)
        rows.append(row)
        _write_manifest(manifest, rows)  # atomically, after every case: resumable at any point
        if progress:
            progress(row)

    if ex is None:
        for args, row in todo:
            finish(_worker(args), row)
    else:  # spawned processes (DALI and CUDA do not survive fork) or dask workers
        futs = {ex.submit(_worker, args): row for args, row in todo}
        for fut in as_completed(futs):
            finish(fut.result(), futs[fut])
    for p, reason in skipped:
        log.info("skipped %s: %s", p, reason)
    return sorted([r for r in rows if r["case"] in this_run], key=lambda r: r["case"])


def _read_manifest(path: str) -> dict[str, dict]:
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        return {r["case"]: r for r in csv.DictReader(f)}


def summary(rows: list[dict]) -> dict:
    """Counts of a run's manifest rows by status, and the mean seconds per converted case."""
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "skipped", "failed")}
    counts["total"] = len(rows)
    secs = [float(r["seconds"]) for r in rows if r.get("seconds")]
    counts["mean_seconds"] = float(np.mean(secs)) if secs else 0.0
    return counts
