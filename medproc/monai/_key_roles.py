"""Which keys of :class:`~medproc.monai.Resampled` are images and which label maps: warnings
when a key's mode and its values disagree (a label map interpolated as an image, or an image
taken for a label map by the default ``mode``)."""

from __future__ import annotations

import numpy as np
import torch

from ..pipeline._dtypes import _dtype_name

__all__ = ["label_named", "say_label_as_image", "say_image_as_label", "check_loadimaged_kwargs"]


def label_named(key) -> bool:
    return any(w in str(key).lower() for w in ("label", "seg", "mask"))


def say_label_as_image(keys, vols, roles) -> bool:
    """Warn (once: returns True) when a key after the first, resampled as an image, holds what
    looks like a label map: whole numbers named like one or with few values. With one mode for
    every key it gets the spec's intensity step and interpolation (a label of 0/1/2 clipped and
    scaled came back as 0.714-0.716 everywhere), where MONAI's intensity transforms touch only
    the keys they name."""
    for k in keys[1:]:
        a = vols[k].array
        if roles[k][1] or _dtype_name(a)[:3] not in ("int", "uin", "boo"):
            continue
        if label_named(k) or len(_values(a)) <= 16:
            import warnings

            from ..errors import MedprocWarning

            warnings.warn(
                f"Resampled: key {k!r} looks like a label map ({a.dtype}, whole numbers) but its "
                "mode makes it an image: it gets the spec's intensity step and is interpolated; "
                f"give it mode 'nearest' (e.g. mode=('bilinear', 'nearest'))",
                MedprocWarning,
                stacklevel=3,
            )
            return True
    return False


def say_image_as_label(keys, vols, roles) -> None:
    """Warn when ``mode`` was not given and a key after the first, resampled as a label map by
    that default, holds what looks like an image: fractional values, or over 256 distinct
    values. A second modality (BraTS' ``t2`` after ``t1``) was resampled with nearest
    neighbour, kept its dtype and skipped the intensity step, unsaid; MONAI's ``Spacingd``
    interpolates every key unless told."""
    for k in keys[1:]:
        if not roles[k][1]:
            continue
        v = _values(vols[k].array)
        whole = bool((v == v.round()).all()) if v.dtype.kind == "f" else True
        if not whole or len(v) > 256:
            import warnings

            from ..errors import MedprocWarning

            shown = "fractional values" if not whole else f"{len(v)}+ distinct values"
            modes = ", ".join("'nearest'" if label_named(x) else "'bilinear'" for x in keys)
            warnings.warn(
                f"Resampled{tuple(keys)} without mode=: key {k!r} is resampled as a label map "
                f"(nearest, its dtype kept, no intensity step), as every key after the first "
                f"is, but it looks like an image ({shown}); pass mode= per key, e.g. "
                f"mode=({modes})",
                MedprocWarning,
                stacklevel=3,
            )
            return


def _values(a) -> np.ndarray:
    """The distinct values of a strided sample of ~262k voxels of ``a`` (numpy or torch)."""
    flat = a.reshape(-1)
    sample = flat[:: max(1, flat.shape[0] // 262_144)]
    if torch.is_tensor(sample):
        return torch.unique(sample).cpu().numpy()
    return np.unique(sample)


#: LoadImaged's arguments that LoadVolumed has no use for, and why (a tutorial's call, moved
#: over as it is, got a bare TypeError)
_LOADIMAGED = {
    "reader": "medproc's own readers read every format (DICOM, NIfTI, NRRD, MHA)",
    "meta_keys": "the metadata travels on each MetaTensor's .meta",
    "meta_key_postfix": "the metadata travels on each MetaTensor's .meta (MONAI's box and "
    "inverse transforms read it there)",
    "overwriting": "the metadata travels on each MetaTensor's .meta",
    "simple_keys": "LoadVolumed writes LoadImaged's keys",
    "prune_meta_pattern": "LoadVolumed writes no NIfTI header fields to prune",
    "prune_meta_sep": "LoadVolumed writes no NIfTI header fields to prune",
    "expanduser": "paths are read as given: expand '~' in the datalist",
}


def check_loadimaged_kwargs(kwargs: dict) -> None:
    """Refuse ``LoadImaged``-only arguments with what to do, and any other unknown one."""
    if not kwargs:
        return
    name = next(iter(kwargs))
    if name in _LOADIMAGED:
        raise TypeError(
            f"LoadVolumed does not take LoadImaged's {name!r}: {_LOADIMAGED[name]}; drop the "
            "argument"
        )
    raise TypeError(f"LoadVolumed got an unexpected keyword argument {name!r}")
