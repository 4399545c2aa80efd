"""Keys of annotation files: the key under which a file lists an image (a DICOM
SeriesInstanceUID, or the image file's stem; tables name images by file name or path too, made
on POSIX or Windows: each reader and each lookup goes through :func:`image_key`, so that they
agree), and the top-level keys of a JSON lesion file (:func:`check_top_keys`)."""

from __future__ import annotations

import difflib

from ..errors import ReadError

__all__ = ["image_key", "check_top_keys"]

_DATALIST = ("training", "validation", "test")  # MONAI's datalist layout


def image_key(p: str) -> str:
    """A file name or path (POSIX or Windows) without its folders and image extension
    (``D:\\scans\\case001.nii.gz`` -> ``case001``); a SeriesInstanceUID stays as it is.

    >>> image_key("D:\\scans\\case001.nii.gz"), image_key("1.2.826.0.1.3680043.8.498.1")
    ('case001', '1.2.826.0.1.3680043.8.498.1')
    """
    from ..io import stem

    return stem(str(p).replace("\\", "/"), extra=(".dcm",))


def check_top_keys(doc: dict, path: str) -> None:
    """A top-level key that is a near miss of ``coordinate_system``, ``box_mode`` or
    ``cases`` (``coordinate_sytem``, ``boxmode``), or a unit (``units: cm``), is an error: left
    unread, the boxes would be placed with the defaults (RAS, cccwhd, mm), wrong without a
    word. Other keys (a datalist's "name", "labels"...) are left alone."""
    known = ("coordinate_system", "box_mode", "cases")
    for key in doc:
        low = str(key).lower()
        if key in known or key in _DATALIST:
            continue
        if low in ("unit", "units", "length_unit", "coordinate_units", "spacing_units"):
            raise ReadError(
                f"key {key!r}: coordinates and sizes are read as millimetres (there is no unit "
                "key); convert them to mm and drop the key",
                path,
            )
        close = difflib.get_close_matches(low.replace("-", "_"), known, n=1, cutoff=0.75)
        if close:
            unread = {"coordinate_system": " (unread: RAS)", "box_mode": " (unread: cccwhd)"}
            raise ReadError(f"unknown key {key!r}: did you mean {close[0]!r}?"
                            f"{unread.get(close[0], '')}", path)  # fmt: skip
