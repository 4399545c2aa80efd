"""Datasets that training tools read directly, made from a finished ``medproc convert``.

- :func:`write_nnunet`: an nnU-Net v2 raw dataset (``imagesTr/<case>_0000.nii.gz``,
  ``labelsTr/<case>.nii.gz``, ``imagesTs/`` for cases without a label, ``dataset.json``).
- :func:`write_monai_datalist`: a decathlon datalist JSON (``{"training": [{"image", "label"}]}``)
  that ``monai.data.load_decathlon_datalist`` reads; paths are relative to the JSON file.

Both read the conversion's ``manifest.csv`` (cases with status ok or skipped). Labels are the
manifest's label outputs, or ``labels=``: label maps, DICOM SEG or RTSTRUCT files per case (see
:func:`find_dicom_labels`) put on the output grid by nearest neighbour through the engine
(:func:`label_on_grid`). Classes become 1..N without gaps (as nnU-Net requires); SEG segments
and RTSTRUCT ROIs are matched across cases by name. A dataset folder is built beside its target
and renamed into place; images are hard links to the outputs (copies across file systems): no
space used, and a later ``convert --force`` (which writes new files) never changes them.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import tempfile

import numpy as np

from .errors import GeometryError, MedprocError
from .volume import Volume

__all__ = ["write_nnunet", "write_monai_datalist", "find_dicom_labels", "label_on_grid"]

_NNUNET_NAME = re.compile(r"^Dataset\d{3}_[A-Za-z0-9_\-]+$")
_DICOM_LABELS = ("SEG", "RTSTRUCT")


def _finished_rows(source) -> list[dict]:
    """Manifest rows (from an output folder, a manifest.csv, or rows) whose output exists."""
    rows = [dict(r) for r in source] if not isinstance(source, (str, os.PathLike)) else None
    if rows is None:
        path = os.fspath(source)
        path = os.path.join(path, "manifest.csv") if os.path.isdir(path) else path
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no manifest.csv; run medproc convert first")
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    done = [r for r in rows if r.get("status") in ("ok", "skipped") and os.path.exists(r["output"])]
    if not done:
        raise MedprocError("no finished case in the manifest (status ok or skipped)", str(source))
    return sorted(done, key=lambda r: r["case"])


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
            lab = _seg_on_image(src, source_image())
    else:
        lab = read_rtstruct(src, source_image()) if modality == "RTSTRUCT" else load(src)
    names = lab.meta.get("segments") or lab.meta.get("rois")
    hdr = nibabel.load(row["output"])
    if lab.shape != hdr.shape[:3] or not np.allclose(lab.affine, hdr.affine, atol=1e-4):
        lab = label_on_grid(lab, hdr.affine, hdr.shape, device)
    return lab, {int(k): str(v) for k, v in names.items() if str(v)} if names else None


def _seg_on_image(path: str, image: Volume) -> Volume:
    """A DICOM SEG's frames placed on ``image``'s grid (nearest voxel of each pixel centre;
    overlaps keep the higher segment number): for SEGs that leave out empty slices."""
    import pydicom

    ds = pydicom.dcmread(path)
    px = ds.pixel_array.reshape(-1, int(ds.Rows), int(ds.Columns))
    shared = ds.SharedFunctionalGroupsSequence[0] if "SharedFunctionalGroupsSequence" in ds else {}
    inv = np.linalg.inv(image.affine)
    out = np.zeros(image.shape, np.uint16)
    for n, fr in enumerate(ds.PerFrameFunctionalGroupsSequence):

        def attr(seq, name, fr=fr):
            item = fr.get(seq) or shared.get(seq)
            return np.array([float(x) for x in item[0].get(name)])

        iop = attr("PlaneOrientationSequence", "ImageOrientationPatient")
        ps = attr("PixelMeasuresSequence", "PixelSpacing")  # row spacing, column spacing
        r, c = np.nonzero(px[n])
        lps = (
            attr("PlanePositionSequence", "ImagePositionPatient")
            + np.outer(c * ps[1], iop[:3])
            + np.outer(r * ps[0], iop[3:])
        )
        ijk = np.rint((lps * [-1, -1, 1]) @ inv[:3, :3].T + inv[:3, 3]).astype(int)
        ok = np.all((ijk >= 0) & (ijk < image.shape), axis=1)
        i, j, k = ijk[ok].T
        seg = int(fr.SegmentIdentificationSequence[0].ReferencedSegmentNumber)
        out[i, j, k] = np.maximum(out[i, j, k], seg)
    names = {
        int(s.SegmentNumber): str(s.get("SegmentLabel", "")) for s in ds.get("SegmentSequence", [])
    }
    out = out.astype(np.uint8 if out.max() < 256 else np.uint16)
    return image.with_array(out, source=path, format="dicom-seg", segments=names)


def _values(arr: np.ndarray) -> list[int]:
    arr = np.asarray(arr)
    if arr.dtype.kind == "f":
        if not np.all(arr == np.round(arr)):
            raise MedprocError("label map holds non-integer values; is it an image?")
        arr = arr.astype(np.int64)
    if arr.size and arr.min() >= 0 and arr.max() < 1 << 20:
        return [int(v) for v in np.flatnonzero(np.bincount(arr.ravel())) if v > 0]
    return [int(v) for v in np.unique(arr) if v > 0]


def _gather(rows, labels, label_names, device):
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
        key = {v: (names or label_names).get(v, v) for v in _values(vol.array)}
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


def _place(src: str, dst: str, link: str) -> None:
    """Hard-link ``src`` at ``dst`` ("auto": a copy where linking fails), or copy it."""
    if link != "copy":
        try:
            return os.link(src, dst)
        except OSError:
            if link == "hard":
                raise
    shutil.copy2(src, dst)


def _write_label(vol: Volume, key: dict, index: dict, link: str | None, dst: str, how: str):
    """The label, renumbered to the class indices (linked as is when nothing changes)."""
    from .io import save

    pairs = {v: index[k] for v, k in key.items()}
    if link is not None and all(v == n for v, n in pairs.items()):
        return _place(link, dst, how)
    lut = np.zeros(max([0, *pairs]) + 1, np.uint8 if len(index) < 255 else np.uint16)
    lut[list(pairs)] = list(pairs.values())
    arr = np.clip(np.asarray(vol.array).astype(np.int64), 0, len(lut) - 1)
    save(Volume(lut[arr], vol.affine), dst)


def _swap_in(tmp: str, target: str) -> None:
    """Rename the finished folder ``tmp`` to ``target``; an older one is moved aside first and
    removed once the new one is in place."""
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
    if os.path.exists(target):
        os.replace(target, os.path.join(old, "d"))
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _channel_name(path: str) -> str:
    """'CT' for HU data (nnU-Net's CT normalisation), else 'zscore' (per-image z-score)."""
    from .io import load

    s = np.asarray(load(path).array)[::4, ::4, ::4]
    return "CT" if s.min() < -500 and s.max() > 200 else "zscore"


def write_nnunet(
    source,
    dataset_dir,
    *,
    labels: dict | None = None,
    channel_name: str | None = None,
    label_names: dict | None = None,
    link: str = "auto",
    overwrite: bool = False,
    device: str = "cpu",
) -> str:
    """Write an nnU-Net v2 raw dataset from a finished conversion.

    Parameters
    ----------
    source : str or list of dict
        The conversion's output folder (or its ``manifest.csv``, or manifest rows). Cases that
        finished (status ok or skipped) are used; outputs must be ``.nii.gz``.
    dataset_dir : str
        ``$nnUNet_raw/DatasetNNN_Name`` (nnU-Net finds datasets by this name).
    labels : dict, optional
        Case name or SeriesInstanceUID -> a label map, DICOM SEG or RTSTRUCT file (e.g. from
        :func:`find_dicom_labels`); otherwise the manifest's label outputs.
    channel_name : str, optional
        ``channel_names["0"]``; nnU-Net picks the normalisation from it. Default: "CT" when
        the first image holds HU, else "zscore".
    label_names : dict, optional
        Label-map value -> class name (SEG segments and RTSTRUCT ROIs bring their own names;
        classes are matched across cases by name, else by value, named "label_<v>").
    link : {"auto", "hard", "copy"}
        Hard links to the outputs (auto: copies where linking fails, e.g. across disks).
    overwrite : bool
        Replace an existing dataset folder (otherwise refuse).
    device : {"cpu", "gpu"}
        Engine device for putting SEG/RTSTRUCT labels on the output grid.

    Returns
    -------
    str
        ``dataset_dir``: labelled cases in imagesTr/labelsTr (``numTraining``), others in imagesTs.
    """
    if link not in ("auto", "hard", "copy"):
        raise ValueError(f"link must be 'auto', 'hard' or 'copy', got {link!r}")
    target = os.path.abspath(os.fspath(dataset_dir))
    if not _NNUNET_NAME.match(os.path.basename(target)):
        raise ValueError(
            f"nnU-Net finds raw datasets by name: {os.path.basename(target)!r} must look like "
            "'Dataset501_Lungs' (Dataset + 3 digits + _ + name), inside $nnUNet_raw"
        )
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--force) to replace it")
    rows = _finished_rows(source)
    for r in rows:
        if not r["output"].endswith(".nii.gz"):
            raise MedprocError(
                "nnU-Net needs .nii.gz images: convert with --format nii.gz", r["output"]
            )
    cases, index = _gather(rows, labels, label_names, device)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.part-", dir=os.path.dirname(target))
    try:
        for sub in ("imagesTr", "labelsTr", "imagesTs"):
            os.makedirs(os.path.join(tmp, sub))
        for r, vol, lk, key in cases:
            name = f"{r['case']}_0000.nii.gz"
            split = "imagesTs" if vol is None else "imagesTr"
            _place(r["output"], os.path.join(tmp, split, name), link)
            if vol is not None:
                dst = os.path.join(tmp, "labelsTr", f"{r['case']}.nii.gz")
                _write_label(vol, key, index, lk, dst, link)
        n_train = sum(vol is not None for _, vol, _, _ in cases)
        if n_train == 0:
            raise MedprocError("no case has a label: nnU-Net needs labelled training cases")
        classes = {(k if isinstance(k, str) else f"label_{k}"): n for k, n in index.items()}
        if len(classes) != len(index) or "background" in classes:
            raise MedprocError(f"label names must be unique, not 'background': {list(index)}")
        doc = {
            "channel_names": {"0": channel_name or _channel_name(rows[0]["output"])},
            "labels": {"background": 0, **classes},
            "numTraining": n_train,
            "file_ending": ".nii.gz",
            "name": os.path.basename(target).split("_", 1)[1],
            "description": "written by medproc from a converted dataset (manifest.csv)",
        }
        with open(os.path.join(tmp, "dataset.json"), "w") as f:
            json.dump(doc, f, indent=1)
        _swap_in(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_monai_datalist(
    source,
    path,
    *,
    labels: dict | None = None,
    label_names: dict | None = None,
    validation=(),
    labels_dir: str | None = None,
    device: str = "cpu",
) -> str:
    """Write a MONAI decathlon datalist JSON for a finished conversion, atomically.

    ``{"training": [{"image": ..., "label": ...}], "validation": [...], "test": [{"image"}]}``
    with paths relative to the JSON's folder (``load_decathlon_datalist`` resolves them there).
    Cases named in ``validation`` go to "validation", cases without a label to "test".
    ``labels`` and ``label_names`` as in :func:`write_nnunet`; labels made from DICOM SEG or
    RTSTRUCT (or renumbered) are written to ``labels_dir`` (default: ``labels/`` beside the
    JSON); "labels" names the classes (as the decathlon's dataset.json). Returns ``path``.
    """
    from .io import atomic_write

    path = os.path.abspath(os.fspath(path))
    base = os.path.dirname(path)
    rows = _finished_rows(source)
    cases, index = _gather(rows, labels, label_names, device)
    labels_dir = labels_dir or os.path.join(base, "labels")
    doc: dict = {"training": [], "validation": [], "test": []}
    for r, vol, lk, key in cases:
        item = {"image": os.path.relpath(r["output"], base)}
        if vol is None:
            doc["test"].append(item)
            continue
        dst = lk if lk and all(v == index[k] for v, k in key.items()) else None
        if dst is None:  # renumbered or from DICOM: written beside the list (save is atomic)
            dst = os.path.join(labels_dir, f"{r['case']}.nii.gz")
            _write_label(vol, key, index, None, dst, "copy")
        item["label"] = os.path.relpath(dst, base)
        doc["validation" if r["case"] in set(validation) else "training"].append(item)
    doc = {k: v for k, v in doc.items() if v or k == "training"}
    doc["labels"] = {"0": "background"} | {
        str(n): (k if isinstance(k, str) else f"label_{k}") for k, n in index.items()
    }
    with atomic_write(path) as t, open(t, "w") as f:
        json.dump(doc, f, indent=1)
    return path
