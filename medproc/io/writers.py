"""Fast, atomic output writers for batch conversion.

``.nii.gz`` is written by serialising the NIfTI image once and compressing it with ISA-L's
igzip (the ``isal`` package): 2-5x faster than zlib, and the decompressed bytes are exactly
nibabel's. Every file is written to a temporary name beside the target and renamed.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..volume import Volume
from . import atomic_path

__all__ = ["write_volume", "FORMATS"]

FORMATS = ("nii.gz", "nii", "npy")


def _replace(tmp: str, path: str) -> None:
    os.replace(tmp, path)


def write_volume(volume: Volume, path: str, compresslevel: int = 1) -> str:
    """Write ``volume`` atomically; the format follows the extension (.nii.gz, .nii, .npy).

    ``.npy`` is the training cache read by DALI's numpy reader: the array as is (C order,
    axis 0 slowest) plus ``<name>.json`` with the affine and metadata.
    """
    from .nifti import to_nibabel

    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    low = path.lower()
    tmp = atomic_path(path)
    try:
        if low.endswith(".nii.gz"):
            from isal import igzip

            raw = to_nibabel(volume).to_bytes()
            with open(tmp, "wb") as f:
                f.write(igzip.compress(raw, compresslevel=compresslevel))
        elif low.endswith(".nii"):
            with open(tmp, "wb") as f:
                f.write(to_nibabel(volume).to_bytes())
        elif low.endswith(".npy"):
            np.save(tmp, np.ascontiguousarray(volume.array), allow_pickle=False)
            side = path[:-4] + ".json"
            stmp = atomic_path(side)
            with open(stmp, "w") as f:
                json.dump({"affine": volume.affine.tolist(), "shape": list(volume.array.shape),
                           "dtype": str(volume.array.dtype)}, f)
            _replace(stmp, side)
        else:
            raise ValueError(f"cannot write {path!r}: use one of {FORMATS}")
        _replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
