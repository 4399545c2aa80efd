"""Checks of the cases found, that say what would otherwise pass unsaid (:mod:`medproc.cases`):
labels paired by file name that fit two images or none, lesion-table keys that match no case,
images in a folder named like label maps; and an output folder that is also an input folder."""

from __future__ import annotations

import os
import warnings

from .errors import MedprocWarning

__all__ = ["check_label_pairs", "warn_unmatched", "warn_label_like", "check_not_an_input"]


def _same_dir(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


def check_label_pairs(cases: list, labels_dir: str) -> None:
    """Labels paired by file name: one label file named like two images fits neither for sure
    (both cases fail, saying so); a labels folder that gave no case a label is said."""
    by_label: dict[str, list] = {}
    for c in cases:
        if c.label and not c.error and _same_dir(os.path.dirname(c.label), labels_dir):
            by_label.setdefault(c.label, []).append(c)
    for lab, group in by_label.items():
        if len(group) > 1:
            names = ", ".join(c.source for c in group)
            for c in group:
                c.error = (
                    f"the label {lab} is named like {len(group)} images ({names}): which one it "
                    "belongs to is ambiguous; pair them in a case list (CSV: image,label)"
                )
    images = [c for c in cases if not c.error and not c.series]
    if images and not any(c.label for c in cases):
        warnings.warn(
            f"--labels {labels_dir}: no label file is named like any of the {len(images)} "
            "image(s); the cases are converted without labels",
            MedprocWarning,
            stacklevel=3,
        )


def warn_unmatched(cases: list, table: dict | None) -> None:
    """Say which keys of a lesion table match no case (their lesions are not used)."""
    if not table:
        return
    used = {c.dicom.uid for c in cases if c.dicom is not None}
    used |= {c.fields.get(k) for c in cases for k in ("stem", "name")}
    left = sorted(str(k) for k in table if k not in used)
    if left:
        lower = {str(k).lower(): str(k) for k in used if k}
        near = [f"{k!r} ~ {lower[k.lower()]!r}" for k in left if k.lower() in lower]
        hint = (
            f" ({len(near)} differ{'s' if len(near) == 1 else ''} from a case's name only in "
            "upper/lower case: "
            f"{', '.join(near[:3])}{', ...' if len(near) > 3 else ''}; keys are matched exactly: "
            "rename them in the file)"
            if near
            else ""
        )
        warnings.warn(
            f"--annotations: {len(left)} image key(s) of the lesion file match no case, their "
            f"lesions are not used: {', '.join(left[:5])}{', ...' if len(left) > 5 else ''}"
            f"{hint}",
            MedprocWarning,
            stacklevel=2,
        )


#: folder names that hold label maps in the layouts users copy (nnU-Net, the decathlon, ...)
_LABEL_FOLDERS = {"labels", "labelstr", "labelsts", "label", "masks", "mask", "segmentations"}


def warn_label_like(cases: list) -> None:
    """Say when images to convert lie in a folder named like label maps (``labels``,
    ``labelsTr``, ``masks``...): given as an input, a label map is resampled as an image (linear
    interpolation) unless its folder is given with --labels."""
    odd = [
        c.source
        for c in cases
        if not c.error and not c.series
        and os.path.basename(os.path.dirname(os.path.abspath(c.source))).lower() in _LABEL_FOLDERS
    ]  # fmt: skip
    if odd:
        warnings.warn(
            f"{len(odd)} image(s) to convert lie in a folder named like label maps "
            f"({', '.join(odd[:3])}{', ...' if len(odd) > 3 else ''}): they are converted as "
            "images (linear interpolation); if they are labels, give their folder with --labels "
            "and only the images' folder as the input",
            MedprocWarning,
            stacklevel=2,
        )


def check_not_an_input(inputs: list[str], outdir: str, labels_dir: str | None = None) -> None:
    """A :class:`UsageError` when the output folder is one of the input folders or the labels
    folder (its files would be no input, and its outputs would land among the inputs)."""
    from .errors import UsageError
    from .io.walk import file_identity

    if not os.path.isdir(outdir):
        return
    here = file_identity(outdir)
    for p in inputs:
        if os.path.isdir(p) and file_identity(p) == here:
            raise UsageError(
                f"the input folder {p} is also the output folder (-o): medproc never reads its "
                "output folder as an input; give another -o (e.g. a new folder beside it)"
            )
    if labels_dir and os.path.isdir(labels_dir) and file_identity(labels_dir) == here:
        raise UsageError(  # (outputs, sidecars and manifest.csv were written among the labels)
            f"the labels folder {labels_dir} (--labels) is also the output folder (-o): medproc "
            "never writes among its inputs; give another -o (e.g. a new folder beside it)"
        )


def say_if_locked(outdir: str) -> None:
    """For ``--dry-run`` (which does not take the lock): say when another run holds the output
    folder's lock now, since the real run would be refused while it does."""
    from ._outdir_lock import lock_holder

    pid = lock_holder(outdir)
    if pid is not None:
        warnings.warn(
            f"another medproc convert (pid {pid}) is writing into {outdir} now: a run would be "
            "refused until it ends; this list shows what that run has done so far",
            MedprocWarning,
            stacklevel=2,
        )
