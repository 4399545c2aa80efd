"""Walking input trees safely: every file once (known by device and inode, :func:`file_identity`:
a symbolic or hard link is another name of its file, listed as skipped, and the file's own name
is kept over a link's), folders that cannot be listed reported, FIFOs, devices, sockets and
broken symlinks never opened, and excluded folders (an output folder inside an input tree,
earlier medproc outputs, training datasets medproc wrote from them) never entered.

Symlinked folders are followed (dataset trees are often assembled from links), each real folder
is entered once: a link back to a folder above it (a loop) or to a folder already walked is
skipped, with the reason.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .atomic import is_temporary
from .safety import is_within, special_kind

#: hidden files said when skipped: those named like images (``._case.nii.gz`` of macOS...);
#: other hidden files (.DS_Store...) pass unsaid
_HIDDEN_SAID = (".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd", ".dcm")

__all__ = [
    "Walk",
    "walk_inputs",
    "is_medproc_output",
    "file_identity",
    "excluded_folders",
    "link_to_output",
    "another_name",
    "SOURCE_MARK",
]

#: the first line of a ``manifest.csv`` that ``medproc convert`` wrote
_MANIFEST_HEAD = "case,source,output,"
#: in a training dataset medproc wrote (``--layout``): the real path of the converted folder
SOURCE_MARK = ".medproc_source"


def file_identity(path: str, st: os.stat_result | None = None):
    """What makes two names one file: (device, inode) of what ``path`` leads to (``st``: its
    stat, when known), else its real path (no stat, or a file system that reports inode 0)."""
    try:
        st = st or os.stat(path)
        if st.st_ino:
            return (st.st_dev, st.st_ino)
    except OSError:
        pass
    return os.path.realpath(path)


def another_name(first: str) -> str:
    """Why a name is skipped: it names a file found already, under ``first``."""
    return f"another name of {first} (the same file): read once"


#: what an excluded folder is, when the caller does not say (:func:`excluded_folders`)
OUTPUT_FOLDER = "the output folder"


def excluded_folders(exclude) -> dict[str, str]:
    """``exclude`` as ``{real path: what the folder is}``: a mapping as given (e.g. ``{out:
    "the output folder", labels: "the labels folder (--labels)"}``), else output folders."""
    items = (
        exclude.items() if isinstance(exclude, Mapping) else ((e, OUTPUT_FOLDER) for e in exclude)
    )
    return {os.path.realpath(os.fspath(e)): what for e, what in items}


def link_to_output(path: str, excluded: Mapping[str, str]) -> str | None:
    """Why the symlink ``path`` is not an input (it leads to a file directly in one of the
    folders ``excluded``, from :func:`excluded_folders`: an output, a label map), or None."""
    if not os.path.islink(path):
        return None
    real = os.path.realpath(path)
    what = excluded.get(os.path.dirname(real))
    return f"a link into {what} ({real}): not an input" if what else None


def dataset_source(folder: str) -> str | None:
    """The converted folder a training dataset medproc wrote came from, or None."""
    try:
        with open(os.path.join(folder, SOURCE_MARK)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def is_medproc_output(folder: str) -> bool:
    """True when ``folder`` holds a ``manifest.csv`` written by ``medproc convert``."""
    p = os.path.join(folder, "manifest.csv")
    try:
        if not stat.S_ISREG(os.stat(p).st_mode):
            return False
        with open(p, "rb") as f:
            return f.read(len(_MANIFEST_HEAD)).decode("latin-1") == _MANIFEST_HEAD
    except OSError:
        return False


@dataclass
class Walk:
    """What a walk found: regular ``files`` (in order, each file once under one name), ``skipped``
    ``(path, reason)`` never opened (special files, broken links, excluded folders), and
    ``bad`` ``(path, reason)``: things that could not be looked at (unlistable folders) or that
    were named explicitly but are not regular files."""

    files: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)


def _kind(path: str) -> tuple[str | None, int | None]:
    """(reason it is not a readable regular file or None, st_mode)."""
    try:
        st = os.stat(path)
    except OSError as e:
        if os.path.islink(path):
            return "is a broken symlink (or a symlink loop)", None
        if not os.path.lexists(path):
            return "no such file or folder; check the path", None
        return f"cannot be examined: {e.strerror}", None
    kind = special_kind(st.st_mode)
    if kind is not None:
        via = " (through a symlink)" if os.path.islink(path) else ""
        return f"is {kind}{via}: never opened", st.st_mode
    return None, st.st_mode


def walk_inputs(
    paths: Iterable,
    keep=None,
    exclude: Iterable[str] | Mapping[str, str] = (),
    skip_names=(),
    skip_outputs: bool = True,
) -> Walk:
    """Regular files under ``paths`` (folders searched recursively, sorted).

    Parameters
    ----------
    keep : callable, optional
        ``keep(name) -> bool`` on file names found in folders (explicit files are always kept).
        A kept name that is not a readable regular file (a FIFO, a device, a broken link) is
        listed in ``bad``: it claims to be what the caller wants.
    exclude : iterable of str, or mapping
        Folders never entered (compared by real path), e.g. the output folder; a mapping says
        what each is (see :func:`excluded_folders`), for the reasons listed in ``skipped``.
    skip_names : tuple of str
        Lower-case suffixes of file names ignored in folders without a word.
    skip_outputs : bool
        Do not enter sub-folders holding ``medproc convert`` outputs (a ``manifest.csv``), nor
        training datasets medproc wrote from outputs among ``paths`` or from an ``exclude``d
        folder (:data:`SOURCE_MARK`).
    """
    paths = [os.fspath(p) for p in paths]
    out = Walk()
    seen: dict = {}  # a file's identity (device, inode) -> its place in out.files
    links: list[bool] = []  # per out.files: whether that name is a symlink
    walked: set[str] = set()  # real paths of the folders entered: each once, no loops
    excluded = excluded_folders(exclude)
    roots = [os.path.realpath(os.fspath(p)) for p in paths]

    def derived(folder: str) -> str | None:
        """Why ``folder`` is a training dataset medproc wrote from outputs among these inputs
        (or from the output folder), or None."""
        src = dataset_source(folder)
        if src and (src in excluded or any(is_within(src, r, real=True) for r in roots)):
            return (
                f"a training dataset medproc wrote from {src} ({SOURCE_MARK}): its images are "
                "those outputs; name this folder itself to convert it"
            )
        return None

    def add(p: str, st: os.stat_result | None = None):
        """One file under the name ``p`` (``st``: its lstat, when it is a regular file);
        another name of a file found already (a symlink, a hard link) is listed as skipped,
        the file itself kept rather than a link to it."""
        link = st is None and os.path.islink(p)
        why = link and link_to_output(p, excluded)  # (a regular file's folder was checked)
        if why:
            out.skipped.append((p, why))
            return
        ident = file_identity(p, st)
        i = seen.get(ident)
        if i is None:
            seen[ident] = len(out.files)
            out.files.append(p)
            links.append(link)
            return
        first = out.files[i]
        if os.path.abspath(first) == os.path.abspath(p):
            return  # the same name twice
        if links[i] and not link:  # the file itself wins over a link to it
            out.files[i], links[i], first, p = p, link, p, first
        out.skipped.append((p, another_name(first)))

    for p in paths:
        p = os.fspath(p)
        reason, mode = _kind(p)
        if mode is not None and stat.S_ISDIR(mode):
            real = os.path.realpath(p)
            if real in excluded:
                out.skipped.append((p, f"{excluded[real]}: never read as an input"))
                continue
            if real in walked:
                continue  # named twice, or inside a folder named before: its files are listed
            walked.add(real)

            def onerror(e, _p=p):
                out.bad.append((e.filename or _p, f"the folder cannot be listed: {e.strerror}"))

            for root, dirs, files in os.walk(p, onerror=onerror, followlinks=True):
                dirs.sort()
                above = os.path.realpath(root).rstrip(os.sep) + os.sep  # (once per folder)
                for d in list(dirs):
                    full = os.path.join(root, d)
                    real = os.path.realpath(full)
                    up = above.startswith(real.rstrip(os.sep) + os.sep)  # root lies under it
                    if real in excluded:
                        dirs.remove(d)
                        out.skipped.append((full, f"{excluded[real]}: never read as an input"))
                    elif real in walked or up:
                        dirs.remove(d)  # (a link up the tree, to `..` or `/`, led out of the
                        # input, into its siblings and the whole file system: not followed)
                        if up:
                            why = f"a symlink to {real}, a folder above it (a loop): not followed"
                        else:
                            why = f"a symlink to {real}, a folder already scanned"
                        out.skipped.append((full, why))
                    elif skip_outputs and is_medproc_output(full):
                        dirs.remove(d)
                        out.skipped.append(
                            (full, "holds medproc convert outputs (manifest.csv): not an input")
                        )
                    elif skip_outputs and (why := derived(full)):
                        dirs.remove(d)
                        out.skipped.append((full, why))
                    else:
                        walked.add(real)
                for name in sorted(files):
                    low = name.lower()
                    if name.startswith(".") and low.endswith(_HIDDEN_SAID):
                        if not is_temporary(name):  # (medproc's own: cleared by a run)
                            why = "a hidden file (its name starts with '.'): not read"
                            out.skipped.append((os.path.join(root, name), why))
                        continue
                    if name.startswith(".") or low.endswith(tuple(skip_names)):
                        continue
                    if keep is not None and not keep(name):
                        continue
                    full = os.path.join(root, name)
                    try:
                        st = os.lstat(full)
                    except OSError:
                        st = None
                    if st is not None and stat.S_ISREG(st.st_mode):
                        # a regular file (not a link): known by its lstat's inode, no
                        # realpath (one call per path component: 0.3 s for 6,600 files on 2
                        # cores, in the main process, before any work)
                        add(full, st)
                        continue
                    why, fmode = _kind(full)
                    if why is None:
                        add(full)
                    elif keep is not None:  # named like a wanted file, but cannot be one
                        out.bad.append((full, why.replace(": never opened", ", not a file")))
                    else:
                        out.skipped.append((full, why))
        elif reason is not None:
            if mode is not None:  # named explicitly, but a FIFO, a device...
                reason = reason.replace(": never opened", "") + (
                    ", not an image file or folder; medproc never reads from pipes or devices"
                )
            out.bad.append((p, reason))
        else:
            add(p)
    return out
