"""Deprecated names kept for one release; each says what replaces it.

``medproc.monai.Invertd`` had MONAI's name and another meaning (it read a ``Plan`` stored in the
sample, which no longer is: plans travel in ``applied_operations``). Use
``monai.transforms.Invertd(keys, transform=your_compose, orig_keys=...)``.
"""

from __future__ import annotations

import warnings

from monai.data import MetaTensor
from monai.transforms import MapTransform

from ._voxels import invert
from .meta import to_metatensor, to_volume
from .transforms import plan_of

__all__ = ["Invertd"]

#: monai.transforms.Invertd's keywords (besides keys and allow_missing_keys)
_MONAI_ARGS = {
    "transform", "orig_keys", "meta_keys", "orig_meta_keys", "meta_key_postfix",
    "nearest_interp", "to_tensor", "post_func",
}  # fmt: skip

_MESSAGE = (
    "medproc.monai.Invertd is deprecated and will be removed: medproc's Resampled is a MONAI "
    "InvertibleTransform, so use monai.transforms.Invertd(keys, transform=<your Compose>, "
    "orig_keys=...) (medproc.monai.plan_of(x) gives the plan of a resampled MetaTensor)"
)


class Invertd(MapTransform):
    """Deprecated: use ``monai.transforms.Invertd``. Maps ``keys`` back through the last
    ``Resampled`` applied to ``plan_key`` without the ``"_plan"`` suffix (``"image_plan"`` ->
    the ``"image"`` MetaTensor's record)."""

    def __init__(
        self,
        keys,
        plan_key: str = "image_plan",
        nearest: bool = True,
        device: str = "cpu",
        allow_missing_keys=False,
        **monai_style,
    ):
        theirs = sorted(set(monai_style) & _MONAI_ARGS)
        if theirs or not isinstance(plan_key, str):  # (MONAI's Invertd(keys, transform, ...))
            got = ", ".join(map(repr, theirs)) if theirs else f"a {type(plan_key).__name__}"
            raise TypeError(
                f"medproc.monai.Invertd got {got}: that is monai.transforms.Invertd's "
                "signature; import Invertd from monai.transforms (it inverts medproc's "
                "Resampled), this one is deprecated"
            )
        if monai_style:  # (a typo of this one's own keywords: Python's own words)
            raise TypeError(
                f"Invertd() got an unexpected keyword argument {next(iter(monai_style))!r}"
            )
        warnings.warn(_MESSAGE, DeprecationWarning, stacklevel=2)
        super().__init__(keys, allow_missing_keys)
        self.source = plan_key[: -len("_plan")] if plan_key.endswith("_plan") else plan_key
        self.nearest = nearest
        self.device = device

    def __call__(self, data):
        """Invert ``keys`` with the source key's plan."""
        d = dict(data)
        plan = plan_of(d[self.source])
        for key in self.key_iterator(d):
            x = d[key]
            vol = to_volume(x, None if isinstance(x, MetaTensor) else plan.out_affine)
            back = invert(vol, plan, nearest=self.nearest, device=self.device)
            meta = {}
            if isinstance(x, MetaTensor) and "filename_or_obj" in x.meta:
                meta["filename_or_obj"] = x.meta["filename_or_obj"]
            d[key] = to_metatensor(back, **meta)
        return d
