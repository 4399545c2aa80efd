"""The labels of the training layouts (:mod:`medproc.layouts`): DICOM SEG and RTSTRUCT files found
beside the inputs, each case's label put on its output grid by nearest neighbour through the
engine, and the classes matched across cases (1..N without gaps)."""

from __future__ import annotations

import os
import warnings

import numpy as np

from .errors import MedprocError, MedprocWarning
from .io.dicom_records import label_kind_of
from .volume import Volume

__all__ = ["find_dicom_labels", "label_on_grid", "gather_labels", "unreadable_dicom_labels"]

_MAX_CLASSES = 65535


def find_dicom_labels(roots) -> dict[str, str]:
    """DICOM SEG and RTSTRUCT files under ``roots``, keyed by the SeriesInstanceUID they annotate.

    Headers only. The keys match the manifest's ``series_uid`` column, so the result can be
    passed as ``labels=`` to :func:`write_nnunet` / :func:`write_monai_datalist`. Where two
    files (not copies of one: another SOPInstanceUID) annotate one series, the first in path
    order is used and a warning names both (pass ``labels=`` yourself to choose). A root that
    does not exist is a :class:`~medproc.errors.ReadError` naming it.
    """
    from .annotations.dicom_labels import referenced_series
    from .errors import ReadError

    out: dict[str, str] = {}
    roots = [os.fspath(r) for r in ([roots] if isinstance(roots, (str, os.PathLike)) else roots)]
    for r in roots:  # (a mistyped path gave no labels: every case unlabelled, unsaid)
        if not os.path.exists(r):
            raise ReadError("no such file or folder; check the path", r)
    files = [r for r in roots if os.path.isfile(r)]
    files += [os.path.join(d, n) for r in roots for d, _, fs in os.walk(r) for n in fs]
    files.sort()  # (path order, whether given as files or found under folders: the CLI gives
    # the scan's files, in the order the scan found them, and picked another file than this)
    seen, sop, more = set(), {}, {}  # real paths read; SOPInstanceUID per file used; left out
    for p in files:
        if os.path.realpath(p) in seen:
            continue
        seen.add(os.path.realpath(p))
        ds = _header(p)
        uid = (referenced_series(ds) or [None])[0] if ds is not None else None
        if ds is None or label_kind_of(ds) is None:
            continue
        if uid is None:  # (it was left out unsaid, and its case went to the test set)
            warnings.warn(
                f"{p}: a DICOM {label_kind_of(ds)} that references no series (no "
                "ReferencedSeriesSequence, nor a series in its ReferencedFrameOfReference"
                "Sequence): left out; pass labels={series UID: file} to use it",
                MedprocWarning,
                stacklevel=2,
            )
            continue
        if uid not in out:
            out[uid], sop[uid] = p, ds.get("SOPInstanceUID")
        elif sop[uid] is None or ds.get("SOPInstanceUID") != sop[uid]:  # (a copy: the same)
            more.setdefault(uid, []).append(p)
    for uid, others in more.items():
        warnings.warn(
            f"{out[uid]} and {', '.join(others)} all annotate series {uid}: {out[uid]} is used, "
            "the other(s) left out; keep one of them among the inputs, or pass labels="
            "{series UID: file} to write_nnunet / write_monai_datalist",
            MedprocWarning,
            stacklevel=2,
        )
    return out


def unreadable_dicom_labels(rows) -> list[str]:
    """The errors of failed rows (manifest or batch rows) whose input is a DICOM SEG or
    RTSTRUCT file: an annotation given but unreadable (each error names its file)."""
    return [
        str(r.get("error") or "cannot be read")
        for r in rows
        if r.get("status") == "failed"
        and os.path.isfile(r.get("source") or "")
        and label_kind_of(_header(r["source"])) is not None
    ]


def _header(path: str):
    """The DICOM header of ``path`` (without DICM preamble too, if named .dcm), or None."""
    import pydicom

    try:
        return pydicom.dcmread(path, stop_before_pixels=True, force=path.lower().endswith(".dcm"))
    except Exception:  # noqa: BLE001 - not DICOM
        return None


def label_on_grid(label: Volume, affine, shape, device: str = "cpu") -> Volume:
    """``label`` resampled onto the grid ``(affine, shape)`` with nearest neighbour (0 outside).

    One plan (output index -> label index) executed by the engine, as every resample is; the
    values and dtype are kept (bool becomes uint8).
    """
    from .geometry import as_affine
    from .pipeline import Engine, Graph, Job
    from .plan import Plan

    out_affine, shape = as_affine(affine), tuple(int(s) for s in shape[:3])
    arr = label.numpy().array
    arr = arr.astype(np.uint8) if arr.dtype == bool else arr
    plan = Plan(
        label.shape, label.affine, shape, out_affine, np.linalg.inv(label.affine) @ out_affine
    )
    graph = Graph(interp="nearest", fill=0.0, dtype=str(arr.dtype))
    ((out,),) = Engine(device, batch_size=1).run([Job(arr, plan)], graph)
    return Volume(out, out_affine, {**label.meta, "resampled_onto_output_grid": True})


def _input_grid(row: dict) -> Volume:
    """The case's input as a grid without voxels (SEG frames and RTSTRUCT contours need only
    its affine and shape): a DICOM series from its headers, the same geometry ``load`` gives
    (reading every series' pixels again cost as much as converting it); other files loaded."""
    from .io import kind_of, load

    src, uid = row["source"], row.get("series_uid") or None
    if kind_of(src) not in ("nifti", "itk"):
        from .io.dicom_read import scan_dicom, select_series
        from .io.headers import series_grid

        found = scan_dicom(src).series
        if found:
            grid = series_grid(select_series(found, uid, src))
            empty = np.broadcast_to(np.zeros((), np.uint8), grid.shape[:3])
            return Volume(empty, grid.affine, {"source": src, "series_uid": uid or ""})
    return load(src, series=uid)


def _label_volume(src: str, row: dict, device: str) -> tuple[Volume, dict | None]:
    """A case's label from a label map, DICOM SEG or RTSTRUCT, on the output grid, and names."""
    import nibabel

    from .annotations import read_rtstruct
    from .annotations.dicom_labels import seg_on_image
    from .io import load

    image_file = src.lower().endswith((".nii", ".nii.gz", ".nrrd", ".mha"))
    modality = None if image_file else label_kind_of(_header(src))
    if modality is not None:  # on the grid of the case's input (SEG frames placed on it)
        image = _input_grid(row)
        if modality == "SEG":
            lab = seg_on_image(src, image)
        else:  # ROI numbers are identifiers (0, -1, 70000): values 1..N, named
            lab = read_rtstruct(src, image, renumber=True)
        if not np.any(lab.array):
            raise MedprocError(
                f"labels no voxel of {row['source']} (its frames or contours are empty): an empty "
                "label would train the case as all background; fix the file, or take it out of "
                "the inputs (the case is then a test case, without a label)",
                src,
            )
        on_grid = lab.shape == image.shape[:3] and np.allclose(lab.affine, image.affine, atol=1e-4)
        if not on_grid and not np.any(label_on_grid(lab, image.affine, image.shape, device).array):
            raise MedprocError(  # (on its own grid: placed nowhere on the series it names)
                f"every labelled voxel lies outside {row['source']}: is it the segmentation of "
                "another series? An empty label would train the case as all background",
                src,
            )
    else:
        lab = load(src)
    names = lab.meta.get("segments") or lab.meta.get("rois")
    hdr = nibabel.load(row["output"])
    if lab.shape != hdr.shape[:3] or not np.allclose(lab.affine, hdr.affine, atol=1e-4):
        from .resample import check_label_values

        check_label_values(lab, src)  # (what the engine resamples exactly; errors name src)
        lab = label_on_grid(lab, hdr.affine, hdr.shape, device)
        if modality is not None and not np.any(lab.array):
            warnings.warn(
                f"{src}: every labelled voxel lies outside the output grid of case "
                f"{row['case']} (cropped away?): its label is empty",
                MedprocWarning,
                stacklevel=2,
            )
    if not names:
        return lab, None
    named = {int(k): " ".join(str(v).split()) for k, v in names.items()}
    what = "segment" if modality == "SEG" else "ROI"
    used = {int(v) for v in np.unique(lab.array) if v}
    unnamed = sorted(k for k in used if not named.get(k))  # (blank, or never declared)
    if unnamed:  # (classes are matched across cases by name)
        raise MedprocError(
            f"{what}(s) {unnamed} have no name (blank, or not declared in the file): a layout "
            "matches classes across cases by name; name them in the file",
            src,
        )
    if any(v.lower() == "background" for v in named.values()):
        raise MedprocError(
            f"a {what} is named 'background', the layouts' name for label 0: rename it", src
        )
    return lab, {k: v for k, v in named.items() if v}


def _values(arr: np.ndarray, path: str) -> list[int]:
    """The classes (values > 0) of a label map; an error naming ``path`` for what no training
    layout can hold: not 3-D, non-integer or negative values."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise MedprocError(f"a label map must be 3-D, this one is {arr.shape}", path)
    if arr.dtype.kind == "f":
        if not np.all(arr == np.round(arr)):
            raise MedprocError("label map holds non-integer values; is it an image?", path)
        arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise MedprocError(
            f"label map holds negative values (min {arr.min()}): classes are >= 0", path
        )
    if arr.size and arr.min() >= 0 and arr.max() < 1 << 20:
        out = [int(v) for v in np.flatnonzero(np.bincount(arr.ravel())) if v > 0]
    else:
        out = [int(v) for v in np.unique(arr) if v > 0]
    if len(out) > _MAX_CLASSES:
        raise MedprocError(
            f"label map holds {len(out)} distinct values > 0, each a class: a training layout "
            f"holds at most {_MAX_CLASSES} classes (nnU-Net's uint16 labels); is it an image?",
            path,
        )
    return out


def gather_labels(rows, labels, label_names, device, failed: list | None = None):
    """Per case: (row, label Volume or None, link path or None, {value: class key}), and the
    classes {key: 1..N}. A key is a segment/ROI name, else ``label_names[value]``, else the
    value; classes are ordered by their smallest value. A case whose label cannot be used
    (unreadable, empty, negative values...) raises, or, given a ``failed`` list, is left out
    of the dataset and its error ("case NAME: ...", naming the label file) added there."""
    labels, label_names = labels or {}, label_names or {}
    known = {r["case"] for r in rows} | {r.get("series_uid") for r in rows}
    stray = [  # a label for no case: said, never dropped silently
        f"{os.fspath(src)}: annotates {'series' if _is_uid(k) else 'case'} {k}, which is none "
        "of the converted cases (not among the inputs, or it failed)"
        for k, src in labels.items()
        if k not in known
    ]
    for text in stray:
        warnings.warn(f"{text}: left out", MedprocWarning, stacklevel=2)
    cases, first, from_dicom = [], {}, set()
    spelled: dict = {}  # a class's name as first met, by its spelling without case and spaces
    for r in rows:
        src = labels.get(r["case"]) or labels.get(r.get("series_uid") or "\0")
        try:
            if src:
                vol, names = _label_volume(os.fspath(src), r, device)
                link = None
            elif r.get("label_output") and os.path.exists(r["label_output"]):
                from .io import load

                vol, names, link = load(r["label_output"]), None, r["label_output"]
            else:
                cases.append((r, None, None, {}))
                continue
            where = os.fspath(src) if src else _label_map_named(r)
            key = {v: (names or label_names).get(v, v) for v in _values(vol.array, where)}
            key = {v: spelled.setdefault(_canon(k), k) for v, k in key.items()}
        except MedprocError as e:
            if failed is None:
                raise
            failed.append(f"case {r['case']}: {e}")
            continue
        for v, k in key.items():
            first[k] = min(first.get(k, v), v)
        from_dicom |= {k for k in key.values() if names}
        cases.append((r, vol, link, key))
    if stray and all(vol is None for _, vol, _, _ in cases):
        raise MedprocError("no case has a label: " + "; ".join(stray))
    bare = sorted(k for k in first if not isinstance(k, str))
    if from_dicom - set(bare) and bare:  # SEG/RTSTRUCT numbers differ file to file: match names
        raise MedprocError(
            f"SEG/RTSTRUCT labels are named ({', '.join(sorted(map(str, from_dicom)))}) but "
            f"label maps hold bare values {bare}: name those values with label_names="
            "{value: name} so that classes match across cases, or label every case alike"
        )
    if len(first) > _MAX_CLASSES:
        raise MedprocError(
            f"the labels hold {len(first)} classes together: a training layout holds at most "
            f"{_MAX_CLASSES} (nnU-Net's uint16 labels); are some of them images?"
        )
    order = sorted(first, key=lambda k: (first[k], str(k)))
    return cases, {k: n for n, k in enumerate(order, 1)}


def _canon(key):
    """How class names are matched across cases: without case and extra spaces ('GTV' and
    'gtv ' are one class, named as first met); values stay values."""
    return " ".join(key.split()).lower() if isinstance(key, str) else key


def _label_map_named(row: dict) -> str:
    """A converted label map, named with the label map it was made from (its sidecar's
    ``label_source``): an error about its values is about that file."""
    import json

    from ._convert_case import sidecar_path

    try:
        with open(sidecar_path(row["output"])) as f:
            source = json.load(f).get("label_source")
    except (OSError, ValueError, AttributeError):
        source = None
    out = row["label_output"]
    return f"{out} (converted from {source})" if isinstance(source, str) and source else out


def _is_uid(key) -> bool:
    return isinstance(key, str) and all(p.isdigit() for p in key.split(".")) and "." in key
