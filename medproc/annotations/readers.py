"""Readers for lesion annotations. Every malformed input names the file and the line/item."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np

from ..errors import MedprocWarning, ReadError
from ..geometry import LPS_TO_RAS
from .dicom_labels import read_seg  # noqa: F401 (re-exported)
from .keys import _DATALIST, check_top_keys, image_key
from .lesions import Lesions
from .rtstruct import read_rtstruct  # noqa: F401 (re-exported)

__all__ = ["read_json", "read_seg", "read_rtstruct", "BOX_MODES"]

_FLIP = LPS_TO_RAS.diagonal()[:3]  # LPS <-> RAS on coordinates
BOX_MODES = ("cccwhd", "xyzxyz")


def _not_dicom(path: str, what: str) -> None:
    from ..io.dicom_header import is_dicom_file

    if is_dicom_file(path):
        raise ReadError(
            f"is a DICOM file, not a {what}. DICOM SEG and RTSTRUCT annotations are read with "
            "medproc.annotations.read_seg / read_rtstruct",
            path,
        )


class _RepeatedKey(ValueError):
    pass


def _no_repeated_keys(pairs: list) -> dict:
    """A JSON object, refusing a key given twice (``json`` keeps the last silently)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _RepeatedKey(k)
        out[k] = v
    return out


def read_json(path, image: str | None = None) -> dict[str, Lesions] | Lesions:
    """medproc's JSON lesion format, modelled on MONAI detection's world-coordinate boxes::

        {"coordinate_system": "RAS",            # or "LPS"
         "box_mode": "cccwhd",                  # or "xyzxyz" (min corner, max corner)
         "cases": [{"image": "case001.nii.gz",
                    "boxes": [[x, y, z, w, h, d], ...], "labels": [0, ...],
                    "points": [[x, y, z, diameter_mm], ...]}]}

    MONAI's own datalist layout (``{"training": [{"image": ..., "box": [...], "label": [...]}]}``,
    world coordinates, ``cccwhd``) is accepted too. Returns ``{image stem: Lesions}``, or the
    Lesions of ``image`` (a path or stem). Anything of the wrong type raises
    :class:`ReadError` naming the item (``cases[2].boxes[0]``).
    """
    from ..io.tables import read_text

    path = os.fspath(path)
    _not_dicom(path, "JSON lesion file")
    text = read_text(path)
    try:
        doc = json.loads(text, object_pairs_hook=_no_repeated_keys)
    except _RepeatedKey as e:
        raise ReadError(
            f"the key {e.args[0]!r} appears twice in one object: which value holds is "
            "ambiguous. Keep one",
            path,
        ) from None
    except json.JSONDecodeError as e:
        raise ReadError(
            f"not valid JSON ({e.msg}); fix it", path, where=f"line {e.lineno}"
        ) from None
    except RecursionError:
        raise ReadError("is nested too deeply to be a lesion file", path) from None
    except ValueError as e:  # e.g. an integer of thousands of digits (Python's limit)
        raise ReadError(
            f"holds a value that cannot be read as a number ({e}); fix it", path
        ) from None
    if not isinstance(doc, dict):
        raise ReadError(
            f"the top level is a JSON {type(doc).__name__}; expected an object with a 'cases' list",
            path,
        )
    check_top_keys(doc, path)
    system = _text(doc.get("coordinate_system", "RAS"), path, "coordinate_system").upper()
    if system not in ("RAS", "LPS"):
        raise ReadError(f"coordinate_system must be 'RAS' or 'LPS', got {system!r}", path)
    mode = _text(doc.get("box_mode", "cccwhd"), path, "box_mode").lower()
    if mode not in BOX_MODES:
        raise ReadError(f"box_mode must be one of {BOX_MODES}, got {mode!r}", path)
    if "cases" not in doc and {"image", "lesions"} <= set(doc):  # convert's annotations.json
        doc = {**doc, "cases": [_converted(doc, path)]}
    cases = doc.get("cases")
    lists = [k for k in _DATALIST if k in doc]
    if cases is not None and lists:
        raise ReadError(
            f"holds both 'cases' and MONAI's {lists}: one file, one layout (which would hold "
            "the lesions?)",
            path,
        )
    if cases is None and not lists:
        keys = ", ".join(map(repr, sorted(doc)[:6])) or "none"
        raise ReadError(
            f"holds neither a 'cases' list nor MONAI's 'training'/'validation'/'test' lists "
            f"(its keys: {keys})",
            path,
        )
    wheres = None  # where each case is in the file (error messages)
    if cases is None:
        cases, wheres = [], []
        for key in lists:
            for n, c in enumerate(_list(doc.get(key, []), path, key)):
                c = {"image": c} if isinstance(c, str) else _obj(c, path, f"{key}[{n}]")
                mine = [k for k in ("boxes", "points") if k in c]
                if mine:
                    raise ReadError(
                        f"{mine[0]!r} is a key of medproc's 'cases' layout; MONAI's datalist "
                        "items hold 'box' and 'label'",
                        path,
                        where=f"{key}[{n}]",
                    )
                lab = c.get("label")  # (a path: a segmentation's label map, no box labels)
                lab = None if isinstance(lab, str) else lab
                cases.append(dict(image=c.get("image"), box=c.get("box"), label=lab))
                wheres.append(f"{key}[{n}]")
        if "coordinate_system" not in doc and any(c["box"] for c in cases):
            _warn_datalist_system(path)
    else:
        for n, c in enumerate(_list(cases, path, "cases")):
            extra = sorted(set(c) - _CASE_KEYS) if isinstance(c, dict) else []
            if extra:
                top = extra[0] in ("coordinate_system", "box_mode")
                once = " (set once for the whole file, at its top level)" if top else ""
                raise ReadError(
                    f"unknown key {extra[0]!r}{once}; a case holds {sorted(_CASE_KEYS)}",
                    path,
                    where=f"cases[{n}]",
                )
    flip = _FLIP if system == "LPS" else np.ones(3)
    out: dict[str, Lesions] = {}
    first: dict[str, str] = {}
    for n, case in enumerate(_list(cases, path, "cases")):
        where = wheres[n] if wheres else f"cases[{n}]"
        bk, lk = ("box", "label") if wheres else ("boxes", "labels")  # (as the file names them)
        case = _obj(case, path, where)
        img = case.get("image")
        if not isinstance(img, str) or not img.strip():
            raise ReadError(f"needs an 'image' path (a string), got {img!r}", path, where=where)
        centers, sizes, kinds, labels, ids = [], [], [], [], []
        boxes = _items(case, bk, path, where)
        if len(boxes) == 6 and all(isinstance(x, (int, float)) for x in boxes):
            raise ReadError(
                f"{bk} must be a list of boxes ([[6 numbers], ...]), got one flat list "
                f"{boxes!r:.80}",
                path,
                where=f"{where}.{bk}",
            )
        labs = [0] * len(boxes) if case.get(lk) is None else _items(case, lk, path, where)
        if len(labs) != len(boxes):
            raise ReadError(
                f"{len(boxes)} boxes but {len(labs)} labels ({bk!r}, {lk!r})", path, where=where
            )
        for b, (box, lab) in enumerate(zip(boxes, labs)):
            v = _numbers(box, 6, path, f"{where}.{bk}[{b}]")
            if mode == "cccwhd":
                c, s = v[:3], v[3:]
            else:
                c, s = (v[:3] + v[3:]) / 2, v[3:] - v[:3]
            if np.any(s <= 0):
                raise ReadError(
                    f"box sizes must be > 0, got {s.tolist()}", path, where=f"{where}.{bk}[{b}]"
                )
            _sane(c, s, path, f"{where}.{bk}[{b}]")
            _label(lab, path, f"{where}.{lk}[{b}]")
            centers.append(c * flip)
            sizes.append(s)
            kinds.append("box")
            labels.append(lab)
            ids.append(f"{os.path.basename(path)}:{where}.{bk}[{b}]")
        for p, pt in enumerate(_items(case, "points", path, where)):
            v = _numbers(pt, 4, path, f"{where}.points[{p}]")
            if v[3] <= 0:
                raise ReadError("diameter must be > 0", path, where=f"{where}.points[{p}]")
            _sane(v[:3], v[3], path, f"{where}.points[{p}]")
            centers.append(v[:3] * flip)
            sizes.append([v[3]] * 3)
            kinds.append("point")
            labels.append(0)
            ids.append(f"{os.path.basename(path)}:{where}.points[{p}]")
        key = image_key(img)
        if key in first:
            raise ReadError(
                f"image {img!r} is listed again (first in {first[key]}); list each image once",
                path,
                where=where,
            )
        first[key] = where
        out[key] = Lesions(
            np.array(centers).reshape(-1, 3),
            np.array(sizes).reshape(-1, 3),
            kinds,
            np.array(labels, int),
            ids,
        )
    if image is not None:
        return out.get(image_key(image), Lesions.empty())
    return out


def _converted(doc: dict, path) -> dict:
    """The case of a ``<name>.annotations.json`` that ``medproc convert`` wrote (one image,
    its lesions in world RAS mm) in the 'cases' layout (``coordinate_system`` RAS, ``cccwhd``)."""
    if str(doc.get("coordinate_system", "RAS")).upper() != "RAS" or doc.get("box_mode"):
        raise ReadError("a converted annotations file holds RAS centres and sizes", path)
    boxes, labels, points = [], [], []
    for n, les in enumerate(_list(doc["lesions"], path, "lesions")):
        les = _obj(les, path, f"lesions[{n}]")
        c = _numbers(les.get("center_world_ras"), 3, path, f"lesions[{n}].center_world_ras")
        if les.get("kind") == "point":
            d = _numbers([les.get("diameter_mm")], 1, path, f"lesions[{n}].diameter_mm")
            points.append([*c.tolist(), float(d[0])])
        else:
            size = _numbers(les.get("size_mm"), 3, path, f"lesions[{n}].size_mm")
            boxes.append([*c.tolist(), *size.tolist()])
            labels.append(_label(les.get("label", 0), path, f"lesions[{n}].label"))
    return {"image": doc["image"], "boxes": boxes, "labels": labels, "points": points}


def _label(lab, path, where) -> int:
    """A box's label: an integer that int32 holds."""
    if isinstance(lab, bool) or not isinstance(lab, int) or not -(2**31) <= lab < 2**31:
        raise ReadError(f"a label must be an integer, got {lab!r}", path, where=where)
    return lab


_CASE_KEYS = {"image", "boxes", "labels", "points"}  # an item of medproc's 'cases'


def _text(v, path, where) -> str:
    if not isinstance(v, str):
        raise ReadError(f"must be a string, got {v!r}", path, where=where)
    return v


def _list(v, path, where) -> list:
    if not isinstance(v, list):
        raise ReadError(f"must be a list, got {type(v).__name__} {v!r:.60}", path, where=where)
    return v


#: world coordinates beyond this (mm) or lesion sizes beyond this (mm) are typing errors, not
#: anatomy (a centre 100 m away, a lesion 2 m wide); refused so nothing downstream overflows
_MAX_COORD_MM, _MAX_SIZE_MM = 1e5, 2000.0


def _sane(center, size, path, where) -> None:
    """Refuse a centre or size no scan can hold (see :data:`_MAX_COORD_MM`)."""
    if np.any(np.abs(center) > _MAX_COORD_MM):
        raise ReadError(
            f"coordinates {np.asarray(center).tolist()} lie more than {_MAX_COORD_MM:g} mm "
            "from the origin: not a position in a scan",
            path,
            where=where,
        )
    if np.any(np.asarray(size) > _MAX_SIZE_MM):
        raise ReadError(
            f"size or diameter {np.asarray(size).tolist()} mm is over {_MAX_SIZE_MM:g} mm: not "
            "a lesion",
            path,
            where=where,
        )


def _warn_datalist_system(path: str) -> None:
    """A MONAI datalist does not say in which world its boxes are: RAS is MONAI's default, but
    its LUNA16 datalists hold LPS boxes, and read as RAS every box lands with its x and y negated
    (on background, silently)."""
    warnings.warn(
        f"{path}: a MONAI detection datalist without 'coordinate_system': its boxes are read "
        "as world RAS mm, as MONAI's AffineBoxToImageCoordinated reads them by default. MONAI's "
        "LUNA16 datalists hold LPS boxes (its bundle sets affine_lps_to_ras=true): if these "
        'do, add "coordinate_system": "LPS" at the file\'s top level; "RAS" says they are '
        "RAS and silences this",
        MedprocWarning,
        stacklevel=3,
    )


def _items(case: dict, key: str, path, where) -> list:
    """``case[key]``: a list (absent or null: empty); anything else is an error (0, false,
    "" or {} are not "no lesions")."""
    v = case.get(key)
    return [] if v is None else _list(v, path, f"{where}.{key}")


def _obj(v, path, where) -> dict:
    if not isinstance(v, dict):
        raise ReadError(f"must be an object, got {type(v).__name__} {v!r:.60}", path, where=where)
    return v


def _numbers(v, n, path, where) -> np.ndarray:
    ok = isinstance(v, list) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in v
    )
    try:
        arr = np.array(v, dtype=np.float64) if ok else None
    except OverflowError:  # an integer beyond float range
        arr = None
    if arr is None or arr.shape != (n,) or not np.all(np.isfinite(arr)):
        raise ReadError(f"expected {n} finite numbers, got {v!r:.80}", path, where=where)
    return arr
