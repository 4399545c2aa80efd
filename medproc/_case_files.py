"""Which files in an output folder are a case's own, and what it read: the rules that keep a
batch from touching what is not medproc's (:mod:`medproc._plan_batch`, :mod:`medproc._batch`).

- :func:`row_files`: the files a manifest row's case owns (its image, ``<name>.json``, label,
  annotations, QC picture). A case writes a path that exists only when it is among these, or
  when its ``<name>.json`` says medproc made it from the same input (:func:`made_from`, an
  output a killed run wrote but did not record); anything else is the user's and the case
  fails instead.
- :func:`input_identity`: size and modification time of every file a case reads (the image or
  the series' files, detached data, the label), hashed: a rerun redoes a case whose input
  changed (:func:`input_changed`).
- :func:`file_state` and :func:`take_back`: a failed case removes the files it wrote in this run
  (those whose identity changed since it started), nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

from ._convert_case import annotations_path, sidecar_path
from .io.atomic import is_temporary
from .manifest import is_finished

log = logging.getLogger("medproc.convert")

__all__ = [
    "row_files",
    "made_from",
    "input_identity",
    "files_read_by",
    "file_stamp",
    "input_changed",
    "side_files",
    "file_state",
    "take_back",
    "remove_files",
]

#: the largest ``<name>.json`` read to tell whether medproc wrote it
_SIDECAR_MAX = 4 << 20


def _rel(path: str) -> str:
    """A case file's name inside the output folder: ``x.nii.gz`` or ``qc/x.png``."""
    folder, name = os.path.split(path)
    return f"qc/{name}" if os.path.basename(folder) == "qc" else name


def row_files(row: dict | None) -> set[str]:
    """The names (as :func:`_rel` gives them) of the files an earlier run's manifest row owns:
    its image, sidecar, annotations, label and QC picture; none for a row that never wrote
    (failed before it started, e.g. because one of those files was someone else's: it has no
    ``options``)."""
    if not row or not (row.get("options") or is_finished(row)):
        return set()
    out = os.path.basename(row.get("output") or "")
    names = {out, os.path.basename(sidecar_path(out)), os.path.basename(annotations_path(out))}
    names = names if out else set()
    if row.get("label_output"):
        names.add(os.path.basename(row["label_output"]))
    if row.get("case"):
        names.add(f"qc/{row['case']}.png")
    return names


def owners(prior: dict) -> dict[str, str]:
    """{file name: the case owning it} over an earlier run's manifest rows."""
    return {f: nm for nm, r in prior.items() for f in row_files(r)}


def is_own(path: str, nm: str, prior: dict) -> bool:
    """Whether the case ``nm`` of an earlier run (any status) owns ``path``."""
    return _rel(path) in row_files(prior.get(nm))


def taken(paths, nm: str, owner: dict[str, str]) -> bool:
    """Whether one of ``paths`` exists and belongs to another case than ``nm``."""
    return any(owner.get(_rel(p), nm) != nm and os.path.lexists(p) for p in paths)


def _medproc_sidecar(sidecar: str) -> dict | None:
    """The ``<name>.json`` at ``sidecar`` when medproc wrote it (it holds ``medproc_version``),
    else None."""
    try:
        if not os.path.isfile(sidecar) or os.path.getsize(sidecar) > _SIDECAR_MAX:
            return None
        with open(sidecar, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "medproc_version" in doc else None


def _same_input(doc: dict, case) -> bool:
    from .io.walk import file_identity

    src, uid = doc.get("source"), doc.get("series_uid")
    if case.dicom is not None and uid and uid == case.dicom.uid:
        return True
    return isinstance(src, str) and file_identity(src) == file_identity(case.source)


def made_from(sidecar: str, case) -> bool:
    """Whether ``sidecar`` is a ``<name>.json`` medproc wrote for ``case``'s input (the same
    file or folder, or the same DICOM series): the files of that output name are medproc's."""
    doc = _medproc_sidecar(sidecar)
    return doc is not None and _same_input(doc, case)


def _files_read(case) -> list[str]:
    """The files converting ``case`` reads for its image."""
    return files_read_by(case.source, case.dicom)


def files_read_by(source, dicom=None) -> list[str]:
    """The files reading the image ``source`` reads: a scanned DICOM series' files (``dicom``),
    every file under a folder, or the file (with a NRRD or MetaImage header's detached data)."""
    source = os.fspath(source)
    if dicom is not None:
        return list(dicom.files)
    if os.path.isdir(source):
        return sorted(os.path.join(d, n) for d, _, ns in os.walk(source) for n in ns)
    files = [source]
    if source.lower().endswith((".nhdr", ".mhd")):
        try:
            from .io.itk_header import check_itk_header

            files += list(check_itk_header(source).data_files)
        except Exception:  # noqa: BLE001 - a bad header fails the case when it is read
            pass
    return files


def file_stamp(files: list[str]) -> str:
    """A short hash of the size and modification time (ns) of each of ``files``."""
    h = hashlib.sha1()
    for p in files:
        try:
            st = os.stat(p)
            h.update(f"{st.st_size}:{st.st_mtime_ns}\n".encode())
        except OSError:  # (a file that cannot be looked at counts as missing)
            h.update(b"-\n")
    return h.hexdigest()[:16]


def input_identity(case) -> str:
    """Short hashes of the size and modification time (ns) of every file ``case`` reads: its
    image's, then ``+`` its label map's. They change when an input is replaced, edited or
    touched, not when it is only read."""
    return file_stamp(_files_read(case)) + (f"+{file_stamp([case.label])}" if case.label else "")


def input_changed(old: str, new: str) -> bool:
    """Whether an earlier run's :func:`input_identity` ``old`` and this run's ``new`` show a
    changed input: the image's differs, or the label map's where both runs read one (a rerun
    without ``--labels`` is not a change). An ``old`` that was not recorded (an older medproc)
    is no change."""
    if not old or not new:
        return False
    (a, _, la), (b, _, lb) = old.partition("+"), new.partition("+")
    return a != b or bool(la and lb and la != lb)


def side_files(old: dict, outdir: str, nm: str, outputs: list[str], case) -> list[str]:
    """The files of an earlier run's row ``old`` of case ``nm`` (the same output) that a redo
    writing ``outputs`` does not write: its label (named in the row, or in the sidecar medproc
    wrote for ``case``: a skip without ``--labels`` leaves the row without it), annotations and
    QC picture, where they exist (removed by the redo: no file of the old run stays beside the
    new ones)."""
    if not old or os.path.basename(old.get("output") or "") != os.path.basename(outputs[0]):
        return []  # (another image name: those outputs are superseded and stay)
    out = os.path.join(outdir, os.path.basename(old["output"]))
    cands = [annotations_path(out), os.path.join(outdir, "qc", f"{nm}.png")]
    label = old.get("label_output") or _sidecar_label(sidecar_path(out), case)
    if label:
        cands.append(os.path.join(outdir, os.path.basename(label)))
    keep = {os.path.abspath(p) for p in outputs}
    return [p for p in cands if os.path.abspath(p) not in keep and os.path.lexists(p)]


def _sidecar_label(sidecar: str, case) -> str:
    """The label output a ``<name>.json`` medproc wrote for ``case`` names ("" if none)."""
    doc = _medproc_sidecar(sidecar)
    if doc is None or not _same_input(doc, case):
        return ""
    label = doc.get("label_output")
    return label if isinstance(label, str) else ""


def file_state(path: str):
    """What tells whether ``path`` was written since: (device, inode, size, mtime) or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def take_back(outputs: list[str], before: dict) -> list[str]:
    """Remove the ``outputs`` written since ``before`` (their :func:`file_state` then), and
    their temporaries; returns the files removed."""
    import glob

    gone = []
    for p in outputs:
        now = file_state(p)
        if now is not None and now != before.get(p):
            gone += remove_files([p])
        folder, name = os.path.split(p)
        for tmp in glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(name)}.*.part*")):
            if is_temporary(os.path.basename(tmp)):  # (the user's own ".<name>.v2.partial" stay)
                remove_files([tmp])
    return gone


def remove_files(paths) -> list[str]:
    """Remove ``paths`` (files; names only for links); returns those removed."""
    gone = []
    for p in paths:
        try:
            os.unlink(p)
            gone.append(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("%s: could not be removed (%s)", p, e.strerror)
    return gone
