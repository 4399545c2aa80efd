"""``medproc convert --layout nnunet|monai``: the training layouts written after a conversion
(from OUTDIR/manifest.csv, see :mod:`medproc.layouts`), their targets checked before any work.
"""

from __future__ import annotations

import json
import os
import sys

__all__ = ["check_layouts", "check_cases", "write_layouts"]


def check_layouts(a) -> dict:
    """Targets of --layout, checked before any work: {kind: path}."""
    import warnings

    from .errors import MedprocWarning, UsageError

    if not a.layout:
        for flag, v, layout in (
            ("--dataset", a.dataset, "nnunet|monai"),
            ("--channel-name", a.channel_name, "nnunet"),
            ("--validation", a.validation, "monai"),
        ):
            if v:
                raise UsageError(f"{flag} goes with --layout {layout}")
        return {}
    kinds = list(dict.fromkeys(a.layout))
    out = {}
    if "nnunet" in kinds:
        if not a.dataset:
            raise UsageError(
                "--layout nnunet needs --dataset $nnUNet_raw/DatasetNNN_Name (e.g. "
                "/data/nnUNet_raw/Dataset501_Lungs)"
            )
        from ._layout_targets import check_nnunet_target, written_from

        _apart(a, a.dataset, "--dataset")
        try:
            check_nnunet_target(a.dataset)
        except ValueError as e:
            raise UsageError(f"--dataset {a.dataset}: {e}") from None
        except FileExistsError as e:
            raise UsageError(f"--dataset {e}") from None
        if os.path.exists(a.dataset) and not a.force and not written_from(a.dataset, a.outdir):
            raise UsageError(
                f"--dataset {a.dataset} exists and was written from another output folder; add "
                "--force to replace it (which also converts every case again)"
            )
        if a.format != "nii.gz":
            raise UsageError("--layout nnunet needs .nii.gz images: use --format nii.gz")
        if a.clip or a.scale or a.zscore or a.percentiles:
            warnings.warn(
                "--layout nnunet with --clip/--percentiles/--scale/--zscore: nnU-Net normalises "
                "intensities itself (channel 'CT' from the dataset's HU statistics); converting "
                "without them is usually what it wants",
                MedprocWarning,
                stacklevel=2,
            )
        out["nnunet"] = a.dataset
    if "monai" in kinds:
        path = a.dataset if a.dataset and "nnunet" not in kinds else None
        if path is None or os.path.isdir(path):
            path = os.path.join(path or a.outdir, "datalist.json")
        out["monai"] = _check_datalist_path(a, path)
    elif a.validation:
        raise UsageError("--validation goes with --layout monai (nnU-Net makes its own splits)")
    return out


def _apart(a, target: str, flag: str, holds: bool = True) -> None:
    """A dataset folder (``holds``: also a folder whose files are replaced) must not hold the
    inputs, the label maps or the output folder (replacing it would delete them), nor lie
    inside an input folder unless it is inside the output folder, which no run reads (a later
    run would read its files as inputs)."""
    from ._layout_targets import within
    from .errors import UsageError

    theirs = [("input", p) for p in a.inputs] + [("--labels folder", a.labels)] * bool(a.labels)
    theirs += [("--annotations file", a.annotations)] * bool(getattr(a, "annotations", None))
    for what, p in [*theirs, ("output folder (-o)", a.outdir)] if holds else ():
        if within(p, target):
            raise UsageError(f"{flag} {target} holds the {what} {p}: choose a folder apart")
    for what, p in theirs:
        if os.path.isdir(p) and within(target, p) and not within(target, a.outdir):
            raise UsageError(f"{flag} {target} lies inside the {what} {p}: choose a folder apart")


def _check_datalist_path(a, path: str) -> str:
    """The MONAI datalist's path, checked: a .json file that is not someone else's, written
    with its relabelled maps (``labels/`` beside it) apart from the inputs."""
    from ._layout_targets import is_medproc_datalist
    from .errors import UsageError

    if not path.endswith(".json"):
        raise UsageError(f"--layout monai: the datalist {path} must be a .json file (or a folder)")
    if os.path.lexists(path) and not is_medproc_datalist(path):
        raise UsageError(
            f"--layout monai: {path} exists and is not a datalist medproc wrote: medproc never "
            "replaces a file it did not write; move it away or give --dataset another path"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--layout monai: cannot write {path} (the folder is read-only)")
    _apart(a, os.path.join(parent, "labels"), "--layout monai: its labels folder")
    _apart(a, parent, "--layout monai: the datalist's folder", holds=False)
    return path


def _cases_apart(batch, targets: dict) -> None:
    """The layouts' folders hold none of the files this run reads: a case list (CSV) can name
    inputs anywhere, which the check of the inputs before the scan did not see."""
    from ._layout_targets import within
    from .errors import MedprocError, UsageError

    folders = [("--dataset", targets["nnunet"])] if "nnunet" in targets else []
    if "monai" in targets:
        from ._layout_targets import check_own_labels

        labels = os.path.join(os.path.dirname(os.path.abspath(targets["monai"])), "labels")
        folders.append(("--layout monai: its labels folder", labels))
        # labels made from SEG/RTSTRUCT always go there, to any series' case (whether a label
        # map is renumbered is known once converted: the layout step checks those)
        if batch.annotations:
            names = {t.row["case"] for t in batch.todo} | {r["case"] for r in batch.decided}
            try:  # (where its relabelled maps would go: over no file of someone else's)
                paths = [os.path.join(labels, f"{n}.nii.gz") for n in names]
                check_own_labels(paths, targets["monai"])
            except MedprocError as e:
                raise UsageError(f"--layout monai: {e}") from None
        # the datalist as one of this run's own outputs (a case's sidecar)
        own = {os.path.abspath(p): t for t in batch.todo for p in t.outputs}
        t = own.get(os.path.abspath(targets["monai"]))
        if t is not None:
            raise UsageError(
                f"--layout monai: the datalist {targets['monai']} is a file case "
                f"{t.row['case']} writes: give --dataset another name"
            )
    for t in batch.todo:
        for p in (t.case.source, t.case.label):
            for flag, folder in folders:
                if p and within(p, folder):
                    raise UsageError(
                        f"{flag} {folder} holds {p}, which case {t.row['case']} reads: choose a "
                        "folder apart"
                    )


def check_cases(a, batch, targets: dict | None = None) -> None:
    """What --layout needs of the cases, checked once they are known (before any conversion):
    a --validation name that is no case, nnU-Net without any label (a label map, a DICOM
    SEG or RTSTRUCT), or a layout folder holding a file a case reads (``targets``: a case list
    can name inputs anywhere), is a usage error."""
    from .errors import UsageError
    from .layouts import check_validation
    from .manifest import is_finished

    rows = batch.kept + batch.decided + [t.row for t in batch.todo]
    if "nnunet" in (a.layout or ()) and not batch.annotations:
        usable = [t.row for t in batch.todo] + [r for r in rows if is_finished(r)]
        if not any(r.get("label_output") for r in usable):
            from ._layout_labels import unreadable_dicom_labels

            bad = unreadable_dicom_labels(rows)
            if bad:
                raise UsageError(
                    "--layout nnunet: no case has a label: the DICOM SEG/RTSTRUCT file(s) among "
                    "the inputs cannot be read: " + "; ".join(bad)
                )
            raise UsageError(
                "--layout nnunet: no case has a label (nnU-Net trains on labelled cases): give "
                "--labels FOLDER (label maps named as their images), or DICOM SEG/RTSTRUCT "
                "files among the inputs"
            )
    _cases_apart(batch, targets or {})
    cases = {r["case"] for r in rows}
    try:  # this run's cases and the earlier runs' the output folder holds: the datalist's
        check_validation(a.validation or (), cases)
    except ValueError as e:
        raise UsageError(f"--validation: {e}") from None


def write_layouts(a, targets: dict, batch, con) -> int:
    """Write the layouts of ``targets`` from the finished conversion; 0, or 1 (said why)."""
    from .errors import MedprocError
    from .layouts import (
        find_dicom_labels,
        gather_layout_labels,
        write_monai_datalist,
        write_nnunet,
        written_from,
    )

    found = [p for p, _ in batch.annotations]
    failed: list[str] = []  # cases left out of the layouts: their labels cannot be used
    try:
        labels = find_dicom_labels(found) if found else None
        gathered = gather_layout_labels(a.outdir, labels, device=a.device, failed=failed)
        if "nnunet" in targets:
            d = write_nnunet(
                a.outdir,
                targets["nnunet"],
                labels=labels,
                channel_name=a.channel_name,
                overwrite=a.force or written_from(targets["nnunet"], a.outdir),
                device=a.device,
                gathered=gathered,
            )
            n = len(os.listdir(os.path.join(d, "imagesTr")))
            m = len(os.listdir(os.path.join(d, "imagesTs")))
            con.print(
                f"nnU-Net dataset: {d} ({n} training case(s), {m} test case(s))", soft_wrap=True
            )
        if "monai" in targets:
            p = write_monai_datalist(
                a.outdir,
                targets["monai"],
                labels=labels,
                validation=a.validation or (),
                device=a.device,
                gathered=gathered,
            )
            with open(p) as f:
                doc = json.load(f)
            n = {k: len(doc[k]) for k in ("training", "validation", "test")}
            con.print(
                f"MONAI datalist: {p} ({n['training']} training and {n['validation']} validation "
                f"case(s); {n['test']} test case(s), those without a label)",
                soft_wrap=True,
            )
    except (MedprocError, ValueError, OSError) as e:
        print(f"medproc convert: error: --layout: {e}", file=sys.stderr)
        return 1
    finally:
        for text in failed:  # (the layouts were written without them, if at all)
            print(f"medproc convert: error: --layout: left out {text}", file=sys.stderr)
    return 1 if failed else 0
