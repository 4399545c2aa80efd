"""NRRD, MetaImage (.mha/.mhd) and other ITK formats through SimpleITK.

SimpleITK's ``GetArrayFromImage`` is C-ordered ``(z, y, x)``; medproc's array is its transpose
``(x, y, z)`` = ``(i, j, k)`` (a view, no copy), and the affine is ITK's index (x, y, z) -> LPS
mapping converted to RAS.
"""

from __future__ import annotations

import numpy as np

from ..errors import MedprocError, ReadError
from ..geometry import LPS_TO_RAS, is_orthogonal, lps_to_ras, spacing_of
from ..volume import Volume
from .safety import check_affine, check_file

__all__ = ["load_sitk", "read_itk_info", "save_sitk", "sitk_affine", "to_sitk", "resample_filter"]


def sitk_affine(img) -> np.ndarray:
    """ITK index (x, y, z) = medproc's (i, j, k) -> RAS mm."""
    dim = img.GetDimension()
    d = np.array(img.GetDirection(), dtype=np.float64).reshape(dim, dim)
    m = np.eye(4)
    m[:dim, :dim] = d * np.array(img.GetSpacing(), dtype=np.float64)
    m[:dim, 3] = img.GetOrigin()
    return lps_to_ras(m)


def read_itk_info(path: str):
    """A SimpleITK ``ImageFileReader`` of a NRRD or MetaImage file with its header read and
    checked (no voxels): ``(reader, affine, header)``. The text header first
    (:mod:`medproc.io.itk_header`: detached data only beside the header, sizes that fit), then
    the dimension (2D or 3D) and the geometry (:func:`~medproc.io.safety.check_affine`: NaN,
    zero or collinear axes, which SimpleITK turns into zeros or a bare "0 0 1"). What
    :func:`load_sitk` and ``medproc inspect`` both use."""
    import SimpleITK as sitk

    from .itk_header import check_itk_header

    check_file(path)
    hdr = check_itk_header(path)
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        raise ReadError(f"SimpleITK cannot read its header: {msg}", path) from None
    dim = reader.GetDimension()
    if dim not in (2, 3):
        raise ReadError(
            f"is {dim}D (size {list(reader.GetSize())}); medproc reads 3D volumes "
            "(split a 4D file into 3D volumes first)",
            path,
        )
    affine = check_affine(sitk_affine(reader), path, "the header (spacing/direction/origin)")
    return reader, affine, hdr


def load_sitk(path: str, nan: str = "error") -> Volume:
    """Read a NRRD or MetaImage file (see :func:`medproc.load`). The header is checked first
    (:func:`read_itk_info`); zlib-compressed MetaImage data is inflated once beforehand
    (:func:`~medproc.io.itk_header.check_itk_zlib`), as SimpleITK reads a damaged stream
    without an error."""
    import SimpleITK as sitk

    from .itk_header import check_itk_zlib
    from .voxel_checks import check_dtype, check_finite

    reader, _, hdr = read_itk_info(path)
    if hdr.compressed == "zlib":
        check_itk_zlib(path, hdr)
    try:
        img = reader.Execute()
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        raise ReadError(f"SimpleITK cannot read it: {msg}", path) from None
    except MemoryError:
        raise ReadError("not enough memory to read its voxels; free memory", path) from None
    if img.GetDimension() == 2:
        img = sitk.JoinSeries(img)
    if "complex" in img.GetPixelIDTypeAsString().lower():
        raise ReadError(
            f"stores complex voxels ({img.GetPixelIDTypeAsString()}); medproc resamples "
            "real-valued volumes. Save the magnitude, or the real and imaginary parts, as "
            "separate files",
            path,
        )
    try:
        array = sitk.GetArrayFromImage(img)  # (z, y, x[, c])
    except MemoryError:
        raise ReadError("not enough memory to read its voxels; free memory", path) from None
    check_dtype(array.dtype, path, "ITK")
    array = array.transpose(2, 1, 0) if array.ndim == 3 else array.transpose(2, 1, 0, 3)
    array = check_finite(array, path, nan)
    affine = check_affine(sitk_affine(img), path, "the header (spacing/direction/origin)")
    meta = {"source": str(path), "format": "itk", "modality": None, "warnings": list(hdr.notes)}
    return Volume(array, affine, meta)


def to_sitk(volume: Volume):
    """The Volume as a SimpleITK image (refuses a sheared affine, which ITK cannot hold)."""
    import SimpleITK as sitk

    if not is_orthogonal(volume.affine):
        raise MedprocError(
            "this volume's affine is sheared (e.g. gantry tilt) and ITK images cannot store "
            "shear: resample it first (medproc.resample) or save as NIfTI"
        )
    arr = volume.numpy().array
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    if not arr.dtype.isnative:  # (big-endian, as nibabel reads some NIfTI: ITK takes native)
        arr = arr.astype(arr.dtype.newbyteorder("="))
    zyx = arr.transpose(2, 1, 0) if arr.ndim == 3 else arr.transpose(2, 1, 0, 3)
    img = sitk.GetImageFromArray(zyx, isVector=arr.ndim == 4)
    lps = lps_to_ras(volume.affine)
    sp = spacing_of(lps)
    img.SetSpacing(sp.tolist())
    img.SetOrigin(lps[:3, 3].tolist())
    img.SetDirection((lps[:3, :3] / sp).ravel().tolist())
    return img


def save_sitk(volume: Volume, path: str) -> None:
    import SimpleITK as sitk

    sitk.WriteImage(to_sitk(volume), str(path), useCompression=True)


def resample_filter(out_affine, out_shape, interp: str = "linear", pixel=None, motion=None):
    """A SimpleITK ``ResampleImageFilter`` onto a medproc output grid (the independent reference
    the tests and benchmarks compare with). ``motion`` (a world 4x4, RAS) is an augmentation
    that moved the content: the filter samples the input at ``inverse(motion)`` of each point."""
    import SimpleITK as sitk

    ref = to_sitk(Volume(np.zeros((1, 1, 1), np.float32), out_affine))
    f = sitk.ResampleImageFilter()
    f.SetOutputOrigin(ref.GetOrigin())
    f.SetOutputSpacing(ref.GetSpacing())
    f.SetOutputDirection(ref.GetDirection())
    f.SetSize([int(x) for x in tuple(out_shape)[:3]])
    f.SetInterpolator(sitk.sitkLinear if interp == "linear" else sitk.sitkNearestNeighbor)
    f.SetOutputPixelType(sitk.sitkFloat32 if pixel is None else pixel)
    if motion is not None and not np.allclose(motion, np.eye(4)):
        m = lps_to_ras(np.linalg.inv(motion)) @ LPS_TO_RAS  # the same motion in LPS
        t = sitk.AffineTransform(3)
        t.SetMatrix(m[:3, :3].ravel().tolist())
        t.SetTranslation(m[:3, 3].tolist())
        f.SetTransform(t)
    return f
