"""A volume's grid from its header alone (no voxels read): what ``medproc inspect`` lists and
what ``medproc convert --dry-run`` checks the output size with."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["HeaderGrid", "header_grid", "series_grid", "series_shape"]


@dataclass
class HeaderGrid:
    """``shape`` (i, j, k[, channels]), the RAS ``affine``, the bytes of the voxels as loaded
    (an estimate: float32 where the reader may rescale) and header ``warnings``."""

    shape: tuple
    affine: np.ndarray
    nbytes: int
    warnings: list[str] = field(default_factory=list)

    @property
    def channels(self) -> int:
        return int(np.prod(self.shape[3:], dtype=np.int64)) if len(self.shape) > 3 else 1


def header_grid(path: str) -> HeaderGrid:
    """The grid of a NIfTI, NRRD or MHA file from its header; a :class:`MedprocError` naming
    the file when the header cannot give one."""
    from . import kind_of
    from .safety import check_affine

    warnings: list[str] = []
    if kind_of(path) == "nifti":
        from .nifti import open_nifti

        img = open_nifti(path)
        shape = tuple(int(s) for s in img.shape)
        if len(shape) == 2:  # (as load_nifti reads it: one slice; channels folded)
            shape = (*shape, 1)
        if len(shape) > 4:
            shape = (*shape[:3], int(np.prod(shape[3:])))
        affine = check_affine(img.affine, path, "the NIfTI header")
        if not img.get_sform(coded=True)[1] and not img.get_qform(coded=True)[1]:
            warnings.append("neither sform nor qform is set")
        slope, inter = img.dataobj.slope, img.dataobj.inter
        scaled = not (slope in (1, None) or np.isnan(slope)) or bool(inter)
        item = 4 if scaled else img.get_data_dtype().itemsize
        return HeaderGrid(shape, affine, int(np.prod(shape, dtype=object)) * item, warnings)
    import SimpleITK as sitk

    from .sitk_io import read_itk_info

    r, affine, _ = read_itk_info(path)  # (the checks medproc.load makes, the same messages)
    shape = tuple(int(s) for s in r.GetSize())
    if len(shape) == 2:  # (as load_sitk reads it: one slice)
        shape = (*shape, 1)
    comps = max(1, r.GetNumberOfComponents())
    shape = shape + ((comps,) if comps > 1 else ())
    tiny = sitk.Image([1] * r.GetDimension(), r.GetPixelID(), comps)  # (its voxels' numpy type)
    item = sitk.GetArrayViewFromImage(tiny).dtype.itemsize
    return HeaderGrid(shape, affine, int(np.prod(shape, dtype=object)) * item, warnings)


def series_grid(series) -> HeaderGrid:
    """The grid of a scanned DICOM series (:class:`~medproc.io.dicom_scan.DicomSeries`), from
    the header scan; a :class:`MedprocError` when its geometry is unusable."""
    from .dicom_geometry import series_geometry
    from .dicom_header import frame_notes
    from .dicom_rescale import rescaled_dtype

    geo = series_geometry(series)
    info, frames = series.info, series.frames
    shape = series_shape(series)
    bits = int(info.get("BitsStored") or info.get("BitsAllocated") or 16)
    signed = bool(info.get("PixelRepresentation"))
    smin, smax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    slopes = np.array([f.slope for f in frames], np.float64)
    dt = rescaled_dtype(smin, smax, slopes, np.array([f.intercept for f in frames], np.float64))
    item = 4 if dt is None else dt.itemsize  # (the reader's rule, for the stored range)
    notes = frame_notes(info) + list(geo.warnings)
    return HeaderGrid(shape, geo.affine, int(np.prod(shape, dtype=object)) * item, notes)


def series_shape(series) -> tuple:
    """(i, j, k[, samples]) of a scanned DICOM series: columns, rows, frames."""
    info = series.info
    spp = int(info.get("SamplesPerPixel") or 1)
    shape = (int(info["Columns"]), int(info["Rows"]), len(series.frames))
    return shape + ((spp,) if spp > 1 else ())
