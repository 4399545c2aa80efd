"""Readers for lesion annotations. Every malformed input names the file and the line/item."""

from __future__ import annotations

import csv
import json
import os

import numpy as np

from ..errors import MedprocError, ReadError
from ..geometry import LPS_TO_RAS
from ..volume import Volume
from .lesions import Lesions

__all__ = ["read_luna_csv", "read_json", "read_seg", "read_rtstruct", "BOX_MODES"]

_FLIP = LPS_TO_RAS.diagonal()[:3]  # LPS <-> RAS on coordinates
BOX_MODES = ("cccwhd", "xyzxyz")


def read_luna_csv(path, series: str | None = None) -> dict[str, Lesions] | Lesions:
    """LUNA16-style ``seriesuid,coordX,coordY,coordZ,diameter_mm`` (world LPS mm).

    Returns ``{seriesuid: Lesions}``, or the Lesions of ``series`` (empty if it has none).
    ``seriesuid`` is a DICOM SeriesInstanceUID or an image file's stem.
    """
    path = os.fspath(path)
    need = ("seriesuid", "coordX", "coordY", "coordZ", "diameter_mm")
    rows: dict[str, list] = {}
    try:
        f = open(path, newline="")
    except OSError as e:
        raise ReadError(f"cannot be opened: {e}", path) from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise ReadError(
                f"line 1: missing column(s) {missing}; a lesion CSV needs {list(need)}", path
            )
        for line, row in enumerate(reader, 2):
            try:
                xyz = np.array([float(row["coordX"]), float(row["coordY"]), float(row["coordZ"])])
                d = float(row["diameter_mm"])
            except (TypeError, ValueError):
                raise ReadError(
                    f"line {line}: coordinates and diameter must be numbers, got "
                    f"{[row.get(c) for c in need[1:]]}",
                    path,
                ) from None
            if not np.all(np.isfinite(xyz)) or not np.isfinite(d) or d <= 0:
                raise ReadError(
                    f"line {line}: coordinates must be finite and the diameter > 0, got "
                    f"{xyz.tolist()} / {d}",
                    path,
                )
            uid = (row["seriesuid"] or "").strip()
            if not uid:
                raise ReadError(f"line {line}: empty seriesuid", path)
            rows.setdefault(uid, []).append((xyz * _FLIP, d, f"{os.path.basename(path)}:{line}"))
    out = {
        uid: Lesions(
            np.array([r[0] for r in rs]),
            np.array([[r[1]] * 3 for r in rs]),
            ["point"] * len(rs),
            None,
            [r[2] for r in rs],
        )
        for uid, rs in rows.items()
    }
    if series is not None:
        return out.get(series, Lesions.empty())
    return out


def read_json(path, image: str | None = None) -> dict[str, Lesions] | Lesions:
    """medproc's JSON lesion format, modelled on MONAI detection's world-coordinate boxes::

        {"coordinate_system": "RAS",            # or "LPS"
         "box_mode": "cccwhd",                  # or "xyzxyz" (min corner, max corner)
         "cases": [{"image": "case001.nii.gz",
                    "boxes": [[x, y, z, w, h, d], ...], "labels": [0, ...],
                    "points": [[x, y, z, diameter_mm], ...]}]}

    MONAI's own datalist layout (``{"training": [{"image": ..., "box": [...], "label": [...]}]}``,
    world coordinates, ``cccwhd``) is accepted too. Returns ``{image stem: Lesions}``, or the
    Lesions of ``image`` (a path or stem).
    """
    path = os.fspath(path)
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise ReadError(f"line {e.lineno}: not valid JSON ({e.msg})", path) from None
    except OSError as e:
        raise ReadError(f"cannot be opened: {e}", path) from None
    if not isinstance(doc, dict):
        raise ReadError("the top level must be an object with a 'cases' list", path)
    system = str(doc.get("coordinate_system", "RAS")).upper()
    if system not in ("RAS", "LPS"):
        raise ReadError(f"coordinate_system must be 'RAS' or 'LPS', got {system!r}", path)
    mode = str(doc.get("box_mode", "cccwhd")).lower()
    if mode not in BOX_MODES:
        raise ReadError(f"box_mode must be one of {BOX_MODES}, got {mode!r}", path)
    cases = doc.get("cases")
    if cases is None:
        cases = [
            dict(image=c.get("image"), boxes=c.get("box", []), labels=c.get("label", []))
            for key in ("training", "validation", "test")
            for c in doc.get(key, [])
        ]
    flip = _FLIP if system == "LPS" else np.ones(3)
    out: dict[str, Lesions] = {}
    for n, case in enumerate(cases):
        where = f"cases[{n}]"
        img = case.get("image") if isinstance(case, dict) else None
        if not img:
            raise ReadError(f"{where}: needs an 'image'", path)
        centers, sizes, kinds, labels, ids = [], [], [], [], []
        boxes = case.get("boxes", []) or []
        labs = case.get("labels", []) or [0] * len(boxes)
        if len(labs) != len(boxes):
            raise ReadError(f"{where}: {len(boxes)} boxes but {len(labs)} labels", path)
        for b, (box, lab) in enumerate(zip(boxes, labs)):
            v = _numbers(box, 6, path, f"{where}.boxes[{b}]")
            if mode == "cccwhd":
                c, s = v[:3], v[3:]
            else:
                c, s = (v[:3] + v[3:]) / 2, v[3:] - v[:3]
            if np.any(s <= 0):
                raise ReadError(
                    f"{where}.boxes[{b}]: box sizes must be > 0, got {s.tolist()}", path
                )
            centers.append(c * flip)
            sizes.append(s)
            kinds.append("box")
            labels.append(int(lab))
            ids.append(f"{os.path.basename(path)}:{where}.boxes[{b}]")
        for p, pt in enumerate(case.get("points", []) or []):
            v = _numbers(pt, 4, path, f"{where}.points[{p}]")
            if v[3] <= 0:
                raise ReadError(f"{where}.points[{p}]: diameter must be > 0", path)
            centers.append(v[:3] * flip)
            sizes.append([v[3]] * 3)
            kinds.append("point")
            labels.append(0)
            ids.append(f"{os.path.basename(path)}:{where}.points[{p}]")
        out[_stem(img)] = Lesions(
            np.array(centers).reshape(-1, 3),
            np.array(sizes).reshape(-1, 3),
            kinds,
            np.array(labels, int),
            ids,
        )
    if image is not None:
        return out.get(_stem(image), Lesions.empty())
    return out


def _numbers(v, n, path, where) -> np.ndarray:
    try:
        arr = np.array([float(x) for x in v])
    except (TypeError, ValueError):
        raise ReadError(f"{where}: expected {n} numbers, got {v!r}", path) from None
    if arr.shape != (n,) or not np.all(np.isfinite(arr)):
        raise ReadError(f"{where}: expected {n} finite numbers, got {v!r}", path)
    return arr


def _stem(p: str) -> str:
    from ..io import stem

    return stem(p, extra=(".dcm",))


def read_seg(path) -> Volume:
    """A DICOM SEG as a label map on its own grid: voxel value = segment number (0 = none).

    Frames are grouped by ReferencedSegmentNumber; each segment's frames are placed on the
    union grid of all frames (positions along the normal), so overlapping segments keep the
    higher segment number where they overlap.
    """
    import pydicom

    from ..io.dicom_geometry import series_geometry
    from ..io.dicom_scan import DicomSeries, frames_of

    path = os.fspath(path)
    try:
        ds = pydicom.dcmread(path)
    except Exception as e:  # noqa: BLE001
        raise ReadError(f"cannot be read as DICOM: {type(e).__name__}: {e}", path) from None
    if ds.get("Modality") != "SEG" or "PerFrameFunctionalGroupsSequence" not in ds:
        raise ReadError(f"is not a DICOM SEG (Modality {ds.get('Modality')!r})", path)
    frames, extra = frames_of(ds, path)
    seg_of = []
    for i, item in enumerate(ds.PerFrameFunctionalGroupsSequence):
        sis = item.get("SegmentIdentificationSequence")
        if not sis:
            raise ReadError(f"frame {i + 1} has no SegmentIdentificationSequence", path)
        seg_of.append(int(sis[0].ReferencedSegmentNumber))
    px = ds.pixel_array
    if px.ndim == 2:
        px = px[None]
    # one frame per distinct position: build the grid from the first frame at each position
    normal = np.cross(frames[0].orientation[:3], frames[0].orientation[3:])
    d = np.array([f.position @ normal for f in frames])
    uniq, first = np.unique(np.round(d, 3), return_index=True)
    info = {"Rows": ds.Rows, "Columns": ds.Columns, **extra}
    geom = series_geometry(
        DicomSeries(str(ds.get("SeriesInstanceUID", path)), [frames[i] for i in first], info)
    )
    slot_of_pos = {
        float(u): k for k, u in enumerate(np.round(d[[first[i] for i in geom.order]], 3))
    }
    lab = np.zeros(
        (len(uniq), int(ds.Rows), int(ds.Columns)), np.uint8 if max(seg_of) < 256 else np.uint16
    )
    for i, seg in enumerate(seg_of):
        k = slot_of_pos[float(np.round(d[i], 3))]
        lab[k][px[i] > 0] = seg
    names = {
        int(s.SegmentNumber): str(s.get("SegmentLabel", "")) for s in ds.get("SegmentSequence", [])
    }
    return Volume(
        lab.transpose(2, 1, 0),
        geom.affine,
        {"source": path, "format": "dicom-seg", "segments": names, "warnings": geom.warnings},
    )


def read_rtstruct(path, image: Volume, roi: str | int | None = None) -> Volume:
    """Rasterise RTSTRUCT contours onto ``image``'s grid: value = ROI number (0 outside).

    Closed planar contours (LPS mm) are mapped to ``image``'s voxel indices; a contour must lie
    on a slice of the image (within 0.5 voxel along k); its interior voxels (centres inside
    the polygon) get the ROI number. ``roi`` keeps one ROI (by name or number).
    """
    import pydicom
    from matplotlib.path import Path

    path = os.fspath(path)
    try:
        ds = pydicom.dcmread(path, force=True)
    except Exception as e:  # noqa: BLE001
        raise ReadError(f"cannot be read as DICOM: {type(e).__name__}: {e}", path) from None
    if "ROIContourSequence" not in ds:
        raise ReadError("is not an RTSTRUCT (no ROIContourSequence)", path)
    names = {
        int(r.ROINumber): str(r.get("ROIName", "")) for r in ds.get("StructureSetROISequence", [])
    }
    if isinstance(roi, str):
        hits = [n for n, name in names.items() if name.lower() == roi.lower()]
        if not hits:
            raise MedprocError(f"no ROI named {roi!r}; ROIs here: {sorted(names.values())}", path)
        roi = hits[0]
    inv = np.linalg.inv(image.affine)
    out = np.zeros(image.shape, np.uint16)
    ii, jj = np.mgrid[: image.shape[0], : image.shape[1]]
    pix = np.stack([ii.ravel(), jj.ravel()], 1).astype(float)
    for rc in ds.ROIContourSequence:
        num = int(rc.ReferencedROINumber)
        if roi is not None and num != roi:
            continue
        for c, contour in enumerate(rc.get("ContourSequence", [])):
            where = f"ROI {num} contour {c + 1}"
            if str(contour.get("ContourGeometricType", "CLOSED_PLANAR")) not in ("CLOSED_PLANAR",):
                continue
            try:
                pts = np.array([float(x) for x in contour.ContourData]).reshape(-1, 3)
            except (AttributeError, ValueError) as e:
                raise ReadError(f"{where}: malformed ContourData ({e})", path) from None
            idx = (inv[:3, :3] @ (pts * _FLIP).T).T + inv[:3, 3]
            k = np.round(idx[:, 2])
            if np.ptp(idx[:, 2]) > 0.5 or np.abs(idx[:, 2] - k).max() > 0.5:
                raise ReadError(
                    f"{where}: the contour does not lie on a slice of the image grid", path
                )
            k = int(k[0])
            if not 0 <= k < image.shape[2]:
                continue  # outside this image's slices
            inside = Path(idx[:, :2]).contains_points(pix).reshape(image.shape[:2])
            out[:, :, k][inside] = num
    dtype = np.uint8 if out.max() < 256 else np.uint16
    return image.with_array(out.astype(dtype), source=path, format="rtstruct", rois=names)
