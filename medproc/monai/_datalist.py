"""The datalist :class:`~medproc.monai.loader.PatchLoader` takes: MONAI's decathlon file or a
list of ``{"image": path, "label": path}`` dicts, checked before any case is read."""

from __future__ import annotations

import os

from ..errors import UsageError

__all__ = ["read_datalist"]


def read_datalist(datalist) -> list[dict]:
    """The cases of ``datalist`` (a decathlon JSON file's "training" list, or a list), each a
    dict whose "image" is a path and whose "label", when present, is a path too. A MONAI
    *detection* datalist holds box labels (a list) under "label": said plainly, with the case,
    instead of failing later in a reader."""
    who = "PatchLoader"
    if isinstance(datalist, (str, os.PathLike)):
        who = f"PatchLoader: {os.fsdecode(datalist)}"
        datalist = _read_decathlon(datalist, who)
    if isinstance(datalist, dict):
        raise UsageError(
            f"PatchLoader: the datalist is a dict (keys {sorted(datalist)[:4]}); give a list of "
            'cases like [{"image": path, "label": path}], or a decathlon JSON file\'s path'
        )
    cases = list(datalist)
    if not cases:  # (it was "0 cases cannot fill 1 shards")
        raise UsageError(f"{who}: the datalist holds no case")
    boxed = [n for n, c in enumerate(cases) if isinstance(c, dict) and "box" in c]
    if boxed and not any("lesions" in cases[n] for n in boxed):
        import warnings

        from ..errors import MedprocWarning

        warnings.warn(
            f"PatchLoader: {len(boxed)} case(s) hold 'box' (a detection datalist's boxes), which "
            "PatchLoader does not read: its patches carry the lesions given under 'lesions' "
            "(medproc Lesions, e.g. from medproc.annotations.read_json)",
            MedprocWarning,
            stacklevel=3,
        )
    for n, case in enumerate(cases):
        if not isinstance(case, dict):
            raise UsageError(
                f"{who}: case {n} is a {type(case).__name__}, not a dict like "
                '{"image": path, "label": path}'
            )
        for key in ("image", "label"):
            v = case.get(key)
            if isinstance(v, (str, os.PathLike)) and not str(os.fspath(v)).strip():
                raise UsageError(f"{who}: case {n}: {key!r} is an empty path")
            if (v is None and key == "label") or isinstance(v, (str, os.PathLike)):
                continue
            what = (
                " (a detection datalist's box labels? PatchLoader samples patches from a label "
                "map: give its path under 'label', and boxes as medproc Lesions under 'lesions', "
                "e.g. from medproc.annotations.read_json)"
                if key == "label" and isinstance(v, list)
                else ""
            )
            raise UsageError(
                f"{who}: case {n} ({case.get('image')!r:.80}): {key!r} must be a file "
                f"path, got {type(v).__name__} {v!r:.60}{what}"
            )
    _check_labels_and_lesions(cases, who)
    return cases


def _read_decathlon(path, who: str) -> list:
    """The "training" list of the decathlon JSON file ``path``, read by MONAI (which resolves
    its paths against the file's folder); a :class:`ReadError` naming the file and what is wrong
    with it (MONAI says "Expecting value: line 1 column 15", or TypeError "Every item in items
    must be a dict", without the file). An empty path in it is refused as written (MONAI makes
    it the file's folder: "holds no DICOM image", later)."""
    import json

    from monai.data import load_decathlon_datalist

    from ..errors import ReadError
    from ..io.safety import check_file

    check_file(path)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        written = doc.get("training") if isinstance(doc, dict) else None
        cases = load_decathlon_datalist(os.fsdecode(path), data_list_key="training")
    except json.JSONDecodeError as e:
        raise ReadError(f"not valid JSON ({e}); fix the file", path) from None
    except UnicodeDecodeError:
        raise ReadError("not a text file: a decathlon datalist (JSON) was expected", path) from None
    except RecursionError:
        raise ReadError("its JSON is nested too deeply to be read: not a datalist", path) from None
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ReadError(
            f"not a decathlon datalist: MONAI's load_decathlon_datalist says {e} (it needs "
            '{"training": [{"image": path, "label": path}, ...]})',
            path,
        ) from None
    for n, case in enumerate(written):
        for key in ("image", "label"):
            if isinstance(case.get(key), str) and not case[key].strip():
                raise UsageError(f"{who}: case {n}: {key!r} is an empty path")
    return cases


def _check_labels_and_lesions(cases: list[dict], who: str) -> None:
    """A case without "label" but with a key like it (``lable``, ``seg``, ``mask``) is an
    error: its patches would get empty labels without a word; some cases without a label
    among labelled ones are said; "lesions" must hold medproc Lesions."""
    import difflib
    import warnings

    from ..annotations import Lesions
    from ..errors import MedprocWarning

    bare = []
    for n, case in enumerate(cases):
        les = case.get("lesions")
        if les is not None and not isinstance(les, Lesions):
            raise UsageError(
                f"{who}: case {n}: lesions must be a medproc.annotations.Lesions (e.g. "
                f"from medproc.annotations.read_json), got {type(les).__name__}"
            )
        if case.get("label") is not None:
            continue
        bare.append(n)
        keys = [str(k) for k in case if k != "label"]  # ("label": None is no label at all)
        near = [k for k in keys if k in ("seg", "mask", "segmentation", "labels", "labelmap")]
        near = near or difflib.get_close_matches("label", keys, 1, 0.7)
        if near:
            raise UsageError(
                f"{who}: case {n} has no 'label' but has {near[0]!r}: the label map is read "
                "from 'label' only (its patches would get empty labels); rename the key"
            )
    if bare and len(bare) < len(cases):
        warnings.warn(
            f"{who}: {len(bare)} of {len(cases)} cases have no 'label' (e.g. case "
            f"{bare[0]}): their patches get empty labels",
            MedprocWarning,
            stacklevel=4,
        )
