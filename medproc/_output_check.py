"""Whether a finished output still holds what was written: its size against what its own header
declares (a ``.npy``'s header, a ``.nii``'s header, a ``.nii.gz``'s gzip trailer) and its
header's shape and dtype against its sidecar's, so that a resumed run redoes a case whose output
was cut short or replaced, instead of skipping it as done. Reads a few hundred bytes per file;
damage that keeps the size and the header is not seen, unless ``--verify`` asks for
:func:`unreadable`: every file read whole (a ``.nii.gz``'s gzip checksum checked)."""

from __future__ import annotations

import gzip
import os

import numpy as np

__all__ = ["damaged", "unreadable", "unreadable_all"]


def damaged(path: str, shape=None, dtype=None) -> str | None:
    """Why the output ``path`` is not whole (None: its size is what its header declares, and
    its header's shape and dtype are ``shape`` and ``dtype`` where given: what its sidecar
    recorded, so another case's file put in its place shows)."""
    got = _header(path)
    if isinstance(got, str):
        return got
    (hshape, hdtype), want, size = got
    if shape is not None and tuple(hshape[:3]) != tuple(int(x) for x in shape[:3]):
        return f"its header says shape {tuple(hshape)}, its sidecar {tuple(shape)}"
    if dtype is not None and np.dtype(hdtype) != np.dtype(dtype):
        return f"its header says dtype {np.dtype(hdtype)}, its sidecar {dtype}"
    return None if want is None or size == want else _said(size, want)


def _header(path: str):
    """((shape, dtype), the bytes the header declares (None: not checked), the size), or why
    it cannot be read."""
    try:
        size = os.path.getsize(path)
        low = path.lower()
        if low.endswith(".npy"):
            with open(path, "rb") as f:
                major, _ = np.lib.format.read_magic(f)
                read = (
                    np.lib.format.read_array_header_1_0
                    if major == 1
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read(f)
                want = f.tell() + int(np.prod(shape, dtype=object)) * dtype.itemsize
            return (shape, dtype), want, size
        if low.endswith((".nii", ".nii.gz")):
            import nibabel as nib

            gz = low.endswith(".gz")
            with (gzip.open if gz else open)(path, "rb") as f:
                hdr = nib.Nifti1Header.from_fileobj(f)
            shape = hdr.get_data_shape()
            want = int(hdr.get_data_offset()) + int(np.prod(shape, dtype=object)) * int(
                hdr.get_data_dtype().itemsize
            )
            head = (shape, hdr.get_data_dtype())
            if not gz:
                return head, want, size
            with open(path, "rb") as f:  # (one gzip member: its length modulo 2^32)
                f.seek(-4, os.SEEK_END)
                isize = int.from_bytes(f.read(4), "little")
            if isize != want % (1 << 32):
                return "its gzip data ends early or late"
            return head, None, size
    except (OSError, ValueError, EOFError, TypeError) as e:
        return f"it cannot be read ({type(e).__name__}: {e})"
    return ((), "u1"), None, 0  # (another format: not checked)


def _said(size: int, want: int) -> str:
    return f"it holds {size} bytes where its header declares {want}"


def unreadable(path: str) -> str | None:
    """Why ``path`` cannot be read whole (None: it can): a ``.gz`` is decompressed to its end,
    which checks its CRC-32 and length; other files are read to their end (I/O errors)."""
    from isal import igzip

    try:
        with igzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    except Exception as e:  # noqa: BLE001 - a damaged stream: BadGzipFile, IsalError, EOFError...
        return f"it cannot be read whole ({type(e).__name__}: {e})"
    return None


def unreadable_all(paths) -> dict:
    """``{path: why}`` for the ``paths`` that cannot be read whole, read on a thread per core
    (decompression releases the interpreter lock)."""
    from concurrent.futures import ThreadPoolExecutor

    from ._procs import _cores

    paths = sorted(set(paths))
    ex = ThreadPoolExecutor(max(1, min(len(paths), _cores())))
    try:
        return {p: why for p, why in zip(paths, ex.map(unreadable, paths)) if why}
    finally:  # (Ctrl-C, SIGTERM: the files not begun are not read)
        ex.shutdown(wait=True, cancel_futures=True)
