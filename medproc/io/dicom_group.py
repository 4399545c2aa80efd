"""How the records of a DICOM scan become series: :class:`DicomSeries`, and the grouping that
keeps one slice stack whole.

Frames are grouped by SeriesInstanceUID (files without one: by folder and SeriesNumber, as
dcm2niix groups them), image size and orientation; a multi-frame file is a volume of its own.
Where the exports of one series differ (:func:`~medproc.io.dicom_copies.dedupe`), each folder is
a *home* of its own: nothing found in one folder (a damaged file, files without
ImageOrientationPatient) is held against the series of another. Within a home:

- a file whose header cannot be right joins its series as a problem (the series fails, naming
  it), never a volume of its own;
- files without ImageOrientationPatient beside files with it are problems of those;
- files of one orientation in another image size (Rows, Columns, samples) are problems of the
  stack: one stack of slices has one size (dcm2niix splits the odd slice off, with a warning,
  and converts the stack a slice short). Localizers and multi-frame files are apart;
- a lone slice in a gap of a stack of its folder and size, kept apart by its header (no
  SeriesInstanceUID, an orientation a little off), is a problem of the stack, named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import ReadError
from .dicom_header import PADDING_NOTE, Frame

__all__ = ["DicomSeries", "group_records"]


@dataclass
class DicomSeries:
    """Frames that belong to one volume, plus the series-level attributes.

    ``problems`` lists ``(file, reason)`` for files of this series that cannot be used (reading
    the series then fails naming them); ``notes`` are warnings about how it was assembled."""

    uid: str
    frames: list[Frame]
    info: dict = field(default_factory=dict)
    part: int = 0  # >0 when a SeriesInstanceUID was split into several volumes
    problems: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: identical copies of this series' files (same SOPInstanceUID and bytes), not read again
    copies: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The name users pass as ``series=``: the UID, with ``.partN`` when split."""
        return self.uid if self.part == 0 else f"{self.uid}.part{self.part}"

    @property
    def files(self) -> list[str]:
        """The files holding this series' frames, sorted."""
        return sorted({f.path for f in self.frames})

    @property
    def folders(self) -> set[str]:
        """The folders holding this series' files."""
        return {os.path.dirname(p) for p in {f.path for f in self.frames}}

    def describe(self) -> str:
        """One line: key, number, modality, description, frames and size."""
        i = self.info
        return (
            f"{self.key} (#{i.get('SeriesNumber', '?')} {i.get('Modality', '?')} "
            f"'{i.get('SeriesDescription', '')}', {len(self.frames)} frames of "
            f"{i.get('Rows')}x{i.get('Columns')})"
        )

    def problem_error(self) -> ReadError | None:
        """The error reading this series raises (naming its first unusable file), or None."""
        if not self.problems:
            return None
        path, reason = self.problems[0]
        more = f" ({len(self.problems)} such files)" if len(self.problems) > 1 else ""
        return ReadError(
            f"{reason}. It belongs to series {self.key}, which cannot be read without it"
            f"{more}: fix or remove the file(s)",
            path,
        )


def _same_orientation(a, b) -> bool:
    """``np.allclose(a, b, atol=1e-4)`` for two direction-cosine sextuples (or both None), in
    plain Python: called once per file, it was most of the grouping's time (25 us a call; the
    main process groups every header of a batch, 6,400 for 32 CT series)."""
    if a is None or b is None:
        return a is None and b is None
    return all(abs(x - y) <= 1e-4 + 1e-5 * abs(y) for x, y in zip(a, b))


def _home(key: tuple):
    """The folder a group is confined to (exports of one series that differ), else None."""
    return next((e[1] for e in key[5:] if isinstance(e, tuple) and e[0] == "folder"), None)


def group_records(records: list[tuple], conflicted: set[str]) -> list[DicomSeries]:
    """The series of the ``"ok"`` records of a scan (``dicom_records``), kept by
    :func:`~medproc.io.dicom_copies.dedupe`; ``conflicted``: the UIDs whose folders are kept
    apart. A key is ``[uid, rows, columns, samples, localizer, *extras]``."""
    groups: list[DicomSeries] = []
    by_key: dict[tuple, list[DicomSeries]] = {}  # the groups of one key, in their order
    keys: dict[int, tuple] = {}  # id(group) -> its key
    sops: dict[int, dict[str, str]] = {}
    # files whose pixel data does not match their header come last: one whose Rows/Columns
    # were damaged joins its series as a problem instead of making a volume of its own
    records = sorted(records, key=lambda r: r[5] is not None)
    for _, key, frames, info, sop, problem in records:
        key = list(key)
        if key[0] in conflicted:  # different files under one SOP UID: keep folders apart
            key.append(("folder", os.path.dirname(frames[0].path)))
        key = tuple(key)
        if problem and key not in by_key:  # (only its own folder's, where kept apart)
            same_uid = [s for s in groups if s.uid == key[0] and _home(keys[id(s)]) == _home(key)]
            if same_uid:
                for s in same_uid:
                    s.problems.append((frames[0].path, problem))
                continue
        ori = frames[0].orientation
        # orientation: cluster within 1e-4 instead of rounding (no split at rounding borders)
        same = by_key.setdefault(key, [])
        matched = next((s for s in same if _same_orientation(ori, s.frames[0].orientation)), None)
        if matched is None:
            own = {k: v for k, v in info.items() if k != PADDING_NOTE}  # (a file's: a note)
            matched = DicomSeries(key[0], [], own)  # (its own: records share theirs)
            groups.append(matched)
            same.append(matched)
            keys[id(matched)] = key
        matched.frames.extend(frames)
        if problem:
            matched.problems.append((frames[0].path, problem))
        elif info.get(PADDING_NOTE) and not any("excess padding" in n for n in matched.notes):
            matched.notes.append(info[PADDING_NOTE])  # (the first such file's, named)
        if sop is not None:
            other = sops.setdefault(id(matched), {}).setdefault(sop, frames[0].path)
            if other != frames[0].path:
                matched.problems.append(
                    (
                        frames[0].path,
                        f"it and {other} carry the same SOPInstanceUID {sop} but differ",
                    )
                )
    groups = _one_size_per_stack(_without_stray_geometry(groups, keys), keys)
    return _no_strays_in_gaps(groups, keys)


def _without_stray_geometry(groups: list[DicomSeries], keys: dict) -> list[DicomSeries]:
    """Files without ImageOrientationPatient in a series whose other files have it are not a
    volume of their own (with a made-up grid): they are problems of that series, named. In a
    folder kept apart (another export of the series) they fail that folder's series alone."""
    out = []
    for g in groups:
        if g.frames[0].orientation is not None:
            out.append(g)
            continue
        oriented = [h for h in groups if h.uid == g.uid and h.frames[0].orientation is not None]
        mine = [h for h in oriented if _home(keys[id(h)]) == _home(keys[id(g)])]
        why = "no ImageOrientationPatient, while the other files of its series have one"
        if mine:
            for h in mine:
                h.problems += [(p, why) for p in g.files]
            continue
        if oriented:  # another export of the series has it: this folder fails on its own
            where = sorted({d for h in oriented for d in h.folders})[0]
            g.problems += [(p, f"{why} (in {where})") for p in g.files]
        out.append(g)
    return out


def _one_size_per_stack(groups: list[DicomSeries], keys: dict) -> list[DicomSeries]:
    """Groups of one series, home and orientation that differ in image size only are one
    stack with odd files: the odd files are problems of the largest group (named), never a
    volume of their own that leaves the stack a slice short."""
    stacks: dict[tuple, list[list[DicomSeries]]] = {}
    for g in groups:
        key, ori = keys[id(g)], g.frames[0].orientation
        if ori is None or key[4] or any(e[0] == "file" for e in key[5:] if isinstance(e, tuple)):
            continue  # no geometry, a localizer, a multi-frame file: not a slice of a stack
        clusters = stacks.setdefault((key[0], *key[4:]), [])
        same = next(
            (c for c in clusters if _same_orientation(ori, c[0].frames[0].orientation)), None
        )
        if same is None:
            clusters.append([g])
        else:
            same.append(g)
    dropped: set[int] = set()
    for clusters in stacks.values():
        for c in (c for c in clusters if len(c) > 1):
            main = max(c, key=lambda s: len(s.files))  # (the first of the largest)
            size = _size(keys[id(main)])
            for g in (g for g in c if g is not main and _within(g, main)):
                why = (
                    f"its image is {_size(keys[id(g)])} (Rows x Columns), while the other "
                    f"{len(main.files)} file(s) of its series in this orientation are {size}: "
                    "one stack of slices has one size"
                )
                main.problems += [(p, why) for p in g.files] + g.problems
                dropped.add(id(g))
    return [g for g in groups if id(g) not in dropped]


def _no_strays_in_gaps(groups: list[DicomSeries], keys: dict) -> list[DicomSeries]:
    """A lone slice of a stack's series (or of none: no SeriesInstanceUID) that lies in a gap
    of that stack, in its folder and of its size, but was kept apart by its header (no UID, an
    orientation a little off) is a problem of the stack, named with the reason: it was a
    1-slice volume of its own (converted "ok") while the stack failed for "missing slices",
    naming no file."""
    from .dicom_geometry import DUPLICATE_MM, slice_gaps

    gapped: dict[tuple, list] = {}  # (folder, size) -> [(stack, normal, positions, gaps)]
    for main in groups:
        folders = main.folders
        if len(main.frames) < 3 or main.frames[0].orientation is None or len(folders) != 1:
            continue
        normal, at = _along_normal(main)
        if len(at) < 3:
            continue
        typical, where = slice_gaps(np.diff(at))  # (the rule reading the stack applies)
        if typical <= DUPLICATE_MM:  # (echoes, repeats: not a stack with gaps)
            continue
        gaps = [(at[i], at[i + 1]) for i in where]
        if gaps:
            key = (next(iter(folders)), _size(keys[id(main)]))
            gapped.setdefault(key, []).append((main, normal, gaps))
    dropped: set[int] = set()
    for g in groups if gapped else ():
        f = g.frames[0]
        if len(g.frames) != 1 or f.orientation is None or f.position is None:
            continue
        key = (os.path.dirname(f.path), _size(keys[id(g)]))
        for main, normal, gaps in gapped.get(key, ()):
            nouid = g.uid.startswith("nouid:")  # (grouped by folder: see dicom_records)
            if g is main or not (nouid or g.uid == main.uid):
                continue  # (another series' slice is its own)
            marks = (keys[id(g)][4], keys[id(main)][4])  # (marked LOCALIZER: it, the stack)
            why = _kept_apart(g, main, normal, gaps, nouid, marks)
            if why:
                main.problems.append((f.path, why))
                dropped.add(id(g))
                break
    return [g for g in groups if id(g) not in dropped]


def _kept_apart(
    g: DicomSeries, main: DicomSeries, normal, gaps, nouid: bool, marks: tuple[bool, bool]
) -> str | None:
    """Why ``g`` (a lone slice) lies in one of ``main``'s ``gaps`` yet was kept apart from it,
    or None when it lies in none (or turns away by over 5 degrees). ``marks``: whether it and
    the stack are marked LOCALIZER (ImageType). A slice whose orientation cannot place it (all
    zeros, not unit vectors, not perpendicular: the reader's rule) is placed by its position
    alone, and that is why."""
    from .dicom_geometry import _fmt, orientation_problem

    f = g.frames[0]
    mine = np.asarray(f.orientation, dtype=np.float64)
    bad = orientation_problem(mine)
    cos = abs(float(np.dot(normal, np.cross(mine[:3], mine[3:])))) if not bad else 1.0
    x = float(np.dot(f.position, normal))
    gap = next(((lo, hi) for lo, hi in gaps if lo < x < hi), None)
    if cos < np.cos(np.radians(5)) or gap is None:
        return None
    if nouid:
        why = "it has no SeriesInstanceUID"
    elif bad:
        why = f"its {bad}"
    elif marks[0] != marks[1]:
        who = "it is" if marks[0] else "the stack's slices are"
        why = f"{who} marked LOCALIZER (ImageType)"
    else:
        o = np.asarray(main.frames[0].orientation, dtype=np.float64)
        dots = [float(np.dot(o[n : n + 3], mine[n : n + 3])) for n in (0, 3)]
        angle = float(np.degrees(np.arccos(min(1.0, cos, *dots))))  # (rows, columns, normal)
        why = f"its orientation differs from theirs by {angle:.2f} degrees"
        if round(angle, 2) == 0:  # (apart by more than rounding, but by no visible angle)
            why = f"its ImageOrientationPatient {_fmt(mine)} differs from theirs {_fmt(o)}"
    return (
        f"it lies in a gap of the stack's slices ({gap[0]:.2f} to {gap[1]:.2f} mm along its "
        f"normal) but was kept apart from them: {why}"
    )


def _along_normal(main: DicomSeries) -> tuple[np.ndarray, list[float]]:
    """``main``'s slice normal and its frames' sorted positions along it (mm)."""
    o = np.asarray(main.frames[0].orientation, dtype=np.float64)
    normal = np.cross(o[:3], o[3:])
    return normal, sorted(float(np.dot(f.position, normal)) for f in main.frames
                          if f.position is not None)  # fmt: skip


def _within(g: DicomSeries, main: DicomSeries) -> bool:
    """Whether ``g``'s slices lie inside ``main``'s stack along its normal, or within one and a
    half of its slice steps beyond either end (a slice of the stack of another size); slices
    elsewhere are a stack of their own (a second acquisition: a ``.partN``, as before)."""
    normal, at = _along_normal(main)
    mine = [float(np.dot(f.position, normal)) for f in g.frames if f.position is not None]
    if len(at) < 2 or not mine:
        return True
    step = float(np.median(np.diff(at))) or 1.0
    lo, hi = at[0] - 1.5 * step, at[-1] + 1.5 * step
    return all(lo <= x <= hi for x in mine)


def _size(key: tuple) -> str:
    rows, cols, spp = key[1:4]
    return f"{rows}x{cols}" + (f"x{spp} samples" if spp != 1 else "")
