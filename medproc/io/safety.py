"""Checks every reader makes before it trusts a file: what kind of file it is (never a FIFO or a
device), whether the sizes its header declares can be real (before any allocation), whether a
referenced data file stays inside the header's folder, and whether the affine is usable.

The memory cap is the smallest of the physical memory, the address-space limit of this process
(``ulimit -v``) and ``MEDPROC_MAX_BYTES`` (bytes; suffixes K, M, G, T allowed).
"""

from __future__ import annotations

import errno
import os
import stat

import numpy as np

from ..errors import LimitError, ReadError

__all__ = [
    "all_zero",
    "spacings_outside",
    "trailing_note",
    "max_bytes",
    "human",
    "check_file",
    "special_kind",
    "os_error",
    "check_declared",
    "check_inside",
    "is_within",
    "check_affine",
    "MAX_DEFLATE_RATIO",
    "SPACING_RANGE_MM",
]

#: deflate (gzip, zlib) cannot expand by more than ~1032x; a margin on top
MAX_DEFLATE_RATIO = 1100
#: voxel spacings outside this range (mm) are damaged headers, not images
SPACING_RANGE_MM = (1e-3, 1e5)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human(n: float) -> str:
    """A byte count in words: ``human(3 * 2**30) == '3 GiB'``."""
    n = float(min(n, 1e300))  # header sizes can be integers beyond float range
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def max_bytes() -> int:
    """The most bytes one volume may take in memory (see the module doc)."""
    caps = []
    env = os.environ.get("MEDPROC_MAX_BYTES", "").strip().upper().rstrip("B").rstrip("I")
    if env:
        unit = env[-1] if env[-1] in _UNITS else ""
        try:
            caps.append(int(float(env[: len(env) - len(unit)]) * _UNITS[unit]))
        except ValueError:
            raise ReadError(
                f"MEDPROC_MAX_BYTES={os.environ['MEDPROC_MAX_BYTES']!r} is not a size; "
                "use e.g. 8G or 8589934592"
            ) from None
    try:
        caps.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            caps.append(soft)
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX
        pass
    return min(caps) if caps else 2**40


def special_kind(mode: int) -> str | None:
    """``"a FIFO"``, ``"a character device"``... for a file mode that is not a regular file or
    a folder, else None."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return None if (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) else "of an unknown type"


def not_regular(kind: str, link: str = "") -> str:
    """``"is <kind><link>, not a regular file"``, with the remark about pipes and devices for
    those (a folder given for a file is only that)."""
    never = "" if kind == "a folder" else "; medproc never reads from pipes or devices"
    return f"is {kind}{link}, not a regular file{never}"


def os_error(e: OSError, path, doing: str = "read") -> ReadError:
    """A :class:`ReadError` for an ``OSError`` met while ``doing`` something with ``path``."""
    if e.errno in (errno.EACCES, errno.EPERM):
        return ReadError(
            f"permission denied: this user cannot {doing} it; fix its permissions "
            "(e.g. chmod a+r) or run as a user who can",
            path,
        )
    if e.errno == errno.ENOENT:
        return ReadError("no such file or folder (a broken symlink?); check the path", path)
    if e.errno == errno.ELOOP:
        return ReadError("is a symlink loop; fix or remove the link", path)
    if e.errno == errno.EISDIR:
        return ReadError("is a folder where a file was expected", path)
    return ReadError(f"cannot be {doing}: {e.strerror or e}", path)


def check_file(path, folder_ok: bool = False) -> os.stat_result:
    """``os.stat(path)`` (following symlinks) when ``path`` is a regular file (or, with
    ``folder_ok``, a folder); a :class:`ReadError` saying what it is otherwise. Never opens it,
    so a FIFO or a device cannot block or feed endless bytes."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise os_error(e, path, "open") from None
    kind = special_kind(st.st_mode)
    if kind is None and stat.S_ISDIR(st.st_mode) and not folder_ok:
        kind = "a folder"
    if kind is not None:
        link = " (through a symlink)" if os.path.islink(path) else ""
        raise ReadError(f"{not_regular(kind, link)}. Point it at a regular file", path)
    return st


def check_declared(
    path,
    what: str,
    nbytes: int,
    available: int | None = None,
    compressed: str | None = None,
    stored: int | None = None,
    peak: int | None = None,
) -> None:
    """Refuse a header whose declared data cannot be real, before anything is allocated.

    Parameters
    ----------
    what : str
        The declaration in words, e.g. ``"30000x30000x30000 int16 voxels"``.
    nbytes : int
        Bytes the declaration needs in memory.
    available : int, optional
        Bytes the file holds for the data (uncompressed data must fit in them).
    compressed : str, optional
        The compression (``"gzip"``...): the data then needs at least
        ``nbytes / MAX_DEFLATE_RATIO`` bytes in the file (``stored`` of them are there).
    peak : int, optional
        Bytes reading takes at once, when more than ``nbytes`` (e.g. the stored voxels and their
        scaled float64 copy); the memory cap applies to it.
    """
    cap = max_bytes()
    need = max(nbytes, peak or 0)
    if need > cap:
        also = f" ({human(need)} while reading)" if need > nbytes else ""
        raise LimitError(
            f"the header declares {what} = {human(nbytes)}{also}, more than the "
            f"{human(cap)} one volume may take here (the smallest of the physical memory, "
            "ulimit -v and MEDPROC_MAX_BYTES). The header is damaged, or the volume needs a "
            "bigger machine (or a higher ulimit -v or MEDPROC_MAX_BYTES, where one of them is "
            "the cap)",
            path,
        )
    if compressed and stored is not None and nbytes > MAX_DEFLATE_RATIO * max(stored, 1) + 2**20:
        raise LimitError(
            f"the header declares {what} = {human(nbytes)}, but {human(stored)} of {compressed} "
            f"data cannot expand to more than about {human(MAX_DEFLATE_RATIO * stored)}: the "
            "header is damaged or the file truncated",
            path,
        )
    if not compressed and available is not None and nbytes > available:
        raise LimitError(
            f"the header declares {what} = {nbytes} bytes, but the file holds only "
            f"{max(available, 0)} bytes of data: the file is truncated or its header is damaged",
            path,
        )


def trailing_note(extra: int, what: str) -> str | None:
    """A volume's note when its file holds ``extra`` bytes after the ``what`` its header
    declares (they are not read): a header whose sizes are too small reads as a cut volume."""
    if extra <= 0:
        return None
    return (
        f"the file holds {extra} byte(s) after the {what} its header declares; they are not "
        "read (if the header's sizes are wrong, the volume is cut: check them)"
    )


def is_within(path: str, folder: str, real: bool = False) -> bool:
    """Whether ``path`` is ``folder`` or lies under it, by absolute paths (by real paths, links
    resolved, with ``real``)."""
    norm = os.path.realpath if real else os.path.abspath
    path, folder = norm(os.fspath(path)), norm(os.fspath(folder))
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_inside(ref: str, header, kind: str = "data file") -> str:
    """The real path of ``ref`` (relative to ``header``'s folder) when it lies inside that
    folder and is a regular file; a :class:`ReadError` otherwise (path traversal, absolute paths
    elsewhere, symlinks out of the folder, devices, FIFOs)."""
    base = os.path.dirname(os.path.abspath(os.fspath(header)))
    target = os.path.realpath(os.path.join(base, ref))
    if not is_within(target, base, real=True):
        raise ReadError(
            f"its {kind} {ref!r} lies outside the header's folder ({target}); medproc reads "
            "detached data only beside its header. Move the data file next to the header and "
            "name it without '..' or an absolute path",
            header,
        )
    try:
        st = os.stat(target)
    except OSError as e:
        raise ReadError(
            f"its {kind} {ref!r} cannot be opened: {os_error(e, target).message}", header
        ) from None
    kind_name = special_kind(st.st_mode) or ("a folder" if stat.S_ISDIR(st.st_mode) else None)
    if kind_name:
        raise ReadError(f"its {kind} {ref!r} {not_regular(kind_name)}", header)
    return target


def spacings_outside(spacings) -> list[tuple[str, float]]:
    """``(axis, spacing)`` of the spacings outside :data:`SPACING_RANGE_MM`, in axis order
    (what the readers refuse, and so what medproc does not write)."""
    lo, hi = SPACING_RANGE_MM
    return [(ax, float(s)) for ax, s in zip("ijk", spacings) if not lo <= s <= hi]


def check_affine(affine, path, source: str = "the header") -> np.ndarray:
    """``affine`` as float64 4x4 when it is finite, invertible and its spacings are plausible
    (:data:`SPACING_RANGE_MM`); a :class:`ReadError` naming ``source`` otherwise."""
    a = np.asarray(affine, dtype=np.float64)
    fix = "The header is damaged: fix the file's geometry (e.g. rewrite it with nibabel or ITK)"
    if a.shape != (4, 4) or not np.all(np.isfinite(a)):
        raise ReadError(
            f"the voxel-to-world affine from {source} is not finite: {np.round(a, 4).tolist()}; "
            f"expected finite numbers. {fix}",
            path,
        )
    sp = np.sqrt((a[:3, :3] ** 2).sum(axis=0))
    lo, hi = SPACING_RANGE_MM
    bad = spacings_outside(sp)
    if bad:
        ax, s = bad[0]
        raise ReadError(
            f"the voxel spacing along {ax} is {s:.3g} mm (from {source}); expected {lo:g} to "
            f"{hi:g} mm. {fix}",
            path,
        )
    if abs(np.linalg.det(a[:3, :3] / sp)) < 1e-6:
        raise ReadError(
            f"the voxel axes from {source} are collinear (a singular affine: "
            f"{np.round(a[:3, :3], 4).tolist()}). {fix}",
            path,
        )
    return a


def all_zero(path: str, start: int, n: int) -> bool:
    """Whether the ``n`` bytes of ``path`` from ``start`` are all zero (DICOM's excess pixel
    padding; read 1 MiB at a time)."""
    with open(path, "rb") as f:
        f.seek(start)
        while n > 0:
            block = f.read(min(n, 1 << 20))
            if not block or block.count(0) != len(block):
                return False
            n -= len(block)
    return True
