"""Batch conversion: find cases, resample each with one spec, write outputs and a manifest.

Guarantees: inputs are only read; every output (and the manifest) is written to a temporary
name and renamed, so a crash or kill -9 never leaves a half-written file under its final name;
a rerun skips cases whose output exists (``force`` redoes them); a failing case is recorded in
the manifest with its reason and the batch goes on.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context

import numpy as np

from .errors import MedprocError
from .io import IMAGE_EXT as _IMAGE_EXT
from .io import atomic_path
from .io import stem as _stem
from .spec import Spec

log = logging.getLogger(__name__)

__all__ = ["Case", "find_cases", "convert", "MANIFEST_FIELDS", "DEFAULT_NAME"]

#: default output name: no patient identifiers (file stem, or a hash of the series UID)
DEFAULT_NAME = "{name}"
MANIFEST_FIELDS = ["case", "source", "output", "label_output", "status", "error", "series_uid",
                   "decode", "in_shape", "in_spacing", "out_shape", "out_spacing", "lesions", "seconds", "worker"]


@dataclass
class Case:
    """One input volume to convert (a DICOM series or an image file) and its optional label."""

    source: str
    series: str | None = None  # DICOM series key when source is a folder
    label: str | None = None
    fields: dict = field(default_factory=dict)  # naming template fields
    dicom: object | None = None  # the scanned DicomSeries: workers read it without a re-scan

    def name(self, template: str) -> str:
        try:
            out = template.format(**self.fields)
        except KeyError as e:
            raise ValueError(f"naming template {template!r} uses unknown field {e}; fields: "
                             f"{sorted(self.fields)}") from None
        return out.replace(os.sep, "_")


def _uid_hash(uid: str) -> str:
    return hashlib.sha1(uid.encode()).hexdigest()[:12]


def find_cases(inputs, labels_dir: str | None = None, executor=None) -> tuple[list[Case], list[tuple[str, str]]]:
    """Cases under ``inputs`` (folders scanned recursively, files, or CSV lists).

    A CSV has a header with ``image`` (and optionally ``label`` and ``name``) columns; relative
    paths are relative to the CSV. With ``labels_dir``, an image file's label is the file of the
    same name there. Returns (cases, skipped files with reasons).
    """
    from .io.dicom_scan import find_series

    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    dicom_roots = []
    for inp in [os.fspath(p) for p in inputs]:
        if inp.lower().endswith(".csv"):
            cases += _cases_from_csv(inp)
        elif os.path.isdir(inp):
            for root, dirs, files in os.walk(inp):
                dirs.sort()
                for n in sorted(files):
                    if n.lower().endswith(_IMAGE_EXT) and not n.startswith("."):
                        p = os.path.join(root, n)
                        cases.append(Case(p, fields={"name": _stem(p), "stem": _stem(p)}))
            dicom_roots.append(inp)
        elif os.path.exists(inp):
            if inp.lower().endswith(_IMAGE_EXT):
                cases.append(Case(inp, fields={"name": _stem(inp), "stem": _stem(inp)}))
            else:
                dicom_roots.append(inp)
        else:
            skipped.append((inp, "no such file or folder"))
    if labels_dir:
        if os.path.abspath(labels_dir) in {os.path.abspath(r) for r in dicom_roots}:
            raise ValueError("the labels folder must not be one of the inputs")
        cases = [c for c in cases if not os.path.abspath(c.source).startswith(os.path.abspath(labels_dir) + os.sep)]
        for c in cases:
            cand = os.path.join(labels_dir, os.path.basename(c.source))
            if os.path.exists(cand):
                c.label = cand
    if dicom_roots:
        series, sk = find_series(dicom_roots, executor=executor)
        skipped += [(p, r) for p, r in sk if not p.lower().endswith(_IMAGE_EXT)]
        for s in series:
            files = s.files
            src = files[0] if len(files) == 1 else os.path.commonpath(files)
            cases.append(Case(src, series=s.key, dicom=s, fields={
                "name": f"series-{_uid_hash(s.key)}", "uid_hash": _uid_hash(s.key),
                "series_number": s.info.get("SeriesNumber") or 0,
                "modality": s.info.get("Modality") or "", "stem": _stem(src)}))
    for c in cases:
        c.fields.setdefault("uid_hash", _uid_hash(c.source))
        c.fields.setdefault("series_number", 0)
        c.fields.setdefault("modality", "")
    return cases, skipped


def _cases_from_csv(path: str) -> list[Case]:
    base = os.path.dirname(os.path.abspath(path))
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "image" not in reader.fieldnames:
            raise MedprocError(f"a case list needs an 'image' column, found {reader.fieldnames}", path)
        for line, row in enumerate(reader, 2):
            img = (row.get("image") or "").strip()
            if not img:
                raise MedprocError(f"line {line}: empty 'image'", path)
            img = img if os.path.isabs(img) else os.path.join(base, img)
            lab = (row.get("label") or "").strip() or None
            if lab and not os.path.isabs(lab):
                lab = os.path.join(base, lab)
            name = (row.get("name") or "").strip() or _stem(img)
            out.append(Case(img, label=lab, fields={"name": name, "stem": _stem(img)}))
    return out


def _fmt(v) -> str:
    return "x".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v)


def _convert_one(case: Case, out_path: str, label_path: str | None, spec: Spec, device: str,
                 qc_path: str | None = None, dali_threads: int | None = None,
                 lesions=None, nan: str = "error", decode_workers: int | None = None) -> dict:
    """Load, resample, write one case (runs in a worker process)."""
    import medproc

    t = time.perf_counter()
    lab = medproc.load(case.label, nan=nan) if case.label else None
    gpu_read = None
    if case.dicom is not None and device == "gpu" and lab is None:
        from .pipeline.decode import gpu_config

        if gpu_config(case.dicom.info) is not None and int(case.dicom.info.get("SamplesPerPixel") or 1) == 1:
            gpu_read = _resample_gpu_decoded(case.dicom, spec)
    if gpu_read is not None:
        vol, out = gpu_read
        out_lab = None
    else:
        if case.dicom is not None:
            from .io.dicom_read import read_series

            vol = read_series(case.dicom, workers=decode_workers)
        else:
            vol = medproc.load(case.source, series=case.series, nan=nan)
        (res,) = medproc.resample_batch([vol], spec, device=device, labels=None if lab is None else [lab],
                                        num_threads=dali_threads)
        out, out_lab = res if lab is not None else (res, None)
    from .io.writers import write_volume

    write_volume(out, out_path)
    if out_lab is not None:
        write_volume(out_lab, label_path)
    n_les = ""
    if lesions is not None:
        _write_annotations(out_path, out, lesions)
        n_les = str(len(lesions))
    if qc_path:
        from .qc import qc_figure

        shown = [(c, d) for c, d in zip(lesions.centers, lesions.diameters)] if lesions is not None else []
        qc_figure(vol, out, qc_path, lab, out_lab, lesions=shown, title=os.path.basename(out_path))
    return {"series_uid": vol.meta.get("series_uid", ""), "decode": vol.meta.get("decode", ""),
            "in_shape": _fmt(vol.shape),
            "in_spacing": _fmt([float(x) for x in vol.spacing]), "out_shape": _fmt(out.shape),
            "out_spacing": _fmt([float(x) for x in out.spacing]),
            "seconds": f"{time.perf_counter() - t:.3f}", "worker": _worker_id(), "lesions": n_les}


def _resample_gpu_decoded(series, spec: Spec):
    """GPU decode (proven syntaxes only) straight into the GPU resampler: no host round trip
    between the compressed bytes and the resampled volume."""
    from .plan import make_plan
    from .resample import get_resampler
    from .pipeline.decode import read_series_gpu
    from .volume import Volume

    tensor, affine, meta = read_series_gpu(series)
    host = None
    needs_array = spec.crop_foreground is not None or spec.intensity.percentiles or spec.intensity.zscore \
        or (spec.intensity.scale and not spec.intensity.clip)
    if needs_array:
        host = tensor.cpu().numpy()  # statistics are computed on the CPU
    plan = make_plan(tuple(tensor.shape), affine, spec, host)
    r = get_resampler("gpu", spec.interp, spec.antialias, str(np.dtype(spec.dtype)), spec.fill, False, 1,
                      (str(tensor.dtype).replace("torch.", ""), "None"))
    out = r.run([tensor], [plan])[0]
    src = Volume(tensor.cpu().numpy() if host is None else host, affine, {**series.info, **meta,
                 "source": series.files[0], "modality": series.info.get("Modality")})
    return src, Volume(out, plan.out_affine, {"decode": meta["decode"]})


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
        "center_voxel_convention": "index (i, j, k) into the array nibabel loads from the image",
        "center_index_convention": "index (a0, a1, a2) into medproc's array (= center_voxel reversed)",
        "affine": out.affine.tolist(),
        "shape_ijk": list(out.shape[::-1]),
        "lesions": lesions.on_grid(out.affine, out.shape),
    }
    path = annotations_path(out_path)
    tmp = atomic_path(path)
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def _worker_id() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _worker(args):
    case, out_path, label_path, spec, device, qc_path, threads, lesions, nan, decode_workers = args
    try:
        return case, "ok", _convert_one(case, out_path, label_path, spec, device, qc_path, threads,
                                        lesions, nan, decode_workers), ""
    except MedprocError as e:
        return case, "failed", {"worker": _worker_id()}, str(e)
    except Exception as e:  # noqa: BLE001 - one bad case never stops the batch
        return case, "failed", {"worker": _worker_id()}, f"{case.source}: {type(e).__name__}: {e}"


def _write_manifest(path: str, rows: list[dict]) -> None:
    tmp = atomic_path(path)
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=MANIFEST_FIELDS)
        w.writeheader()
        for r in sorted(rows, key=lambda r: r["case"]):
            w.writerow({k: r.get(k, "") for k in MANIFEST_FIELDS})
    os.replace(tmp, path)


def convert(inputs, outdir: str, spec: Spec, *, fmt: str = "nii.gz", labels_dir: str | None = None,
            name: str = DEFAULT_NAME, device: str = "cpu", workers: int = 1, force: bool = False,
            qc: bool = False, dask: str | None = None, annotations: str | None = None,
            progress=None, executor=None, nan: str = "error") -> list[dict]:
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
    from .io.writers import FORMATS

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
    table = _read_annotations(annotations) if annotations else None
    try:
        return _convert(ex, inputs, outdir, spec, fmt, labels_dir, name, device, force, progress, qc,
                        threads, table, nan)
    finally:
        for close in closers:
            close()


def _dask_executor(address: str, workers: int):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ImportError("--dask needs dask.distributed: pip install 'dask[distributed]'") from None
    if address.startswith("local"):
        n = int(address.split(":", 1)[1]) if ":" in address else max(1, workers)
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        return client.get_executor(), [client.close, cluster.close]
    client = Client(address)
    return client.get_executor(), [client.close]


def _read_annotations(path: str) -> dict:
    from .annotations import read_json, read_luna_csv

    return read_json(path) if path.lower().endswith(".json") else read_luna_csv(path)


def _lesions_for(case: Case, table: dict | None):
    if table is None:
        return None
    from .annotations import Lesions

    keys = [case.dicom.uid] if case.dicom is not None else []
    keys += [case.fields.get("stem"), case.fields.get("name")]
    for k in keys:
        if k in table:
            return table[k]
    return Lesions.empty()


def _convert(ex, inputs, outdir, spec, fmt, labels_dir, name, device, force, progress, qc, threads,
             table=None, nan="error"):
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
        done = os.path.exists(out_path) and (label_path is None or os.path.exists(label_path)) and (
            table is None or os.path.exists(annotations_path(out_path)))
        if done and not force:
            old = prior.get(nm, {})
            row = {**old, **row, "status": "skipped", "error": "output exists (use --force to redo)"}
            rows.append(row)
            if progress:
                progress(row)
            continue
        qc_path = os.path.join(outdir, "qc", f"{nm}.png") if qc else None
        if qc_path:
            os.makedirs(os.path.dirname(qc_path), exist_ok=True)
        todo.append(((c, out_path, label_path, spec, device, qc_path, threads, _lesions_for(c, table), nan,
                      1 if ex is not None else None), row))  # a pool already spreads cases over the cores
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
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "skipped", "failed")}
    counts["total"] = len(rows)
    secs = [float(r["seconds"]) for r in rows if r.get("seconds")]
    counts["mean_seconds"] = float(np.mean(secs)) if secs else 0.0
    return counts


__all__ += ["summary"]
