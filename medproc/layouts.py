"""Datasets that training tools read directly, made from a finished ``medproc convert``.

- :func:`write_nnunet`: an nnU-Net v2 raw dataset (``imagesTr/<case>_0000.nii.gz``,
  ``labelsTr/<case>.nii.gz``, ``imagesTs/`` for cases without a label, ``dataset.json``).
- :func:`write_monai_datalist`: a decathlon datalist JSON (``{"training": [{"image", "label"}]}``)
  that ``monai.data.load_decathlon_datalist`` reads; paths are relative to the JSON file.

Both read the conversion's ``manifest.csv`` (cases with status ok or skipped). Labels are the
manifest's label outputs, or ``labels=``: label maps, DICOM SEG or RTSTRUCT files per case (see
:func:`find_dicom_labels`) put on the output grid by nearest neighbour through the engine
(:func:`label_on_grid`). Classes become 1..N without gaps (as nnU-Net requires); SEG segments
and RTSTRUCT ROIs are matched across cases by name. A dataset folder is built beside its target
and renamed into place; images are hard links to the outputs (copies across file systems): no
space used, and a later ``convert --force`` (which writes new files) never changes them.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections import Counter

import numpy as np

from ._layout_labels import find_dicom_labels, gather_labels, label_on_grid
from ._layout_targets import (
    _DESCRIPTION,
    check_nnunet_target,
    check_own_labels,
    dataset_lock,
    drop_leftovers,
    is_medproc_datalist,
    old_channel_name,
    within,
    written_from,
)
from .cases import safe_name
from .errors import MedprocError, MedprocWarning
from .io.atomic import atomic_dir
from .manifest import is_finished, manifest_rows
from .volume import Volume

__all__ = [
    "write_nnunet",
    "write_monai_datalist",
    "gather_layout_labels",
    "find_dicom_labels",
    "label_on_grid",
]


def _manifest_rows(source) -> list[dict]:
    """Manifest rows, from an output folder, a manifest.csv (parsed strictly:
    :func:`medproc.manifest.manifest_rows`), or rows."""
    if not isinstance(source, (str, os.PathLike)):
        return [dict(r) for r in source]
    path = os.fspath(source)
    path = os.path.join(path, "manifest.csv") if os.path.isdir(path) else path
    if not os.path.exists(path):
        raise MedprocError("no manifest.csv there; run medproc convert first", path)
    return manifest_rows(path)


def gather_layout_labels(source, labels=None, label_names=None, device="cpu", failed=None):
    """The finished cases of ``source`` with their labels on the output grid, and the classes:
    what both writers need (``gathered=``), read once."""
    return gather_labels(_finished_rows(source), labels, label_names, device, failed)


def _finished_rows(source, rows=None) -> list[dict]:
    """Manifest rows whose case finished (status ok or skipped) and whose output exists (a
    missing one is said); a case name that is no file name medproc writes (a path, empty, or
    twice: an edited manifest) is an error, as a layout file is named after it."""
    rows = _manifest_rows(source) if rows is None else rows
    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "the rows given"
    names = Counter(r.get("case") or "" for r in rows)
    for name, n in names.items():
        if not name or safe_name(name) != name or n > 1:
            why = "repeated" if n > 1 and name else "not a file name medproc writes (a path?)"
            raise MedprocError(
                f"case name {name!r}: {why}; was the manifest edited? Convert again to rewrite it",
                where,
            )
    done = []
    for r in filter(is_finished, rows):
        if not os.path.isfile(r.get("output") or ""):
            _say(f"case {r['case']}: its output {r.get('output')!r} is missing: left out")
            continue
        if r.get("label_output") and not os.path.isfile(r["label_output"]):
            # (not demoted to an unlabelled case: it would enter the test set unsaid)
            _say(f"case {r['case']}: its label {r['label_output']} is missing: left out")
            continue
        done.append(r)
    if not done:
        raise MedprocError("no finished case in the manifest (status ok or skipped)", where)
    # in a manifest an output is one case's (two rows of one: trained on twice); rows given
    # may pair one image with two raters' labels
    owner: dict = {}
    for r in done if isinstance(source, (str, os.PathLike)) else []:
        first = owner.setdefault(os.path.realpath(r["output"]), r["case"])
        if first != r["case"]:
            raise MedprocError(
                f"cases {first!r} and {r['case']!r} both name {r['output']} as their output; "
                "was the manifest edited? Convert again to rewrite it",
                where,
            )
    return sorted(done, key=lambda r: r["case"])


def _say(text: str) -> None:
    warnings.warn(text, MedprocWarning, stacklevel=3)


def _place(src: str, dst: str, link: str) -> None:
    """Hard-link ``src`` at ``dst`` ("auto": a copy where linking fails), or copy it."""
    if link != "copy":
        try:
            return os.link(src, dst)
        except OSError:
            if link == "hard":
                raise
    shutil.copy2(src, dst)


def _write_label(vol: Volume, key: dict, index: dict, link: str | None, dst: str, how: str):
    """The label, renumbered to the class indices (linked as is when nothing changes)."""
    from .io import save

    pairs = {v: index[k] for v, k in key.items()}
    if link is not None and all(v == n for v, n in pairs.items()):
        return _place(link, dst, how)
    lut = np.zeros(max([0, *pairs]) + 1, np.uint8 if len(index) < 255 else np.uint16)
    lut[list(pairs)] = list(pairs.values())
    arr = np.clip(np.asarray(vol.array).astype(np.int64), 0, len(lut) - 1)
    save(Volume(lut[arr], vol.affine), dst)


def check_validation(validation, cases) -> None:
    """Raise ValueError if a name in ``validation`` is not among ``cases`` (the case names a
    datalist could hold), TypeError if it is one string instead of a list of names."""
    if isinstance(validation, (str, bytes)):
        raise TypeError(f"validation: a list of case names, not one string ({validation!r})")
    unknown = sorted(set(validation) - set(cases))
    if unknown:
        some = ", ".join(sorted(cases)[:10]) + (", ..." if len(cases) > 10 else "")
        raise ValueError(f"validation case(s) {', '.join(unknown)}: no such case (cases: {some})")


def _swap_in(tmp: str, target: str) -> None:
    """Rename the finished folder ``tmp`` to ``target``; an older one is moved aside first and
    removed once the new one is in place. What a user added at the top of the older one (notes,
    a folder of predictions) is moved into the new one, said in a warning: a rerun removed it."""
    from .io.walk import SOURCE_MARK

    old = atomic_dir(target, "old")
    if os.path.exists(target):
        owned = {"imagesTr", "labelsTr", "imagesTs", "dataset.json", SOURCE_MARK}
        kept = sorted(set(os.listdir(target)) - owned - set(os.listdir(tmp)))
        for name in kept:
            os.replace(os.path.join(target, name), os.path.join(tmp, name))
        if kept:
            import warnings

            from .errors import MedprocWarning

            warnings.warn(
                f"{target}: kept {len(kept)} entry(ies) medproc did not write ("
                f"{', '.join(kept[:4])}{', ...' if len(kept) > 4 else ''}) in the rewritten "
                "dataset",
                MedprocWarning,
                stacklevel=3,
            )
        os.replace(target, os.path.join(old, "d"))
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _channel_name(path: str) -> str:
    """'CT' for HU data (nnU-Net's CT normalisation), else 'zscore' (per-image z-score)."""
    from .io import load

    s = np.asarray(load(path).array)[::4, ::4, ::4]
    return "CT" if s.min() < -500 and s.max() > 200 else "zscore"


def write_nnunet(
    source,
    dataset_dir,
    *,
    labels: dict | None = None,
    channel_name: str | None = None,
    label_names: dict | None = None,
    link: str = "auto",
    overwrite: bool = False,
    device: str = "cpu",
    failed: list | None = None,
    gathered: tuple | None = None,
) -> str:
    """Write an nnU-Net v2 raw dataset from a finished conversion.

    Parameters
    ----------
    source : str or list of dict
        The conversion's output folder (or its ``manifest.csv``, or manifest rows). Cases that
        finished (status ok or skipped) are used; outputs must be ``.nii.gz``.
    dataset_dir : str
        ``$nnUNet_raw/DatasetNNN_Name`` (nnU-Net finds datasets by this name).
    labels : dict, optional
        Case name or SeriesInstanceUID -> a label map, DICOM SEG or RTSTRUCT file (e.g. from
        :func:`find_dicom_labels`); otherwise the manifest's label outputs.
    channel_name : str, optional
        ``channel_names["0"]``; nnU-Net picks the normalisation from it. Default: the dataset's
        own when it replaces one, else "CT" when the first image holds HU, else "zscore".
    label_names : dict, optional
        Label-map value -> class name (SEG segments and RTSTRUCT ROIs bring their own names;
        classes are matched across cases by name, else by value, named "label_<v>").
    link : {"auto", "hard", "copy"}
        Hard links to the outputs (auto: copies where linking fails, e.g. across disks).
    overwrite : bool
        Replace an existing dataset folder (otherwise refuse; :func:`written_from` says
        whether medproc wrote it from this ``source``). Entries at its top other than
        ``imagesTr``, ``labelsTr``, ``imagesTs`` and ``dataset.json`` (what a user added) are
        moved into the new one, with a warning.
    device : {"cpu", "gpu"}
        Engine device for putting SEG/RTSTRUCT labels on the output grid.
    failed : list, optional
        Given, a case whose label cannot be used (unreadable, empty, negative values) is left
        out of the dataset and its error added to this list; otherwise it raises.
    gathered : tuple, optional
        :func:`gather_layout_labels` of the same source and labels, computed once by a caller
        writing both layouts (the labels are read and put on the output grid once).

    Returns
    -------
    str
        ``dataset_dir``: labelled cases in imagesTr/labelsTr (``numTraining``), others in imagesTs.
    """
    if link not in ("auto", "hard", "copy"):
        raise ValueError(f"link must be 'auto', 'hard' or 'copy', got {link!r}")
    target = os.path.abspath(os.fspath(dataset_dir))
    check_nnunet_target(target)
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--force) to replace it")
    if isinstance(source, (str, os.PathLike)) and within(source, target):
        raise ValueError(f"the converted folder {source} lies inside the dataset folder {target}")
    rows = _finished_rows(source)
    for r in rows:
        if not r["output"].endswith(".nii.gz"):
            raise MedprocError(
                "nnU-Net needs .nii.gz images: convert with --format nii.gz", r["output"]
            )
    cases, index = gathered or gather_labels(rows, labels, label_names, device, failed)
    if written_from(target, source):  # (a name given once, "MR", is kept; a guess is not)
        channel_name = channel_name or old_channel_name(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    lock = dataset_lock(target)  # (another run writing it: refused, and its leftovers kept)
    drop_leftovers(target)
    tmp = atomic_dir(target)
    try:
        for sub in ("imagesTr", "labelsTr", "imagesTs"):
            os.makedirs(os.path.join(tmp, sub))
        for r, vol, lk, key in cases:
            name = f"{r['case']}_0000.nii.gz"
            split = "imagesTs" if vol is None else "imagesTr"
            _place(r["output"], os.path.join(tmp, split, name), link)
            if vol is not None:
                dst = os.path.join(tmp, "labelsTr", f"{r['case']}.nii.gz")
                _write_label(vol, key, index, lk, dst, link)
        n_train = sum(vol is not None for _, vol, _, _ in cases)
        if n_train == 0:
            raise MedprocError("no case has a label: nnU-Net needs labelled training cases")
        classes = {(k if isinstance(k, str) else f"label_{k}"): n for k, n in index.items()}
        if len(classes) != len(index) or "background" in classes:
            raise MedprocError(f"label names must be unique, not 'background': {list(index)}")
        doc = {
            "channel_names": {"0": channel_name or _channel_name(rows[0]["output"])},
            "labels": {"background": 0, **classes},
            "numTraining": n_train,
            "file_ending": ".nii.gz",
            "name": os.path.basename(target).split("_", 1)[1],
            "description": _DESCRIPTION,
        }
        with open(os.path.join(tmp, "dataset.json"), "w") as f:
            json.dump(doc, f, indent=1)
        from .io.walk import SOURCE_MARK  # (nnU-Net reads no dotfile)

        with open(os.path.join(tmp, SOURCE_MARK), "w") as f:  # (rows: no folder to name)
            named = isinstance(source, (str, os.PathLike))
            f.write(os.path.realpath(os.fspath(source)) + "\n" if named else "")
        _swap_in(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        lock.release()
    return target


def write_monai_datalist(
    source,
    path,
    *,
    labels: dict | None = None,
    label_names: dict | None = None,
    validation=(),
    labels_dir: str | None = None,
    device: str = "cpu",
    failed: list | None = None,
    gathered: tuple | None = None,
) -> str:
    """Write a MONAI decathlon datalist JSON for a finished conversion, atomically.

    ``{"training": [{"image": ..., "label": ...}], "validation": [...], "test": [{"image"}]}``
    (each list always there, maybe empty) with paths relative to the JSON's folder
    (``load_decathlon_datalist`` resolves them there), and the decathlon's properties ("labels",
    "name", "description", "tensorImageSize", "numTraining", "numValidation", "numTest": each
    the length of its list). Cases named in
    ``validation`` go to "validation" (a name that is no case of the manifest is an error; one
    whose case failed is left out, with a warning), cases without a label to "test".
    ``labels`` and ``label_names`` as in :func:`write_nnunet`; labels made from DICOM SEG or
    RTSTRUCT (or renumbered) are written to ``labels_dir`` (default: ``labels/`` beside the
    JSON); "labels" names the classes (as the decathlon's dataset.json); ``failed`` and
    ``gathered`` as in :func:`write_nnunet`. Returns ``path``.
    """
    from .io import atomic_write

    path = os.path.abspath(os.fspath(path))
    base = os.path.dirname(path)
    if os.path.lexists(path) and not is_medproc_datalist(path):
        raise FileExistsError(
            f"{path} exists and is not a datalist medproc wrote: medproc never replaces a file "
            "it did not write; move it away or choose another path"
        )
    every = _manifest_rows(source)
    check_validation(validation, {r["case"] for r in every})
    rows = _finished_rows(source, every)
    unconverted = sorted(set(validation) - {r["case"] for r in rows})
    if unconverted:  # in the manifest, not converted: the list is written without them
        warnings.warn(
            f"validation case(s) {', '.join(unconverted)} did not convert (see manifest.csv): "
            "left out of the datalist",
            MedprocWarning,
            stacklevel=2,
        )
    cases, index = gathered or gather_labels(rows, labels, label_names, device, failed)
    labels_dir = labels_dir or os.path.join(base, "labels")
    doc: dict = {"training": [], "validation": [], "test": []}
    made = []  # (vol, key, dst): labels renumbered or from DICOM, written beside the list
    for r, vol, lk, key in cases:
        item = {"image": os.path.relpath(r["output"], base)}
        if vol is None:
            if r["case"] in set(validation):
                warnings.warn(
                    f"validation case {r['case']} has no label: listed under 'test'",
                    MedprocWarning,
                    stacklevel=2,
                )
            doc["test"].append(item)
            continue
        dst = lk if lk and all(v == index[k] for v, k in key.items()) else None
        if dst is None:
            dst = os.path.join(labels_dir, f"{r['case']}.nii.gz")
            made.append((vol, key, dst))
        item["label"] = os.path.relpath(dst, base)
        doc["validation" if r["case"] in set(validation) else "training"].append(item)
    check_own_labels([d for _, _, d in made], path)
    for vol, key, dst in made:  # (save is atomic)
        _write_label(vol, key, index, None, dst, "copy")
    doc["labels"] = {"0": "background"} | {
        str(n): (k if isinstance(k, str) else f"label_{k}") for k, n in index.items()
    }
    doc |= {  # the decathlon's properties (load_decathlon_properties)
        "name": os.path.basename(base),
        "description": _DESCRIPTION,
        "tensorImageSize": "3D",
        "numTraining": len(doc["training"]),  # (each count is its list's length)
        "numValidation": len(doc["validation"]),
        "numTest": len(doc["test"]),
    }
    with atomic_write(path) as t, open(t, "w") as f:
        json.dump(doc, f, indent=1)
    return path
