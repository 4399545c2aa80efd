"""Which keys of :class:`~medproc.monai.Resampled` are images and which label maps: warnings
when a key's mode and its values disagree (a label map interpolated as an image, or an image
taken for a label map by the default ``mode``)."""

from __future__ import annotations

import numpy as np
import torch

from ..pipeline._dtypes import _dtype_name

__all__ = ["label_named", "say_label_as_image", "say_image_as_label"]


def label_named(key) -> bool:
    return any(w in str(key).lower() for w in ("label", "seg", "mask"))


def say_label_as_image(keys, vols, roles, intensity: bool = True, judge=None) -> bool:
    """Warn (once: returns True) when a key resampled as an image holds what looks like a
    label map: whole numbers named like one, or, after the first key, with few values. With
    one mode for every key it is interpolated (values between its classes: 1 and 2 mixed into
    1.5) and gets the spec's intensity step if there is one (``intensity``; a label of 0/1/2
    clipped and scaled came back as 0.714-0.716 everywhere), where MONAI's intensity
    transforms touch only the keys they name. (The first key is the image unless told: judged
    by its name alone, ``Resampled("label", spec)``.) ``judge``: the keys to judge (all)."""
    for n, k in enumerate(keys):
        a = vols[k].array
        if (
            (judge is not None and k not in judge)
            or roles[k][1]
            or _dtype_name(a)[:3] not in ("int", "uin", "boo")
        ):
            continue
        if label_named(k) or (n > 0 and len(_values(a)) <= 16):
            import warnings

            from ..errors import MedprocWarning

            step = "gets the spec's intensity step and " if intensity else ""
            warnings.warn(
                f"Resampled: key {k!r} looks like a label map ({a.dtype}, whole numbers) but its "
                f"mode makes it an image: it {step}is interpolated (values between its classes); "
                "give it mode 'nearest' (e.g. mode=('bilinear', 'nearest'))",
                MedprocWarning,
                stacklevel=3,
            )
            return True
    return False


def say_image_as_label(keys, vols, roles, all_keys) -> None:
    """Warn when ``mode`` was not given and a key resampled as a label map by that default
    (every key after the first configured) holds what looks like an image: fractional values,
    negative values among over 256 distinct ones (CT), or over 2048 distinct values (MR). A
    second modality (BraTS' ``t2`` after ``t1``) was resampled with nearest neighbour, kept its
    dtype and skipped the intensity step, unsaid; MONAI's ``Spacingd`` interpolates every key
    unless told. Keys named like label maps, and uint8/bool ones, are not judged (a
    parcellation has hundreds of labels); ``all_keys``: the transform's, for the advice."""
    for k in keys:
        a = vols[k].array
        if not roles[k][1] or label_named(k) or _dtype_name(a) in ("uint8", "bool"):
            continue
        v = _values(a)
        whole = bool((v == v.round()).all()) if v.dtype.kind == "f" else True
        if whole and not (len(v) > 256 and v.min() < 0) and len(v) <= 2048:
            continue
        import warnings

        from ..errors import MedprocWarning

        shown = "fractional values" if not whole else f"{len(v)}+ distinct values"
        modes = ", ".join("'nearest'" if label_named(x) else "'bilinear'" for x in all_keys)
        warnings.warn(
            f"Resampled{tuple(all_keys)} without mode=: key {k!r} is resampled as a label map "
            "(nearest, its dtype kept, no intensity step), as every key after the first is, but "
            f"it looks like an image ({shown}); pass mode= per key, e.g. mode=({modes})",
            MedprocWarning,
            stacklevel=3,
        )


def _values(a) -> np.ndarray:
    """The distinct values of a strided sample of ~262k voxels of ``a`` (numpy or torch), taken
    along every axis (a reshape of a Fortran-ordered volume would copy it whole)."""
    step = max(1, int(np.ceil((a.numel() if torch.is_tensor(a) else a.size) / 262_144)))
    step = max(1, int(round(step ** (1 / a.ndim))))
    sample = a[(slice(None, None, step),) * a.ndim]
    if torch.is_tensor(sample):
        return torch.unique(sample).cpu().numpy()
    return np.unique(sample)
