"""RTSTRUCT annotations as label maps: closed planar contours rasterised on an image's grid
(the checks and messages of :mod:`.dicom_labels`)."""

from __future__ import annotations

import numbers
import os

import numpy as np

from ..errors import MedprocError, ReadError, UsageError
from ..volume import Volume
from ._overlap import combine_contours, overlay
from .dicom_labels import _FLIP, _ROIS, _check_series, _dcmread, _incomplete, _warn, check_image

__all__ = ["read_rtstruct"]


def read_rtstruct(path, image: Volume, roi: str | int | None = None, *, renumber=False) -> Volume:
    """Rasterise RTSTRUCT contours onto ``image``'s grid: value = ROI number (0 outside).

    Closed planar contours (LPS mm) are mapped to ``image``'s voxel indices; a contour must lie
    on a slice of the image (within 0.5 voxel along k). An ROI's contours on one slice combine
    by nesting (a contour inside another is a hole, one inside a hole an island; contours that
    merely overlap are taken together, a contour given twice once: said in a warning);
    voxels whose centres are inside get the ROI's value. Where ROIs overlap the higher ROI
    number wins, with a warning naming the ROIs and the voxels overwritten (and any ROI left
    without a voxel). ``roi`` keeps one ROI (by name or number). ROI numbers are identifiers:
    one that cannot be a voxel value (below 1) is an error unless ``renumber``, which gives
    the ROIs values 1..N in ascending ROI number order (``meta["rois"]`` names them).
    ``image`` read from another DICOM series than the one the structure set references is used
    all the same, with a warning naming both; an ``image`` that is not a :class:`Volume`, or an
    ``roi`` that is neither a name nor a number, is a :class:`~medproc.errors.UsageError`.
    """
    check_image(image, "read_rtstruct")
    if roi is not None and (isinstance(roi, bool) or not isinstance(roi, (str, numbers.Integral))):
        raise UsageError(f"read_rtstruct: roi must be an ROI's name or number, got {roi!r:.80}")
    path = os.fspath(path)
    ds = _dcmread(path, force=True)
    if "ROIContourSequence" not in ds:
        raise ReadError("is not an RTSTRUCT (no ROIContourSequence)", path)
    with _incomplete(path, "RTSTRUCT"):
        _check_series(ds, image, path, depth=1)
        listed = [(int(r.ROINumber), str(r.get("ROIName", ""))) for r in ds.get(_ROIS, [])]
        names = dict(listed)
        if len(names) < len(listed):
            raise ReadError(f"{_ROIS} lists an ROI number twice: {sorted(listed)}", path)
        if isinstance(roi, str):
            hits = [n for n, name in names.items() if name == roi] or [
                n for n, name in names.items() if name.lower() == roi.lower()
            ]  # (the exact name first: "GTV" and "gtv" are two ROIs)
            if len(hits) > 1:
                raise UsageError(
                    f"ROI name {roi!r} matches ROIs {hits} "
                    f"({', '.join(repr(names[n]) for n in hits)}) but for upper/lower case: "
                    "give the exact name or the ROI number",
                    path,
                )
            if not hits:
                raise MedprocError(
                    f"no ROI named {roi!r}; ROIs here: {sorted(names.values())}", path
                )
            roi = hits[0]
        elif roi is not None and int(roi) not in names:
            raise MedprocError(f"no ROI number {roi}; ROIs here: {names}", path)
        value = dict(zip(sorted(names), range(1, len(names) + 1))) if renumber else None
        masks, drawn, outside, unlisted = _roi_masks(ds, names, roi, image, path)
    value = value or {n: n for n in names}
    bad = sorted(n for n in masks if not 1 <= value[n] < 2**31)
    if bad:  # (0 is background: its voxels would vanish)
        why = f"ROI number(s) {bad} cannot be voxel values (1 to 2^31-1): read it with "
        raise ReadError(f"{why}read_rtstruct(..., renumber=True) (values 1..N)", path)
    if unlisted:
        _warn(
            f"{path}: contours of ROI {sorted(set(unlisted))}, which {_ROIS} does not list (it "
            f"lists {sorted(names)}), are left out (a deleted ROI's leftovers?)"
        )
    src = image.meta.get("source") or "this image"
    if outside and not drawn:
        raise ReadError(
            f"all {outside} of its contours lie outside the image (off its slices or beside "
            f"them, or enclosing no voxel centre): is it the structure set of another series "
            f"than {src}?",
            path,
        )
    if outside:
        _warn(
            f"{path}: {outside} of {outside + drawn} contours lie outside the image (off its "
            "slices or beside them, or enclosing no voxel centre): left out"
        )
    out = np.zeros(image.shape[:3], np.min_scalar_type(max([value[n] for n in masks] + [0])))
    overlay(out, masks, value, names, path)
    if not out.any():
        _warn(f"{path}: no closed planar contour labels a voxel of {src}: the label is empty")
    rois = {value[n]: name for n, name in names.items()}
    return image.with_array(out, source=path, format="rtstruct", rois=rois)


def _roi_masks(ds, names, roi, image: Volume, path: str):
    """{ROI number: {slice k: 2-D mask}} (contours on a slice combined by nesting:
    :func:`combine_contours`), and the counts of contours drawn and outside, and the unlisted
    ROI numbers met."""
    inv = np.linalg.inv(image.affine)
    masks: dict[int, dict[int, list]] = {}
    drawn = outside = 0
    cut: set = set()  # the ROIs with a contour running past the image's edge
    unlisted = []
    for rc in ds.ROIContourSequence:
        num = int(rc.ReferencedROINumber)
        if roi is not None and num != roi:
            continue
        if num not in names:  # (its voxels would carry a number no ROI is named by)
            unlisted.append(num)
            continue
        slices = masks.setdefault(num, {})
        for c, contour in enumerate(rc.get("ContourSequence", [])):
            where = f"ROI {num} contour {c + 1}"
            if str(contour.get("ContourGeometricType", "CLOSED_PLANAR")) != "CLOSED_PLANAR":
                continue
            try:
                pts = np.array([float(x) for x in contour.ContourData]).reshape(-1, 3)
            except (AttributeError, ValueError, TypeError) as e:
                raise ReadError(f"malformed ContourData ({e})", path, where=where) from None
            if len(pts) < 3 or not np.all(np.isfinite(pts)):
                why = f"a closed contour needs 3 or more finite points, got {len(pts)}"
                raise ReadError(why, path, where=where)
            idx = (inv[:3, :3] @ (pts * _FLIP).T).T + inv[:3, 3]
            k = np.round(idx[:, 2])
            if np.ptp(idx[:, 2]) > 0.5 or np.abs(idx[:, 2] - k).max() > 0.5:
                raise ReadError(
                    "the contour does not lie on a slice of the image grid", path, where=where
                )
            k = int(k[0])
            x, y = idx[:, 0], idx[:, 1]
            if abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))) < 1e-6:  # (shoelace)
                raise ReadError(  # (3 collinear points labelled 7 voxels along their line)
                    "the contour encloses no area (its points lie on one line)",
                    path,
                    where=where,
                )
            inside = _inside(idx[:, :2], image.shape[:2]) if 0 <= k < image.shape[2] else None
            if inside is None or not inside.any():  # off its slices, or beside it in-plane
                outside += 1
                continue
            slices.setdefault(k, []).append(inside)
            drawn += 1
            edge = np.array(image.shape[:2]) - 0.5 + 1e-3  # (a BODY contour along the border)
            if np.any((idx[:, :2] < -0.501) | (idx[:, :2] > edge)):
                cut.add(f"ROI {num} ({names[num]!r})")
    out: dict[int, dict[int, np.ndarray]] = {}
    for num, slices in masks.items():
        said = {}
        for k, contours in slices.items():
            out.setdefault(num, {})[k], said[k] = combine_contours(contours)
        if any(said.values()):
            ks = sorted(k for k, t in said.items() if t)
            _warn(f"{path}: ROI {num} ({names[num]!r}), slice(s) {ks}: {said[ks[0]]}")
    if cut:  # (was clipped without a word)
        _warn(f"{path}: {', '.join(sorted(cut))}: contour(s) run past the image's edge: cut there")
    return out, drawn, outside, unlisted


def _inside(poly: np.ndarray, shape) -> np.ndarray:
    """The pixels (i, j) of a ``shape`` plane whose centres are inside the polygon."""
    from matplotlib.path import Path

    out = np.zeros(shape, bool)
    # (clipped to the plane before the cast: a contour at 1e30 mm overflowed int64, said as
    # "invalid value encountered in cast" and then as lying outside the image)
    lo = np.clip(np.floor(poly.min(0)), 0, shape).astype(np.int64)
    hi = np.clip(np.ceil(poly.max(0)) + 1, 0, shape).astype(np.int64)
    if np.any(hi <= lo):
        return out
    ii, jj = np.mgrid[lo[0] : hi[0], lo[1] : hi[1]]
    pix = np.stack([ii.ravel(), jj.ravel()], 1).astype(float)
    out[lo[0] : hi[0], lo[1] : hi[1]] = Path(poly).contains_points(pix).reshape(ii.shape)
    return out
