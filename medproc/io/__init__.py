"""Readers and writers: every source becomes a :class:`~medproc.Volume`."""

from __future__ import annotations

import os

from ..errors import ReadError, UsageError, check_device
from ..volume import Volume
from .atomic import atomic_path, atomic_write
from .safety import check_file
from .writers import FORMATS, save

__all__ = ["load", "save", "kind_of", "atomic_path", "atomic_write", "stem", "IMAGE_EXT", "FORMATS"]

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


def load(
    path, series=None, nan: str = "error", workers: int | None = None, device: str = "cpu"
) -> Volume:
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
        Float images with NaN/inf voxels (NIfTI, ITK, DICOM float pixel data): refuse them
        (default, with the count), set them to 0, or keep them.
    workers : int, optional
        DICOM: processes decoding compressed files (JPEG 2000, JPEG lossless...). Default:
        all cores (up to 16) for series of 24 compressed files or more; 1 decodes in this process.
    device : {"cpu", "gpu"}
        ``"gpu"``: the voxels come back as a CUDA tensor. Compressed DICOM is decoded on the GPU
        where a decoder plugin proves the encoding (:mod:`medproc.io.decoders`), on the CPU and
        copied otherwise; ``meta["decode"]`` says which.

    Returns
    -------
    Volume
        ``.array`` indexed ``(i, j, k)`` as nibabel's (DICOM: column, row, slice), in the file's
        memory order; ``.affine`` maps ``(i, j, k)`` to RAS mm; ``.meta['warnings']`` lists the
        geometry warnings.

    Examples
    --------
    >>> import medproc, nibabel
    >>> p = "sample_data/nifti/images/case000.nii.gz"
    >>> medproc.load(p).shape == nibabel.load(p).shape  # doctest: +SKIP
    True

    Raises
    ------
    ReadError, SeriesError, GeometryError
        With the file named, what is wrong and what to do.
    """
    try:
        p = os.fsdecode(os.fspath(path))  # (bytes paths too)
    except TypeError:
        raise UsageError(f"path must be a str or path-like, got {type(path).__name__}") from None
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise UsageError(f"workers must be a whole number >= 1 (or None), got {workers!r}")
    device = check_device(device)
    if nan not in ("error", "zero", "keep"):
        raise UsageError(f"nan must be one of ('error', 'zero', 'keep'), got {nan!r}")
    if not os.path.lexists(p):
        raise ReadError("no such file or folder; check the path", p)
    check_file(p, folder_ok=True)  # never a FIFO or a device
    try:
        return _load(p, series, nan, workers, device)
    except MemoryError:
        raise ReadError(
            "not enough memory to load it; free memory, or use a machine with more", p
        ) from None
    except RecursionError:
        raise ReadError("is nested too deeply to be parsed (a damaged file?)", p) from None


def _load(p: str, series, nan: str, workers, device: str) -> Volume:
    if p.lower().endswith(".npy") and os.path.isfile(p):
        raise ReadError(
            "a .npy holds an array without its grid: medproc reads NIfTI, NRRD, MHA and DICOM. "
            "A `medproc convert --format npy` output is the training cache: read it with "
            "numpy.load (indexed (i, j, k)) and take its affine from the <name>.json beside it",
            p,
        )
    kind = kind_of(p)
    if kind in ("nifti", "itk") and series is not None:
        raise UsageError(f"series= picks one of a folder's DICOM series; {p} is one image file")
    if kind == "nifti":
        from .nifti import load_nifti

        return load_nifti(p, nan).to(device)
    if kind == "itk":
        from .sitk_io import load_sitk

        return load_sitk(p, nan).to(device)
    from .dicom_read import load_dicom

    return load_dicom(p, series=series, workers=workers, device=device, nan=nan)
