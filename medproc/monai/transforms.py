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


def to_metatensor(vol: Volume, **meta) -> MetaTensor:
    """A Volume as MONAI sees images: a ``(C, i, j, k)`` MetaTensor with the Volume's affine
    (a view of the same memory, on the same device: no copy).

    Parameters
    ----------
    vol : Volume
        Voxels ``(i, j, k)`` or ``(i, j, k, C)``, numpy or torch.
    **meta
        Extra metadata (``affine``/``original_affine`` are ignored: the Volume's affine is used).
    """
    arr = vol.array
    if isinstance(arr, np.ndarray):
        t = torch.from_numpy(arr if arr.flags.writeable else np.array(arr))
    else:
        t = arr
    t = t[None] if t.ndim == 3 else t.permute(3, 0, 1, 2)
    m = {
        "filename_or_obj": vol.meta.get("source", ""),
        **{k: v for k, v in meta.items() if k not in ("affine", "original_affine")},
    }
    return MetaTensor(t, affine=torch.as_tensor(vol.affine), meta=m)


def to_volume(x, affine=None) -> Volume:
    """A MONAI image ``(C, i, j, k)`` (MetaTensor, tensor or array, + affine) as a Volume: a view,
    on the same device (CPU tensors become numpy arrays)."""
    aff = x.affine if affine is None and isinstance(x, MetaTensor) else affine
    if aff is None:
        raise ValueError("to_volume needs an affine: pass a MetaTensor or affine=")
    aff = np.asarray(aff.detach().cpu() if torch.is_tensor(aff) else aff, dtype=np.float64)
    if torch.is_tensor(x):
        x = x.as_tensor() if isinstance(x, MetaTensor) else x
        x = x.detach()
        a = x.numpy() if x.device.type == "cpu" else x
    else:
        a = np.asarray(x)
    if a.shape[0] == 1:
        a = a[0]
    else:
        a = a.permute(1, 2, 3, 0) if torch.is_tensor(a) else np.moveaxis(a, 0, -1)
    return Volume(a, aff)


class LoadVolumed(MapTransform):
    """Load ``keys`` (paths: DICOM folders/files, NIfTI, NRRD, MHA) with medproc's readers into
    ``(C, i, j, k)`` MetaTensors; lesion files under ``lesion_key`` become
    :class:`~medproc.annotations.Lesions`.

    Parameters
    ----------
    keys : str or sequence of str
        Keys holding paths.
    series : str or int, optional
        Which DICOM series of a folder (see :func:`medproc.load`).
    lesion_key : str, optional
        Key of a lesion file (LUNA16-style CSV or medproc JSON).
    device : {"cpu", "gpu"}
        ``"gpu"``: CUDA tensors, compressed DICOM decoded on the GPU where proven.
    allow_missing_keys : bool
        As in MONAI.
    """

    def __init__(
        self,
        keys,
        series=None,
        lesion_key: str | None = None,
        device: str = "cpu",
        allow_missing_keys=False,
    ):
        super().__init__(keys, allow_missing_keys)
        self.series = series
        self.lesion_key = lesion_key
        self.device = device

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        from ..io import load

        d = dict(data)
        for key in self.key_iterator(d):
            vol = load(d[key], series=self.series, device=self.device)
            d[key] = to_metatensor(vol)
        if self.lesion_key and self.lesion_key in d and isinstance(d[self.lesion_key], str):
            from ..annotations import read_json, read_luna_csv

            path = d[self.lesion_key]
            stem = (
                str(d[self.first_key(d)].meta.get("filename_or_obj", ""))
                .split("/")[-1]
                .split(".")[0]
            )
            d[self.lesion_key] = (
                read_json(path, image=stem) if path.endswith(".json") else read_luna_csv(path, stem)
            )
        return d


class Resampled(MapTransform):
    """Resample ``keys`` to a :class:`~medproc.Spec` with medproc's plan and DALI pipeline.

    The first key is the image (spec interpolation and intensity); the others are labels
    (nearest neighbour, dtype kept), on the image's grid, resampled in the same DALI call. The
    plan is kept in the dict under ``"<first key>_plan"`` so that :class:`Invertd` can map
    predictions back. With ``device="gpu"`` the outputs are CUDA tensors.
    """

    def __init__(
        self,
        keys,
        spec: Spec,
        device: str = "cpu",
        lesion_key: str | None = None,
        allow_missing_keys=False,
    ):
        super().__init__(keys, allow_missing_keys)
        self.spec = spec
        self.device = device
        self.lesion_key = lesion_key

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        from ..pipeline import Engine, Graph, Job

        d = dict(data)
        keys = list(self.key_iterator(d))
        img = to_volume(d[keys[0]])
        labs = [to_volume(d[k]) for k in keys[1:]]
        plan = make_plan(img.shape, img.affine, self.spec, img.array)
        engine = Engine(self.device, batch_size=1)
        (out,) = engine.run(
            [Job(img.array, plan, [lb.array for lb in labs])],
            Graph.from_spec(self.spec, labels=len(labs)),
            as_torch=self.device == "gpu",
        )
        keep = {k: v for k, v in d[keys[0]].meta.items() if k not in ("affine", "original_affine")}
        d[keys[0]] = to_metatensor(img.with_array(out[0], plan.out_affine), **keep)
        for k, lab, arr in zip(keys[1:], labs, out[1:]):
            d[k] = to_metatensor(lab.with_array(arr, plan.out_affine))
        d[f"{keys[0]}_plan"] = plan
        if self.lesion_key and self.lesion_key in d:
            d[f"{self.lesion_key}_on_grid"] = plan.lesions_on_grid(d[self.lesion_key])
        return d


class Invertd(MapTransform):
    """Map ``keys`` (predictions on a plan's output grid) back to the source grid of the plan
    stored under ``plan_key`` (the inverse matrix; nearest neighbour for label maps)."""

    def __init__(
        self,
        keys,
        plan_key: str = "image_plan",
        nearest: bool = True,
        device: str = "cpu",
        allow_missing_keys=False,
    ):
        super().__init__(keys, allow_missing_keys)
        self.plan_key = plan_key
        self.nearest = nearest
        self.device = device

    def __call__(self, data):
        d = dict(data)
        plan = d[self.plan_key]
        for key in self.key_iterator(d):
            d[key] = to_metatensor(
                invert(
                    to_volume(
                        d[key], plan.out_affine if not isinstance(d[key], MetaTensor) else None
                    ),
                    plan,
                    nearest=self.nearest,
                    device=self.device,
                )
            )
        return d


def invert(pred: Volume, plan, nearest: bool = True, device: str = "cpu") -> Volume:
    """``pred`` on ``plan``'s output grid, resampled back onto the plan's input grid (nearest
    neighbour for label maps, else linear)."""
    from ..pipeline import Engine, Graph, Job

    arr = pred.array
    graph = Graph(
        interp="nearest" if nearest else "linear",
        fill=0.0,
        dtype=_dtype_name(arr) if nearest else "float32",
    )
    (out,) = Engine(device, batch_size=1).run([Job(arr, plan.inverse())], graph)
    return Volume(out[0], plan.in_affine, {**pred.meta, "inverted": True})


def _dtype_name(a) -> str:
    name = str(a.dtype).replace("torch.", "")
    return "uint8" if name == "bool" else name


__all__ += ["invert"]
