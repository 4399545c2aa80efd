"""Copies of DICOM files (the same SOPInstanceUID): identical ones are read once; exports of
one series that differ in a file are kept apart, each folder whole."""

from __future__ import annotations

import hashlib
import os

__all__ = ["dedupe"]


def _digest(p: str, cache: dict):
    """(size, sha1) of a file's bytes, cached; ``(p, None)`` when it cannot be read (so it
    equals no other file)."""
    if p not in cache:
        h = hashlib.sha1()
        try:
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            cache[p] = (os.path.getsize(p), h.hexdigest())
        except OSError:
            cache[p] = (p, None)
    return cache[p]


def _same_bytes(a: str, b: str, cache: dict) -> bool:
    try:
        if os.path.getsize(a) != os.path.getsize(b):
            return False
    except OSError:
        return False
    return _digest(a, cache) == _digest(b, cache)


def dedupe(records: list[tuple]) -> tuple[list[tuple], set[str], dict]:
    """Drop identical copies (same SOPInstanceUID and bytes); return the records kept, the
    series UIDs with different files under one SOPInstanceUID, and the copies dropped per UID
    as (copy, original).

    Where a UID has different files under one SOPInstanceUID (two exports of a series, one
    edited or damaged), each folder is a series of its own, whole: a file is a copy only of a
    file of its own folder, and a folder whose files all equal another folder's is a copy of
    that folder (its files listed as copies)."""
    cache: dict = {}
    first: dict[tuple, str] = {}  # (series UID, SOPInstanceUID) -> the first file
    conflicted: set[str] = set()
    for _, key, frames, _, sop, _ in records:
        if sop is None:
            continue
        prev = first.setdefault((key[0], sop), frames[0].path)
        if prev != frames[0].path and not _same_bytes(prev, frames[0].path, cache):
            conflicted.add(key[0])
    folders: dict[tuple, list[tuple]] = {}  # (uid, folder) -> records, conflicted UIDs only
    kept, seen, copies = [], {}, {}
    for rec in records:
        _, key, frames, _, sop, _ = rec
        if key[0] in conflicted:
            folders.setdefault((key[0], os.path.dirname(frames[0].path)), []).append(rec)
            continue
        prev = seen.get((key[0], sop)) if sop is not None else None
        if prev is not None and _same_bytes(prev, frames[0].path, cache):
            copies.setdefault(key[0], []).append((frames[0].path, prev))
            continue
        if sop is not None:
            seen.setdefault((key[0], sop), frames[0].path)
        kept.append(rec)
    earlier: list[tuple[str, dict]] = []  # (uid, SOP -> file) of the folders kept
    for (uid, _), recs in folders.items():
        by_sop: dict = {}
        mine, loose = [], False  # loose: a file without a SOPInstanceUID (never a copy)
        for rec in recs:
            path, sop = rec[2][0].path, rec[4]
            if sop is None:
                loose = True
                mine.append(rec)
                continue
            prev = by_sop.get(sop)
            if prev is not None and _same_bytes(prev, path, cache):
                copies.setdefault(uid, []).append((path, prev))
                continue
            by_sop.setdefault(sop, path)
            mine.append(rec)
        # the copy of a folder kept: the same SOPInstanceUIDs (no file read to know), then the
        # same bytes file by file (files are read only for folders with the same UIDs)
        same = None
        if not loose:
            same = next(
                (
                    other
                    for u, other in earlier
                    if u == uid
                    and other.keys() == by_sop.keys()
                    and all(_same_bytes(other[k], p, cache) for k, p in by_sop.items())
                ),
                None,
            )
        if same is not None:
            copies.setdefault(uid, []).extend((p, same[k]) for k, p in by_sop.items())
        else:
            earlier.append((uid, by_sop))
            kept += mine
    return kept, conflicted, copies
