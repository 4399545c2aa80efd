"""LUNA16-style lesion tables: ``seriesuid,coordX,coordY,coordZ,diameter_mm`` (world LPS mm).

Rows are parsed as text into flat arrays, and their numbers checked together (a table near the
256 MiB cap holds millions of rows: checked row by row with numpy, 28 MB took 15 s; a Python
tuple per row took ~40x the file's size in memory); the first bad row is named by its line,
whichever its problem, as a row-by-row reader names it. Repeated rows are found by sorting.
"""

from __future__ import annotations

import os
import warnings
from array import array

import numpy as np

from ..errors import MedprocWarning, ReadError, UsageError
from .keys import image_key
from .lesions import Lesions
from .readers import _FLIP, _MAX_COORD_MM, _MAX_SIZE_MM, _not_dicom, _sane

__all__ = ["read_luna_csv"]

_NEED = ("seriesuid", "coordX", "coordY", "coordZ", "diameter_mm")


def read_luna_csv(path, series: str | None = None) -> dict[str, Lesions] | Lesions:
    """LUNA16-style ``seriesuid,coordX,coordY,coordZ,diameter_mm`` (world LPS mm).

    Returns ``{seriesuid: Lesions}``, or the Lesions of ``series`` (empty if it has none).
    ``seriesuid`` is a DICOM SeriesInstanceUID or an image file's stem (a file name or path
    is read as its stem: ``D:\\scans\\case001.nii.gz`` is ``case001``). A malformed file (not
    UTF-8, binary, missing columns, a value that is not a number) raises :class:`ReadError`
    naming the line.
    """
    path = os.fspath(path)
    if series is not None and not isinstance(series, (str, os.PathLike)):  # (3: empty, unsaid)
        raise UsageError(
            f"read_luna_csv: series must be a SeriesInstanceUID or an image's file name, got "
            f"{series!r:.80}"
        )
    _not_dicom(path, "lesion table")
    lines, key_of_row, keys, a = _rows(path)
    first = _first_same(key_of_row, a)  # each row's first identical row (itself: new)
    again = np.flatnonzero(first != np.arange(len(first)))
    if len(again):  # (kept once: twice would be two boxes on one lesion)
        said = "; ".join(f"line {lines[n]} repeats line {lines[first[n]]}" for n in again[:5])
        warnings.warn(
            f"{path}: {said}{' ...' if len(again) > 5 else ''} (the same image, centre and "
            f"diameter): {len(again)} repeated row(s) read once",
            MedprocWarning,
            stacklevel=2,
        )
    kept = np.flatnonzero(first == np.arange(len(first)))
    kept = kept[np.argsort(key_of_row[kept], kind="stable")]  # by image, each in line order
    starts = np.searchsorted(key_of_row[kept], np.arange(len(keys) + 1))
    name = os.path.basename(path)
    out = {}
    for k, uid in enumerate(keys):  # (in order of each image's first line)
        ns = kept[starts[k] : starts[k + 1]]
        out[uid] = Lesions(
            a[ns, :3] * _FLIP,
            np.repeat(a[ns, 3:], 3, axis=1),
            ["point"] * len(ns),
            None,
            [f"{name}:{lines[n]}" for n in ns],
        )
    if series is not None:
        return out.get(image_key(series), Lesions.empty())
    return out


def _first_same(key_of_row: np.ndarray, a: np.ndarray) -> np.ndarray:
    """For each row, the index of the first row with its image, centre and diameter."""
    if not len(a):
        return np.zeros(0, np.int64)
    rows = np.column_stack([key_of_row.astype(np.float64), a + 0.0])  # (+0.0: -0.0 is 0.0)
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    return first[inverse.reshape(-1)]


def _rows(path: str):
    """(line of each row, its image's number, the images' keys, its (x, y, z, diameter) as an
    (n, 4) array), each row checked; a ReadError naming the first bad line. Rows are kept in
    arrays (a Python tuple per row took ~40x the file's size in memory)."""
    from ..io.tables import read_csv_rows

    lines, key_of_row, nums = array("q"), array("q"), array("d")
    keys: list[str] = []
    number: dict[str, int] = {}  # key -> its index in keys
    raws: dict[str, tuple] = {}  # key -> (the seriesuid written, its line)
    key_of: dict[str, str] = {}  # seriesuid written -> its key (image_key, once per name)
    rows = read_csv_rows(path, _NEED, "lesion table (LUNA16 CSV)")
    while True:
        line = None
        try:
            item = next(rows, None)  # (a malformed line raises here: an earlier one's first)
            if item is None:
                break
            line, row = item
            _parsed(row, path, line, nums)
            raw = (row["seriesuid"] or "").strip()
            uid = key_of.get(raw)
            if uid is None:
                uid = key_of[raw] = image_key(raw)  # (a file name or path: its stem)
            if not uid:
                raise ReadError("empty seriesuid", path, where=f"line {line}")
            if raws.setdefault(uid, (raw, line))[0] != raw:  # (two images under one key)
                first = raws[uid]
                raise ReadError(
                    f"{raw!r} and {first[0]!r} (line {first[1]}) are both read as the image "
                    f"{uid!r}: give each image one name, or key them by distinct names",
                    path,
                    where=f"line {line}",
                )
        except ReadError:  # (an earlier line's problem, or this line's numbers, first)
            _check_numbers(np.frombuffer(nums, np.float64).reshape(-1, 4), [*lines, line], path)
            raise
        if uid not in number:
            number[uid] = len(keys)
            keys.append(uid)
        lines.append(line)
        key_of_row.append(number[uid])
    a = np.frombuffer(nums, np.float64).reshape(-1, 4)
    _check_numbers(a, lines, path)
    return lines, np.frombuffer(key_of_row, np.int64), keys, a


def _parsed(row: dict, path: str, line: int, nums) -> None:
    """Append ``row``'s (x, y, z, diameter) to ``nums``, or raise naming the line."""
    cells = [row.get(c) for c in _NEED[1:]]
    if None in cells or row.get("seriesuid") is None:
        raise ReadError(
            "fewer fields than the header (an unterminated quote?)", path, where=f"line {line}"
        )
    try:
        if "_" in "".join(cells):  # float() takes "1_000"; a table does not
            raise ValueError
        nums.extend(tuple(map(float, cells)))  # (all four, or none: a tuple first)
    except (TypeError, ValueError):
        got = [str(row.get(c))[:40] for c in _NEED[1:]]
        raise ReadError(
            f"coordinates and diameter must be numbers, got {got}", path, where=f"line {line}"
        ) from None


def _check_numbers(a: np.ndarray, lines, path: str) -> None:
    """Coordinates finite, diameters finite and > 0, and both such as a scan can hold
    (:func:`._sane`): checked as arrays (row n's line is ``lines[n]``); the first bad row is
    named by its line."""
    if not len(a):
        return
    xyz, d = a[:, :3], a[:, 3]
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(a).all(1) | ~(d > 0)
        wild = (np.abs(xyz) > _MAX_COORD_MM).any(1) | (d > _MAX_SIZE_MM)
    if not (bad | wild).any():
        return
    n = int(np.argmax(bad | wild))  # (the first bad row, whichever its problem)
    if bad[n]:
        raise ReadError(
            f"coordinates must be finite and the diameter > 0, got {xyz[n].tolist()} / {d[n]}",
            path,
            where=f"line {lines[n]}",
        )
    _sane(xyz[n], d[n], path, f"line {lines[n]}")
