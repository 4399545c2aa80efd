"""Lesions placed on a grid as boxes in MONAI's detection format."""

from __future__ import annotations

import numpy as np

__all__ = ["clip_boxes", "lesion_boxes"]


def lesion_boxes(placed: list[dict], mode: str = "xyzxyz"):
    """Lesions placed on a grid (``Lesions.on_grid`` dicts) as MONAI detection boxes.

    Returns ``(boxes_voxel, boxes_world, labels)``: float32 ``(N, 6)`` arrays in ``mode``
    (``"xyzxyz"``: corners, MONAI's ``StandardMode``; ``"cccwhd"``: centre and size), in voxel
    ``(i, j, k)`` and world RAS mm coordinates, and int64 ``(N,)`` labels. Every lesion, also
    those off the grid: :func:`clip_boxes` keeps what lies on it.
    """
    _check_mode(mode)
    vox = np.zeros((len(placed), 6), np.float32)
    world = np.zeros((len(placed), 6), np.float32)
    for n, p in enumerate(placed):
        for out, c, s in (
            (vox, p["center_voxel"], p["size_voxels"]),
            (world, p["center_world_ras"], p["size_mm"]),
        ):
            c, s = np.asarray(c, np.float64), np.asarray(s, np.float64)
            out[n] = np.r_[c - s / 2, c + s / 2] if mode == "xyzxyz" else np.r_[c, s]
    return vox, world, np.array([p["label"] for p in placed], np.int64)


def clip_boxes(boxes_voxel: np.ndarray, shape, mode: str = "xyzxyz"):
    """Voxel boxes clipped to a grid of ``shape``, those holding no voxel centre on it removed:
    a detector's ground truth on a crop.

    The grid's extent is ``-0.5 .. n - 0.5`` along each axis (voxel centres at integer indices,
    as the boxes are, and as MONAI's ``AffineBoxToImageCoordinated`` computes them). MONAI's
    ``ClipBoxToImaged(remove_empty=True)`` does the same job with two differences: it clamps to
    ``0 .. n`` (half a voxel off that convention) and drops boxes narrower than one voxel on
    any axis after clamping, also a small lesion well inside the image.

    Returns ``(kept, clipped)``: the int64 indices of the boxes kept, and those boxes clipped,
    in ``mode``."""
    _check_mode(mode)
    b = np.asarray(boxes_voxel, np.float64).reshape(-1, 6)
    lo, hi = (b[:, :3], b[:, 3:]) if mode == "xyzxyz" else (b[:, :3] - b[:, 3:] / 2, None)
    if hi is None:
        hi = b[:, :3] + b[:, 3:] / 2
    ext = np.asarray(shape[:3], np.float64) - 0.5
    lo, hi = np.maximum(lo, -0.5), np.minimum(hi, ext)
    kept = np.flatnonzero(np.all(np.ceil(lo) <= np.floor(hi), axis=1))  # a voxel centre inside
    lo, hi = lo[kept], hi[kept]
    out = np.c_[lo, hi] if mode == "xyzxyz" else np.c_[(lo + hi) / 2, hi - lo]
    return kept.astype(np.int64), out.astype(np.float32).reshape(-1, 6)


def _check_mode(mode: str) -> None:
    if mode not in ("xyzxyz", "cccwhd"):
        raise ValueError(f"box mode must be 'xyzxyz' or 'cccwhd', got {mode!r}")
