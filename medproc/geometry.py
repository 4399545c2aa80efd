"""Small pure functions on 4x4 affines (array index -> RAS millimetres, float64).

medproc has one affine convention: a float64 4x4 matrix that maps a voxel index ``(i, j, k)``
(NIfTI's axis order, the order of ``Volume.array``'s axes) to RAS world millimetres. DICOM and ITK
use LPS; they are converted here, once (:func:`lps_to_ras`).
"""

from __future__ import annotations

import numpy as np
from nibabel.affines import apply_affine
from nibabel.orientations import aff2axcodes

__all__ = [
    "LPS_TO_RAS",
    "apply_affine",
    "as_affine",
    "axcodes",
    "is_orthogonal",
    "lps_to_ras",
    "spacing_of",
]

#: Flips x and y: LPS <-> RAS (its own inverse).
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def as_affine(affine, name: str = "affine") -> np.ndarray:
    """Return ``affine`` as a new float64 4x4 matrix, refusing anything that is not one.

    >>> as_affine(np.eye(4)).dtype
    dtype('float64')
    """
    if np.iscomplexobj(affine):  # (numpy would drop the imaginary parts with a warning)
        raise ValueError(f"{name} must be real, got complex values")
    if affine is None:
        raise ValueError(f"{name} must be a 4x4 matrix, got None")
    try:
        a = np.array(affine, dtype=np.float64, copy=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{name} must be a 4x4 matrix of numbers ({e})") from None
    if a.shape != (4, 4):
        raise ValueError(f"{name} must be a 4x4 matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf: {a.tolist()}")
    if not np.allclose(a[3], [0, 0, 0, 1]):
        raise ValueError(f"{name}'s last row must be [0, 0, 0, 1], got {a[3].tolist()}")
    with np.errstate(over="ignore"):
        det = np.linalg.det(a[:3, :3])
        big = not (np.all(np.isfinite(np.linalg.norm(a[:3, :3], axis=0))) and np.isfinite(det))
    if big:  # (its spacings would be inf: repr and orientation failed inside nibabel)
        raise ValueError(
            f"{name} is too large: its spacings or their product overflow float64: {a.tolist()}"
        )
    if abs(det) < 1e-12:
        raise ValueError(f"{name} is singular (a zero spacing or collinear axes): {a.tolist()}")
    return a


def lps_to_ras(affine_lps: np.ndarray) -> np.ndarray:
    """Convert an index -> LPS affine to index -> RAS (also the reverse).

    >>> lps_to_ras(np.eye(4))[:3, :3].diagonal().tolist()
    [-1.0, -1.0, 1.0]
    """
    return LPS_TO_RAS @ np.asarray(affine_lps, dtype=np.float64)


def spacing_of(affine: np.ndarray) -> np.ndarray:
    """Voxel spacing in mm along i, j, k (column norms of the 3x3 part).

    >>> spacing_of(np.diag([2.0, -3.0, 1.5, 1.0])).tolist()
    [2.0, 3.0, 1.5]
    """
    return np.sqrt((np.asarray(affine)[:3, :3] ** 2).sum(axis=0))


def axcodes(affine: np.ndarray) -> str:
    """Orientation codes of axes (i, j, k), e.g. ``"LPS"`` for i -> Left, j -> Posterior...

    >>> axcodes(np.diag([1.0, 1.0, 1.0, 1.0]))
    'RAS'
    """
    return "".join(aff2axcodes(affine))


def is_orthogonal(affine: np.ndarray, tol: float = 1e-6) -> bool:
    """True when the voxel axes are mutually perpendicular (no shear, e.g. no gantry tilt)."""
    m = np.asarray(affine)[:3, :3] / spacing_of(affine)
    return bool(np.allclose(m.T @ m, np.eye(3), atol=tol))
