"""Reading one file's DICOM header safely: never a FIFO or a device, values over 1 MiB not
read (a damaged length cannot make it allocate), an element whose length runs past the end of
the file an error naming it."""

from __future__ import annotations

import os
import stat
import struct
import warnings

import pydicom
from pydicom.errors import BytesLengthException, InvalidDicomError

from ..errors import ReadError
from .safety import check_file, os_error

__all__ = ["is_dicom_file", "read_header"]

#: DICOM values longer than this are not read by the header scan
_DEFER = 1 << 20


def is_dicom_file(path: str) -> bool:
    """Cheap test: the 'DICM' preamble marker (files without a preamble are tried anyway)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # never open a FIFO or a device
        with open(path, "rb") as f:
            head = f.read(132)
    except OSError:
        return False
    return len(head) == 132 and head[128:132] == b"DICM"


class _PastEnd(Exception):
    pass


def _cut_short(ds) -> int:
    """Bytes missing from the value of a top-level element pydicom read short (its declared
    length runs past the end of the file), else 0."""
    from pydicom.dataelem import RawDataElement

    for elem in getattr(ds, "_dict", {}).values():
        if isinstance(elem, RawDataElement) and isinstance(elem.value, bytes):
            if elem.length != 0xFFFFFFFF and len(elem.value) < elem.length:
                return elem.length - len(elem.value)
    return 0


def read_header(path: str, force: bool = False, with_offset: bool = False):
    """Read a DICOM header without pixel data, raising :class:`ReadError` naming the file.

    With ``with_offset`` returns ``(dataset, offset)``: the byte offset where pydicom stopped
    (the PixelData element, when the file has one). Never opens a FIFO or a device; values
    over 1 MiB are not read (a damaged length cannot make it allocate), and an element whose
    length runs past the end of the file is an error."""
    size = check_file(path).st_size
    marker = is_dicom_file(path)
    try:
        with open(path, "rb") as fp, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # medproc's own checks say it better
            ds = pydicom.dcmread(fp, stop_before_pixels=True, force=force, defer_size=_DEFER)
            offset = fp.tell()
        if offset > size:
            raise _PastEnd(offset - size)
        if offset >= size and (short := _cut_short(ds)):  # (read to the end: a length that
            raise _PastEnd(short)  # ran past it took the rest of the file as its value)
    except InvalidDicomError as e:
        raise ReadError(f"not a DICOM file ({e})", path) from None
    except OSError as e:
        raise os_error(e, path) from None
    except RecursionError:
        raise ReadError(
            "its sequences are nested too deeply to be parsed: a damaged or hostile file", path
        ) from None
    except Exception as e:  # noqa: BLE001 - pydicom raises many kinds on damaged files
        # (struct.error, BytesLengthException, NotImplementedError for an unknown VR... left
        # the batch as "a bug in medproc", naming no file)
        if not marker:
            raise ReadError(
                "not a DICOM file (no 'DICM' marker, and its bytes do not parse as DICOM)", path
            ) from None
        if isinstance(e, _PastEnd):
            raise ReadError(
                f"a DICOM element declares a length that runs {e.args[0]} bytes past the end "
                "of the file: the file is truncated or its header damaged",
                path,
            ) from None
        short = isinstance(e, (struct.error, EOFError, BytesLengthException))
        kind = "struct.error" if isinstance(e, struct.error) else type(e).__name__
        hint = " (it ends inside an element: a truncated file?)" if short else ""
        raise ReadError(f"the DICOM header cannot be parsed{hint}: {kind}: {e}", path) from None
    return (ds, offset) if with_offset else ds
