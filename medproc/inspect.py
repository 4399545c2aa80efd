"""What is in a dataset: series, files, geometry and warnings, from headers only.

This is what ``medproc inspect`` prints; it reads no pixel data, so it is fast on large trees.
Every file under the paths is accounted for: a volume (DICOM series or image file), an error,
an annotation (DICOM SEG or RTSTRUCT: not converted, used as labels by ``--layout``) or a
skipped file with the reason (stray files such as ``.csv`` or ``.txt`` are listed too).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import MedprocError
from .geometry import axcodes, spacing_of

__all__ = ["Entry", "inspect_paths"]

from .io import IMAGE_EXT as _IMAGE_EXT


@dataclass
class Entry:
    """One volume found (a DICOM series or an image file), or one file that failed."""

    #: "dicom", "nifti", "itk", "annotation" (SEG/RTSTRUCT), "error" or "skipped" (not an image)
    kind: str
    source: str
    series: str = ""
    modality: str = ""
    description: str = ""
    shape: tuple = ()
    spacing: tuple = ()
    orientation: str = ""
    files: int = 0
    transfer_syntax: str = ""
    decode: str = ""
    warnings: list[str] = field(default_factory=list)
    error: str = ""
    #: the folders holding a series' files (a series may span input folders)
    folders: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The entry as a plain dict (``medproc inspect --json``)."""
        return asdict(self)


def _header_entry(path: str) -> Entry:
    from .io import kind_of
    from .io.headers import header_grid

    e = Entry(kind_of(path) or "?", path, files=1)
    try:
        g = header_grid(path)
    except MedprocError as ex:
        e.kind, e.error = "error", ex.message
        return e
    e.warnings += g.warnings
    e.shape = g.shape
    e.spacing = tuple(float(x) for x in np.round(spacing_of(g.affine), 4))
    e.orientation = axcodes(g.affine)
    return e


def inspect_paths(paths) -> list[Entry]:
    """Entries for every DICOM series and image file under ``paths`` (files or folders).

    Files that cannot be used are entries of kind ``"error"`` with the reason; stray files that
    are not images are entries of kind ``"skipped"``. Reads headers only (and never opens a
    FIFO or a device)."""
    from .cases import is_seg
    from .io.dicom_records import RTSTRUCT_SKIPPED
    from .io.dicom_scan import scan_dicom, series_source
    from .io.headers import series_grid, series_shape
    from .io.walk import file_identity, walk_inputs
    from .pipeline.decode import decode_path

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    out: list[Entry] = []
    image_paths = [p for p in paths if os.path.isdir(p) or p.lower().endswith(_IMAGE_EXT)]
    images = walk_inputs(
        image_paths, keep=lambda n: n.lower().endswith(_IMAGE_EXT), skip_outputs=False
    )
    dicom_paths = [p for p in paths if os.path.isdir(p) or not p.lower().endswith(_IMAGE_EXT)]
    scan = scan_dicom(dicom_paths, skip_outputs=False) if dicom_paths else None
    accounted = set()  # the files of every series, by identity (io.walk.file_identity)
    for s in scan.series if scan else []:
        i = s.info
        files = s.files
        accounted.update(file_identity(f) for f in files + s.copies + [p for p, _ in s.problems])
        src = series_source(files)
        ts = i.get("TransferSyntaxUID")
        e = Entry(
            "annotation" if is_seg(i) else "dicom",
            src,
            series=s.key,
            modality=str(i.get("Modality") or ""),
            description=str(i.get("SeriesDescription") or ""),
            shape=series_shape(s),
            files=len(files),
            transfer_syntax=str(getattr(ts, "name", ts) or ""),
            decode=decode_path(i),
            folders=sorted(s.folders),
        )
        if s.problems:
            p, reason = s.problems[0]
            more = f" ({len(s.problems)} unusable files)" if len(s.problems) > 1 else ""
            e.error = f"{os.path.basename(p)}: {reason}{more}"
        if e.kind == "annotation":
            out.append(e)
            continue
        try:
            g = series_grid(s)
            e.spacing = tuple(float(x) for x in np.round(spacing_of(g.affine), 4))
            e.orientation = axcodes(g.affine)
            e.warnings = list(g.warnings) + list(s.notes)
        except MedprocError as ex:
            if not e.error:  # a missing file's gap is a consequence, not a second problem
                e.error = ex.message
        out.append(e)
    for f in images.files:
        out.append(_header_entry(f))
    out += [Entry("skipped", p, error=reason) for p, reason in images.skipped]
    listed = set()
    for p, reason in (scan.bad if scan else []) + images.bad:
        if p not in listed:
            listed.add(p)
            out.append(Entry("error", p, error=reason))
    for p, reason in scan.skipped if scan else []:
        if not p.lower().endswith(_IMAGE_EXT):
            if reason == RTSTRUCT_SKIPPED:
                out.append(Entry("annotation", p, modality="RTSTRUCT", files=1))
            else:
                out.append(Entry("skipped", p, error=reason))
    accounted.update(file_identity(f) for f in (scan.bad_files if scan else []))
    out = _named_inputs_accounted(paths, _stray_files(paths, out, accounted))
    # (both walks skip a folder; two series of one folder share their source: keyed apart)
    once = {(e.kind, e.source, e.series, e.error): e for e in out}.values()
    return sorted(once, key=lambda e: (e.kind == "skipped", e.source))  # by path, skipped last


def _stray_files(paths, out: list[Entry], accounted: set) -> list[Entry]:
    """Files the scans pass over without a word (``.csv``, ``.txt``, ``.png``...), as skipped
    entries: the report accounts for every file under the paths."""
    from .io.walk import file_identity, walk_inputs

    folders = [p for p in paths if os.path.isdir(p)]
    if not folders:
        return out
    known = accounted | {file_identity(e.source) for e in out}
    for f in walk_inputs(folders, skip_outputs=False).files:
        if file_identity(f) not in known:
            out.append(Entry("skipped", f, error="not a DICOM or image file (by its name)"))
    return out


def _named_inputs_accounted(paths, out: list[Entry]) -> list[Entry]:
    """A path the user named that gave no volume and no error becomes an error entry saying
    why (an empty folder, a report with no image...): never silently nothing."""
    from .cases import nothing_in_folder
    from .io.safety import is_within

    for p in paths:
        found = [
            e
            for e in out
            if e.kind != "skipped"
            and (is_within(e.source, p) or any(is_within(f, p) for f in e.folders))
        ]
        if found:
            continue
        mine = [e for e in out if e.kind == "skipped" and is_within(e.source, p)]
        if os.path.isdir(p):
            reason = nothing_in_folder(p, [(e.source, e.error) for e in mine])
            out.append(Entry("error", p, error=reason))
        else:
            for e in mine:
                out.remove(e)
            out.append(Entry("error", p, error=mine[0].error if mine else "not an image file"))
    return out
