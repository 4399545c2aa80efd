"""Slice geometry of a DICOM series: order, affine and the checks dcm2niix makes.

From the frames' ImagePositionPatient / ImageOrientationPatient / PixelSpacing this computes,
in float64 and from headers alone (so ``medproc inspect`` needs no pixel data):

- the slice order, by position along the slice normal (never by InstanceNumber);
- the slice step as a least-squares line fit through *all* positions (not the first step);
- missing slices, duplicate positions and wildly uneven spacing (errors: the grid would be
  wrong), mildly uneven spacing and gantry tilt (warnings with the numbers);
- the index -> RAS affine of the array ``(column, row, slice)`` = ``(i, j, k)``. A tilted series keeps every voxel
  where the scanner put it: the slice axis follows the positions, so the affine is sheared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import GeometryError
from ..geometry import lps_to_ras
from .dicom_scan import DicomSeries
from .safety import check_affine

__all__ = ["SeriesGeometry", "series_geometry", "orientation_problem"]

#: positions closer than this (mm) along the normal are duplicates
DUPLICATE_MM = 1e-3
#: a step this many times the typical step means slices are missing
MISSING_RATIO = 1.5
#: steps that deviate less than this fraction from the fit are "even"
UNEVEN_REL = 1e-3
#: worst position error (fraction of the step) accepted with a warning; above it: error
UNEVEN_ERROR_REL = 0.25
#: tilt (degrees) above which a warning is given
TILT_DEG = 0.01


@dataclass
class SeriesGeometry:
    order: list[int]  # frame indices, in array slice order
    affine: np.ndarray  # index (i, j, k) = (column, row, slice) -> RAS mm
    warnings: list[str] = field(default_factory=list)
    slice_positions: np.ndarray | None = None  # along the normal, mm, sorted
    tilt_deg: float = 0.0


def _fmt(v) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in v) + "]"


def orientation_problem(iop) -> str | None:
    """Why an ImageOrientationPatient cannot place a slice (not unit vectors, row and column
    not perpendicular, within 1e-2), or None."""
    iop = np.asarray(iop, dtype=np.float64)
    row_cos, col_cos = iop[:3], iop[3:]
    if abs(np.linalg.norm(row_cos) - 1) > 1e-2 or abs(np.linalg.norm(col_cos) - 1) > 1e-2:
        return f"ImageOrientationPatient is not made of unit vectors: {_fmt(iop)}"
    if abs(row_cos @ col_cos) > 1e-2:
        return f"ImageOrientationPatient's row and column are not perpendicular: {_fmt(iop)}"
    return None


def series_geometry(series: DicomSeries) -> SeriesGeometry:
    """Order, affine and warnings for ``series``; raises :class:`GeometryError` if unusable."""
    frames = series.frames
    info = series.info
    where = series.files[0] if len(series.files) == 1 else os.path.dirname(series.files[0])
    warnings: list[str] = []
    ps = frames[0].pixel_spacing
    if ps is None:
        warnings.append("no PixelSpacing: in-plane spacing set to 1 mm")
        ps = (1.0, 1.0)
    for f in frames[1:]:
        if f.pixel_spacing is not None and not np.allclose(f.pixel_spacing, ps, rtol=1e-4):
            raise GeometryError(
                f"PixelSpacing differs between frames ({_fmt(ps)} in {frames[0].path}, "
                f"{_fmt(f.pixel_spacing)} in {f.path}): these are not one volume",
                where,
            )
    declared = _declared_step(info)

    lacking = [f for f in frames if f.position is None or f.orientation is None]
    if lacking and len(lacking) < len(frames):
        # some frames placed, others not: sorting them would be a guess, so refuse
        raise GeometryError(
            f"{len(lacking)} of {len(frames)} frames have no ImagePositionPatient/"
            f"ImageOrientationPatient (e.g. {_where(lacking[0])}) while the others do: the "
            "slices cannot be ordered. Fix or remove those files",
            where,
        )
    if lacking:
        # no patient geometry (secondary capture, ultrasound...): a placeholder grid
        warnings.append(
            "no patient geometry (ImagePositionPatient/ImageOrientationPatient missing): "
            "the affine is a placeholder (identity directions, origin 0), frames in "
            "InstanceNumber order"
        )
        step = declared or 1.0
        # (column, row, frame): column -> +x, row -> +y, frame -> +z (in LPS)
        aff_lps = np.diag([ps[1], ps[0], step, 1.0])
        order = sorted(
            range(len(frames)),
            key=lambda n: (
                frames[n].instance is None,
                frames[n].instance or 0,
                frames[n].path,
                frames[n].index or 0,
            ),
        )
        affine = check_affine(lps_to_ras(aff_lps), where, "the DICOM PixelSpacing/SliceThickness")
        return SeriesGeometry(order, affine, warnings)

    iop = frames[0].orientation
    row_cos, col_cos = iop[:3], iop[3:]
    problem = orientation_problem(iop)
    if problem:
        raise GeometryError(problem, where)
    # re-orthonormalise the small rounding of DS strings
    row_cos = row_cos / np.linalg.norm(row_cos)
    col_cos = col_cos - (col_cos @ row_cos) * row_cos
    col_cos /= np.linalg.norm(col_cos)
    normal = np.cross(row_cos, col_cos)

    pos = np.array([f.position for f in frames])
    d = pos @ normal
    order = np.argsort(d, kind="stable")
    d_sorted = d[order]
    pos_sorted = pos[order]
    n = len(frames)

    if n == 1:
        step_vec = normal * (declared or 1.0)
        if declared is None:
            given = info.get("SliceThickness")
            said = "without SliceThickness"
            if given not in (None, ""):
                said = f"with an unusable SliceThickness ({given!r})"
            warnings.append(f"single slice {said}: slice spacing set to 1 mm")
        origin = pos_sorted[0]
        tilt = 0.0
    else:
        steps = np.diff(d_sorted)
        dup = np.nonzero(steps < DUPLICATE_MM)[0]
        if dup.size:
            i = dup[0]
            a, b = frames[order[i]], frames[order[i + 1]]
            raise GeometryError(
                f"{dup.size + 1 if dup.size == 1 else dup.size} frames share a slice position "
                f"(e.g. {d_sorted[i]:.3f} mm along the normal: {_where(a)} and {_where(b)}). "
                "The series holds several volumes (echoes, time points, repeats?); split it or "
                "load the files of one volume",
                where,
            )
        typical, gaps = slice_gaps(steps)
        if gaps.size:
            i = gaps[0]
            lost = int(round(steps[i] / typical)) - 1
            raise GeometryError(
                f"missing slices: a gap of {steps[i]:.3f} mm between {_where(frames[order[i]])} "
                f"and {_where(frames[order[i + 1]])} where the step is {typical:.3f} mm "
                f"(about {max(lost, 1)} slice(s) missing; {gaps.size} gap(s) in all). "
                "The volume would be stretched; find the missing files",
                where,
            )
        # least-squares line through all positions: p_k = origin + k * step_vec
        k = np.arange(n, dtype=np.float64)
        A = np.stack([np.ones(n), k], axis=1)
        coef, *_ = np.linalg.lstsq(A, pos_sorted, rcond=None)
        origin, step_vec = coef[0], coef[1]
        resid = np.linalg.norm(pos_sorted - (origin + k[:, None] * step_vec), axis=1)
        step = float(step_vec @ normal)
        worst = float(resid.max())
        if worst > UNEVEN_ERROR_REL * step:
            raise GeometryError(
                f"uneven slice spacing: steps from {steps.min():.4g} to {steps.max():.4g} mm; "
                f"a regular grid would misplace a slice by {worst:.3g} mm (> {UNEVEN_ERROR_REL:g} "
                "of the step). Resample the series with a tool that handles irregular stacks",
                where,
            )
        if steps.max() - steps.min() > max(UNEVEN_REL * step, 1e-4):
            warnings.append(
                f"uneven slice spacing: steps from {steps.min():.4g} to {steps.max():.4g} mm; "
                f"using the best-fit step {step:.6g} mm (worst slice off by {worst:.3g} mm)"
            )
        if (
            declared is not None
            and info.get("SpacingBetweenSlices")
            and abs(declared - step) > 0.01 * step
        ):
            warnings.append(
                f"SpacingBetweenSlices says {declared:g} mm but the positions give {step:.6g} mm; "
                "using the positions"
            )
        cosang = abs(step_vec @ normal) / np.linalg.norm(step_vec)
        tilt = float(np.degrees(np.arccos(min(1.0, cosang))))
        if tilt <= TILT_DEG:
            # no tilt: keep the slice axis exactly on the normal (no spurious shear)
            step_vec = normal * step
            tilt = 0.0
        else:
            gt = info.get("GantryDetectorTilt")
            warnings.append(
                f"gantry tilt of {tilt:.3f} degrees (GantryDetectorTilt={gt}): slices are "
                "sheared; the affine keeps every voxel at its true position (a sheared grid). "
                "Resample to get an orthogonal grid"
            )
    aff_lps = np.eye(4)
    aff_lps[:3, 0] = row_cos * ps[1]  # i (column index) moves along a row
    aff_lps[:3, 1] = col_cos * ps[0]  # j (row index) moves down a column
    aff_lps[:3, 2] = step_vec  # k: the slices
    aff_lps[:3, 3] = origin
    affine = check_affine(lps_to_ras(aff_lps), where, "the DICOM geometry (spacing, positions)")
    return SeriesGeometry([int(i) for i in order], affine, warnings, d_sorted, tilt)


def slice_gaps(steps: np.ndarray) -> tuple[float, np.ndarray]:
    """The typical step (the median) of sorted slice positions' ``steps``, and the indices of
    the steps that are gaps (slices missing): more than :data:`MISSING_RATIO` of it."""
    typical = float(np.median(steps))
    return typical, np.nonzero(steps > MISSING_RATIO * typical)[0]


def _declared_step(info: dict) -> float | None:
    for key in ("SpacingBetweenSlices", "SliceThickness"):
        v = info.get(key)
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if 0 < v < 1e4:  # (1e400 is inf: it made the affine NaN, said as that; a 10 m
            return v  # step is no slice spacing either)
    return None


def _where(frame) -> str:
    name = os.path.basename(frame.path)
    return name if frame.index is None else f"{name} frame {frame.index + 1}"
