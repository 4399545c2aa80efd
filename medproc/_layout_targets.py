"""Where the training layouts are written, and what they never replace: a dataset folder or
datalist medproc did not write, a folder holding the run's inputs or outputs, files a datalist
did not list; the lock a dataset is written under, and what a killed run left beside it."""

from __future__ import annotations

import json
import os
import re
import shutil

from .errors import MedprocError

_DESCRIPTION = "written by medproc from a converted dataset (manifest.csv)"

__all__ = [
    "check_nnunet_target",
    "is_medproc_dataset",
    "is_medproc_datalist",
    "medproc_datalist",
    "within",
    "written_from",
    "check_own_labels",
    "old_channel_name",
    "dataset_lock",
    "drop_leftovers",
]


_NNUNET_NAME = re.compile(r"^(Dataset(\d{3}))_[A-Za-z0-9_\-]+$")  # (prefix, ID)


def check_nnunet_target(target: str) -> None:
    """Raise ValueError for a dataset folder nnU-Net would not find (by its name), and
    FileExistsError for one that exists and that medproc did not write (never replaced)."""
    name = os.path.basename(os.path.abspath(target))
    named = _NNUNET_NAME.match(name)
    if not named:
        raise ValueError(
            f"nnU-Net finds raw datasets by name: {name!r} must look like 'Dataset501_Lungs' "
            "(Dataset + 3 digits + _ + name), inside $nnUNet_raw"
        )
    if os.path.lexists(target) and not is_medproc_dataset(target):
        raise FileExistsError(
            f"{target} exists and is not a dataset medproc wrote: medproc never replaces a folder "
            "it did not write (not even with --force); move it away or choose another name"
        )
    parent = os.path.dirname(os.path.abspath(target))
    same = sorted(  # (nnU-Net refuses a raw folder where two datasets share an ID: it takes
        n  # every folder whose name starts with DatasetNNN, Dataset501_X.bak too)
        for n in (os.listdir(parent) if os.path.isdir(parent) else [])
        if n != name and n.startswith(named[1]) and os.path.isdir(os.path.join(parent, n))
    )
    if same:
        raise FileExistsError(
            f"{os.path.join(parent, same[0])} has the dataset ID {named[2]} of {name}: nnU-Net "
            "refuses two datasets of one ID; choose another ID, or move that dataset away"
        )


def is_medproc_dataset(folder) -> bool:
    """Whether ``folder`` is a training dataset medproc wrote (it holds the source mark)."""
    from .io.walk import SOURCE_MARK

    return os.path.isfile(os.path.join(os.fspath(folder), SOURCE_MARK))


def is_medproc_datalist(path) -> bool:
    """Whether ``path`` is a datalist JSON medproc wrote (its "description" says so)."""
    return medproc_datalist(path) is not None


def medproc_datalist(path) -> dict | None:
    """The datalist at ``path`` if medproc wrote it, else None (not one, or unreadable)."""
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    ours = isinstance(doc, dict) and doc.get("description") == _DESCRIPTION
    # (a datalist has its lists; medproc's nnU-Net dataset.json has the same description)
    return doc if ours and isinstance(doc.get("training"), list) else None


def within(path, folder) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (real paths; either may not exist)."""
    a, b = os.path.realpath(os.fspath(path)), os.path.realpath(os.fspath(folder))
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def written_from(dataset_dir, source) -> bool:
    """Whether ``dataset_dir`` is a dataset medproc wrote from the converted folder ``source``
    (a later run into the same pair rewrites it without ``overwrite``)."""
    from .io.walk import dataset_source

    got = dataset_source(os.fspath(dataset_dir))
    return got is not None and got == os.path.realpath(os.fspath(source))


def check_own_labels(paths: list[str], datalist: str) -> None:
    """Label files the datalist will write may replace only files that datalist (medproc's,
    from an earlier run) lists: never a user's label maps (``--labels`` given as the
    datalist's ``labels/`` folder was rewritten in place)."""
    clash = [p for p in paths if os.path.lexists(p)]
    if not clash:
        return
    mine = set()
    old = medproc_datalist(datalist) or {}  # (an existing one is medproc's: checked before)
    base = os.path.dirname(datalist)
    if old:
        for key in ("training", "validation"):
            for item in old.get(key) or []:
                if isinstance(item, dict) and isinstance(item.get("label"), str):
                    mine.add(os.path.realpath(os.path.join(base, item["label"])))
    foreign = [p for p in clash if os.path.realpath(p) not in mine]
    if foreign:
        raise MedprocError(
            f"would write labels over {len(foreign)} file(s) that no datalist of medproc's "
            f"lists (e.g. {foreign[0]}): medproc never replaces files it did not write; give the "
            "datalist another folder",
            os.path.dirname(foreign[0]),
        )


def old_channel_name(target: str) -> str | None:
    """The channel name of the dataset being replaced (a rerun without ``channel_name`` keeps
    it: a name given once, "MR", was silently turned into a guessed "CT" before)."""
    try:
        with open(os.path.join(target, "dataset.json")) as f:
            name = json.load(f)["channel_names"]["0"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return name if isinstance(name, str) and name else None


def dataset_lock(target: str):
    """A lock on the dataset ``target`` while it is written (``.<name>.lock`` beside it; the
    output folder's lock does not cover a dataset two output folders write with --force)."""
    from ._outdir_lock import OutdirLock

    parent, name = os.path.split(target)
    busy = f"is writing the dataset {name} here; wait for it to finish"
    return OutdirLock(parent, name=f".{name}.lock", busy=busy)


def drop_leftovers(target: str) -> None:
    """Remove the half-built folders a killed run left beside ``target`` (``atomic_dir``'s
    ``.<name>.part-*`` and ``.<name>.old-*``; the caller holds the dataset's lock)."""
    parent, name = os.path.split(target)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for n in names:
        p = os.path.join(parent, n)
        if re.fullmatch(rf"\.{re.escape(name)}\.(part|old)-[A-Za-z0-9_]+", n) and os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
