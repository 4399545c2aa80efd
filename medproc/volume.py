"""The one core type: ``Volume`` = array + float64 RAS affine + metadata."""

from __future__ import annotations

from typing import Any

import numpy as np

from .geometry import apply_affine, as_affine, axcodes, spacing_of

__all__ = ["Volume"]


class Volume:
    """A 3D image (optionally with a trailing channel axis) on a world grid.

    Parameters
    ----------
    array : array_like
        Voxel data, shape ``(n0, n1, n2)`` or ``(n0, n1, n2, channels)``. Readers return
        C-contiguous arrays whose axis 0 is the slowest (for DICOM the slice axis, for NIfTI
        the file's k axis), i.e. the reverse of nibabel's ``(i, j, k)`` order; the affine says
        which way each axis points, so no layout is assumed anywhere else.
    affine : array_like
        4x4 matrix mapping an index ``(a0, a1, a2)`` of ``array`` to RAS millimetres. Copied
        into a new float64 array.
    meta : dict, optional
        Free-form metadata (source path, modality, series UID, warnings...). Copied.

    Examples
    --------
    >>> v = Volume(np.zeros((4, 5, 6), np.int16), np.diag([3.0, 2.0, 1.0, 1.0]))
    >>> v.spacing.tolist(), v.orientation
    ([3.0, 2.0, 1.0], 'SAR')
    >>> v.voxel_to_world([1, 1, 1]).tolist()
    [3.0, 2.0, 1.0]
    """

    __slots__ = ("array", "affine", "meta")

    def __init__(self, array, affine, meta: dict[str, Any] | None = None):
        arr = np.asarray(array)
        if arr.ndim not in (3, 4):
            raise ValueError(
                f"Volume array must be 3D (n0, n1, n2) or 4D with trailing channels, "
                f"got shape {arr.shape}; add an axis with arr[None] for a single slice"
            )
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"Volume array must be boolean, integer or float, got {arr.dtype}")
        self.array = arr
        self.affine = as_affine(affine)
        self.meta = dict(meta or {})

    # geometry ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        """Spatial shape (the first three axes)."""
        return tuple(self.array.shape[:3])  # type: ignore[return-value]

    @property
    def channels(self) -> int:
        """Number of channels (1 for a 3D array)."""
        return 1 if self.array.ndim == 3 else self.array.shape[3]

    @property
    def spacing(self) -> np.ndarray:
        """Voxel spacing in mm along array axes 0, 1, 2."""
        return spacing_of(self.affine)

    @property
    def origin(self) -> np.ndarray:
        """RAS position (mm) of voxel (0, 0, 0)'s centre."""
        return self.affine[:3, 3].copy()

    @property
    def orientation(self) -> str:
        """Orientation codes as nibabel/NIfTI name them: axes ``(i, j, k)`` = array axes
        ``(2, 1, 0)``. A DICOM axial series is ``"LPS"`` (column -> Left, row -> Posterior,
        slice -> Superior); ``medproc.resample(v, orientation="RAS")`` gives ``"RAS"``."""
        return axcodes(self.affine)[::-1]

    def voxel_to_world(self, index) -> np.ndarray:
        """RAS mm of (fractional) array indices, shape ``(..., 3)``."""
        return apply_affine(self.affine, np.asarray(index, dtype=np.float64))

    def world_to_voxel(self, points) -> np.ndarray:
        """Fractional array indices of RAS mm points, shape ``(..., 3)``."""
        return apply_affine(np.linalg.inv(self.affine), np.asarray(points, dtype=np.float64))

    # derived volumes ---------------------------------------------------------------------
    def with_array(self, array, affine=None, **meta) -> Volume:
        """A new Volume with another array (and optionally affine); meta updated by ``meta``."""
        return Volume(array, self.affine if affine is None else affine, {**self.meta, **meta})

    def __getitem__(self, item):
        raise TypeError(
            "A Volume cannot be indexed directly: index its data with vol.array[...], "
            "or use medproc.resample / a crop in the preprocessing spec to get a new Volume "
            "with a correct affine"
        )

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)

    def __repr__(self) -> str:
        sp = ", ".join(f"{s:.4g}" for s in self.spacing)
        src = self.meta.get("source")
        return (
            f"Volume(shape={self.array.shape}, dtype={self.array.dtype}, spacing=({sp}) mm, "
            f"orientation={self.orientation}" + (f", source={src!r})" if src else ")")
        )
