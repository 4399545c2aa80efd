"""One DICOM file's header, without its pixel data: the frames it holds (position, orientation,
spacing, rescale, where the raw pixels start) and the series-level attributes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pydicom
from pydicom.errors import InvalidDicomError

from ..errors import ReadError

__all__ = ["Frame", "frames_of", "read_header", "is_dicom_file"]


@dataclass
class Frame:
    """One 2D frame of a series and where it sits (LPS mm, as DICOM stores it)."""

    path: str
    index: int | None  # frame number inside a multi-frame file, None for a classic file
    position: np.ndarray | None  # ImagePositionPatient, LPS mm
    orientation: np.ndarray | None  # ImageOrientationPatient (row cosine, column cosine)
    pixel_spacing: tuple[float, float] | None  # (between rows, between columns) mm
    slope: float = 1.0
    intercept: float = 0.0
    instance: int | None = None
    #: (byte offset of the PixelData element, numpy dtype) when the pixels are native
    #: little-endian and can be read without parsing the file again (see dicom_read)
    fast: tuple[int, str] | None = None
    #: bytes missing from the end of native pixel data (a truncated file), found from the size
    missing_bytes: int = 0


def is_dicom_file(path: str) -> bool:
    """Cheap test: the 'DICM' preamble marker (files without a preamble are tried anyway)."""
    try:
        with open(path, "rb") as f:
            head = f.read(132)
    except OSError:
        return False
    return len(head) == 132 and head[128:132] == b"DICM"


_NATIVE_LE = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1"}  # implicit / explicit VR little endian


def _fast_pixels(ds: pydicom.Dataset, offset: int) -> tuple[int, str] | None:
    """Where the raw pixels start, if they can be read straight from the file."""
    ts = str(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", "") or "")
    try:
        bits, stored = int(ds.BitsAllocated), int(ds.get("BitsStored") or ds.BitsAllocated)
        signed, spp = int(ds.get("PixelRepresentation") or 0), int(ds.get("SamplesPerPixel") or 1)
        nframes = int(ds.get("NumberOfFrames") or 1)
    except (AttributeError, TypeError, ValueError):
        return None
    if ts not in _NATIVE_LE or spp != 1 or nframes != 1 or bits not in (8, 16, 32):
        return None
    if signed and stored != bits:
        return None  # needs sign correction: leave it to pydicom
    return offset, f"<{'i' if signed else 'u'}{bits // 8}"


def read_header(path: str, force: bool = False, with_offset: bool = False):
    """Read a DICOM header without pixel data, raising :class:`ReadError` naming the file.

    With ``with_offset`` returns ``(dataset, offset)``: the byte offset where pydicom stopped
    (the PixelData element, when the file has one)."""
    try:
        if with_offset:
            with open(path, "rb") as fp:
                ds = pydicom.dcmread(fp, stop_before_pixels=True, force=force)
                return ds, fp.tell()
        return pydicom.dcmread(path, stop_before_pixels=True, force=force)
    except InvalidDicomError as e:
        raise ReadError(f"not a DICOM file ({e})", path) from None
    except (EOFError, OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ReadError(
            f"the DICOM header cannot be parsed: {type(e).__name__}: {e}", path
        ) from None


_STRING_VRS = {"DS", "IS", "CS", "UI", "LO", "SH", "PN", "DA", "TM", "ST", "LT"}
_TAGS: dict[str, int] = {}


def _val(ds: pydicom.Dataset, keyword: str):
    """``ds.get(keyword)``, but string attributes are read from the raw bytes without pydicom's
    (slow) value conversion: a str, a list of str for multi-valued ones, or None."""
    tag = _TAGS.get(keyword)
    if tag is None:
        from pydicom.datadict import tag_for_keyword

        tag = _TAGS[keyword] = tag_for_keyword(keyword)
    if tag not in ds:
        return None
    elem = ds.get_item(tag)
    raw_vr = getattr(elem, "VR", None)
    vr = raw_vr or pydicom.datadict.dictionary_VR(tag)
    if isinstance(elem, pydicom.dataelem.RawDataElement) and vr in _STRING_VRS:
        v = elem.value
        if not v:
            return None
        txt = v.decode("latin-1").strip(" \x00")
        if not txt:
            return None
        parts = [t.strip(" \x00") for t in txt.split("\\")]
        return parts if len(parts) > 1 else parts[0]
    return ds.get(keyword)


def _floats(value, n: int) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    try:
        arr = np.array([float(v) for v in value], dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return arr if arr.shape == (n,) and np.all(np.isfinite(arr)) else None


def _first(seq_owner, seq_name: str):
    seq = seq_owner.get(seq_name) if seq_owner is not None else None
    return seq[0] if seq else None


def _frame_attrs(groups) -> dict:
    """Geometry/rescale attributes of one functional-groups item (shared or per-frame)."""
    out = {}
    if groups is None:
        return out
    pos = _first(groups, "PlanePositionSequence")
    if pos is not None and "ImagePositionPatient" in pos:
        out["position"] = _floats(pos.ImagePositionPatient, 3)
    ori = _first(groups, "PlaneOrientationSequence")
    if ori is not None and "ImageOrientationPatient" in ori:
        out["orientation"] = _floats(ori.ImageOrientationPatient, 6)
    pm = _first(groups, "PixelMeasuresSequence")
    if pm is not None:
        ps = _floats(pm.get("PixelSpacing"), 2)
        if ps is not None:
            out["pixel_spacing"] = (ps[0], ps[1])
        for k in ("SliceThickness", "SpacingBetweenSlices"):
            if pm.get(k) is not None:
                out[k] = float(pm.get(k))
    pv = _first(groups, "PixelValueTransformationSequence")
    if pv is not None:
        if pv.get("RescaleSlope") is not None:
            out["slope"] = float(pv.RescaleSlope)
        if pv.get("RescaleIntercept") is not None:
            out["intercept"] = float(pv.RescaleIntercept)
    return out


def frames_of(ds: pydicom.Dataset, path: str) -> tuple[list[Frame], dict]:
    """Split a header into frames. Returns (frames, extra series-level info)."""
    nframes = int(_val(ds, "NumberOfFrames") or 1)
    ps = _floats(_val(ds, "PixelSpacing") or _val(ds, "ImagerPixelSpacing"), 2)
    base = {
        "position": _floats(_val(ds, "ImagePositionPatient"), 3),
        "orientation": _floats(_val(ds, "ImageOrientationPatient"), 6),
        "pixel_spacing": None if ps is None else (ps[0], ps[1]),
        "slope": float(_val(ds, "RescaleSlope") or _val(ds, "DoseGridScaling") or 1.0),
        "intercept": float(_val(ds, "RescaleIntercept") or 0.0),
    }
    extra: dict = {}
    inst = _val(ds, "InstanceNumber")
    inst = int(inst) if inst not in (None, "") else None
    per_frame = (
        ds.get("PerFrameFunctionalGroupsSequence")
        if "PerFrameFunctionalGroupsSequence" in ds
        else None
    )
    if per_frame:
        shared = _frame_attrs(_first(ds, "SharedFunctionalGroupsSequence"))
        frames = []
        for i in range(nframes):
            a = {**base, **shared, **_frame_attrs(per_frame[i] if i < len(per_frame) else None)}
            for k in ("SliceThickness", "SpacingBetweenSlices"):
                if k in a:
                    extra[k] = a.pop(k)
            frames.append(Frame(path, i, instance=i + 1, **a))
        return frames, extra
    if nframes > 1:
        offsets = _floats(ds.get("GridFrameOffsetVector"), nframes)
        frames = []
        for i in range(nframes):
            pos = None
            if (
                offsets is not None
                and base["position"] is not None
                and base["orientation"] is not None
            ):
                n = np.cross(base["orientation"][:3], base["orientation"][3:])
                rel = offsets - offsets[0] if offsets[0] != 0 else offsets
                # DICOM: offsets are relative when the first is 0, else absolute along the normal
                pos = base["position"] + rel[i] * n
            a = {**base, "position": pos}
            frames.append(Frame(path, i, instance=i + 1, **a))
        if offsets is not None and nframes > 1:
            extra["SpacingBetweenSlices"] = float(abs(np.median(np.diff(offsets))))
        return frames, extra
    return [Frame(path, None, instance=inst, **base)], extra


#: never DICOM: skipped without opening (stray files beside a series are common)
_NOT_DICOM_EXT = (
    ".csv",
    ".json",
    ".txt",
    ".md",
    ".png",
    ".jpg",
    ".jpeg",
    ".py",
    ".yaml",
    ".yml",
    ".nii",
    ".nii.gz",
    ".nrrd",
    ".nhdr",
    ".mha",
    ".mhd",
    ".npy",
    ".xml",
    ".pdf",
    ".zip",
    ".gz",
)
