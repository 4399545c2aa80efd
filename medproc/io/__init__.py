"""Readers and writers: every source becomes a :class:`~medproc.Volume`."""

from __future__ import annotations

import os
import tempfile

from ..errors import ReadError
from ..volume import Volume

__all__ = ["load", "save", "kind_of", "atomic_path", "stem", "IMAGE_EXT"]

NIFTI_EXT = (".nii", ".nii.gz")
ITK_EXT = (".nrrd", ".nhdr", ".mha", ".mhd")
#: image files medproc reads (besides DICOM), longest suffix first
IMAGE_EXT = (".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd")


def stem(path, extra: tuple = ()) -> str:
    """A file's name without its image extension (``case001.nii.gz`` -> ``case001``)."""
    b = os.path.basename(os.fspath(path).rstrip("/" + os.sep))
    for ext in IMAGE_EXT + tuple(extra):
        if b.lower().endswith(ext):
            return b[: -len(ext)]
    return b


def kind_of(path) -> str | None:
    """'nifti', 'itk', 'dicom' (file or folder) or None, from the name and magic bytes."""
    p = os.fspath(path)
    low = p.lower()
    if os.path.isdir(p):
        return "dicom"
    if low.endswith(NIFTI_EXT):
        return "nifti"
    if low.endswith(ITK_EXT):
        return "itk"
    if low.endswith(".dcm") or low.endswith(".ima"):
        return "dicom"
    from .dicom_scan import is_dicom_file

    return "dicom" if is_dicom_file(p) else None


def load(path, series=None, nan: str = "error", workers: int | None = None) -> Volume:
    """Load a volume.

    Parameters
    ----------
    path : str or path-like
        A DICOM file or a folder (searched recursively for DICOM series), a NIfTI file
        (``.nii``, ``.nii.gz``), or an ITK file (``.nrrd``, ``.nhdr``, ``.mha``, ``.mhd``).
    series : str or int, optional
        Which DICOM series, when a folder holds several: SeriesInstanceUID (or the
        ``UID.partN`` key `medproc inspect` shows for a split series), SeriesNumber, or a
        unique part of SeriesDescription.
    nan : {"error", "zero", "keep"}
        Float images with NaN/inf voxels (NIfTI, ITK): refuse them (default, with the count),
        set them to 0, or keep them.
    workers : int, optional
        DICOM: processes decoding compressed files (JPEG 2000, JPEG lossless...). Default:
        all cores (up to 16) for series of 24 compressed files or more; 1 decodes in this process.

    Returns
    -------
    Volume
        ``.array`` C-contiguous, axis 0 the slowest (DICOM: the slice axis); ``.affine`` maps
        array indices to RAS mm; ``.meta['warnings']`` lists the geometry warnings.

    Raises
    ------
    ReadError, SeriesError, GeometryError
        With the file named, what is wrong and what to do.
    """
    p = os.fspath(path)
    if not os.path.exists(p):
        raise ReadError("no such file or folder", p)
    kind = kind_of(p)
    if kind == "nifti":
        from .nifti import load_nifti

        return load_nifti(p, nan)
    if kind == "itk":
        from .sitk_io import load_sitk

        return load_sitk(p, nan)
    if kind == "dicom" or kind is None:
        from .dicom_read import load_dicom

        if kind is None:  # unknown extension: try DICOM without a preamble
            from .dicom_scan import read_header

            read_header(p, force=True)
        return load_dicom(p, series=series, workers=workers)
    raise ReadError("unknown format", p)  # pragma: no cover


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_path(path: str) -> str:
    """A temporary name beside ``path`` (same folder, same extension) for an atomic write.

    The file gets the usual permissions (0666 less the umask), not mkstemp's private 0600, so
    the renamed output is readable like any other file the user writes."""
    d, name = os.path.split(os.path.abspath(path))
    ext = ".nii.gz" if name.lower().endswith(".nii.gz") else os.path.splitext(name)[1]
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".part{ext}", dir=d)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)
    return tmp


def save(volume: Volume, path) -> str:
    """Write ``volume`` atomically (temporary file + rename) as NIfTI or an ITK format.

    The format follows the extension: ``.nii``/``.nii.gz`` (nibabel; a sheared affine is kept in
    the sform), ``.nrrd``/``.mha``/``.mhd`` (SimpleITK). Returns the path written.
    """
    p = os.fspath(path)
    low = p.lower()
    os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    tmp = atomic_path(p)
    try:
        if low.endswith(NIFTI_EXT):
            from .nifti import save_nifti

            save_nifti(volume, tmp)
        elif low.endswith((".nrrd", ".mha")):
            from .sitk_io import save_sitk

            save_sitk(volume, tmp)
        else:
            raise ValueError(
                f"cannot save {p!r}: use a .nii.gz, .nii, .nrrd or .mha name "
                "(.mhd/.nhdr write two files and cannot be written atomically)"
            )
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return p
