"""MONAI-style dict transforms backed by medproc (readers, plans, DALI resampling)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import MapTransform

from ..plan import make_plan
from ..spec import Spec
from ..volume import Volume

__all__ = ["to_metatensor", "to_volume", "LoadVolumed", "Resampled", "Invertd"]

_REV = [2, 1, 0, 3]


def to_metatensor(vol: Volume, **meta) -> MetaTensor:
    """A Volume as MONAI sees images: (C, i, j, k) MetaTensor, affine (i, j, k) -> RAS.

    medproc's arrays are (k, j, i): the transpose is a view (no copy)."""
    arr = vol.array
    t = torch.from_numpy(np.ascontiguousarray(arr)) if not arr.flags.writeable else torch.from_numpy(arr)
    t = t.permute(2, 1, 0)[None] if arr.ndim == 3 else t.permute(3, 2, 1, 0)
    m = {"filename_or_obj": vol.meta.get("source", ""),
         **{k: v for k, v in meta.items() if k not in ("affine", "original_affine")}}
    return MetaTensor(t, affine=torch.as_tensor(vol.affine[:, _REV]), meta=m)


def to_volume(x, affine=None) -> Volume:
    """A MONAI image (C, i, j, k) MetaTensor/tensor (+ affine) back into a medproc Volume."""
    aff = x.affine if affine is None and isinstance(x, MetaTensor) else affine
    if aff is None:
        raise ValueError("to_volume needs an affine: pass a MetaTensor or affine=")
    aff = np.asarray(aff.detach().cpu() if torch.is_tensor(aff) else aff, dtype=np.float64)
    a = x.detach().cpu().numpy() if torch.is_tensor(x) else np.asarray(x)
    a = a[0] if a.shape[0] == 1 else np.moveaxis(a, 0, -1)
    a = a.transpose(2, 1, 0) if a.ndim == 3 else a.transpose(2, 1, 0, 3)
    return Volume(np.ascontiguousarray(a), aff[:, _REV])


class LoadVolumed(MapTransform):
    """Load ``keys`` (paths: DICOM folders/files, NIfTI, NRRD, MHA) with medproc's readers into
    MetaTensors; lesion files under ``lesion_key`` become :class:`~medproc.annotations.Lesions`."""

    def __init__(self, keys, series=None, lesion_key: str | None = None, allow_missing_keys=False):
        super().__init__(keys, allow_missing_keys)
        self.series = series
        self.lesion_key = lesion_key

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        from ..io import load

        d = dict(data)
        for key in self.key_iterator(d):
            vol = load(d[key], series=self.series)
            d[key] = to_metatensor(vol)
        if self.lesion_key and self.lesion_key in d and isinstance(d[self.lesion_key], str):
            from ..annotations import read_json, read_luna_csv

            path = d[self.lesion_key]
            stem = str(d[self.first_key(d)].meta.get("filename_or_obj", "")).split("/")[-1].split(".")[0]
            d[self.lesion_key] = read_json(path, image=stem) if path.endswith(".json") else read_luna_csv(path, stem)
        return d


class Resampled(MapTransform):
    """Resample ``keys`` to a :class:`~medproc.Spec` with medproc's plan and DALI pipeline.

    The first key is the image (spec interpolation and intensity); the others are labels
    (nearest neighbour, dtype kept), on the image's grid. The plan is kept in the dict under
    ``"<first key>_plan"`` so that :class:`Invertd` can map predictions back.
    """

    def __init__(self, keys, spec: Spec, device: str = "cpu", lesion_key: str | None = None,
                 allow_missing_keys=False):
        super().__init__(keys, allow_missing_keys)
        self.spec = spec
        self.device = device
        self.lesion_key = lesion_key

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        from dataclasses import replace

        from ..resample import get_resampler

        d = dict(data)
        keys = list(self.key_iterator(d))
        img = to_volume(d[keys[0]])
        plan = make_plan(img.shape, img.affine, self.spec, img.array)
        s = self.spec
        r = get_resampler(self.device, s.interp, s.antialias, str(np.dtype(s.dtype)), s.fill, False, 1,
                          (str(img.array.dtype), "None"))
        out = r.run([img.array], [plan])[0]
        keep = {k: v for k, v in d[keys[0]].meta.items() if k not in ("affine", "original_affine")}
        d[keys[0]] = to_metatensor(img.with_array(out, plan.out_affine), **keep)
        label_plan = replace(plan, intensity=None)
        for k in keys[1:]:
            lab = to_volume(d[k])
            arr = lab.array.astype(np.uint8) if lab.array.dtype == np.bool_ else lab.array
            rl = get_resampler(self.device, "nearest", False, str(arr.dtype), s.fill, False, 1,
                               (str(arr.dtype), "None"))
            d[k] = to_metatensor(lab.with_array(rl.run([arr], [label_plan])[0], plan.out_affine))
        d[f"{keys[0]}_plan"] = plan
        if self.lesion_key and self.lesion_key in d:
            d[f"{self.lesion_key}_on_grid"] = plan.lesions_on_grid(d[self.lesion_key])
        return d


class Invertd(MapTransform):
    """Map ``keys`` (predictions on a plan's output grid) back to the source grid of the plan
    stored under ``plan_key`` (the inverse matrix; nearest neighbour for label maps)."""

    def __init__(self, keys, plan_key: str = "image_plan", nearest: bool = True, device: str = "cpu",
                 allow_missing_keys=False):
        super().__init__(keys, allow_missing_keys)
        self.plan_key = plan_key
        self.nearest = nearest
        self.device = device

    def __call__(self, data):
        d = dict(data)
        plan = d[self.plan_key]
        for key in self.key_iterator(d):
            d[key] = to_metatensor(invert(to_volume(d[key], plan.out_affine if not isinstance(d[key], MetaTensor) else None),
                                          plan, nearest=self.nearest, device=self.device))
        return d


def invert(pred: Volume, plan, nearest: bool = True, device: str = "cpu") -> Volume:
    """``pred`` on ``plan``'s output grid, resampled back onto the plan's input grid."""
    from ..plan import Plan
    from ..resample import get_resampler

    inv = Plan(tuple(pred.shape), pred.affine, tuple(plan.in_shape), plan.in_affine,
               np.linalg.inv(plan.matrix))
    arr = pred.array
    if nearest and arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    r = get_resampler(device, "nearest" if nearest else "linear", False,
                      str(arr.dtype) if nearest else "float32", 0, False, 1, (str(arr.dtype), "None"))
    out = r.run([arr], [inv])[0]
    return Volume(out, plan.in_affine, {**pred.meta, "inverted": True})


__all__ += ["invert"]
