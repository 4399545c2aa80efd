"""The output folder of a batch: checked before any work, locked while a run writes into it,
cleared of temporaries a killed run left, and its ``manifest.csv`` (one row per case) read and
written safely.

- An output folder that is a file, cannot be created or is not writable is an
  :class:`~medproc.errors.OutputError` before anything starts.
- One run at a time: ``OUTDIR/.medproc.lock`` is locked (``fcntl.lockf``; the kernel releases
  it when the process dies, even by ``kill -9``); a second run into the same folder is refused.
  It is never written through a link (:class:`OutdirLock`), and removed when the run ends.
- Hidden ``.<name>.<random>.part<ext>`` temporaries (``medproc.io.atomic``) of the files a
  batch writes, left by a killed run, are removed when the next run starts; nothing else
  (:func:`medproc.io.atomic.is_temporary`: ``.dataset.tar.part`` is the user's).
- A ``manifest.csv`` that cannot be parsed (binary, not UTF-8, wrong header) is moved aside to
  ``manifest.csv.unreadable-<time>`` with a warning; its cases are then redone.
- Each row records the options that made its outputs (``options``: the spec, format and NaN
  policy as JSON), so a rerun with other options can say what differs
  (:func:`medproc._options.options_diff`),
  and the identity of what it read (``input_id``: sizes and modification times, hashed, see
  :func:`medproc._case_files.input_identity`), so a rerun redoes a case whose input changed.
"""

from __future__ import annotations

import csv
import logging
import os
import re
import tempfile
import time
import warnings

from ._outdir_lock import OutdirLock, lock_holder  # noqa: F401  (re-exported)
from .errors import MedprocWarning, OutputError, ReadError
from .io import atomic_write
from .io.atomic import is_temporary

log = logging.getLogger(__name__)

__all__ = [
    "MANIFEST_FIELDS",
    "prepare_outdir",
    "check_outdir",
    "read_manifest",
    "manifest_rows",
    "write_manifest",
    "OutdirLock",
    "STATUSES",
    "FINISHED",
    "is_finished",
]

#: the statuses of a case in manifest.csv (docs/cli.md says what each means)
STATUSES = ("ok", "skipped", "failed", "interrupted", "not started", "superseded")
#: the statuses of a case whose outputs are whole, made with the options its row records
FINISHED = ("ok", "skipped")


def is_finished(row: dict) -> bool:
    """Whether a manifest row's case finished (status ok or skipped): the only rows a rerun
    skips and a layout uses."""
    return row.get("status") in FINISHED


MANIFEST_FIELDS = [
    "case",
    "source",
    "output",
    "label_output",
    "status",
    "error",
    "series_uid",
    "decode",
    "in_shape",
    "in_spacing",
    "out_shape",
    "out_spacing",
    "lesions",
    "seconds",
    "worker",
    "warnings",
    "options",
    "input_id",
]
#: what a batch writes into its output folder (whose temporaries a new run removes)
OUTPUT_EXT = (".nii.gz", ".nii", ".npy", ".json", ".png", ".csv")
#: prepare_outdir's write probe
_PROBE = ".medproc-write-test."
_PROBE_LEFT = re.compile(r"^\.medproc-write-test\.[a-z0-9_]{8}$")
#: the manifest is UTF-8 for every reader: file names that are not (kept by Python as
#: surrogates) are written escaped (``\udce9``); case and output names are always UTF-8
_ENC = {"encoding": "utf-8", "errors": "backslashreplace"}


def check_outdir(outdir: str) -> None:
    """Raise :class:`OutputError` when ``outdir`` could not be used, writing nothing: it is a
    file, or neither it nor the folder it would be created in is writable."""
    outdir = os.fspath(outdir)
    if os.path.lexists(outdir) and not os.path.isdir(outdir):
        raise OutputError(
            "exists and is not a folder (a file?); choose another -o, or move the file away",
            outdir,
        )
    probe = os.path.abspath(outdir)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):  # (a file on the way: /tmp/afile/sub)
        raise OutputError(
            f"cannot be created: {probe} is a file, not a folder; choose another -o", outdir
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == os.path.abspath(outdir) else f" ({probe} is not writable)"
        raise OutputError(
            f"cannot be written to{where}; choose a folder you can write to with -o", outdir
        )


def check_qc_folder(outdir: str) -> None:
    """Raise :class:`OutputError` when ``OUTDIR/qc`` (``--qc``'s pictures) exists and is not a
    folder: every case failed as a bug, recorded as killed."""
    qc = os.path.join(os.fspath(outdir), "qc")
    if os.path.lexists(qc) and not os.path.isdir(qc):
        raise OutputError(
            "exists and is not a folder: --qc writes its pictures in it; move it away", qc
        )


def prepare_outdir(outdir: str) -> OutdirLock:
    """Create, check and lock ``outdir``; remove stale temporaries. Returns the lock."""
    outdir = os.fspath(outdir)
    check_outdir(outdir)
    created = not os.path.isdir(outdir)
    try:
        os.makedirs(outdir, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=_PROBE, dir=outdir)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(
            f"cannot be written to ({e.strerror}); choose a folder you can write to with -o",
            outdir,
        ) from None
    lock = OutdirLock(outdir, created)
    removed = 0
    for d in (outdir, os.path.join(outdir, "qc")):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if is_temporary(name, OUTPUT_EXT) or _PROBE_LEFT.match(name):
                try:
                    os.unlink(os.path.join(d, name))
                    removed += 1
                except OSError:
                    pass
    if removed:
        log.info("removed %d temporary file(s) left by an interrupted run in %s", removed, outdir)
    return lock


#: how the manifest (valid UTF-8, ``backslashreplace``) writes the bytes of a file name that are
#: not UTF-8 (Python holds them as surrogates): read back into the same name
_SURROGATE = re.compile(r"\\udc[89a-f][0-9a-f]")


def _unescaped(value: str | None) -> str | None:
    """A path as written, unless it names nothing and its escapes read back name a file (a
    name holding the text ``\\udce9`` itself stays as it is)."""
    if not value or "\\udc" not in value or os.path.lexists(value):
        return value
    name = _SURROGATE.sub(lambda m: chr(int(m.group()[2:], 16)), value)
    return name if os.path.lexists(name) else value


def manifest_rows(path: str) -> list[dict]:
    """The rows of ``path``, parsed strictly: :class:`~medproc.errors.ReadError` (naming the
    file and the line) for a file that is no medproc manifest, cannot be decoded, or has a row
    without a case name, with extra cells or repeating a case name."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields = reader.fieldnames or []
            need = ("case", "source", "output", "status")
            missing = [k for k in need if k not in fields]
            if fields and len(missing) == len(need):
                raise ReadError(
                    f"is not a medproc manifest (its columns: {', '.join(fields[:6])})", path
                )
            if missing:
                raise ReadError(f"has no {missing} column(s) in its header {fields[:6]}", path)
            rows, seen = [], set()
            for line, r in enumerate(reader, 2):
                if not r.get("case") or None in r:
                    raise ReadError(f"line {line} is not a manifest row", path)
                if r["case"] in seen:
                    raise ReadError(f"line {line} repeats case {r['case']!r}", path)
                seen.add(r["case"])
                for k in ("source", "output", "label_output"):
                    r[k] = _unescaped(r.get(k))
                rows.append(r)
            return rows
    except (csv.Error, UnicodeDecodeError) as e:
        raise ReadError(f"is not UTF-8 CSV text ({type(e).__name__}: {e})", path) from None
    except OSError as e:
        raise ReadError(f"cannot be read ({e.strerror or e})", path) from None


def read_manifest(path: str, repair: bool = True) -> dict[str, dict]:
    """The rows of an existing manifest by case name ({} if there is none). One that cannot be
    parsed is moved aside (``manifest.csv.unreadable-<time>``) with a :class:`MedprocWarning`
    (with ``repair=False``, e.g. for a dry run, it is left where it is: {} with the warning);
    someone else's table of that name is a :class:`~medproc.errors.UsageError`."""
    if not os.path.exists(path):
        return {}
    try:
        return {r["case"]: r for r in manifest_rows(path)}
    except ReadError as e:
        if e.message.startswith("is not a medproc manifest"):
            from .errors import UsageError

            raise UsageError(
                f"{path} {e.message}: medproc never replaces a file it did not write; choose "
                "another -o"
            ) from None
        if not repair:
            warnings.warn(
                f"{path} could not be parsed: {e.message}; a run would move it aside and redo "
                "the outputs it recorded",
                MedprocWarning,
                stacklevel=2,
            )
            return {}
        aside = f"{path}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            os.replace(path, aside)
        except OSError as e2:
            raise OutputError(
                f"could not be parsed ({e.message}) nor moved aside ({e2.strerror}); remove it",
                path,
            ) from None
        warnings.warn(
            f"{path} could not be parsed: {e.message}; moved aside to {aside}. Outputs it "
            "recorded are redone",
            MedprocWarning,
            stacklevel=2,
        )
        return {}


def write_manifest(path: str, rows: list[dict]) -> None:
    """Write ``rows`` (sorted by case) atomically."""
    try:
        with atomic_write(path) as tmp, open(tmp, "w", newline="", **_ENC) as f:
            w = csv.DictWriter(f, fieldnames=MANIFEST_FIELDS)
            w.writeheader()
            for r in sorted(rows, key=lambda r: r["case"]):
                w.writerow({k: r.get(k, "") for k in MANIFEST_FIELDS})
    except OSError as e:
        raise OutputError(f"cannot be written: {e.strerror or e}", path) from None
