"""Find DICOM series in files and folder trees, from headers only (no pixel data read).

A *series* here is a set of frames that make one regular volume: files are grouped by
SeriesInstanceUID and split where geometry differs (image size, orientation, localizers), and
every multi-frame file is a volume of its own. Each frame (a slice of a classic file, or one
frame of an enhanced multi-frame / RT dose file) becomes a :class:`Frame` with its own position,
orientation, pixel spacing and rescale, so the geometry code treats all kinds alike.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..errors import ReadError
from .dicom_header import (  # noqa: F401  (Frame, frames_of, is_dicom_file: re-exported)
    _NOT_DICOM_EXT,
    Frame,
    _fast_pixels,
    _val,
    frames_of,
    is_dicom_file,
    read_header,
)

log = logging.getLogger(__name__)

__all__ = ["Frame", "DicomSeries", "find_series", "read_header", "is_dicom_file"]

#: SOP classes (by keyword of their name) that carry no image: loading them is refused.
_NON_IMAGE_MODALITIES = {"SR", "RTPLAN", "RTSTRUCT", "ECG", "KO", "PR", "REG", "DOC"}


@dataclass
class DicomSeries:
    """Frames that belong to one volume, plus the series-level attributes."""

    uid: str
    frames: list[Frame]
    info: dict = field(default_factory=dict)
    part: int = 0  # >0 when a SeriesInstanceUID was split into several volumes

    @property
    def key(self) -> str:
        """The name users pass as ``series=``: the UID, with ``.partN`` when split."""
        return self.uid if self.part == 0 else f"{self.uid}.part{self.part}"

    @property
    def files(self) -> list[str]:
        return sorted({f.path for f in self.frames})

    def describe(self) -> str:
        i = self.info
        return (
            f"{self.key} (#{i.get('SeriesNumber', '?')} {i.get('Modality', '?')} "
            f"'{i.get('SeriesDescription', '')}', {len(self.frames)} frames of "
            f"{i.get('Rows')}x{i.get('Columns')})"
        )


_INFO_KEYS = (
    "Modality",
    "SeriesDescription",
    "SeriesNumber",
    "StudyInstanceUID",
    "SOPClassUID",
    "Rows",
    "Columns",
    "SamplesPerPixel",
    "BitsAllocated",
    "BitsStored",
    "PixelRepresentation",
    "PhotometricInterpretation",
    "SliceThickness",
    "SpacingBetweenSlices",
    "GantryDetectorTilt",
    "ImageType",
    "NumberOfFrames",
)


def _iter_files(paths: Iterable[str]) -> Iterable[str]:
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for name in sorted(files):
                    if not name.startswith(".") and not name.lower().endswith(_NOT_DICOM_EXT):
                        yield os.path.join(root, name)
        else:
            yield p


def _scan_files(files: list[str], strict: bool = False) -> list[tuple]:
    """Read the headers of ``files``: ("skip", path, reason) or ("ok", key, frames, info)."""
    return [_scan_file(p, strict) for p in files]


def _scan_file(path: str, strict: bool) -> tuple:
    try:
        ds, offset = read_header(
            path, force=not os.path.basename(path).upper().startswith("DICOMDIR"), with_offset=True
        )
    except ReadError as e:
        if strict:
            raise
        return ("skip", path, e.message)
    if "SOPClassUID" not in ds and "Rows" not in ds:
        reason = "not a DICOM file (no DICOM attributes found)"
        if strict:
            raise ReadError(reason, path)
        return ("skip", path, reason)
    if "Rows" not in ds or _val(ds, "Modality") in _NON_IMAGE_MODALITIES:
        sop = ds.get("SOPClassUID")
        return ("skip", path, f"no image in it (SOP class {getattr(sop, 'name', sop)})")
    try:
        frames, extra = frames_of(ds, path)
        rows, cols = int(ds.Rows), int(ds.Columns)
    except (ValueError, TypeError, AttributeError, IndexError) as e:
        return ("skip", path, f"malformed geometry attributes: {e}")
    if len(frames) == 1 and frames[0].index is None:
        frames[0].fast = _fast_pixels(ds, offset)
        if frames[0].fast is not None:
            # header + value of PixelData: 12 bytes (explicit VR OB/OW) or 8 (implicit)
            head = 8 if str(ds.file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2" else 12
            need = (
                offset
                + head
                + int(ds.Rows) * int(ds.Columns) * np.dtype(frames[0].fast[1]).itemsize
            )
            frames[0].missing_bytes = max(0, need - os.path.getsize(path))
    image_type = _val(ds, "ImageType") or []
    image_type = [image_type] if isinstance(image_type, str) else image_type
    localizer = "LOCALIZER" in [str(t).upper() for t in image_type]
    uid = str(_val(ds, "SeriesInstanceUID") or f"nouid:{path}")
    key = [uid, rows, cols, int(ds.get("SamplesPerPixel") or 1), localizer]
    if len(frames) > 1 or "PerFrameFunctionalGroupsSequence" in ds:
        key.append(("file", path))  # a multi-frame file is a volume of its own
    info = {k: _val(ds, k) for k in _INFO_KEYS}
    for k in (
        "Rows",
        "Columns",
        "SamplesPerPixel",
        "BitsAllocated",
        "BitsStored",
        "PixelRepresentation",
    ):
        info[k] = ds.get(k)
    for k in ("SeriesNumber", "NumberOfFrames"):
        try:
            info[k] = int(info[k]) if info[k] not in (None, "") else None
        except (TypeError, ValueError):
            info[k] = None
    sop = ds.get("SOPClassUID")
    info["SOPClassUID"] = sop
    info.update(extra)
    info["TransferSyntaxUID"] = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    return ("ok", key, frames, info)


def find_series(
    paths, strict: bool = False, executor=None
) -> tuple[list[DicomSeries], list[tuple[str, str]]]:
    """Group the DICOM files under ``paths`` into volumes.

    Parameters
    ----------
    paths : path or list of paths
        Files and/or folders (searched recursively).
    strict : bool
        Raise on the first unreadable file instead of listing it in ``skipped``.
    executor : concurrent.futures.Executor, optional
        Read headers in parallel (chunks of 64 files), e.g. the process pool of a batch run.

    Returns
    -------
    series : list of DicomSeries
        Sorted by series number then UID.
    skipped : list of (path, reason)
        Files that are not DICOM images (stray files, DICOMDIR, reports), with the reason.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = list(_iter_files(paths))
    if executor is not None and len(files) > 64:
        chunks = [files[i : i + 64] for i in range(0, len(files), 64)]
        records = [
            r for part in executor.map(_scan_files, chunks, [strict] * len(chunks)) for r in part
        ]
    else:
        records = _scan_files(files, strict)
    groups: dict[tuple, DicomSeries] = {}
    skipped: list[tuple[str, str]] = []
    for rec in records:
        if rec[0] == "skip":
            skipped.append((rec[1], rec[2]))
            continue
        _, key, frames, info = rec
        uid = key[0]
        ori = frames[0].orientation
        # orientation: cluster within 1e-4 instead of rounding (no split at rounding borders)
        matched = None
        for k, s in groups.items():
            if list(k[:-1]) == key:
                o2 = s.frames[0].orientation
                if (ori is None and o2 is None) or (
                    ori is not None and o2 is not None and np.allclose(ori, o2, atol=1e-4)
                ):
                    matched = s
                    break
        if matched is None:
            matched = DicomSeries(uid, [], info)
            groups[(*key, len(groups))] = matched
        matched.frames.extend(frames)
    series = sorted(
        groups.values(), key=lambda s: (_num(s.info.get("SeriesNumber")), s.uid, s.files[0])
    )
    by_uid: dict[str, list[DicomSeries]] = {}
    for s in series:
        by_uid.setdefault(s.uid, []).append(s)
    for parts in by_uid.values():
        if len(parts) > 1:
            for i, s in enumerate(parts, 1):
                s.part = i
    return series, skipped


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("inf")
