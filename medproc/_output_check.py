"""Whether a finished output still holds what was written: its size against what its own header
declares (a ``.npy``'s header, a ``.nii``'s header, a ``.nii.gz``'s gzip trailer), so that a
resumed run redoes a case whose output was cut short or replaced, instead of skipping it as
done. Reads a few hundred bytes per file; damage that keeps the size is not seen."""

from __future__ import annotations

import gzip
import os

import numpy as np

__all__ = ["damaged"]


def damaged(path: str) -> str | None:
    """Why the output ``path`` is not whole (None: its size is what its header declares)."""
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
            return None if size == want else _said(size, want)
        if low.endswith((".nii", ".nii.gz")):
            import nibabel as nib

            gz = low.endswith(".gz")
            with (gzip.open if gz else open)(path, "rb") as f:
                hdr = nib.Nifti1Header.from_fileobj(f)
            shape = hdr.get_data_shape()
            want = int(hdr.get_data_offset()) + int(np.prod(shape, dtype=object)) * int(
                hdr.get_data_dtype().itemsize
            )
            if not gz:
                return None if size == want else _said(size, want)
            with open(path, "rb") as f:  # (one gzip member: its length modulo 2^32)
                f.seek(-4, os.SEEK_END)
                isize = int.from_bytes(f.read(4), "little")
            return None if isize == want % (1 << 32) else "its gzip data ends early or late"
    except (OSError, ValueError, EOFError) as e:
        return f"it cannot be read ({type(e).__name__}: {e})"
    return None


def _said(size: int, want: int) -> str:
    return f"it holds {size} bytes where its header declares {want}"
