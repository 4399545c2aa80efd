"""The labels of the training layouts (:mod:`medproc.layouts`): DICOM SEG and RTSTRUCT files found
beside the inputs, each case's label put on its output grid by nearest neighbour through the
engine, and the classes matched across cases (1..N without gaps)."""

from __future__ import annotations

import os

import numpy as np

from .errors import GeometryError, MedprocError
from .volume import Volume

__all__ = ["find_dicom_labels", "label_on_grid", "gather_labels"]

_DICOM_LABELS = ("SEG", "RTSTRUCT")


def find_dicom_labels(roots) -> dict[str, str]:
    """DICOM SEG and RTSTRUCT files under ``roots``, keyed by the SeriesInstanceUID they annotate.

    Headers only. The keys match the manifest's ``series_uid`` column, so the result can be
    passed as ``labels=`` to :func:`write_nnunet` / :func:`write_monai_datalist`.
    """
    out: dict[str, str] = {}
    roots = [os.fspath(r) for r in ([roots] if isinstance(roots, (str, os.PathLike)) else roots)]
    files = [r for r in roots if os.path.isfile(r)]
    files += [
        os.path.join(d, n) for r in roots for d, _, fs in sorted(os.walk(r)) for n in sorted(fs)
    ]
    for p in files:
        ds = _header(p)
        if ds is not None and ds.get("Modality") in _DICOM_LABELS and _referenced_series(ds):
            out.setdefault(_referenced_series(ds), p)
    return out


def _header(path: str):
    """The DICOM header of ``path`` (without DICM preamble too, if named .dcm), or None."""
    import pydicom

    try:
        return pydicom.dcmread(path, stop_before_pixels=True, force=path.lower().endswith(".dcm"))
    except Exception:  # noqa: BLE001 - not DICOM
        return None


def _referenced_series(ds) -> str | None:
    """The series a SEG (ReferencedSeriesSequence) or RTSTRUCT annotates."""
    uids = [str(i.SeriesInstanceUID) for i in ds.get("ReferencedSeriesSequence", [])] + [
        str(se.SeriesInstanceUID)
        for fr in ds.get("ReferencedFrameOfReferenceSequence", [])
        for st in fr.get("RTReferencedStudySequence", [])
        for se in st.get("RTReferencedSeriesSequence", [])
    ]
    return uids[0] if uids else None


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


def _label_volume(src: str, row: dict, device: str) -> tuple[Volume, dict | None]:
    """A case's label from a label map, DICOM SEG or RTSTRUCT, on the output grid, and names."""
    import nibabel

    from .annotations import read_rtstruct, read_seg
    from .io import load

    image_file = src.lower().endswith((".nii", ".nii.gz", ".nrrd", ".mha"))
    modality = None if image_file else getattr(_header(src), "Modality", None)

    def source_image():  # the case's input volume (RTSTRUCT contours are drawn on its grid)
        return load(row["source"], series=row.get("series_uid") or None)

    if modality == "SEG":
        try:
            lab = read_seg(src)
        except GeometryError:  # frames with gaps (empty slices left out): onto the image
            lab = read_seg(src, image=source_image())
    else:
        lab = read_rtstruct(src, source_image()) if modality == "RTSTRUCT" else load(src)
    names = lab.meta.get("segments") or lab.meta.get("rois")
    hdr = nibabel.load(row["output"])
    if lab.shape != hdr.shape[:3] or not np.allclose(lab.affine, hdr.affine, atol=1e-4):
        lab = label_on_grid(lab, hdr.affine, hdr.shape, device)
    return lab, {int(k): str(v) for k, v in names.items() if str(v)} if names else None


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
        return [int(v) for v in np.flatnonzero(np.bincount(arr.ravel())) if v > 0]
    return [int(v) for v in np.unique(arr) if v > 0]


def gather_labels(rows, labels, label_names, device):
    """Per case: (row, label Volume or None, link path or None, {value: class key}), and the
    classes {key: 1..N}. A key is a segment/ROI name, else ``label_names[value]``, else the
    value; classes are ordered by their smallest value."""
    labels, label_names = labels or {}, label_names or {}
    cases, first, from_dicom = [], {}, set()
    for r in rows:
        src = labels.get(r["case"]) or labels.get(r.get("series_uid") or "\0")
        if src:
            vol, names = _label_volume(os.fspath(src), r, device)
            link = None
        elif r.get("label_output") and os.path.exists(r["label_output"]):
            from .io import load

            vol, names, link = load(r["label_output"]), None, r["label_output"]
        else:
            cases.append((r, None, None, {}))
            continue
        where = os.fspath(src) if src else r["label_output"]
        key = {v: (names or label_names).get(v, v) for v in _values(vol.array, where)}
        for v, k in key.items():
            first[k] = min(first.get(k, v), v)
        from_dicom |= {k for k in key.values() if names}
        cases.append((r, vol, link, key))
    bare = sorted(k for k in first if not isinstance(k, str))
    if from_dicom - set(bare) and bare:  # SEG/RTSTRUCT numbers differ file to file: match names
        raise MedprocError(
            f"SEG/RTSTRUCT labels are named ({', '.join(sorted(map(str, from_dicom)))}) but "
            f"label maps hold bare values {bare}: name those values with label_names="
            "{value: name} so that classes match across cases, or label every case alike"
        )
    order = sorted(first, key=lambda k: (first[k], str(k)))
    return cases, {k: n for n, k in enumerate(order, 1)}
