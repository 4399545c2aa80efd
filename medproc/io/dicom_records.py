"""One file of a DICOM scan: a record saying what it is, from its header alone.

``scan_file(path)`` returns one of

- ``("skip", path, reason)``: not a DICOM image (a stray file, a report, DICOMDIR);
- ``("bad", path, reason, series_uid or None, sop_instance_uid or None)``: a file that looks
  like DICOM (a ``.dcm`` / ``.ima`` name or the ``DICM`` marker) or cannot be read at all, and
  cannot be used;
- ``("ok", key, frames, info, sop_instance_uid, problem or None)``: frames of a series;
  ``problem`` says why its pixels cannot be used (truncated, shorter or longer than declared,
  missing), found from the header and the file size, so the series fails naming the file.

Declared sizes are checked before anything is allocated (NumberOfFrames, Rows x Columns x
frames x bits against the pixel data element and the memory cap).
"""

from __future__ import annotations

import os
import struct

from pydicom.errors import BytesLengthException
from pydicom.uid import UID

from ..errors import ReadError
from .dicom_header import (
    PADDING_NOTE,
    _fast_pixels,
    _number,
    _val,
    frames_of,
    n_frames,
    read_header,
)
from .safety import all_zero, check_declared, check_file, os_error

__all__ = [
    "length_problem",
    "scan_file",
    "INFO_KEYS",
    "pixel_element",
    "expected_pixel_bytes",
    "dicom_label_kind",
    "label_kind_of",
    "RTSTRUCT_SKIPPED",
]

_SEG_CLASS = "1.2.840.10008.5.1.4.1.1.66.4"  # Segmentation Storage
_RTSTRUCT_CLASS = "1.2.840.10008.5.1.4.1.1.481.3"  # RT Structure Set Storage
#: the reason the scan gives for skipping an RTSTRUCT file (an annotation, not an image)
RTSTRUCT_SKIPPED = "no image in it (SOP class RT Structure Set Storage)"


def dicom_label_kind(modality, sop_class_uid) -> str | None:
    """``"SEG"`` or ``"RTSTRUCT"`` for a DICOM segmentation or structure set, by its Modality
    or its SOP Class UID (either is enough); None for anything else.

    >>> dicom_label_kind(None, "1.2.840.10008.5.1.4.1.1.66.4"), dicom_label_kind("CT", None)
    ('SEG', None)
    """
    sop = str(sop_class_uid or "")
    if modality == "SEG" or sop == _SEG_CLASS:
        return "SEG"
    if modality == "RTSTRUCT" or sop == _RTSTRUCT_CLASS:
        return "RTSTRUCT"
    return None


def label_kind_of(header) -> str | None:
    """:func:`dicom_label_kind` of a header (a pydicom Dataset, or a scanned series' ``info``
    dict; None: None)."""
    if header is None:
        return None
    return dicom_label_kind(header.get("Modality"), header.get("SOPClassUID"))


#: SOP classes (by keyword of their name) that carry no image: loading them is refused.
_NON_IMAGE_MODALITIES = {"SR", "RTPLAN", "RTSTRUCT", "ECG", "KO", "PR", "REG", "DOC"}
_DICOM_EXT = (".dcm", ".ima", ".dicom", ".dic")
_NATIVE = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.2"}

INFO_KEYS = (
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


#: INFO_KEYS read as checked integers (the others as they are)
_INTS = ("Rows", "Columns", "SamplesPerPixel", "BitsAllocated", "BitsStored", "PixelRepresentation")

_IMPLICIT = "1.2.840.10008.1.2"
_BIG_ENDIAN = "1.2.840.10008.1.2.2"
_LONG_VRS = {b"OB", b"OW", b"OF", b"OD", b"OL", b"OV", b"UN", b"UT", b"SQ", b"UC", b"UR"}


def pixel_element(path: str, offset: int, ts: str) -> tuple[int, int] | None:
    """``(length of the pixel data value, bytes of the element header)`` for the element that
    starts at ``offset`` (where the header scan stopped), ``length = -1`` for encapsulated
    (undefined length) data; None when there is no pixel data element there."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            head = f.read(12)
    except OSError:
        return None
    if len(head) < 8:
        return None
    big = ts == _BIG_ENDIAN
    order = "big" if big else "little"
    group = int.from_bytes(head[0:2], order)
    if group != 0x7FE0:
        return None
    if ts == _IMPLICIT:
        length, hdr = int.from_bytes(head[4:8], order), 8
    elif head[4:6] in _LONG_VRS:
        if len(head) < 12:
            return None
        length, hdr = int.from_bytes(head[8:12], order), 12
    else:
        length, hdr = int.from_bytes(head[6:8], order), 8
    return (-1 if length == 0xFFFFFFFF else length), hdr


def length_problem(length: int, want: int, what: str, excess_zero) -> str | None:
    """Why native pixel data of ``length`` bytes cannot be the ``want`` that ``what`` declare
    (None: it can). Longer is fine by one pad byte of an odd length, or when the excess is
    zero bytes (``excess_zero()``: padding, which DICOM asks readers to accept, PS3.5 8.1.1);
    the one rule of the header scan and of both pixel readers."""
    if length < want:
        return (
            f"PixelData holds {length} bytes, {want} expected for {what}: Rows, Columns, "
            "NumberOfFrames or BitsAllocated do not match the pixel data"
        )
    if length > want + want % 2 and not excess_zero():
        return (
            f"PixelData holds {length} bytes, more than the {want} that {what} need, and the "
            "excess is not zero padding: Rows, Columns, NumberOfFrames or BitsAllocated do not "
            "match the pixel data"
        )
    return None


def padding_note(path: str, length: int, want: int, what: str) -> str:
    return (
        f"{path}: PixelData holds {length - want} zero bytes past the {want} that {what} need: "
        "excess padding, which DICOM asks readers to accept (PS3.5 8.1.1); left out"
    )


def expected_pixel_bytes(info: dict, nframes: int) -> int:
    """Bytes of native (uncompressed) pixel data that Rows x Columns x frames x samples x
    BitsAllocated declare (YBR_FULL_422 stores 2 samples per pixel; 1-bit data is packed)."""
    rows, cols = int(info["Rows"]), int(info["Columns"])
    spp = int(info.get("SamplesPerPixel") or 1)
    bits = int(info.get("BitsAllocated") or 16)
    if str(info.get("PhotometricInterpretation") or "") == "YBR_FULL_422":
        spp = 2
    n = rows * cols * spp * nframes
    return (n + 7) // 8 if bits == 1 else n * bits // 8


_PAIR = (
    "an Analyze / NIfTI pair file (.hdr + .img), which medproc does not read: make it one .nii "
    "first, e.g. nibabel.save(nibabel.load('x.hdr'), 'x.nii')"
)


_DICOMDIR = "1.2.840.10008.1.3.10"  # Media Storage Directory Storage
_DICOMDIR_SKIPPED = (
    "a DICOMDIR (the index of a DICOM medium): not an image; the files it lists are read "
    "where they lie"
)


#: what pydicom raises converting a damaged value (BytesLengthException: a wrong length)
_VALUE_ERRORS = (
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
    KeyError,
    OverflowError,
    NotImplementedError,
    struct.error,
    BytesLengthException,
)


def _malformed(e: Exception) -> str:
    return f"malformed attributes ({type(e).__name__}: {e}); fix or remove the file"


def _fail(path, reason, looks: bool, strict: bool, uid=None, sop=None) -> tuple:
    if strict:
        raise ReadError(reason, path)
    return ("bad", path, reason, uid, sop) if looks else ("skip", path, reason)


def scan_file(path: str, strict: bool = False) -> tuple:
    """The record of one file (see the module doc); ``strict`` raises instead of skipping."""
    try:
        size = check_file(path).st_size
        with open(path, "rb") as f:
            head = f.read(132)
    except ReadError as e:
        if strict:
            raise
        return ("bad", path, e.message, None, None)
    except OSError as e:
        if strict:
            raise os_error(e, path) from None
        return ("bad", path, os_error(e, path).message, None, None)
    looks = path.lower().endswith(_DICOM_EXT) or head[128:132] == b"DICM"
    if not looks and path.lower().endswith((".hdr", ".img")):
        return _fail(path, _PAIR, looks, strict)
    if not head:
        return _fail(path, "is empty (0 bytes): not a DICOM file", looks, strict)
    try:
        ds, offset = read_header(
            path, force=not os.path.basename(path).upper().startswith("DICOMDIR"), with_offset=True
        )
    except ReadError as e:
        return _fail(path, e.message, looks, strict)
    try:
        return _record(ds, offset, path, size, looks, strict)
    except ReadError as e:
        return _fail(path, e.message, looks, strict)
    except _VALUE_ERRORS as e:  # pydicom converts values lazily, and raises many kinds on
        # damaged ones (an unknown VR: NotImplementedError)
        return _fail(path, _malformed(e), looks, strict)


def _record(ds, offset: int, path: str, size: int, looks: bool, strict: bool) -> tuple:
    """:func:`scan_file`'s record of a header pydicom has read."""
    uid = _val(ds, "SeriesInstanceUID")
    uid = str(uid) if uid else None
    sop = _val(ds, "SOPInstanceUID")
    sop = str(sop) if sop else None
    media = getattr(getattr(ds, "file_meta", None), "MediaStorageSOPClassUID", None)
    if str(media) == _DICOMDIR or "DirectoryRecordSequence" in ds:
        return ("skip", path, _DICOMDIR_SKIPPED)
    if "SOPClassUID" not in ds and "Rows" not in ds:
        return _fail(path, "not a DICOM file (no DICOM attributes found)", looks, strict)
    sop_class = ds.get("SOPClassUID")
    name = str(getattr(sop_class, "name", sop_class))
    modality = _val(ds, "Modality")
    if dicom_label_kind(modality, sop_class) == "RTSTRUCT":
        return ("skip", path, RTSTRUCT_SKIPPED)
    if "Rows" not in ds or modality in _NON_IMAGE_MODALITIES:
        if "Rows" not in ds and "Image Storage" in name and modality not in _NON_IMAGE_MODALITIES:
            reason = f"declares an image ({name}) but has no Rows: the header is damaged"
            return _fail(path, reason, True, strict, uid, sop)
        return ("skip", path, f"no image in it (SOP class {name})")
    try:
        return _image_record(ds, offset, path, size, uid)
    except ReadError as e:
        return _fail(path, e.message, True, strict, uid, sop)
    except _VALUE_ERRORS as e:  # (as above; here the file's series is known)
        return _fail(path, _malformed(e), True, strict, uid, sop)


def _image_record(ds, offset: int, path: str, size: int, uid: str | None) -> tuple:
    nframes = n_frames(ds, path)
    ints = {k: _number(ds, k, path, integer=True) for k in _INTS}  # (each read once)
    rows, cols = ints["Rows"], ints["Columns"]
    spp = 1 if ints["SamplesPerPixel"] is None else ints["SamplesPerPixel"]
    bits = 16 if ints["BitsAllocated"] is None else ints["BitsAllocated"]
    if rows is None or cols is None or rows < 1 or cols < 1:
        raise ReadError(
            f"Rows x Columns is {rows}x{cols}: expected both >= 1; the header is damaged", path
        )
    if bits not in (1, 8, 16, 32, 64) or spp not in (1, 3, 4):
        raise ReadError(
            f"BitsAllocated {bits} / SamplesPerPixel {spp}: expected 1, 8, 16, 32 or 64 bits "
            "and 1, 3 or 4 samples; the header is damaged",
            path,
        )
    info = {k: _val(ds, k) for k in INFO_KEYS if k not in _INTS}
    info.update(ints)
    for k in ("SeriesNumber", "NumberOfFrames"):
        try:
            info[k] = int(info[k]) if info[k] not in (None, "") else None
        except (TypeError, ValueError):
            info[k] = None
    meta = getattr(ds, "file_meta", None)
    ts = _val(meta, "TransferSyntaxUID") if meta is not None else None
    for k, v in (("TransferSyntaxUID", ts), ("SOPClassUID", info["SOPClassUID"])):
        info[k] = UID(v) if isinstance(v, str) else v  # (names and kinds for the reports)
    problem = _pixel_problem(
        path, offset, str(info["TransferSyntaxUID"] or ""), info, nframes, size
    )
    if problem and nframes > 1:
        raise ReadError(problem, path)  # a multi-frame header that lies: no frames built
    frames, extra = frames_of(ds, path)
    if len(frames) == 1 and frames[0].index is None:
        frames[0].fast = _fast_pixels(info, nframes, offset)
    image_type = _val(ds, "ImageType") or []
    image_type = [image_type] if isinstance(image_type, str) else image_type
    localizer = "LOCALIZER" in [str(t).upper() for t in image_type]
    # without a SeriesInstanceUID: the files of a folder with one SeriesNumber (as dcm2niix
    # groups them), not a volume per file
    key = [uid or f"nouid:{os.path.dirname(path)}", rows, cols, spp, localizer]
    if not uid:
        key.append(("series_number", info.get("SeriesNumber")))
    if len(frames) > 1 or "PerFrameFunctionalGroupsSequence" in ds:
        key.append(("file", path))  # a multi-frame file is a volume of its own
    info.update(extra)
    sop = _val(ds, "SOPInstanceUID")
    return ("ok", key, frames, info, str(sop) if sop else None, problem)


def _pixel_problem(path, offset, ts, info, nframes, size) -> str | None:
    """Why the pixel data cannot be right, from the header and the file size; raises
    :class:`~medproc.errors.LimitError` when the declared size cannot be real."""
    rows, cols = int(info["Rows"]), int(info["Columns"])
    spp = int(info.get("SamplesPerPixel") or 1)
    bits = int(info.get("BitsAllocated") or 16)
    what = f"{nframes} frame(s) of {rows}x{cols}{f'x{spp}' if spp > 1 else ''} at {bits} bits"
    decoded = rows * cols * spp * nframes * max(bits, 8) // 8
    check_declared(path, what, decoded)
    if ts == "1.2.840.10008.1.2.1.99":
        return None  # deflated: the pixel data element is inside the compressed stream
    pe = pixel_element(path, offset, ts)
    if pe is None:
        return "has no pixel data (PixelData is missing)"
    length, head = pe
    if ts in _NATIVE:
        if length < 0:
            return "native pixel data with an undefined length: the file is damaged"
        end = offset + head + length
        if end > size:
            return f"truncated file: its pixel data ends {end - size} bytes early"
        want = expected_pixel_bytes(info, nframes)
        start = offset + head + want
        problem = length_problem(length, want, what, lambda: all_zero(path, start, length - want))
        if problem is None and length > want + want % 2:
            info[PADDING_NOTE] = padding_note(path, length, want, what)
        return problem
    elif length == -1 and nframes * 8 > size - offset:
        raise ReadError(
            f"NumberOfFrames is {nframes}, but {size - offset} bytes of compressed pixel data "
            "cannot hold that many frames: the header is damaged",
            path,
        )
    return None
