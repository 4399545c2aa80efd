"""Volumes <-> MONAI MetaTensors, with the metadata MONAI's ``LoadImaged`` writes.

A MetaTensor here is what ``LoadImaged(ensure_channel_first=True)`` gives: ``(C, i, j, k)``
voxels, ``affine`` (float64 tensor, index -> RAS mm), and in ``meta`` ``original_affine``,
``spatial_shape``, ``pixdim``, ``original_channel_dim``, ``filename_or_obj`` and ``space`` (what
``SaveImage``/``SaveImaged`` read to name a file and to put it back in its source geometry).

Under ``monai.data.set_track_meta(False)`` MONAI's transforms return plain tensors; medproc's do
too (:func:`store`), keeping each key's metadata and affine under ``"<key>_meta_dict"`` as
``LoadImaged(image_only=False)`` does, from where :func:`fetch` takes the geometry back (MONAI's
``Spacingd`` would assume an identity affine; ``Resampled`` does not need to).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

import numpy as np
import torch
from monai.data import MetaTensor, get_track_meta

from ..geometry import spacing_of
from ..volume import Volume

__all__ = ["to_metatensor", "to_volume", "source_meta", "store", "fetch"]


def source_meta(vol: Volume) -> dict:
    """The metadata ``LoadImaged(ensure_channel_first=True)`` writes for a freshly read ``vol``
    (without ``affine``, which a MetaTensor holds itself).

    >>> m = source_meta(Volume(np.zeros((4, 5, 6), np.int16), np.eye(4), {"source": "a.nii"}))
    >>> m["filename_or_obj"], m["spatial_shape"].tolist(), m["space"]
    ('a.nii', [4, 5, 6], 'RAS')
    """
    return {
        "filename_or_obj": str(vol.meta.get("source", "")),
        "original_affine": np.array(vol.affine, dtype=np.float64),
        "spatial_shape": np.array(vol.shape[:3], dtype=np.int64),
        # NIfTI's pixdim (voxel sizes in [1:4]), which MONAI code reads for spacing-aware
        # metrics; Resampled keeps it current
        "pixdim": np.array([1.0, *spacing_of(np.asarray(vol.affine)), 1.0, 1.0, 1.0, 1.0]),
        # LoadImaged's marks: NaN = the file had no channel axis, else where it was
        "original_channel_dim": float("nan") if len(vol.shape) == 3 else -1,
        "space": "RAS",
    }


def to_metatensor(vol: Volume, **meta) -> MetaTensor:
    """A Volume as MONAI sees images: a ``(C, i, j, k)`` MetaTensor with the Volume's affine and
    the metadata of :func:`source_meta` (a view of the same memory, on the same device).

    Parameters
    ----------
    vol : Volume
        Voxels ``(i, j, k)`` or ``(i, j, k, C)``, numpy or torch.
    **meta
        Metadata that replaces or adds to :func:`source_meta` (``affine`` is ignored: the
        Volume's affine is used; pass ``original_affine`` to keep an earlier one).
    """
    if not isinstance(vol, Volume):
        raise TypeError(
            f"to_metatensor takes a medproc.Volume, got {type(vol).__name__} (wrap an array "
            "with medproc.Volume(array, affine))"
        )
    arr = vol.array
    if isinstance(arr, np.ndarray):
        t = torch.from_numpy(arr if arr.flags.writeable else np.array(arr))
    else:
        t = arr
    t = t[None] if t.ndim == 3 else t.permute(3, 0, 1, 2)
    m = {**source_meta(vol), **{k: v for k, v in meta.items() if k != "affine"}}
    return MetaTensor(t, affine=torch.as_tensor(vol.affine, dtype=torch.float64), meta=m)


def to_volume(x, affine=None) -> Volume:
    """A MONAI image ``(C, i, j, k)`` (MetaTensor, tensor or array, + affine) as a Volume: a view,
    on the same device (CPU tensors become numpy arrays); bfloat16 voxels (an autocast
    prediction) as a float32 copy, which holds them exactly.

    Raises
    ------
    ValueError
        When there is no affine (a plain tensor without ``affine=``) or the image is not
        ``(C, i, j, k)``.
    """
    aff = x.affine if affine is None and isinstance(x, MetaTensor) else affine
    if aff is None:
        raise ValueError(
            f"to_volume needs an affine: got a {type(x).__name__} without one; pass a MetaTensor "
            "(LoadVolumed or MONAI's LoadImaged give them; under monai.data.set_track_meta(False) "
            "LoadVolumed keeps the affine under '<key>_meta_dict') or affine="
        )
    if len(x.shape) != 4:
        if len(x.shape) == 5 and x.shape[0] == 1:
            fix = (
                "a channel was added twice: LoadVolumed (and LoadImaged(ensure_channel_first="
                "True)) already put it first, remove EnsureChannelFirstd"
            )
        elif len(x.shape) == 3 and x.shape[0] <= 4:
            fix = (
                "a 2-D image with its channel first: medproc resamples 3-D volumes; "
                "LoadVolumed reads a 2-D file as one slice (1, i, j, 1)"
            )
        else:
            fix = (
                "load it with LoadVolumed or LoadImaged(..., ensure_channel_first=True), or "
                "add EnsureChannelFirstd"
            )
        raise ValueError(
            f"expected a channel-first image (C, i, j, k), got shape {tuple(x.shape)}: {fix}"
        )
    last = isinstance(x, MetaTensor) and x.meta.get("original_channel_dim") == -1
    if last and x.shape[0] >= 8 and x.shape[-1] == 1:  # (as LoadImaged left it; MONAI too)
        import warnings

        from ..errors import MedprocWarning

        warnings.warn(
            f"an image of shape {tuple(x.shape)} is read as {x.shape[0]} channels of "
            f"{tuple(x.shape[1:])}: is it channel-last (i, j, k, 1)? MONAI's LoadImaged keeps "
            "a 4-D file's last axis last: add EnsureChannelFirstd, or load it with LoadVolumed",
            MedprocWarning,
            stacklevel=2,
        )
    aff = np.asarray(aff.detach().cpu() if torch.is_tensor(aff) else aff, dtype=np.float64)
    if torch.is_tensor(x):
        x = x.as_tensor() if isinstance(x, MetaTensor) else x
        x = x.detach()
        if x.dtype == torch.bfloat16:  # (an autocast prediction: float32 holds it exactly)
            x = x.float()
        if x.dtype in (torch.complex64, torch.complex128):
            raise ValueError(
                f"{x.dtype} voxels cannot be resampled (numpy and DALI have no such type): cast "
                "the image to float32 first (e.g. EnsureTyped(dtype=torch.float32))"
            )
        a = x.numpy() if x.device.type == "cpu" else x
    else:
        a = np.asarray(x)
    if a.shape[0] == 1:
        a = a[0]
    else:
        a = a.permute(1, 2, 3, 0) if torch.is_tensor(a) else np.moveaxis(a, 0, -1)
    return Volume(a, aff)


def with_voxels(like: MetaTensor, array, affine) -> MetaTensor:
    """A MetaTensor holding ``array`` (``(C, i, j, k)``, numpy or torch) on ``affine``, with
    ``like``'s metadata and applied operations (``pixdim`` follows the new spacing)."""
    t = torch.from_numpy(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else array
    out = MetaTensor(t)
    out.copy_meta_from(like)
    out.affine = torch.as_tensor(np.asarray(affine), dtype=torch.float64)
    pixdim = out.meta.get("pixdim")
    if pixdim is not None and len(pixdim) >= 4:
        pixdim = np.array(pixdim, copy=True)
        pixdim[1:4] = spacing_of(np.asarray(affine))
        out.meta["pixdim"] = pixdim
    return out


def meta_key(key) -> str:
    """Where a key's metadata goes when MONAI does not track it (``LoadImaged``'s default
    ``meta_key_postfix``)."""
    return f"{key}_meta_dict"


def store(d: MutableMapping, key, x: MetaTensor) -> None:
    """Put ``x`` under ``key`` as MONAI's transforms would: the MetaTensor while MONAI tracks
    metadata (the default); under ``set_track_meta(False)`` a plain tensor, and ``x``'s
    metadata with its ``affine`` under ``"<key>_meta_dict"``."""
    if get_track_meta():
        d[key] = x
        return
    d[key] = x.as_tensor()
    shape = tuple(int(n) for n in x.shape[-3:])  # (what the affine is the grid of)
    d[meta_key(key)] = {**x.meta, "affine": x.affine.clone(), "medproc_grid_shape": shape}


def fetch(d: Mapping, key):
    """``d[key]`` as a MetaTensor when its geometry is known: itself, or a plain tensor or
    array with the affine that :func:`store` put under ``"<key>_meta_dict"`` (else as it is)."""
    x = d[key]
    meta = d.get(meta_key(key))
    if isinstance(x, MetaTensor) or not isinstance(meta, Mapping) or meta.get("affine") is None:
        return x
    t = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    grid = meta.get("medproc_grid_shape")
    if grid is not None and tuple(grid) != tuple(int(n) for n in t.shape[-3:]):
        raise ValueError(
            f"is {tuple(t.shape[-3:])} but its {meta_key(key)!r} holds the affine "
            f"of a {tuple(grid)} grid: a transform between changed the grid without updating "
            "it (MONAI's do not under set_track_meta(False)); track metadata, or resample "
            "with Resampled first"
        )
    return MetaTensor(t, meta={k: v for k, v in meta.items() if k != "medproc_grid_shape"})
