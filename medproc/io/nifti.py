"""NIfTI through nibabel.

nibabel's arrays are ``(i, j, k)`` (Fortran order on disk): medproc keeps them as they are, with
nibabel's affine.
"""

from __future__ import annotations

import numpy as np

from ..errors import ReadError
from ..geometry import is_orthogonal
from ..volume import Volume

__all__ = ["load_nifti", "to_nibabel", "check_finite"]

NAN_POLICIES = ("error", "zero", "keep")


def check_finite(array: np.ndarray, path, nan: str = "error") -> np.ndarray:
    """Apply the NaN/inf policy: ``"error"`` (default) refuses the file with the count,
    ``"zero"`` replaces them with 0 (a copy), ``"keep"`` passes them on."""
    if nan not in NAN_POLICIES:
        raise ValueError(f"nan must be one of {NAN_POLICIES}, got {nan!r}")
    if array.dtype.kind != "f" or nan == "keep":
        return array
    finite = np.isfinite(array)
    if finite.all():
        return array
    bad = int(finite.size - finite.sum())
    if nan == "error":
        raise ReadError(
            f"contains {bad} NaN/inf voxel(s); clean the file, or load it with "
            f"nan='zero' (convert: --nan zero) to set them to 0",
            path,
        )
    return np.where(finite, array, 0).astype(array.dtype)


def load_nifti(path: str, nan: str = "error") -> Volume:
    import nibabel as nib

    try:
        img = nib.load(path)
        data = np.asanyarray(img.dataobj)  # applies scl_slope/scl_inter like every reader
    except Exception as e:
        raise ReadError(f"cannot be read as NIfTI: {type(e).__name__}: {e}", path) from None
    if not hasattr(img, "get_sform"):
        raise ReadError(
            f"is a {type(img).__name__} (e.g. CIFTI), not a volume on a voxel grid", path
        )
    if data.ndim == 2:
        data = data[:, :, None]
    if data.ndim > 4:
        data = data.reshape(data.shape[:3] + (-1,))
    array = check_finite(data, path, nan)
    hdr = img.header
    warnings = []
    sform, scode = img.get_sform(coded=True)
    qform, qcode = img.get_qform(coded=True)
    if not scode and not qcode:
        warnings.append("neither sform nor qform is set: the affine is nibabel's best guess")
    affine = img.affine
    meta = {
        "source": str(path),
        "format": "nifti",
        "modality": None,
        "intent": str(hdr.get_intent()[0]),
        "warnings": warnings,
    }
    return Volume(array, affine, meta)


def to_nibabel(volume: Volume):
    """The Volume as a ``nibabel.Nifti1Image`` (sform and, when possible, qform set)."""
    import nibabel as nib

    data = volume.numpy().array
    if data.dtype == np.bool_:
        data = data.astype(np.uint8)
    affine = volume.affine
    img = nib.Nifti1Image(data, affine)
    img.set_sform(affine, code=1)
    if is_orthogonal(affine):
        img.set_qform(affine, code=1)
    else:  # a sheared grid (gantry tilt) cannot be a qform
        img.set_qform(None, code=0)
    img.header.set_xyzt_units("mm")
    return img
