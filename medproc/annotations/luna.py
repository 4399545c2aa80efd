"""LUNA16-style lesion tables: ``seriesuid,coordX,coordY,coordZ,diameter_mm`` (world LPS mm).

Each row is parsed as text; the numbers are checked together, as arrays (a table near the
256 MiB cap holds millions of rows: checked row by row with numpy, 28 MB took 29 s), and the
first bad row is named by its line, as a row-by-row reader would name it.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from ..errors import MedprocWarning, ReadError
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
    _not_dicom(path, "lesion table")
    lines, keys, values = _rows(path)
    xyz = np.array(values, dtype=np.float64).reshape(-1, 4)
    xyz, d = xyz[:, :3], xyz[:, 3]
    name = os.path.basename(path)
    firsts: dict[tuple, int] = {}  # (key, x, y, z, diameter) -> its first line
    rows: dict[str, list] = {}  # key -> row indices, each lesion once
    repeats: list[str] = []
    for n, (line, uid, row) in enumerate(zip(lines, keys, map(tuple, values))):
        seen = firsts.setdefault((uid, *row), line)
        if seen != line:  # (kept once: twice would be two boxes on one lesion)
            repeats.append(f"line {line} repeats line {seen}")
        else:
            rows.setdefault(uid, []).append(n)
    if repeats:
        warnings.warn(
            f"{path}: {'; '.join(repeats[:5])}{' ...' if len(repeats) > 5 else ''} (the same "
            f"image, centre and diameter): {len(repeats)} repeated row(s) read once",
            MedprocWarning,
            stacklevel=2,
        )
    out = {
        uid: Lesions(
            xyz[ns] * _FLIP,
            np.repeat(d[ns, None], 3, axis=1),
            ["point"] * len(ns),
            None,
            [f"{name}:{lines[n]}" for n in ns],
        )
        for uid, ns in rows.items()
    }
    if series is not None:
        return out.get(image_key(series), Lesions.empty())
    return out


def _rows(path: str) -> tuple[list[int], list[str], list[tuple]]:
    """(line of each row, its image key, its (x, y, z, diameter) as floats), each row checked;
    a ReadError naming the first bad line."""
    from ..io.tables import read_csv_rows

    lines: list[int] = []
    keys: list[str] = []
    values: list[tuple] = []
    raws: dict[str, tuple] = {}  # key -> (the seriesuid written, its line)
    key_of: dict[str, str] = {}  # seriesuid written -> its key (image_key, once per name)
    for line, row in read_csv_rows(path, _NEED, "lesion table (LUNA16 CSV)"):
        try:
            _parsed(row, path, line, values)
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
            _check_numbers(values[: len(lines) + 1], [*lines, line], path)
            raise
        lines.append(line)
        keys.append(uid)
    _check_numbers(values, lines, path)
    return lines, keys, values


def _parsed(row: dict, path: str, line: int, values: list) -> None:
    """Append ``row``'s (x, y, z, diameter) to ``values``, or raise naming the line."""
    cells = [row.get(c) for c in _NEED[1:]]
    if None in cells or row.get("seriesuid") is None:
        raise ReadError(
            "fewer fields than the header (an unterminated quote?)", path, where=f"line {line}"
        )
    try:
        if "_" in "".join(cells):  # float() takes "1_000"; a table does not
            raise ValueError
        values.append(tuple(map(float, cells)))
    except (TypeError, ValueError):
        got = [str(row.get(c))[:40] for c in _NEED[1:]]
        raise ReadError(
            f"coordinates and diameter must be numbers, got {got}", path, where=f"line {line}"
        ) from None


def _check_numbers(values: list, lines: list[int], path: str) -> None:
    """Coordinates finite, diameters finite and > 0, and both such as a scan can hold
    (:func:`._sane`): checked as arrays; the first bad row is named by its line."""
    if not values:
        return
    a = np.array(values, dtype=np.float64)
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
