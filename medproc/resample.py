"""``medproc.resample``: one volume or many, to a target spacing/orientation, through DALI."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from .plan import make_plan
from .spec import Spec
from .volume import Volume

__all__ = ["resample", "resample_batch", "get_resampler"]


@functools.lru_cache(maxsize=16)
def get_resampler(device: str, interp: str, antialias: bool, dtype: str, fill, with_label: bool,
                  batch_size: int, in_dtypes: tuple = (), num_threads: int | None = None):
    """A cached :class:`~medproc.pipeline.Resampler` (building a DALI pipeline costs ~0.1 s).

    ``in_dtypes`` is part of the key: a DALI external source keeps one input dtype."""
    from .pipeline import Resampler

    return Resampler(device=device, batch_size=batch_size, interp=interp, antialias=antialias,
                     dtype=dtype, fill=fill, with_label=with_label, num_threads=num_threads)


def _spec(spec: Spec | None, **kw) -> Spec:
    kw = {k: v for k, v in kw.items() if v is not None}
    return spec.replace(**kw) if spec is not None else Spec(**kw)


def resample_batch(volumes: Sequence[Volume], spec: Spec, device: str = "cpu",
                   labels: Sequence[Volume] | None = None, batch_size: int = 8,
                   num_threads: int | None = None):
    """Resample many volumes with one spec, batched through one DALI pipeline.

    ``num_threads`` sets DALI's CPU threads (default: all cores; 1 in batch workers).

    Returns a list of Volumes, or of ``(image, label)`` pairs when ``labels`` is given (each
    label on its image's grid; nearest neighbour, dtype kept).
    """
    vols = list(volumes)
    labs = list(labels) if labels is not None else None
    if labs is not None:
        for v, lb in zip(vols, labs):
            if lb.shape != v.shape or not np.allclose(lb.affine, v.affine, atol=1e-4):
                raise ValueError(
                    f"label {lb.meta.get('source', '')} is not on its image's grid "
                    f"({lb.shape} vs {v.shape}); resample it onto the image first"
                )
    bs = max(1, min(batch_size, len(vols)))
    img_dt = np.result_type(*[v.array.dtype for v in vols])
    lab_dt = np.result_type(*[lb.array.dtype for lb in labs]) if labs else None
    if lab_dt == np.bool_:
        lab_dt = np.dtype(np.uint8)
    r = get_resampler(device, spec.interp, spec.antialias, str(np.dtype(spec.dtype)), spec.fill,
                      labs is not None, bs, (str(img_dt), str(lab_dt)), num_threads)
    plans = [make_plan(v.shape, v.affine, spec, v.array) for v in vols]
    batches = []
    for s in range(0, len(vols), bs):
        sl = slice(s, s + bs)
        lab_arrays = None
        if labs is not None:
            lab_arrays = [np.asarray(lb.array, dtype=lab_dt) for lb in labs[sl]]
        batches.append(([np.asarray(v.array, dtype=img_dt) for v in vols[sl]], plans[sl], lab_arrays))
    out = []
    i = 0
    for res in r.run_batches(batches):
        for item in res:
            p, v = plans[i], vols[i]
            meta = {"resampled_from": v.meta.get("source"), "device": device}
            if labs is None:
                out.append(v.with_array(item, p.out_affine, **meta))
            else:
                img, lab = item
                out.append((v.with_array(img, p.out_affine, **meta),
                            labs[i].with_array(lab, p.out_affine, **meta)))
            i += 1
    return out


def resample(volume: Volume, spacing=None, orientation: str | None = None, interp: str | None = None,
             device: str = "cpu", *, shape=None, spec: Spec | None = None,
             label: Volume | None = None, **spec_kw):
    """Resample ``volume`` to a target spacing (or shape) and orientation.

    Parameters
    ----------
    volume : Volume
    spacing : float or (si, sj, sk), optional
        Target spacing in mm, NIfTI axis order (i, j, k) of the output.
    orientation : str, optional
        Target axis codes, e.g. ``"RAS"`` (closest permutation/flip; obliquity is kept).
    interp : {"linear", "cubic", "nearest"}, optional
        Image interpolation (default linear).
    device : {"cpu", "gpu"}
        DALI backend.
    shape : (ni, nj, nk), optional
        Target grid size instead of a spacing.
    spec : Spec, optional
        A full spec; the other arguments override its fields.
    label : Volume, optional
        A label map on ``volume``'s grid, resampled with nearest neighbour alongside.
    **spec_kw
        Other :class:`~medproc.spec.Spec` fields (crop, intensity, dtype, antialias...).

    Returns
    -------
    Volume, or (Volume, Volume) with ``label``
        The output grid follows medproc's rule (see :class:`~medproc.spec.Spec`); its affine is
        exact in float64.

    Examples
    --------
    >>> import medproc
    >>> v = medproc.load("sample_data/dicom/ct_axial")  # doctest: +SKIP
    >>> medproc.resample(v, spacing=1.5, orientation="RAS").orientation  # doctest: +SKIP
    'RAS'
    """
    s = _spec(spec, spacing=spacing, orientation=orientation, interp=interp, shape=shape, **spec_kw)
    res = resample_batch([volume], s, device=device, labels=None if label is None else [label])
    return res[0]
