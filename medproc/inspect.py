"""What is in a dataset: series, files, geometry and warnings, from headers only.

This is what ``medproc inspect`` prints; it reads no pixel data, so it is fast on large trees.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import MedprocError
from .geometry import axcodes, spacing_of

__all__ = ["Entry", "inspect_paths"]

from .io import IMAGE_EXT as _IMAGE_EXT


@dataclass
class Entry:
    """One volume found (a DICOM series or an image file), or one file that failed."""

    kind: str  # "dicom", "nifti", "itk" or "skipped"
    source: str
    series: str = ""
    modality: str = ""
    description: str = ""
    shape: tuple = ()
    spacing: tuple = ()
    orientation: str = ""
    files: int = 0
    transfer_syntax: str = ""
    decode: str = ""
    warnings: list[str] = field(default_factory=list)
    error: str = ""

    def as_dict(self) -> dict:
        """The entry as a plain dict (``medproc inspect --json``)."""
        return asdict(self)


def _image_files(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for n in sorted(files):
                    if n.lower().endswith(_IMAGE_EXT) and not n.startswith("."):
                        yield os.path.join(root, n)
        elif p.lower().endswith(_IMAGE_EXT):
            yield p


def _header_entry(path: str) -> Entry:
    from .io import kind_of

    kind = kind_of(path)
    e = Entry(kind or "?", path, files=1)
    try:
        if kind == "nifti":
            import nibabel as nib

            img = nib.load(path)
            aff = img.affine
            shp = tuple(img.shape)
            if not img.get_sform(coded=True)[1] and not img.get_qform(coded=True)[1]:
                e.warnings.append("neither sform nor qform is set")
        else:
            import SimpleITK as sitk

            from .io.sitk_io import sitk_affine

            r = sitk.ImageFileReader()
            r.SetFileName(path)
            r.ReadImageInformation()
            aff = sitk_affine(r)
            shp = tuple(r.GetSize())
    except Exception as ex:  # noqa: BLE001 - reported per file, the scan goes on
        e.kind, e.error = "skipped", f"cannot read header: {type(ex).__name__}: {ex}"
        return e
    e.shape = tuple(int(s) for s in shp)
    e.spacing = tuple(float(x) for x in np.round(spacing_of(aff), 4))
    e.orientation = axcodes(aff)
    return e


def inspect_paths(paths) -> list[Entry]:
    """Entries for every DICOM series and image file under ``paths`` (files or folders)."""
    from .io.dicom_geometry import series_geometry
    from .io.dicom_scan import find_series
    from .pipeline.decode import decode_path

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    out: list[Entry] = []
    dicom_paths = [p for p in paths if os.path.isdir(p) or not p.lower().endswith(_IMAGE_EXT)]
    series, skipped = find_series(dicom_paths) if dicom_paths else ([], [])
    for s in series:
        i = s.info
        files = s.files
        src = files[0] if len(files) == 1 else os.path.commonpath(files)
        ts = i.get("TransferSyntaxUID")
        spp = int(i.get("SamplesPerPixel") or 1)
        e = Entry(
            "dicom",
            src,
            series=s.key,
            modality=str(i.get("Modality") or ""),
            description=str(i.get("SeriesDescription") or ""),
            shape=(int(i["Columns"]), int(i["Rows"]), len(s.frames)) + ((spp,) if spp > 1 else ()),
            files=len(files),
            transfer_syntax=str(getattr(ts, "name", ts) or ""),
            decode=decode_path(i),
        )
        short = [f for f in s.frames if f.missing_bytes]
        if short:
            e.error = (
                f"{len(short)} truncated file(s), e.g. {os.path.basename(short[0].path)}: its pixel "
                f"data ends {short[0].missing_bytes} bytes early"
            )
        try:
            g = series_geometry(s)
            e.spacing = tuple(float(x) for x in np.round(spacing_of(g.affine), 4))
            e.orientation = axcodes(g.affine)
            e.warnings = list(g.warnings)
        except MedprocError as ex:
            e.error = "; ".join(x for x in (e.error, ex.message) if x)
        out.append(e)
    for f in _image_files(paths):
        out.append(_header_entry(f))
    for p, reason in skipped:
        if not p.lower().endswith(_IMAGE_EXT):
            out.append(Entry("skipped", p, error=reason))
    return out
