"""Finding the cases of a batch: DICOM series and image files under folders, files, or CSV
case lists, with their labels and the fields of the output naming template.

Nothing the user named is dropped silently: an input path that does not exist stops the run
before it starts (:class:`~medproc.errors.UsageError`); an input (file, folder, case-list row)
that yields no volume becomes a case with an ``error`` (a failed manifest row). Every file is a
case once (inputs are compared by real path; identical DICOM copies are read once), and folders
holding ``medproc convert`` outputs, or the output folder itself, are never taken as inputs.
DICOM SEG and RTSTRUCT files are annotations, not images: they are listed as skipped with a
reason starting ``annotation:`` (``medproc convert --layout`` uses them as labels).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

from ._case_checks import check_label_pairs
from .errors import ReadError, UsageError
from .io import IMAGE_EXT as _IMAGE_EXT
from .io import stem as _stem
from .io.names import format_name
from .io.safety import is_within
from .io.tables import read_csv_rows

__all__ = [
    "Case",
    "find_cases",
    "read_annotation_table",
    "safe_name",
    "check_template",
    "check_inputs",
    "is_annotation",
    "DEFAULT_NAME",
    "NAME_FIELDS",
]

#: default output name: no patient identifiers (file stem, or a hash of the series UID)
DEFAULT_NAME = "{name}"
#: the fields of the output naming template, and what each holds
NAME_FIELDS = {
    "name": "file stem, or series-<uid_hash> for DICOM (no patient identifiers)",
    "stem": "file name without its extension (a DICOM series: its folder's name)",
    "folder": "name of the folder holding the series or file",
    "uid_hash": "12 hex digits of the SeriesInstanceUID's SHA-1 (of the path for files)",
    "series_number": "DICOM SeriesNumber (0 when absent)",
    "description": "DICOM SeriesDescription, sanitised ('' when absent)",
    "modality": "DICOM Modality ('' for files)",
}
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f/\\]")  # (C0, DEL and C1 controls, separators)
_DESCRIPTION_KEEP = re.compile(r"[^\w.+-]+")
_ANNOTATION = "annotation: "


def check_template(template: str) -> None:
    """Raise :class:`~medproc.errors.UsageError` when a naming template uses an unknown field
    or is malformed (before any work, with the list of fields).

    >>> check_template("{folder}_{series_number}")
    """
    Case("x", fields={k: "x" for k in NAME_FIELDS}).name(template)


def is_annotation(reason: str) -> bool:
    """Whether a skipped file's reason says it is an annotation (DICOM SEG or RTSTRUCT)."""
    return reason.startswith(_ANNOTATION)


def _description(text) -> str:
    """A SeriesDescription usable in a file name: runs of other characters become ``_``.

    >>> _description("CT Chest  w/o contrast (1.5mm)")
    'CT_Chest_w_o_contrast_1.5mm'
    """
    return _DESCRIPTION_KEEP.sub("_", str(text or "")).strip("_.")


def safe_name(name: str) -> str:
    """``name`` usable as one file name inside the output folder: no path separators or
    control characters, no leading dot (so never ``..`` or hidden), at most ~200 bytes.

    >>> safe_name("../../etc/passwd"), safe_name(".hidden"), safe_name("a/b")
    ('_.._etc_passwd', 'hidden', 'a_b')
    """
    out = _UNSAFE.sub("_", str(name)).strip().lstrip(".").strip()
    # bytes that are not UTF-8 (surrogates in Python): "_", so names are UTF-8 everywhere
    out = "".join("_" if "\udc80" <= ch <= "\udcff" else ch for ch in out)
    if not out:
        out = "case"
    if len(out.encode("utf-8", "replace")) > 200:
        digest = hashlib.sha1(out.encode("utf-8", "replace")).hexdigest()[:10]
        out = out.encode("utf-8", "replace")[:180].decode("utf-8", "ignore") + "-" + digest
    return out


@dataclass
class Case:
    """One input volume to convert (a DICOM series or an image file) and its optional label.

    ``error`` is set for an input that yields no volume: it is recorded as a failed case."""

    source: str
    series: str | None = None  # DICOM series key when source is a folder
    label: str | None = None
    fields: dict = field(default_factory=dict)  # naming template fields
    dicom: object | None = None  # the scanned DicomSeries: workers read it without a re-scan
    error: str = ""

    def name(self, template: str) -> str:
        """The output name from a naming template such as ``"{name}"`` or ``"{modality}_{stem}"``
        (plain ``{field}``s only, see :mod:`medproc.io.names`; made safe: one file name inside
        the output folder, see :func:`safe_name`)."""
        return safe_name(format_name(template, self.fields))


def _uid_hash(uid: str) -> str:
    return hashlib.sha1(uid.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def _folder_of(p: str) -> str:
    return os.path.basename(os.path.dirname(os.path.abspath(p)))


def _image_case(p: str) -> Case:
    return Case(p, fields={"name": _stem(p), "stem": _stem(p), "folder": _folder_of(p)})


def _failed(p: str, reason: str) -> Case:
    return Case(p, fields={"name": _stem(p) or "input", "stem": _stem(p)}, error=reason)


def nothing_in_folder(folder: str, skipped: list[tuple[str, str]]) -> str:
    """Why ``folder`` gave no input, from the ``(file, reason)`` skipped under it (or, with
    none, from what it holds)."""
    head = "holds no DICOM series or NIfTI/NRRD/MHA file"
    if skipped:
        listed = "; ".join(f"{os.path.basename(p)}: {r}" for p, r in skipped[:3])
        return f"{head} ({len(skipped)} file(s) skipped: {listed})"
    from .io.walk import walk_inputs  # (links followed, loops not, as the scan walked it)

    names = walk_inputs([folder], skip_outputs=False).files
    if not names:
        return f"{head}: it holds no file at all"
    first = os.path.basename(names[0])
    return f"{head}: its {len(names)} file(s) are named otherwise (e.g. {first})"


def check_exist(paths) -> None:
    """Raise :class:`~medproc.errors.UsageError` naming the paths that do not exist (a
    mistyped path is not an empty dataset)."""
    missing = [p for p in paths if not os.path.lexists(p)]
    if len(missing) == 1:
        raise UsageError("no such file or folder; check the input path", missing[0])
    if missing:
        raise UsageError(f"no such files or folders: {', '.join(missing)}; check the input paths")


def check_inputs(inputs, labels_dir: str | None = None) -> dict[str, list[Case]]:
    """Raise :class:`~medproc.errors.UsageError` for an input path that does not exist, or a
    labels folder that is missing or is also an input, and ``ReadError`` for a malformed case
    list (before any work); returns the case lists' cases, by list."""
    inputs = [os.fspath(p) for p in inputs]
    if labels_dir is not None and not os.path.isdir(labels_dir):
        what = "is not a folder" if os.path.exists(labels_dir) else "does not exist"
        raise UsageError(f"the labels folder (--labels) {what}; check the path", labels_dir)
    if labels_dir is not None and not os.access(labels_dir, os.R_OK | os.X_OK):
        raise UsageError("the labels folder (--labels) cannot be read (permissions)", labels_dir)
    check_exist(inputs)
    # a malformed case list stops the run before its output folder is made
    lists = {p: _cases_from_csv(p) for p in inputs if _is_case_list(p)}
    if labels_dir and os.path.realpath(labels_dir) in {os.path.realpath(p) for p in inputs}:
        raise UsageError(
            "the labels folder (--labels) is also an input; give the images and the labels as "
            "two separate folders",
            labels_dir,
        )
    return lists


def _is_case_list(p: str) -> bool:
    return p.lower().endswith(".csv") and os.path.isfile(p)


def find_cases(
    inputs, labels_dir: str | None = None, executor=None, exclude=(), on_files=None
) -> tuple[list[Case], list[tuple[str, str]]]:
    """Cases under ``inputs`` (folders scanned recursively, files, or CSV lists).

    A CSV has a header with ``image`` (and optionally ``label`` and ``name``) columns; relative
    paths are relative to the CSV. With ``labels_dir``, an image file's label is the file of the
    same name there. ``exclude``: folders never entered (the output folder). ``executor``: see
    :func:`~medproc.io.dicom_scan.scan_dicom`; ``on_files(files, n_cases)``: called before the
    DICOM headers are read, with the files to read and the number of other cases found (image
    files, case lists); it may return an executor to read them with. Returns (cases, skipped
    files with reasons); inputs that yield nothing are cases with an ``error``.
    """
    from .io.dicom_scan import scan_dicom, series_source
    from .io.walk import (
        OUTPUT_FOLDER,
        another_name,
        excluded_folders,
        file_identity,
        link_to_output,
        walk_inputs,
    )

    inputs = [os.fspath(p) for p in inputs]
    lists = check_inputs(inputs, labels_dir)
    exclude = {e: OUTPUT_FOLDER for e in exclude}
    if labels_dir:
        exclude[labels_dir] = "the labels folder (--labels)"
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    seen: dict = {}  # file identity (io.walk.file_identity, as the walk knows files) -> case
    found_by: dict[str, int] = {}

    def add(c: Case, origin: str):
        ident = file_identity(c.source)
        first = seen.get(ident)
        if c.error or first is None:
            seen.setdefault(ident, c)
            cases.append(c)
        elif origin.lower().endswith(".csv"):  # a case list's row: same image, other case?
            if (c.label, c.fields["name"]) != (first.label, first.fields["name"]):
                c.error = f"listed again ({origin}) with another label or name: list it once"
                cases.append(c)
        else:  # another name (a symbolic or hard link) of an image named already: said
            if os.path.islink(first.source) and not os.path.islink(c.source):
                cases[cases.index(first)] = seen[ident] = c  # the file itself, not a link to it
                first, c = c, first
            if os.path.abspath(first.source) != os.path.abspath(c.source):
                skipped.append((c.source, another_name(first.source)))
        found_by[origin] = found_by.get(origin, 0) + 1

    outs = excluded_folders(exclude)
    tree_inputs = []
    for inp in inputs:
        if inp in lists:
            for c in lists[inp]:
                add(c, inp)
            if not lists[inp]:  # (a named input that gives nothing fails, saying why)
                cases.append(_failed(inp, "the case list has no cases (a header line only)"))
        elif inp.lower().endswith(_IMAGE_EXT) and not os.path.isdir(inp):
            why = link_to_output(inp, outs)
            if why:
                skipped.append((inp, why))
                continue
            add(_image_case(inp), inp)  # a missing or unreadable one fails when loaded
        else:
            tree_inputs.append(inp)
    if labels_dir:
        for c in cases:
            cand = os.path.join(labels_dir, os.path.basename(c.source))
            if os.path.exists(cand) and not c.label:
                c.label = cand
    images = walk_inputs(
        [p for p in tree_inputs if os.path.isdir(p)],
        keep=lambda n: n.lower().endswith(_IMAGE_EXT),
        exclude=exclude,
    )
    for p in images.files:
        c = _image_case(p)
        if labels_dir:
            cand = os.path.join(labels_dir, os.path.basename(p))
            c.label = cand if os.path.exists(cand) else None
        add(c, p)
        for r in tree_inputs:  # every input folder that holds it found something
            if is_within(p, r):
                found_by[r] = found_by.get(r, 0) + 1
    hook = (lambda files: on_files(files, len(cases))) if on_files is not None else None
    scan = (
        scan_dicom(tree_inputs, executor=executor, exclude=exclude, on_files=hook)
        if tree_inputs
        else None
    )
    for s in scan.series if scan else []:
        files = s.files
        if is_seg(s.info):
            for f in files:
                skipped.append((f, f"{_ANNOTATION}a DICOM SEG (segmentation), not an image: not "
                                   "converted (--layout uses it as a label)"))  # fmt: skip
            continue
        src = series_source(files)
        folder = os.path.abspath(os.path.dirname(src) if len(files) == 1 else src)
        c = Case(
            src,
            series=s.key,
            dicom=s,
            fields={
                "name": f"series-{_uid_hash(s.key)}",
                "uid_hash": _uid_hash(s.key),
                "series_number": s.info.get("SeriesNumber") or 0,
                "modality": s.info.get("Modality") or "",
                "description": _description(s.info.get("SeriesDescription")),
                "stem": _stem(src),
                "folder": os.path.basename(folder),
            },
        )
        cases.append(c)
        for r in tree_inputs:
            if any(is_within(f, r) for f in files + s.copies):
                found_by[r] = found_by.get(r, 0) + 1
    for p, reason in (scan.bad if scan else []) + images.bad:
        if file_identity(p) not in seen:
            add(_failed(p, reason), next((r for r in tree_inputs if is_within(p, r)), p))
    skipped += [(p, _annotation_reason(r)) for p, r in (scan.skipped if scan else [])]
    skipped += images.skipped
    for inp in tree_inputs:  # a named file or folder that gave nothing fails, saying why
        if found_by.get(inp):
            continue
        mine = [(p, r) for p, r in skipped if is_within(p, inp)]
        if any(is_annotation(r) for _, r in mine):
            continue  # SEG/RTSTRUCT named, or a folder of them: annotations, not a failure
        if not os.path.lexists(inp):
            reason = "no such file or folder; check the path"
        elif os.path.isdir(inp):
            reason = nothing_in_folder(inp, mine)
        else:
            reason = mine[0][1] if mine else "not a DICOM or image file"
        cases.append(_failed(inp, reason))
    if labels_dir:
        check_label_pairs(cases, labels_dir)
    for c in cases:
        c.fields.setdefault("uid_hash", _uid_hash(c.source))
        c.fields.setdefault("series_number", 0)
        c.fields.setdefault("modality", "")
        c.fields.setdefault("description", "")
        c.fields.setdefault("folder", _folder_of(c.source))
    once = {}  # a path skipped by two walks (images, DICOM headers) or twice: listed once
    for p, reason in skipped:
        once.setdefault(p, (p, reason))
    return cases, list(once.values())


def is_seg(info: dict) -> bool:
    """Whether a scanned series' attributes (``DicomSeries.info``) are a DICOM SEG's."""
    from .io.dicom_records import label_kind_of

    return label_kind_of(info) == "SEG"


def _annotation_reason(reason: str) -> str:
    """RTSTRUCT files (skipped by the scan: no image) are reported as annotations."""
    from .io.dicom_records import RTSTRUCT_SKIPPED

    if reason == RTSTRUCT_SKIPPED:
        return (
            f"{_ANNOTATION}a DICOM RTSTRUCT (contours), not an image: not converted (--layout "
            "uses it as a label)"
        )
    return reason


def _cases_from_csv(path: str) -> list[Case]:
    base = os.path.dirname(os.path.abspath(path))
    out = []
    for line, row in read_csv_rows(path, ("image",), "case list"):
        img = (row.get("image") or "").strip()
        if not img:
            raise ReadError(
                "the 'image' cell is empty; give every row an image path (or delete the row)",
                path,
                where=f"line {line}",
            )
        img = img if os.path.isabs(img) else os.path.join(base, img)
        lab = (row.get("label") or "").strip() or None
        if lab and not os.path.isabs(lab):
            lab = os.path.join(base, lab)
        name = (row.get("name") or "").strip() or _stem(img)
        fields = {"name": safe_name(name), "stem": _stem(img), "folder": _folder_of(img)}
        out.append(Case(img, label=lab, fields=fields))
    return out


def read_annotation_table(path: str) -> dict:
    """Lesions per image key from a LUNA16-style CSV or a medproc JSON file."""
    from .annotations import read_json, read_luna_csv

    return read_json(path) if path.lower().endswith(".json") else read_luna_csv(path)
