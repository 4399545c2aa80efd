"""Atomic writes: every file medproc writes goes to a temporary name beside its target and is
renamed into place, so a crash or ``kill -9`` never leaves a half-written file under its name."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Iterator

__all__ = ["atomic_path", "atomic_write", "atomic_dir", "is_temporary", "make_parent"]

_UMASK = os.umask(0)
os.umask(_UMASK)


def _ext(name: str) -> str:
    return ".nii.gz" if name.lower().endswith(".nii.gz") else os.path.splitext(name)[1]


def atomic_path(path: str) -> str:
    """A new temporary file beside ``path`` (same folder, same extension) for an atomic write:
    ``.<name>.<random>.part<ext>`` (see :func:`is_temporary`).

    The file gets the usual permissions (0666 less the umask), not mkstemp's private 0600, so
    the renamed output is readable like any other file the user writes."""
    d, name = os.path.split(os.path.abspath(path))
    ext = _ext(name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".part{ext}", dir=d)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)
    return tmp


#: ``.<name>.<random>.part<ext>``: the random part is tempfile's (8 of ``a-z0-9_``)
_TEMP = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{6,8}\.part(?P<ext>(\.[A-Za-z0-9]+){0,2})$")


def is_temporary(name: str, targets: tuple[str, ...] | None = None) -> bool:
    """Whether the file name ``name`` is one :func:`atomic_path` makes: ``.<target>.<random>
    .part<ext>`` where ``<ext>`` is the target's own extension, and (``targets``: extensions
    such as ``(".nii.gz", ".json")``) the target ends with one of them. Other hidden files
    that hold ``.part`` (``.dataset.tar.part``, ``.thesis.part.docx``) are not.

    >>> is_temporary(".case1.nii.gz.k2j3h4g5.part.nii.gz"), is_temporary(".thesis.part.docx")
    (True, False)
    >>> is_temporary(".dataset.tar.part"), is_temporary(".x.nii.gz.abcdefgh.part.json")
    (False, False)
    >>> is_temporary(".a.txt.abcdefgh.part.txt"), is_temporary(".a.txt.abcdefgh.part.txt", (".nii",))
    (True, False)
    """
    m = _TEMP.match(name)
    if not m or _ext(m["target"]) != m["ext"]:
        return False
    return targets is None or m["target"].lower().endswith(tuple(targets))


def make_parent(path: str) -> None:
    """Create the folder ``path`` goes in (and those above it) where missing; a file in the way
    is a NotADirectoryError that names it ("File exists" named nothing)."""
    parent = os.path.dirname(os.path.abspath(path))
    above = parent
    while not os.path.lexists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if os.path.lexists(above) and not os.path.isdir(above):
        what = "parent" if above == parent else "ancestor"
        raise NotADirectoryError(
            errno.ENOTDIR, f"its {what} {above} is not a folder (a file)", above
        )
    os.makedirs(parent, exist_ok=True)


def atomic_dir(path: str, kind: str = "part") -> str:
    """A new temporary folder beside ``path``, for a folder built then renamed into place; with
    the usual permissions (0777 less the umask), not mkdtemp's private 0700."""
    d, name = os.path.split(os.path.abspath(path))
    tmp = tempfile.mkdtemp(prefix=f".{name}.{kind}-", dir=d)
    os.chmod(tmp, 0o777 & ~_UMASK)
    return tmp


@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[str]:
    """Yield a temporary path to write; on success it replaces ``path``, on error it is removed.

    >>> import json, tempfile, os
    >>> out = os.path.join(tempfile.mkdtemp(), "doc.json")
    >>> with atomic_write(out) as tmp:
    ...     with open(tmp, "w") as f:
    ...         json.dump({"ok": True}, f)
    >>> json.load(open(out))
    {'ok': True}
    """
    path = os.fspath(path)
    make_parent(path)
    tmp = atomic_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
