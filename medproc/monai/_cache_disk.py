"""PatchLoader's ``cache_dir``: an entry's name (its input files, the spec), and how an entry
is written, read back (checked against its json: damaged or mixed-up entries are rebuilt, never
used) and removed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

from ._cache_entry import VERSION, Entry

__all__ = ["cache_key"]


def _stat(path) -> list:
    """The path and a stamp (size, modification time) of every file reading it reads: each
    file of a DICOM folder, a MetaImage's or NRRD's detached data (a slice edited in place
    left the folder's own stamp as it was, and its stale entry was used)."""
    from .._case_files import file_stamp, files_read_by

    try:
        return [os.path.abspath(path), file_stamp(files_read_by(path))]
    except (OSError, TypeError):
        return [str(path)]


def cache_key(case: dict, spec, image_threshold) -> str:
    """A case's entry name: its files (paths, sizes, modification times: see :func:`_stat`),
    the spec, the background threshold and the format version."""
    doc = [
        VERSION,
        _stat(case["image"]),
        _stat(case["label"]) if case.get("label") is not None else None,
        repr(spec),
        image_threshold,
    ]
    return hashlib.sha1(json.dumps(doc, default=str).encode()).hexdigest()[:20]


def _write(entry: Entry, base: str) -> None:
    """Write an entry as ``base``{_image.npy, _label.npy, _index.npz, .json}; the json last
    (atomically): its presence means the entry is complete."""
    from ..io import atomic_write

    image, label = entry.host_image(), entry.host_label()
    with atomic_write(base + "_image.npy") as tmp:
        np.save(tmp, image)
    if label is not None:
        with atomic_write(base + "_label.npy") as tmp:
            np.save(tmp, label)
    with atomic_write(base + "_index.npz") as tmp:
        extra = {"bg_bits": entry.bg_bits} if entry.bg_bits is not None else {}
        if entry.bg_index is not None:
            extra["bg_index"] = entry.bg_index
        np.savez(tmp, fg=entry.fg, **extra)
    doc = {
        "version": VERSION,
        "image": str(entry.case["image"]),
        "label": None if entry.case.get("label") is None else str(entry.case["label"]),
        "shape": list(entry.shape),
        "affine": entry.affine.tolist(),
        "intensity": None if entry.intensity is None else list(entry.intensity),
        "has_label": entry.label is not None,
        "n_bg": entry.n_bg,
        "order": _order(image),  # (a flipped fortran_order in the .npy header shows)
        # dtype, shape and samples of the bytes of each array (another case's files of the same
        # shape, or another dtype, show; see _sample)
        "sample": _samples(image, label, entry.fg, entry.bg_bits, entry.bg_index),
    }
    with atomic_write(base + ".json") as tmp, open(tmp, "w") as f:
        json.dump(doc, f)


def _order(a) -> str | None:
    """ "F" or "C": how a saved array's bytes are ordered (None: neither)."""
    return (
        "F"
        if a.flags.f_contiguous and not a.flags.c_contiguous
        else ("C" if a.flags.c_contiguous else None)
    )


#: set bits of each byte value (a bitmap's count, numpy < 2 has no bitwise_count)
_BITS = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _samples(image, label, fg, bg_bits, bg_index) -> dict:
    """:func:`_sample` of each array of an entry (the background's too: a zeroed bitmap made
    the background sampler loop for ever, a prober's finding)."""
    return {
        "image": _sample(image),
        "label": _sample(label),
        "fg": _sample(fg),
        "bg": _sample(bg_index if bg_index is not None else bg_bits),
    }


def _sample(a, n: int = 16384) -> str | None:
    """A short hash of ``a``'s dtype, shape and three runs of ``n`` values (its first, middle
    and last, in memory order: a few pages of a memory-mapped entry, not the whole file)."""
    if a is None:
        return None
    flat = np.asarray(a).ravel(order="K")
    mid = max(0, flat.size // 2 - n // 2)
    h = hashlib.sha1(f"{a.dtype.str}{tuple(a.shape)}".encode())
    for part in (flat[:n], flat[mid : mid + n], flat[-n:]):
        h.update(np.ascontiguousarray(part).tobytes())
    return h.hexdigest()[:16]


def _regular(*paths: str) -> bool:
    """Whether every one of ``paths`` is a regular file (through links: the readers' check)."""
    from ..errors import ReadError
    from ..io.safety import check_file

    try:
        for p in paths:
            check_file(p)
    except ReadError:
        return False
    return True


def _read(case: dict, base: str) -> Entry | None:
    """The entry written by :func:`_write`, memory-mapped; None when absent or damaged (then
    rebuilt): its files must agree with its json (the case it was made from, its shape, the
    label's shape, indices inside the volume). Damage inside the voxels, which a header does
    not show, is not found. A file of it that is not a regular file (a FIFO would block the
    loader for ever) is damage too."""
    if not _regular(base + ".json", base + "_image.npy", base + "_index.npz"):
        return None
    try:
        with open(base + ".json") as f:
            doc = json.load(f)
        if doc.get("version") != VERSION or doc.get("image") != str(case["image"]):
            return None
        label = None if case.get("label") is None else str(case["label"])
        shape = tuple(int(x) for x in doc["shape"])
        if doc.get("label") != label or len(shape) != 3 or bool(doc["has_label"]) != bool(label):
            return None
        image = np.load(base + "_image.npy", mmap_mode="r")
        if label and not _regular(base + "_label.npy"):
            return None
        lab = np.load(base + "_label.npy", mmap_mode="r") if label else None
        if image.shape != shape or (lab is not None and lab.shape != shape):
            return None
        if _order(image) is None or doc.get("order", _order(image)) != _order(image):
            return None
        with np.load(base + "_index.npz") as idx:
            fg = idx["fg"]
            bg_bits = idx["bg_bits"] if "bg_bits" in idx.files else None
            bg_index = idx["bg_index"] if "bg_index" in idx.files else None
        if doc.get("sample") != _samples(image, lab, fg, bg_bits, bg_index):
            return None
        n = int(np.prod(shape))
        for a in (fg, bg_index):
            if a is not None and a.size and (a.min() < 0 or a.max() >= n):
                return None
        if bg_bits is not None and bg_bits.size * 8 < n:
            return None
        affine = np.array(doc["affine"], dtype=np.float64).reshape(4, 4)
        inten = doc["intensity"]  # (the json's own fields are checked too: a prober's finding)
        if inten is not None and (len(inten) != 4 or not np.all(np.isfinite(inten))):
            return None
        n_bg = int(doc["n_bg"])
        bg_count = bg_index.size if bg_index is not None else None
        if bg_count is None and bg_bits is not None:
            bg_count = int(_BITS[bg_bits].sum(dtype=np.int64))  # (no n-byte unpacked copy)
        if not np.all(np.isfinite(affine)) or not 0 <= n_bg <= n or bg_count not in (None, n_bg):
            return None
        return Entry(
            case=case,
            shape=shape,
            affine=affine,
            intensity=None if inten is None else tuple(inten),
            image=image,
            label=lab,
            fg=fg,
            bg_bits=bg_bits,
            bg_index=bg_index,
            n_bg=n_bg,
        )
    except Exception:  # noqa: BLE001 - a damaged entry (BadZipFile, EOFError, a null field...)
        return None


def _unlink(base: str) -> None:
    for suffix in ("_image.npy", "_label.npy", "_index.npz", ".json"):
        try:
            os.unlink(base + suffix)
        except FileNotFoundError:
            pass


#: a temporary of an entry older than this was left by a killed build (a build writes each
#: file in seconds), and is removed by the next
_LEFT_S = 3600


def _writable(cache_dir: str) -> bool:
    """Make ``cache_dir``; False (said once) when entries cannot be written there: then the
    entries it lacks are built in memory, and those it holds are still read. Temporaries a
    killed build left there (older than an hour) are removed."""
    import time
    import warnings

    from ..errors import MedprocWarning
    from ..io.atomic import is_temporary

    try:
        os.makedirs(cache_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".medproc-write-test.", dir=cache_dir)
        os.close(fd)
        os.unlink(probe)
        for name in os.listdir(cache_dir):
            p = os.path.join(cache_dir, name)
            if is_temporary(name, (".npy", ".npz", ".json")):
                try:
                    if time.time() - os.lstat(p).st_mtime > _LEFT_S:
                        os.unlink(p)
                except OSError:
                    pass
        return True
    except OSError as e:
        warnings.warn(
            f"cache_dir {cache_dir}: cannot write there ({e.strerror}): the entries it lacks "
            "are built in memory for this run, not kept",
            MedprocWarning,
            stacklevel=4,
        )
        return False


def _scratch() -> str:
    """A temporary folder for decoded voxels: in RAM (/dev/shm) when it has room."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    if base is not None and shutil.disk_usage(base).free < 4 << 30:
        base = None
    return tempfile.mkdtemp(prefix="medproc-patch-", dir=base)
