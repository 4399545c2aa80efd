"""Batch conversion: find cases, resample each with one spec, write outputs and a manifest.

Guarantees: inputs are only read; every output (and the manifest) is written to a temporary
name and renamed, so a crash or kill -9 never leaves a half-written file under its final name;
a rerun skips the cases the manifest records as done whose outputs exist (``force`` redoes
them) and redoes an output on disk that the manifest does not record (a run killed between the
two); temporaries a killed run left are removed; a failing case, or an input that yields
nothing, is recorded in the manifest with its reason and the batch goes on. Pool workers exit
when the main process dies (``kill -9``), so nothing writes outputs nobody records.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

import numpy as np

from ._convert_case import _init_worker, _worker, annotations_path, plain_warning
from .cases import DEFAULT_NAME, Case, find_cases, lesions_for, read_annotation_table
from .errors import UsageError
from .manifest import MANIFEST_FIELDS, prepare_outdir, read_manifest, write_manifest
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
    "plain_warning",
]


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
    on_start=None,
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
    on_start : callable, optional
        Called with the number of cases once they are found (before any is converted).

    Raises
    ------
    UsageError, OutputError, ReadError
        Before any case starts: bad options, an output folder that cannot be used (a file, not
        writable, or busy with another run), a malformed annotation file or case list.
    """
    from .io import FORMATS

    if fmt not in FORMATS:
        raise UsageError(f"format must be one of {FORMATS}, got {fmt!r}")
    if nan not in ("error", "zero", "keep"):
        raise UsageError(f"nan must be 'error', 'zero' or 'keep', got {nan!r}")
    table = read_annotation_table(annotations) if annotations else None  # fails before any work
    lock = prepare_outdir(outdir)
    closers = [lock.release]
    ex = executor
    try:
        if ex is None and dask:
            ex, more = _dask_executor(dask, workers)
            closers = more + closers
        elif ex is None and workers > 1:
            ex = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=get_context("spawn"),
                initializer=_init_worker,
                initargs=(os.getpid(),),  # workers end with this process, even on kill -9
            )
            closers = [ex.shutdown] + closers
        threads = 1 if ex is not None and device == "cpu" else None
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
            on_start,
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
    on_start=None,
):
    # headers read by the pool too; the output folder is never taken as an input
    cases, skipped = find_cases(inputs, labels_dir, executor=ex, exclude=[outdir])
    if on_start:
        on_start(len(cases))
    manifest = os.path.join(outdir, "manifest.csv")
    prior = read_manifest(manifest)
    rows: list[dict] = []
    todo = []
    seen: set[str] = set()
    for c in cases:
        nm = base = c.name(name)
        n = 1
        while nm in seen:
            nm = f"{base}-{c.fields['uid_hash']}" + (f"-{n}" if n > 1 else "")
            n += 1
        seen.add(nm)
        out_path = os.path.join(outdir, f"{nm}.{fmt}")
        label_path = os.path.join(outdir, f"{nm}_label.{fmt}") if c.label else None
        row = {"case": nm, "source": c.source, "output": out_path, "label_output": label_path or ""}
        err = ""
        if c.error:
            err = f"{c.source}: {c.error}"
        elif os.path.abspath(out_path) == os.path.abspath(c.source):
            err = f"{c.source}: the output would overwrite the input; choose another -o"
        if err:
            row.update(status="failed", error=err)
            rows.append(row)
            if progress:
                progress(row)
            continue
        old = prior.get(nm, {})
        recorded = old.get("status") in ("ok", "skipped") and os.path.basename(
            old.get("output", "")
        ) == os.path.basename(out_path)
        done = (
            os.path.exists(out_path)
            and (label_path is None or os.path.exists(label_path))
            and (table is None or os.path.exists(annotations_path(out_path)))
        )
        if done and recorded and not force:
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
        if done and not recorded:
            log.info("%s: on disk but not in the manifest (an interrupted run): redone", out_path)
        qc_path = os.path.join(outdir, "qc", f"{nm}.png") if qc else None
        if qc_path:
            os.makedirs(os.path.dirname(qc_path), exist_ok=True)
        args = (c, out_path, label_path, spec, device, qc_path, threads, lesions_for(c, table))
        # a pool already spreads cases over the cores: one decoding process per case there
        todo.append((args + (nan, 1 if ex is not None else None), row))
    this_run = {r["case"] for r in rows} | {t[-1]["case"] for t in todo}
    kept = [r for c, r in prior.items() if c not in this_run]  # cases of earlier runs stay listed
    rows = kept + rows
    write_manifest(manifest, rows)

    def finish(res, row):
        case, status, info, err = res
        row.update(info, status=status, error=err)
        rows.append(row)
        write_manifest(manifest, rows)  # atomically, after every case: resumable at any point
        if progress:
            progress(row)

    if ex is None:
        for args, row in todo:
            finish(_worker(args), row)
    else:  # spawned processes (DALI and CUDA do not survive fork) or dask workers
        futs = {ex.submit(_worker, args): row for args, row in todo}
        for fut in as_completed(futs):
            try:
                res = fut.result()
            except Exception as e:  # noqa: BLE001 - a worker died (OOM killer...): say so
                c = next(a for a, r in todo if r is futs[fut])[0]
                res = (c, "failed", {}, f"{c.source}: the worker process died ({e})")
            finish(res, futs[fut])
    for p, reason in skipped:
        log.info("skipped %s: %s", p, reason)
    return sorted([r for r in rows if r["case"] in this_run], key=lambda r: r["case"])


def summary(rows: list[dict]) -> dict:
    """Counts of a run's manifest rows by status, and the mean seconds per converted case."""
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "skipped", "failed")}
    counts["total"] = len(rows)
    secs = [float(r["seconds"]) for r in rows if r.get("seconds")]
    counts["mean_seconds"] = float(np.mean(secs)) if secs else 0.0
    return counts
