"""The checks every reader makes of the voxels it read: their type (complex and RGB refused) and
the NaN/inf policy (``nan=`` of :func:`medproc.load`, ``--nan`` of ``medproc convert``), the
same for NIfTI, NRRD/MHA and DICOM."""

from __future__ import annotations

import numpy as np

from ..errors import ReadError

__all__ = ["NAN_POLICIES", "check_finite", "nan_error", "check_dtype"]

NAN_POLICIES = ("error", "zero", "keep")


def check_finite(array: np.ndarray, path, nan: str = "error") -> np.ndarray:
    """Apply the NaN/inf policy: ``"error"`` (default) refuses the file with the count,
    ``"zero"`` replaces them with 0 (a copy), ``"keep"`` passes them on."""
    if nan not in NAN_POLICIES:
        from ..errors import UsageError

        raise UsageError(f"nan must be one of {NAN_POLICIES}, got {nan!r}")
    if array.dtype.kind != "f":
        return array
    from .._float32 import beyond_float32

    why = beyond_float32(array)
    if why:  # checked whatever the NaN policy: resampling would make these inf
        raise ReadError(why, path)
    if nan == "keep":
        return array
    finite = np.isfinite(array)
    if finite.all():
        return array
    bad = int(finite.size - finite.sum())
    if nan == "error":
        raise nan_error(bad, path)
    return np.where(finite, array, 0).astype(array.dtype)


def nan_error(count: int, path) -> ReadError:
    """The error of ``--nan error`` for ``count`` NaN/inf voxels (NIfTI, ITK, DICOM alike)."""
    return ReadError(
        f"contains {count} NaN/inf voxel(s); clean the file, or set them to 0: "
        f"`medproc convert --nan zero`, or medproc.load(..., nan='zero')",
        path,
    )


def check_dtype(dtype, path, fmt: str = "NIfTI") -> None:
    """Refuse voxel types medproc cannot resample: complex numbers and RGB(A) colour records."""
    dtype = np.dtype(dtype)
    if dtype.names is not None:
        kind = "RGBA" if len(dtype.names) == 4 else "RGB"
        raise ReadError(
            f"stores {kind} colour voxels ({fmt} type {kind}{8 * dtype.itemsize}); medproc "
            "resamples scalar volumes. Convert it to grey values, or save each colour as a "
            "volume of its own",
            path,
        )
    if dtype.kind == "c":
        raise ReadError(
            f"stores complex voxels ({dtype}); medproc resamples real-valued volumes. Save "
            "the magnitude (numpy.abs) or the real and imaginary parts as separate files",
            path,
        )
    if dtype.kind not in "biuf":
        raise ReadError(f"stores voxels of type {dtype}; expected integers or floats", path)
