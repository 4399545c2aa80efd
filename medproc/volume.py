"""The one core type: ``Volume`` = array + float64 RAS affine + metadata."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import check_device
from .geometry import apply_affine, as_affine, axcodes, spacing_of

__all__ = ["Volume"]


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "device")


class Volume:
    """A 3D image (optionally with a trailing channel axis) on a world grid.

    Parameters
    ----------
    array : array_like
        Voxel data indexed ``(i, j, k)`` or ``(i, j, k, channels)``, NIfTI's axis order (as
        nibabel, MONAI and TorchIO use): for DICOM, i runs along a row (column index), j down a
        column (row index) and k through the slices. Readers return the file's memory as is,
        which for DICOM and NIfTI is Fortran order (i fastest). A numpy array, or a torch tensor
        (e.g. CUDA, from ``medproc.load(..., device="gpu")``).
    affine : array_like
        4x4 matrix mapping an index ``(i, j, k)`` of ``array`` to RAS millimetres. Copied
        into a new float64 array.
    meta : dict, optional
        Free-form metadata (source path, modality, series UID, warnings...). Copied.

    Examples
    --------
    >>> v = Volume(np.zeros((4, 5, 6), np.int16), np.diag([3.0, 2.0, 1.0, 1.0]))
    >>> v.shape, v.spacing.tolist(), v.orientation
    ((4, 5, 6), [3.0, 2.0, 1.0], 'RAS')
    >>> v.voxel_to_world([1, 1, 1]).tolist()
    [3.0, 2.0, 1.0]
    """

    __slots__ = ("array", "affine", "meta")

    def __init__(self, array, affine, meta: dict[str, Any] | None = None):
        arr = array if _is_tensor(array) else np.asarray(array)
        if 0 in tuple(arr.shape):
            raise ValueError(f"Volume array is empty: shape {tuple(arr.shape)}")
        if arr.ndim not in (3, 4):
            raise ValueError(
                f"Volume array must be 3D (i, j, k) or 4D with trailing channels, "
                f"got shape {tuple(arr.shape)}; add an axis with arr[..., None] for a single slice"
            )
        if not _is_tensor(arr) and arr.dtype.kind not in "biuf":
            raise ValueError(f"Volume array must be boolean, integer or float, got {arr.dtype}")
        self.array = arr
        self.affine = as_affine(affine)
        self.meta = dict(meta or {})

    # geometry ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        """Spatial shape ``(ni, nj, nk)`` (the first three axes)."""
        return tuple(self.array.shape[:3])  # type: ignore[return-value]

    @property
    def channels(self) -> int:
        """Number of channels (1 for a 3D array)."""
        return 1 if self.array.ndim == 3 else self.array.shape[3]

    @property
    def spacing(self) -> np.ndarray:
        """Voxel spacing in mm along i, j, k."""
        return spacing_of(self.affine)

    @property
    def origin(self) -> np.ndarray:
        """RAS position (mm) of voxel (0, 0, 0)'s centre."""
        return self.affine[:3, 3].copy()

    @property
    def orientation(self) -> str:
        """Orientation codes of axes ``(i, j, k)``, as nibabel names them. A DICOM axial series
        is ``"LPS"`` (i -> Left, j -> Posterior, k -> Superior);
        ``medproc.resample(v, orientation="RAS")`` gives ``"RAS"``."""
        return axcodes(self.affine)

    @property
    def dtype(self):
        """The array's dtype (numpy or torch)."""
        return self.array.dtype

    @property
    def device(self) -> str:
        """``"cpu"`` for a numpy array, else the tensor's device (``"cuda:0"``...)."""
        return str(self.array.device) if _is_tensor(self.array) else "cpu"

    def to(self, device: str) -> Volume:
        """This volume with its voxels on ``device``: ``"cpu"`` (numpy), ``"gpu"`` (= the
        current CUDA device) or ``"cuda:N"`` (torch tensors; needs PyTorch with CUDA)."""
        device = check_device(device, cuda=True)
        if device == "cpu":
            return self.numpy()
        try:
            import torch
        except ImportError:
            raise ImportError(f"Volume.to({device!r}) needs PyTorch: pip install torch") from None
        if not torch.cuda.is_available():
            from .errors import DeviceError

            raise DeviceError(
                f"Volume.to({device!r}): PyTorch sees no CUDA GPU here; use device='cpu'"
            )
        dev = "cuda" if device == "gpu" else device
        arr = self.array if _is_tensor(self.array) else torch.from_numpy(np.asarray(self.array))
        if arr.dtype == torch.bool:
            arr = arr.to(torch.uint8)
        return self.with_array(arr.to(dev, non_blocking=True))

    def numpy(self) -> Volume:
        """This volume with its data as a numpy array (a copy from the GPU; itself if already)."""
        if not _is_tensor(self.array):
            return self
        return self.with_array(self.array.detach().cpu().numpy())

    def voxel_to_world(self, index) -> np.ndarray:
        """RAS mm of (fractional) voxel indices ``(i, j, k)``, shape ``(..., 3)``."""
        return apply_affine(self.affine, _points(index, "voxel_to_world", "voxel indices"))

    def world_to_voxel(self, points) -> np.ndarray:
        """Fractional voxel indices ``(i, j, k)`` of RAS mm points, shape ``(..., 3)``."""
        return apply_affine(
            np.linalg.inv(self.affine), _points(points, "world_to_voxel", "RAS mm points")
        )

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
        a = self.numpy().array
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        sp = ", ".join(f"{s:.4g}" for s in self.spacing)
        src = self.meta.get("source")
        return (
            f"Volume(shape={tuple(self.array.shape)}, dtype={self.array.dtype}, spacing=({sp}) mm, "
            f"orientation={self.orientation}"
            + (f", device={self.device}" if self.device != "cpu" else "")
            + (f", source={src!r})" if src else ")")
        )


def _points(values, where: str, what: str) -> np.ndarray:
    """``values`` as float64 of shape ``(..., 3)``, or a ValueError saying what it got."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: expected {what}, numbers of shape (3,) or (n, 3)") from None
    if arr.ndim == 0 or arr.shape[-1] != 3:
        raise ValueError(f"{where}: expected {what} of shape (3,) or (n, 3), got shape {arr.shape}")
    return arr
