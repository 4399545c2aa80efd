"""Label maps from DICOM annotations: SEG (segment frames on their own grid) and RTSTRUCT
(closed planar contours rasterised on an image's grid).

A truncated or incomplete file raises :class:`~medproc.errors.ReadError` naming the file and
the item (frame, ROI, contour) and what is missing, never a bare ``ValueError`` or
``AttributeError``.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from ..errors import MedprocError, ReadError
from ..geometry import LPS_TO_RAS
from ..volume import Volume

__all__ = ["read_seg", "read_rtstruct"]

_FLIP = LPS_TO_RAS.diagonal()[:3]  # LPS <-> RAS on coordinates


def _dcmread(path: str, force: bool = False):
    import pydicom

    from ..io.safety import check_file, os_error

    check_file(path)
    try:
        return pydicom.dcmread(path, force=force)
    except OSError as e:
        raise os_error(e, path) from None
    except Exception as e:  # noqa: BLE001 - pydicom raises many kinds on damaged files
        raise ReadError(f"cannot be read as DICOM: {type(e).__name__}: {e}", path) from None


@contextlib.contextmanager
def _incomplete(path: str, what: str):
    """Turn the errors an incomplete dataset causes into a ReadError naming the file."""
    try:
        yield
    except MedprocError:
        raise
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as e:
        raise ReadError(
            f"is an incomplete or malformed {what} ({type(e).__name__}: {e}); export it again "
            "or fix the attribute named",
            path,
        ) from None


def read_seg(path, image: Volume | None = None) -> Volume:
    """A DICOM SEG as a label map: voxel value = segment number (0 = none); where segments
    overlap, the higher number.

    Without ``image`` the map is on the SEG's own grid: the union of its frames' positions
    along the normal, which must be evenly spaced (a SEG that leaves out empty slices has gaps:
    give ``image``). With ``image`` (the series the SEG segments, e.g. ``medproc.load(folder)``)
    every frame's pixels are placed on that image's grid (the nearest voxel of each pixel
    centre), gaps or not.
    """
    from ..errors import GeometryError
    from ..io.dicom_geometry import series_geometry
    from ..io.dicom_scan import DicomSeries, frames_of

    path = os.fspath(path)
    ds = _dcmread(path)
    if ds.get("Modality") != "SEG" or "PerFrameFunctionalGroupsSequence" not in ds:
        raise ReadError(f"is not a DICOM SEG (Modality {ds.get('Modality')!r})", path)
    with _incomplete(path, "DICOM SEG"):
        frames, extra = frames_of(ds, path)
        seg_of = []
        for i, item in enumerate(ds.PerFrameFunctionalGroupsSequence):
            sis = item.get("SegmentIdentificationSequence")
            if not sis or "ReferencedSegmentNumber" not in sis[0]:
                raise ReadError(
                    "has no SegmentIdentificationSequence / ReferencedSegmentNumber",
                    path,
                    where=f"frame {i + 1}",
                )
            seg_of.append(int(sis[0].ReferencedSegmentNumber))
        if not seg_of:
            raise ReadError("holds no frames", path)
        placed = [f for f in frames if f.position is not None and f.orientation is not None]
        if len(placed) != len(frames):
            raise ReadError(
                "frames without PlanePositionSequence / PlaneOrientationSequence: the segments "
                "cannot be placed",
                path,
            )
        try:
            px = ds.pixel_array
        except Exception as e:  # noqa: BLE001 - decoders raise many kinds on damaged data
            raise ReadError(
                f"its pixel data cannot be decoded ({type(e).__name__}: {e}); truncated?", path
            ) from None
        if px.ndim == 2:
            px = px[None]
        if px.shape[0] < len(seg_of):
            raise ReadError(
                f"{len(seg_of)} frames declared but the pixel data holds {px.shape[0]}", path
            )
        names = {
            int(s.SegmentNumber): str(s.get("SegmentLabel", ""))
            for s in ds.get("SegmentSequence", [])
        }
        if image is not None:
            lab = _frames_on_image(frames, seg_of, px, image)
            return image.with_array(lab, source=path, format="dicom-seg", segments=names)
        # one frame per distinct position: build the grid from the first frame at each position
        normal = np.cross(frames[0].orientation[:3], frames[0].orientation[3:])
        d = np.array([f.position @ normal for f in frames])
        uniq, first = np.unique(np.round(d, 3), return_index=True)
        declared = extra.get("SpacingBetweenSlices")
        if declared and len(uniq) > 1 and np.diff(uniq).max() > 1.5 * float(declared):
            raise GeometryError(
                f"its frames lie up to {np.diff(uniq).max():g} mm apart where it declares "
                f"SpacingBetweenSlices {float(declared):g} mm: it leaves out slices, and has no "
                "grid of its own: give the series it segments, read_seg(path, "
                "image=medproc.load(series_folder))",
                path,
            )
        info = {"Rows": ds.Rows, "Columns": ds.Columns, **extra}
        try:
            geom = series_geometry(
                DicomSeries(
                    str(ds.get("SeriesInstanceUID", path)), [frames[i] for i in first], info
                )
            )
        except GeometryError as e:
            raise GeometryError(
                f"{e.message}. A SEG that leaves out empty slices has no grid of its own: give "
                "the series it segments, read_seg(path, image=medproc.load(series_folder))",
                path,
            ) from None
        slot_of_pos = {
            float(u): k for k, u in enumerate(np.round(d[[first[i] for i in geom.order]], 3))
        }
        lab = np.zeros(
            (len(uniq), int(ds.Rows), int(ds.Columns)),
            np.uint8 if max(seg_of) < 256 else np.uint16,
        )
        for i, seg in enumerate(seg_of):
            k = slot_of_pos[float(np.round(d[i], 3))]
            lab[k][px[i] > 0] = np.maximum(lab[k][px[i] > 0], seg)
    return Volume(
        lab.transpose(2, 1, 0),
        geom.affine,
        {"source": path, "format": "dicom-seg", "segments": names, "warnings": geom.warnings},
    )


def _frames_on_image(frames, seg_of, px, image: Volume) -> np.ndarray:
    """Each SEG frame's pixels placed on ``image``'s grid (the nearest voxel of each pixel
    centre; overlaps keep the higher segment number)."""
    inv = np.linalg.inv(np.asarray(image.affine, dtype=np.float64))
    out = np.zeros(image.shape[:3], np.uint16)
    for f, seg, frame in zip(frames, seg_of, px):
        r, c = np.nonzero(frame)
        if f.pixel_spacing is None:
            raise ReadError("has no PixelSpacing for its frames: they cannot be placed", f.path)
        rows, cols = f.pixel_spacing
        lps = (
            f.position
            + np.outer(c * cols, f.orientation[:3])
            + np.outer(r * rows, f.orientation[3:])
        )
        ijk = np.rint((lps * _FLIP) @ inv[:3, :3].T + inv[:3, 3]).astype(int)
        ok = np.all((ijk >= 0) & (ijk < image.shape[:3]), axis=1)
        i, j, k = ijk[ok].T
        out[i, j, k] = np.maximum(out[i, j, k], seg)
    return out.astype(np.uint8 if out.max() < 256 else np.uint16)


def _warn(text: str) -> None:
    import warnings

    from ..errors import MedprocWarning

    warnings.warn(text, MedprocWarning, stacklevel=3)


def read_rtstruct(path, image: Volume, roi: str | int | None = None) -> Volume:
    """Rasterise RTSTRUCT contours onto ``image``'s grid: value = ROI number (0 outside).

    Closed planar contours (LPS mm) are mapped to ``image``'s voxel indices; a contour must lie
    on a slice of the image (within 0.5 voxel along k); its interior voxels (centres inside
    the polygon) get the ROI number. ``roi`` keeps one ROI (by name or number).
    """
    from matplotlib.path import Path

    path = os.fspath(path)
    ds = _dcmread(path, force=True)
    if "ROIContourSequence" not in ds:
        raise ReadError("is not an RTSTRUCT (no ROIContourSequence)", path)
    with _incomplete(path, "RTSTRUCT"):
        names = {
            int(r.ROINumber): str(r.get("ROIName", ""))
            for r in ds.get("StructureSetROISequence", [])
        }
        if isinstance(roi, str):
            hits = [n for n, name in names.items() if name.lower() == roi.lower()]
            if not hits:
                raise MedprocError(
                    f"no ROI named {roi!r}; ROIs here: {sorted(names.values())}", path
                )
            roi = hits[0]
        elif roi is not None and int(roi) not in names:
            raise MedprocError(f"no ROI number {roi}; ROIs here: {names}", path)
        inv = np.linalg.inv(image.affine)
        out = np.zeros(image.shape, np.uint16)
        ii, jj = np.mgrid[: image.shape[0], : image.shape[1]]
        pix = np.stack([ii.ravel(), jj.ravel()], 1).astype(float)
        drawn = outside = 0
        unlisted = []
        for rc in ds.ROIContourSequence:
            num = int(rc.ReferencedROINumber)
            if roi is not None and num != roi:
                continue
            if num not in names:  # (its voxels would carry a number no ROI is named by)
                unlisted.append(num)
                continue
            for c, contour in enumerate(rc.get("ContourSequence", [])):
                where = f"ROI {num} contour {c + 1}"
                kind = str(contour.get("ContourGeometricType", "CLOSED_PLANAR"))
                if kind != "CLOSED_PLANAR":
                    continue
                try:
                    pts = np.array([float(x) for x in contour.ContourData]).reshape(-1, 3)
                except (AttributeError, ValueError, TypeError) as e:
                    raise ReadError(f"malformed ContourData ({e})", path, where=where) from None
                if len(pts) < 3 or not np.all(np.isfinite(pts)):
                    raise ReadError(
                        f"a closed contour needs 3 or more finite points, got {len(pts)}",
                        path,
                        where=where,
                    )
                idx = (inv[:3, :3] @ (pts * _FLIP).T).T + inv[:3, 3]
                k = np.round(idx[:, 2])
                if np.ptp(idx[:, 2]) > 0.5 or np.abs(idx[:, 2] - k).max() > 0.5:
                    raise ReadError(
                        "the contour does not lie on a slice of the image grid", path, where=where
                    )
                k = int(k[0])
                if not 0 <= k < image.shape[2]:
                    outside += 1  # outside this image's slices
                    continue
                inside = Path(idx[:, :2]).contains_points(pix).reshape(image.shape[:2])
                if not inside.any():  # (on a slice, but beside the image in its plane)
                    outside += 1
                    continue
                out[:, :, k][inside] = num
                drawn += 1
    if unlisted:
        _warn(
            f"{path}: contours of ROI {sorted(set(unlisted))}, which StructureSetROISequence does "
            f"not list (it lists {sorted(names)}), are left out (a deleted ROI's leftovers?)"
        )
    if outside and not drawn:
        raise ReadError(
            f"all {outside} of its contours lie outside the image (off its slices or beside "
            f"them, or enclosing no voxel centre): is it the "
            f"structure set of another series than {image.meta.get('source') or 'this image'}?",
            path,
        )
    if outside:
        _warn(
            f"{path}: {outside} of {outside + drawn} contours lie outside the image (off its "
            "slices or beside them, or enclosing no voxel centre): left out"
        )
    dtype = np.uint8 if out.max() < 256 else np.uint16
    return image.with_array(out.astype(dtype), source=path, format="rtstruct", rois=names)
