"""Finding the cases of a batch: DICOM series and image files under folders, files, or CSV
case lists, with their labels and the fields of the output naming template."""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass, field

from .errors import MedprocError
from .io import IMAGE_EXT as _IMAGE_EXT
from .io import stem as _stem

__all__ = ["Case", "find_cases", "lesions_for", "read_annotation_table", "DEFAULT_NAME"]

#: default output name: no patient identifiers (file stem, or a hash of the series UID)
DEFAULT_NAME = "{name}"


@dataclass
class Case:
    """One input volume to convert (a DICOM series or an image file) and its optional label."""

    source: str
    series: str | None = None  # DICOM series key when source is a folder
    label: str | None = None
    fields: dict = field(default_factory=dict)  # naming template fields
    dicom: object | None = None  # the scanned DicomSeries: workers read it without a re-scan

    def name(self, template: str) -> str:
        """The output name from a naming template such as ``"{name}"`` or ``"{modality}_{stem}"``."""
        try:
            out = template.format(**self.fields)
        except KeyError as e:
            raise ValueError(
                f"naming template {template!r} uses unknown field {e}; fields: "
                f"{sorted(self.fields)}"
            ) from None
        return out.replace(os.sep, "_")


def _uid_hash(uid: str) -> str:
    return hashlib.sha1(uid.encode()).hexdigest()[:12]


def find_cases(
    inputs, labels_dir: str | None = None, executor=None
) -> tuple[list[Case], list[tuple[str, str]]]:
    """Cases under ``inputs`` (folders scanned recursively, files, or CSV lists).

    A CSV has a header with ``image`` (and optionally ``label`` and ``name``) columns; relative
    paths are relative to the CSV. With ``labels_dir``, an image file's label is the file of the
    same name there. Returns (cases, skipped files with reasons).
    """
    from .io.dicom_scan import find_series

    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    dicom_roots = []
    for inp in [os.fspath(p) for p in inputs]:
        if inp.lower().endswith(".csv"):
            cases += _cases_from_csv(inp)
        elif os.path.isdir(inp):
            for root, dirs, files in os.walk(inp):
                dirs.sort()
                for n in sorted(files):
                    if n.lower().endswith(_IMAGE_EXT) and not n.startswith("."):
                        p = os.path.join(root, n)
                        cases.append(Case(p, fields={"name": _stem(p), "stem": _stem(p)}))
            dicom_roots.append(inp)
        elif os.path.exists(inp):
            if inp.lower().endswith(_IMAGE_EXT):
                cases.append(Case(inp, fields={"name": _stem(inp), "stem": _stem(inp)}))
            else:
                dicom_roots.append(inp)
        else:
            skipped.append((inp, "no such file or folder"))
    if labels_dir:
        if os.path.abspath(labels_dir) in {os.path.abspath(r) for r in dicom_roots}:
            raise ValueError("the labels folder must not be one of the inputs")
        cases = [
            c
            for c in cases
            if not os.path.abspath(c.source).startswith(os.path.abspath(labels_dir) + os.sep)
        ]
        for c in cases:
            cand = os.path.join(labels_dir, os.path.basename(c.source))
            if os.path.exists(cand):
                c.label = cand
    if dicom_roots:
        series, sk = find_series(dicom_roots, executor=executor)
        skipped += [(p, r) for p, r in sk if not p.lower().endswith(_IMAGE_EXT)]
        for s in series:
            files = s.files
            src = files[0] if len(files) == 1 else os.path.commonpath(files)
            cases.append(
                Case(
                    src,
                    series=s.key,
                    dicom=s,
                    fields={
                        "name": f"series-{_uid_hash(s.key)}",
                        "uid_hash": _uid_hash(s.key),
                        "series_number": s.info.get("SeriesNumber") or 0,
                        "modality": s.info.get("Modality") or "",
                        "stem": _stem(src),
                    },
                )
            )
    for c in cases:
        c.fields.setdefault("uid_hash", _uid_hash(c.source))
        c.fields.setdefault("series_number", 0)
        c.fields.setdefault("modality", "")
    return cases, skipped


def _cases_from_csv(path: str) -> list[Case]:
    base = os.path.dirname(os.path.abspath(path))
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "image" not in reader.fieldnames:
            raise MedprocError(
                f"a case list needs an 'image' column, found {reader.fieldnames}", path
            )
        for line, row in enumerate(reader, 2):
            img = (row.get("image") or "").strip()
            if not img:
                raise MedprocError(f"line {line}: empty 'image'", path)
            img = img if os.path.isabs(img) else os.path.join(base, img)
            lab = (row.get("label") or "").strip() or None
            if lab and not os.path.isabs(lab):
                lab = os.path.join(base, lab)
            name = (row.get("name") or "").strip() or _stem(img)
            out.append(Case(img, label=lab, fields={"name": name, "stem": _stem(img)}))
    return out


def read_annotation_table(path: str) -> dict:
    """Lesions per image key from a LUNA16-style CSV or a medproc JSON file."""
    from .annotations import read_json, read_luna_csv

    return read_json(path) if path.lower().endswith(".json") else read_luna_csv(path)


def lesions_for(case: Case, table: dict | None):
    """The lesions of ``case`` in ``table`` (by SeriesInstanceUID or file stem), or none."""
    if table is None:
        return None
    from .annotations import Lesions

    keys = [case.dicom.uid] if case.dicom is not None else []
    keys += [case.fields.get("stem"), case.fields.get("name")]
    for k in keys:
        if k in table:
            return table[k]
    return Lesions.empty()
