"""MONAI dict transforms backed by medproc (readers, plans, DALI resampling).

``Resampled`` is a MONAI ``InvertibleTransform``: it records each key's resample in the
MetaTensor's ``applied_operations`` (plain arrays, strings and numbers, so
``list_data_collate``/``decollate_batch`` carry it), and ``monai.transforms.Invertd`` (or
``Compose.inverse``) undoes it wherever it sits in a Compose of MONAI and medproc transforms.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Hashable, Mapping

import numpy as np
import torch
from monai.data import MetaTensor, get_track_meta
from monai.transforms import InvertibleTransform, MapTransform
from monai.utils import ensure_tuple_rep, get_equivalent_dtype

from ..errors import check_device
from ..geometry import spacing_of
from ..plan import Plan, make_plan, say_notes
from ..resample import check_label_grid
from ..spec import Spec
from ._key_roles import label_named, say_image_as_label, say_label_as_image
from ._loadimaged import check_loadimaged_kwargs, check_spacingd_kwargs
from ._voxels import MONAI_NAME, _cast, interp_of, invert, resample_arrays
from .meta import fetch, store, to_metatensor, to_volume, with_voxels

__all__ = ["LoadVolumed", "Resampled", "plan_of", "invert", "to_metatensor", "to_volume"]


class LoadVolumed(MapTransform):
    """Load ``keys`` (paths: DICOM folders/files, NIfTI, NRRD, MHA) with medproc's readers into
    ``(C, i, j, k)`` MetaTensors with the metadata ``LoadImaged(ensure_channel_first=True)``
    writes (``filename_or_obj`` per key, ``original_affine``, ``spatial_shape``...); lesion files
    under ``lesion_key`` become :class:`~medproc.annotations.Lesions`.

    Parameters
    ----------
    keys : str or sequence of str
        Keys holding paths; a list of paths under one key is stacked as channels, as
        ``LoadImaged`` does (one 3-D file each, all on the first's grid: BraTS' modalities).
    series : str or int, optional
        Which DICOM series of a folder (see :func:`medproc.load`).
    lesion_key : str, optional
        Key of a lesion file (LUNA16-style CSV or medproc JSON). A ``Lesions`` object does not
        collate: batch such samples with ``collate_fn=monai.data.utils.no_collation``.
    device : {"cpu", "gpu"}
        ``"gpu"``: CUDA tensors, compressed DICOM decoded on the GPU where proven.
    allow_missing_keys : bool
        As in MONAI.
    ensure_channel_first, image_only : bool
        ``LoadImaged``'s, accepted where they mean what ``LoadVolumed`` does anyway (``True``:
        a channel first, MetaTensors); ``False`` is refused with the reason.
    dtype : numpy or torch dtype, optional
        As ``LoadImaged``'s ``dtype``: every key's voxels cast to it once read. ``None`` (the
        default) keeps each file's own dtype (int16 CT stays int16: half the memory of
        ``LoadImaged``'s default ``np.float32``; :class:`Resampled` gives images the spec's
        dtype). Pass ``np.float32`` where code after it needs float voxels (an intensity
        shift before any resampling, a torch loss on the label).
    **loadimaged
        ``LoadImaged``'s other arguments: accepted at their defaults (``reader=None``,
        ``meta_key_postfix="meta_dict"``...), refused otherwise with the reason.
    """

    def __init__(
        self,
        keys,
        series=None,
        lesion_key: str | None = None,
        device: str = "cpu",
        allow_missing_keys=False,
        ensure_channel_first: bool = True,
        image_only: bool = True,
        dtype=None,
        **loadimaged,
    ):
        check_loadimaged_kwargs(loadimaged, inspect.signature(LoadVolumed).parameters)
        if ensure_channel_first is not True:
            raise ValueError(
                "LoadVolumed always puts the channel first ((C, i, j, k), as "
                "LoadImaged(ensure_channel_first=True)); ensure_channel_first=False is not offered"
            )
        if image_only is not True:
            raise ValueError(
                "LoadVolumed gives MetaTensors (their .meta holds what LoadImaged's "
                "image_only=False puts under '<key>_meta_dict'; under "
                "monai.data.set_track_meta(False) LoadVolumed writes '<key>_meta_dict')"
            )
        super().__init__(keys, allow_missing_keys)
        self.series = series
        self.lesion_key = lesion_key
        self.device = device
        self.dtype = None if dtype is None else get_equivalent_dtype(dtype, np.ndarray)

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        """Read every key's path (and the lesion file) into the sample."""
        from ..io import load

        d = dict(data)
        first = None
        for key in self.key_iterator(d):
            paths = d[key] if isinstance(d[key], (list, tuple)) and d[key] else [d[key]]
            if not all(isinstance(p, (str, bytes, os.PathLike)) for p in paths):
                from ..errors import UsageError

                raise UsageError(  # (load named no key)
                    f"LoadVolumed: sample[{key!r}] must be a file or folder path (or a list "
                    f"of them: channels), got {type(d[key]).__name__} {d[key]!r:.60}"
                )
            vols = [load(p, series=self.series, device=self.device) for p in paths]
            vol = vols[0] if len(vols) == 1 else _channels(vols, key)
            first = vol if first is None else first
            if self.dtype is not None:  # (before wrapping: set_track_meta(False) too)
                vol = vol.with_array(_cast(vol.array, np.dtype(self.dtype).name))
            store(d, key, to_metatensor(vol))
        les = d.get(self.lesion_key) if self.lesion_key else None
        if isinstance(les, (str, os.PathLike)) and first is not None:
            d[self.lesion_key] = _lesions_of(os.fspath(les), first)
        return d


def _channels(vols: list, key) -> object:
    """Files of one key as the channels of one volume (BraTS' modalities, as ``LoadImaged``
    stacks a list of files): each one 3-D volume on the first's grid; the first's metadata."""
    from ..resample import check_label_grid

    for n, v in enumerate(vols):
        where = f"LoadVolumed: sample[{key!r}][{n}] ({v.meta.get('source')})"
        if v.array.ndim != 3:
            raise ValueError(f"{where} has shape {tuple(v.shape)}: a list holds 3-D volumes")
        check_label_grid(vols[0], v, where, f"sample[{key!r}][0]")
    arrays = [v.array for v in vols]
    if torch.is_tensor(arrays[0]):  # (torch.stack takes one dtype: numpy's promotion)
        dt = torch.from_numpy(np.zeros(0, np.result_type(*map(_np_dtype, arrays)))).dtype
        return vols[0].with_array(torch.stack([a.to(dt) for a in arrays], -1))
    return vols[0].with_array(np.stack(arrays, -1))


def _np_dtype(t) -> np.dtype:
    return torch.empty(0, dtype=t.dtype).numpy().dtype


def _lesions_of(path: str, vol) -> object:
    """The lesions of the volume ``vol`` in the lesion file ``path`` (one file may list many
    images: LUNA16's): keyed by the image's file stem (JSON, CSV) or its SeriesInstanceUID
    (CSV); none listed: no lesions (a negative case)."""
    from ..annotations import Lesions, read_json, read_luna_csv
    from ..annotations.keys import image_key

    source = str(vol.meta.get("source", ""))
    keys = [k for k in (vol.meta.get("series_uid"), image_key(source)) if k]
    table = read_json(path) if path.lower().endswith(".json") else read_luna_csv(path)
    if not any(k in table for k in keys) and keys:
        _near_miss(keys[-1], table, path)  # (by its file stem: UIDs are never near misses)
    les = Lesions.of(table, keys)
    note = les.off_image(vol.affine, vol.shape)
    if note:
        import warnings

        from ..errors import MedprocWarning

        warnings.warn(f"{path} on {source}: {note}", MedprocWarning, stacklevel=4)
    return les


def _near_miss(key: str, table: dict, path: str) -> None:
    """Warn when a volume whose file stem is not in the lesion file has a namesake there up to
    a ``_suffix`` (``case001_0000`` against ``case001``: nnU-Net's channel suffix): its lesions
    would be dropped without a word. Other names (negative cases) pass unsaid."""
    import warnings

    from ..errors import MedprocWarning

    close = [k for k in map(str, table) if key.startswith(f"{k}_") or k.startswith(f"{key}_")]
    if close:
        warnings.warn(
            f"{path}: no lesions listed for {key!r}, but {close[0]!r} is: the same case under "
            "another name? Its lesions are not used (rename the entry, or the file)",
            MedprocWarning,
            stacklevel=4,
        )


class Resampled(MapTransform, InvertibleTransform):
    """Resample ``keys`` to a :class:`~medproc.Spec` with one plan and medproc's DALI engine,
    invertible as MONAI's own spatial transforms are.

    Parameters
    ----------
    keys : str or sequence of str
        Keys of ``(C, i, j, k)`` MetaTensors on one grid (same shape and affine), e.g. an image
        and its label map.
    spec : Spec
        The output grid (``grid="monai"`` gives ``Spacingd``'s grid), image interpolation,
        intensity steps and image dtype.
    mode : str or sequence, optional
        Per key, as MONAI's ``Spacingd``: ``"bilinear"``, ``"nearest"``, ``"bicubic"`` (or 1, 0,
        3; also ``"linear"``/``"trilinear"``, ``"nearest-exact"``, ``"cubic"``). A
        ``"nearest"`` key keeps its dtype and values (a label map: no intensity step); the
        others are images: the spec's dtype and intensity steps (statistics per key).
        Default: the first key is the image (``spec.interp``), the others label maps.
    device : {"cpu", "gpu"}
        DALI backend; ``"gpu"`` returns CUDA MetaTensors (on the inputs' GPU if they are there).
    lesion_key : str, optional
        Key of :class:`~medproc.annotations.Lesions`: their places on the output grid are put
        under ``"<lesion_key>_on_grid"`` (a list of dicts; see ``LoadVolumed`` on collation):
        on this transform's output grid; MONAI transforms after it do not move them.
    allow_missing_keys : bool
        As in MONAI.

    Notes
    -----
    Each key's MetaTensor gets the output affine (``original_affine``, ``spatial_shape`` and
    ``filename_or_obj`` are kept, so ``SaveImaged(resample=True)`` writes in the source
    geometry) and a record in ``applied_operations``: the input affine and shape, the index
    matrix and the mode. ``inverse`` (what ``monai.transforms.Invertd`` calls) resamples back
    onto the input grid: nearest keeps the dtype, bilinear/bicubic give float32; where a crop
    cut the input away the inverse is 0, elsewhere the border is repeated (MONAI's default).
    Intensity steps are not inverted (neither are MONAI's). :func:`plan_of` rebuilds the plan.
    """

    def __init__(
        self,
        keys,
        spec: Spec,
        mode=None,
        device: str = "cpu",
        lesion_key: str | None = None,
        allow_missing_keys=False,
        **spacingd,
    ):
        check_spacingd_kwargs(spacingd, inspect.signature(Resampled).parameters)
        super().__init__(keys, allow_missing_keys)
        if not isinstance(spec, Spec):
            raise TypeError(f"spec must be a medproc.Spec, got {type(spec).__name__}")
        device = check_device(device)
        self.spec = spec
        self.device = device
        self.lesion_key = lesion_key
        self._as_image = set(self.keys)  # (keys not yet judged label maps given an image's mode)
        # (keys the default mode makes label maps: judged once each, when first present)
        self._unjudged = set(self.keys[1:]) if mode is None else set()
        if mode is None:
            self.roles = ((spec.interp, False),) + (("nearest", True),) * (len(self.keys) - 1)
            first_label = label_named(self.keys[0]) and not all(map(label_named, self.keys[1:]))
            if len(self.keys) > 1 and ("image" in self.keys[1:] or first_label):  # say so
                import warnings

                from ..errors import MedprocWarning

                warnings.warn(
                    f"Resampled{tuple(self.keys)} without mode=: the first key "
                    f"({self.keys[0]!r}) is resampled as the image and the others as label maps "
                    "(nearest, no intensity step); put the image first or pass mode=",
                    MedprocWarning,
                    stacklevel=2,
                )
        else:
            try:
                modes = ensure_tuple_rep(mode, len(self.keys))
            except ValueError:  # (MONAI's words name neither the transform nor the keys)
                raise ValueError(
                    f"Resampled: mode={mode!r} for keys {list(self.keys)}: give one mode for "
                    "every key, or one per key in their order"
                ) from None
            interps = [interp_of(m, k) for m, k in zip(modes, self.keys)]
            self.roles = tuple((i, i == "nearest") for i in interps)

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        """Resample the sample's keys (see the class doc)."""
        d = dict(data)
        items = list(self.key_iterator(d, self.roles))
        if not items:
            return d
        keys = [k for k, _ in items]
        vols = {}
        for k in keys:
            try:
                vols[k] = to_volume(fetch(d, k))
            except ValueError as e:
                raise ValueError(f"Resampled: key {k!r}: {e}") from None
        ref = vols[keys[0]]
        for k in keys[1:]:
            check_label_grid(ref, vols[k], f"Resampled: key {k!r}", f"key {keys[0]!r}")
        device_id = None
        on_gpu = isinstance(ref.array, torch.Tensor) and ref.array.is_cuda
        if self.device == "gpu" and on_gpu:
            device_id = ref.array.device.index
        elif self.device == "cpu":
            vols = {k: v.numpy() for k, v in vols.items()}
        roles = dict(items)
        if self._as_image & set(keys):  # (each key judged once; said once per transform)
            said = say_label_as_image(keys, vols, roles, self.spec.intensity.active, self._as_image)
            self._as_image = set() if said else self._as_image - set(keys)
        if self._unjudged & set(keys):
            mine = [k for k in keys if k in self._unjudged]
            say_image_as_label(mine, vols, roles, self.keys)
            self._unjudged -= set(mine)
        stats = next((k for k in keys if not roles[k][1]), keys[0])
        arr = vols[stats].array if self.spec.needs_array else None
        nearest = any(roles[k][0] == "nearest" for k in keys)
        plan = make_plan(ref.shape, ref.affine, self.spec, arr, labels=nearest)
        say_notes(plan, vols[stats].meta.get("source"))
        out = resample_arrays(
            {k: vols[k].array for k in keys}, plan, roles, self.spec, self.device, device_id
        )
        for k in keys:
            x = with_voxels(fetch(d, k), out[k], plan.out_affine)
            if get_track_meta():
                d[k] = self._record(x, plan, roles[k][0])
            else:  # (plain tensors, as MONAI's: nothing to invert)
                store(d, k, x)
        if self.lesion_key and self.lesion_key in d:
            d[f"{self.lesion_key}_on_grid"] = plan.lesions_on_grid(d[self.lesion_key])
        return d

    def _record(self, x: MetaTensor, plan: Plan, interp: str) -> MetaTensor:
        info = {
            "src_affine": np.array(plan.in_affine, dtype=np.float64),
            "matrix": np.array(plan.matrix, dtype=np.float64),
            "out_shape": tuple(int(n) for n in plan.out_shape),
            "mode": MONAI_NAME[interp],
            "grid": self.spec.grid,
        }
        return self.push_transform(x, orig_size=tuple(plan.in_shape), extra_info=info)

    def inverse(self, data: Mapping[Hashable, object]) -> dict:
        """Put each key back on the grid it had before this transform (see the class doc)."""
        d = dict(data)
        for key in self.key_iterator(d):
            record = self.pop_transform(d[key])
            d[key] = _inverted(d[key], record, key)
        return d


def plan_of(x: MetaTensor) -> Plan:
    """The :class:`~medproc.plan.Plan` of the last :class:`Resampled` applied to ``x`` (from its
    ``applied_operations``): for mapping lesions or predictions with medproc's own tools."""
    if not isinstance(x, MetaTensor):
        raise TypeError(
            f"plan_of takes the MetaTensor Resampled gave, got a {type(x).__name__} (plain tensors "
            "carry no record: under monai.data.set_track_meta(False) nothing is recorded)"
        )
    for op in reversed(list(x.applied_operations)):
        if op.get("class") == "Resampled":
            return _record_plan(op)
    raise ValueError(
        "no Resampled in this MetaTensor's applied_operations (they are kept only while MONAI "
        "tracks metadata: monai.data.set_track_meta(True), the default)"
    )


def _record_plan(record: Mapping) -> Plan:
    info = record["extra_info"]
    src = np.asarray(info["src_affine"], dtype=np.float64)
    m = np.asarray(info["matrix"], dtype=np.float64)
    in_shape = tuple(int(n) for n in np.asarray(record["orig_size"]).ravel())
    out_shape = tuple(int(n) for n in np.asarray(info["out_shape"]).ravel())
    return Plan(in_shape, src, out_shape, src @ m, m)


def _inverted(x, record: Mapping, key) -> MetaTensor:
    """``x`` (on a Resampled output grid) back on that Resampled's input grid."""
    plan = _record_plan(record)
    same = tuple(x.shape[1:]) == plan.out_shape
    own = to_volume(x) if isinstance(x, MetaTensor) else None  # (a view, on its own affine)
    a = None if own is None else own.affine
    if same and (a is None or np.allclose(a, plan.out_affine, atol=1e-4)):
        vol = to_volume(x, affine=plan.out_affine)
    elif a is not None and np.allclose(spacing_of(a), spacing_of(plan.out_affine), rtol=1e-4):
        # its grid changed after Resampled without a record on its stack (pad_list_data_collate
        # padding a batch, a flip left on the stack): back from the grid its affine says, in
        # world space, as MONAI's own inverses go (a grid of other spacings is no such change)
        vol = own
        plan = Plan(
            plan.in_shape, plan.in_affine, vol.shape[:3], a, np.linalg.inv(plan.in_affine) @ a
        )
    else:
        raise ValueError(
            f"Resampled.inverse: key {key!r} is {tuple(x.shape[1:])} on "
            f"{'no affine' if a is None else 'an affine of other spacings'}, but Resampled made "
            f"{plan.out_shape} at {tuple(np.round(spacing_of(plan.out_affine), 4))} mm: invert "
            "what changed its grid first (Compose.inverse and monai.transforms.Invertd do)"
        )
    interp = interp_of(record["extra_info"]["mode"], key)
    on_gpu = isinstance(x, torch.Tensor) and x.is_cuda
    device, device_id = ("gpu", x.device.index) if on_gpu else ("cpu", None)
    back = invert(vol, plan, interp=interp, device=device, device_id=device_id)
    arr = back.array
    if arr.ndim == 3:
        arr = arr[None]
    else:
        arr = arr.permute(3, 0, 1, 2) if torch.is_tensor(arr) else np.moveaxis(arr, -1, 0)
    like = x if isinstance(x, MetaTensor) else MetaTensor(x)
    return with_voxels(like, arr, plan.in_affine)
