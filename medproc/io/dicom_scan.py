"""Find DICOM series in files and folder trees, from headers only (no pixel data read).

A *series* here is a set of frames that make one regular volume: files are grouped by
SeriesInstanceUID (without one: by folder and SeriesNumber) and split where orientation differs
or a localizer is among them, and every multi-frame file is a volume of its own; files of one
orientation in another image size fail their stack (see :mod:`~medproc.io.dicom_group`). Each frame (a slice of a classic file, or one
frame of an enhanced multi-frame / RT dose file) becomes a :class:`Frame` with its own position,
orientation, pixel spacing and rescale, so the geometry code treats all kinds alike.

Nothing is dropped silently. A file that looks like DICOM (a ``.dcm``/``.ima`` name or the
``DICM`` marker) but cannot be used, or that cannot be read at all, is a *problem* of the series
it belongs to (by SeriesInstanceUID, else by folder), so that series fails naming the file;
with no such series it is listed in :attr:`DicomScan.bad`. Copies of one file (the same
SOPInstanceUID and the same bytes) are read once; different files under one SOPInstanceUID in
two folders keep the folders apart, with a note, and then a bad file fails only the series
of its own folder. Stray non-DICOM files are listed as skipped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .dicom_copies import dedupe
from .dicom_group import DicomSeries, _same_orientation, group_records  # noqa: F401
from .dicom_header import (  # noqa: F401  (Frame, frames_of, is_dicom_file: re-exported)
    _NOT_DICOM_EXT,
    Frame,
    frames_of,
    is_dicom_file,
    read_header,
)
from .dicom_records import scan_file
from .walk import walk_inputs

log = logging.getLogger(__name__)

__all__ = [
    "Frame",
    "DicomSeries",
    "DicomScan",
    "find_series",
    "series_source",
    "scan_dicom",
    "read_header",
    "is_dicom_file",
]


@dataclass
class DicomScan:
    """The result of :func:`scan_dicom`: ``series``; ``skipped`` ``(path, reason)`` for files
    that are not DICOM images (stray files, reports, DICOMDIR, FIFOs); ``bad`` ``(path,
    reason)`` for DICOM-looking or unreadable files that belong to no series found (a series
    none of whose files is usable: one entry, its folder); ``bad_files`` every file behind
    ``bad``."""

    series: list[DicomSeries]
    skipped: list[tuple[str, str]]
    bad: list[tuple[str, str]]
    bad_files: list[str] = field(default_factory=list)


#: headers read per task of a pool whose size is not known (see :func:`_chunks`)
CHUNK = 64
#: header-scan tasks per worker of a pool of known size (see _chunks)
TASKS_PER_WORKER = 4
#: fewer files than this are read in this process even when a pool is given: reading them
#: (~0.6 ms each) is over about as soon as the pool's workers would have started, and the
#: workers are free for other work meanwhile
POOL_MIN_FILES = 256


def series_source(files: list[str]) -> str:
    """The path naming a series: its file, or the folder holding all its files (absolute when
    relative paths share none, e.g. a series split over two input folders)."""
    if len(files) == 1:
        return files[0]
    return os.path.commonpath(files) or os.path.commonpath([os.path.abspath(f) for f in files])


def _scan_files(files: list[str], strict: bool = False) -> list[tuple]:
    """Read the headers of ``files`` (one record per file, see ``dicom_records``)."""
    from .._trace import span

    with span("scan", files=len(files)):
        return _shared_info([scan_file(p, strict) for p in files])


def _shared_info(records: list[tuple]) -> list[tuple]:
    """The records with equal ``info`` dicts made one object (the files of a series share their
    series' attributes): pickled once each, so a pool's results reach the main process a third
    as long to unpickle (8.1 -> 2.7 ms for the 572 headers of 4 CT series)."""
    seen: dict[str, dict] = {}
    out = []
    for r in records:
        if r[0] == "ok":
            r = (*r[:3], seen.setdefault(repr(sorted(r[3].items())), r[3]), *r[4:])
        out.append(r)
    return out


def _one_per_series(bad: list[tuple], named: set) -> list[tuple[str, str]]:
    """``(path, reason)`` of the unusable files of no series: those of one SeriesInstanceUID in
    one folder (a series every file of which failed, e.g. all with RescaleSlope 0) as one entry
    for the folder, naming its first file, the reason and how many files there are; files the
    user named (``named``, absolute) stay entries of their own."""
    out, groups = [], {}
    for path, reason, uid in bad:
        if uid is None or os.path.abspath(path) in named:
            out.append((path, reason))
        else:
            groups.setdefault((uid, os.path.dirname(path)), []).append((path, reason))
    for (uid, folder), items in groups.items():
        if len(items) == 1:
            out.append(items[0])
            continue
        path, reason = items[0]
        same = sum(r == reason for _, r in items)
        out.append(
            (
                folder,
                f"no usable file of series {uid} ({len(items)} files): {os.path.basename(path)}: "
                f"{reason}"
                + (f" ({same} of them say so)" if same < len(items) else " (all say so)"),
            )
        )
    return out


def _chunks(files: list[str], workers: int | None) -> list[list[str]]:
    """The pool's tasks: :data:`TASKS_PER_WORKER` per worker (the files in order, split evenly
    by count) when the pool's size is known (``ProcessPoolExecutor``'s ``_max_workers``), else
    :data:`CHUNK` files each. A few tasks per worker balance the workers (on 2 cores one scan
    task of 3,300 files ended 0.65 s after the other's), and the main process unpickles the
    first results while the workers read the rest; not many more, for the round trips through
    the main process (when the GPU service was a thread of it, its warm-up held the
    interpreter lock and the workers stood idle between 64-file tasks: the scan ended
    0.3-0.45 s later on the H200 node)."""
    size = CHUNK if not workers else max(1, -(-len(files) // (TASKS_PER_WORKER * workers)))
    return [files[i : i + size] for i in range(0, len(files), size)]


def scan_dicom(
    paths,
    strict: bool = False,
    executor=None,
    exclude: Iterable[str] | Mapping[str, str] = (),
    skip_outputs: bool = True,
    on_files=None,
) -> DicomScan:
    """Group the DICOM files under ``paths`` into volumes (see the module doc).

    Parameters
    ----------
    paths : path or list of paths
        Files and/or folders (searched recursively).
    strict : bool
        Raise on the first unreadable file instead of listing it.
    executor : concurrent.futures.Executor, optional
        Read headers in parallel (a few tasks per worker, see :func:`_chunks`), e.g. the
        process pool of a batch run, when there are :data:`POOL_MIN_FILES` files or more.
    exclude : iterable of str, or mapping
        Folders never entered (e.g. an output folder inside an input tree; a mapping says what
        each is, see :func:`~medproc.io.walk.walk_inputs`).
    skip_outputs : bool
        Do not enter sub-folders holding ``medproc convert`` outputs.
    on_files : callable, optional
        Called with the list of files found before their headers are read; it may return an
        executor to read them with (instead of ``executor``), e.g. a pool sized by what was
        found.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    walk = walk_inputs(paths, exclude=exclude, skip_names=_NOT_DICOM_EXT, skip_outputs=skip_outputs)
    files = walk.files
    if on_files is not None:
        executor = on_files(files) or executor
    if executor is not None and len(files) >= POOL_MIN_FILES:
        chunks = _chunks(files, getattr(executor, "_max_workers", None))
        records = [
            r for part in executor.map(_scan_files, chunks, [strict] * len(chunks)) for r in part
        ]
    else:
        records = _scan_files(files, strict)
    skipped = list(walk.skipped) + [(r[1], r[2]) for r in records if r[0] == "skip"]
    bad_recs = [(p, reason, None, None) for p, reason in walk.bad]
    bad_recs += [r[1:5] for r in records if r[0] == "bad"]
    held = {(r[1][0], r[4]) for r in records if r[0] == "ok" and r[4] is not None}
    ok, conflicted, copies = dedupe([r for r in records if r[0] == "ok"])
    series = group_records(ok, conflicted)
    for uid in conflicted:
        parts = [s for s in series if s.uid == uid]
        where = sorted({d for s in parts for d in s.folders})
        for s in parts:
            s.notes.append(
                f"SeriesInstanceUID {uid} is in {len(where)} folders ({', '.join(where)}) with "
                "different files under the same SOPInstanceUIDs: each folder is kept as a "
                "series of its own"
            )
    for s in series:
        files = set(s.files)
        mine = [(c, orig) for c, orig in copies.get(s.uid, []) if orig in files]
        s.copies += [c for c, _ in mine]
        if mine:
            s.notes.append(
                f"{len(mine)} file(s) are identical copies of its files (same SOPInstanceUID "
                f"and bytes), e.g. {mine[0][0]} of {mine[0][1]}: each is read once"
            )
    bad: list = []
    for path, reason, uid, sop in bad_recs:  # attach each to its series: by UID, else folder
        here = [s for s in series if os.path.dirname(path) in s.folders]
        owners = [s for s in series if uid is not None and s.uid == uid]
        # exports kept apart, or a damaged copy of a file read elsewhere: only the series of
        # its own folder, if any (else a failed file of its own)
        if uid in conflicted or (uid, sop) in held:
            owners = [s for s in owners if s in here]
        else:
            owners = [s for s in owners if s in here] or owners or here
        for s in owners:
            s.problems.append((path, reason))
        if not owners:
            bad.append((path, reason, uid))
    bad_files = [path for path, _, _ in bad]
    named = {os.path.abspath(os.fspath(p)) for p in paths if not os.path.isdir(p)}
    bad = _one_per_series(bad, named)
    series.sort(key=lambda s: (_num(s.info.get("SeriesNumber")), s.uid, s.files[0]))
    by_uid: dict[str, list[DicomSeries]] = {}
    for s in series:
        by_uid.setdefault(s.uid, []).append(s)
    for parts in by_uid.values():
        if len(parts) > 1:
            for i, s in enumerate(parts, 1):
                s.part = i
    return DicomScan(series, skipped, bad, bad_files)


def find_series(
    paths, strict: bool = False, executor=None
) -> tuple[list[DicomSeries], list[tuple[str, str]]]:
    """Group the DICOM files under ``paths`` into volumes: ``(series, skipped)``.

    ``skipped`` lists ``(path, reason)`` for the files that are not part of a series: stray
    files, and unusable files that belong to no series found (see :func:`scan_dicom`, which
    keeps the two apart)."""
    scan = scan_dicom(paths, strict=strict, executor=executor)
    return scan.series, scan.skipped + scan.bad


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("inf")
