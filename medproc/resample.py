"""``medproc.resample``: one volume or many, to a target spacing/orientation, through DALI."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .errors import ReadError, UsageError
from .plan import make_plan, say_notes
from .spec import Spec
from .volume import Volume

__all__ = ["resample", "resample_batch", "check_label_grid"]


def check_output_size(plan, channels: int, in_bytes: int, source=None) -> None:
    """Refuse a plan's output grid that would not fit in memory (e.g. spacing=0.001) before the
    engine allocates it: resampling holds the input (``in_bytes``) and about twice the float32
    output at its peak (6.8 GB for a 3.2 GB output on DALI's CPU backend). Refuse too a grid
    whose spacing the readers would refuse (``shape=`` can make one) when the input's is not:
    a resample makes nothing medproc cannot read back. ``convert --dry-run`` asks it from the
    headers alone."""
    from .geometry import spacing_of
    from .io.safety import SPACING_RANGE_MM, human, max_bytes, spacings_outside

    out_shape = plan.out_shape
    if max(int(n) for n in out_shape) >= 2**31:  # (DALI's extents are 32-bit: it came back 1)
        raise UsageError(
            f"the output grid would be {'x'.join(map(str, out_shape))} voxels: an axis of 2^31 "
            "voxels or more cannot be resampled; choose a smaller shape or a coarser spacing",
            source,
        )
    lo, hi = SPACING_RANGE_MM
    sp = spacing_of(plan.out_affine)
    if spacings_outside(sp) and not spacings_outside(spacing_of(plan.in_affine)):
        raise UsageError(
            f"the output grid ({'x'.join(map(str, out_shape))} voxels) would have a spacing of "
            f"{'x'.join(f'{s:.3g}' for s in sp)} mm; a spacing outside {lo:g} to {hi:g} mm cannot "
            "be read back; choose another shape",
            source,
        )
    nbytes = int(np.prod(out_shape, dtype=object)) * max(channels, 1) * 4
    need = 2 * nbytes + int(in_bytes)
    if need > max_bytes():
        raise UsageError(
            f"the output grid would be {'x'.join(map(str, out_shape))} voxels = "
            f"{human(nbytes)}; resampling it needs ~{human(need)} (twice the output, and the "
            f"input), more than the {human(max_bytes())} one volume may take here; "
            "choose a coarser spacing or a crop (the cap is the smallest of the physical memory, "
            "ulimit -v and MEDPROC_MAX_BYTES)",
            source,
        )


def _check_output_size(vol: Volume, plan) -> None:
    a = vol.array  # numpy, or a torch tensor (CUDA: medproc.load(..., device="gpu"))
    item = a.itemsize if isinstance(a, np.ndarray) else a.element_size()
    in_bytes = int(np.prod(a.shape, dtype=object)) * item
    check_output_size(plan, vol.channels, in_bytes, vol.meta.get("source"))


def check_label_grid(image: Volume, label: Volume, label_name=None, image_name=None) -> None:
    """Refuse a label map that is not on its image's grid (shape, or affine within 1e-4 mm):
    resampled with the image's plan it would land off its structures. The one check of
    ``resample``, ``convert``, the proxy and the MONAI layer; the names default to the
    Volumes' sources."""
    if label.shape[:3] == image.shape[:3] and np.allclose(label.affine, image.affine, atol=1e-4):
        return
    name = label_name or label.meta.get("source") or "the label map"
    img = image_name or image.meta.get("source") or "its image"
    why = (
        f"shape {tuple(label.shape[:3])} vs {tuple(image.shape[:3])}"
        if label.shape[:3] != image.shape[:3]
        else f"the same shape, affines {np.abs(label.affine - image.affine).max():.3g} mm apart"
    )
    raise UsageError(
        f"{name} is not on the grid of {img} ({why}); resample it onto the image first, or "
        "give a label map made on this image"
    )


def check_label_values(label: Volume, label_name=None) -> None:
    """Refuse a label map with several values per voxel (a 4-D file: one class per voxel is
    what nearest neighbour keeps and training tools read), or one holding a value that is not
    a whole number within +-2^24 (DALI resamples labels in float32, exact for those only): a
    ReadError naming the label file (the engine would say it about the batch, without the
    file, and the case's error named the image)."""
    from .pipeline._dtypes import _feed_dtype_of

    shape = tuple(label.array.shape)
    if len(shape) > 3 and int(np.prod(shape[3:])) != 1:
        raise ReadError(
            f"a label map holds one class per voxel; this one has {int(np.prod(shape[3:]))} "
            f"values per voxel (shape {shape}): give one 3-D label map per image",
            label_name or label.meta.get("source"),
        )

    try:  # (whole numbers within +-2^24, of any dtype)
        _feed_dtype_of(label.array, label=True)
    except ValueError as e:
        raise ReadError(str(e), label_name or label.meta.get("source")) from None


def _spec(spec: Spec | None, **kw) -> Spec:
    kw = {k: v for k, v in kw.items() if v is not None}
    return spec.replace(**kw) if spec is not None else Spec(**kw)


def resample_batch(
    volumes: Sequence[Volume],
    spec: Spec,
    device: str = "cpu",
    labels: Sequence[Volume] | None = None,
    batch_size: int = 8,
    num_threads: int | None = None,
    into: Callable[[tuple, np.dtype], np.ndarray | None] | None = None,
    warn: bool = True,
):
    """Resample many volumes with one spec, batched through the engine.

    Parameters
    ----------
    volumes : sequence of Volume
        Voxels on the CPU (numpy) or the GPU (CUDA tensors, e.g. from
        ``medproc.load(..., device="gpu")``: they stay there).
    spec : Spec
        The output grid and intensity steps.
    device : {"cpu", "gpu"}
        DALI backend.
    labels : sequence of Volume, optional
        One label map per volume, on its grid (nearest neighbour, dtype kept).
    batch_size : int
        Volumes per DALI batch: the pipeline is built for this many whatever the call's
        count (one pipeline for calls of any size).
    num_threads : int, optional
        DALI's CPU threads (default: all cores; 1 in batch workers).
    into : callable, optional
        Numpy outputs (host inputs): ``into(shape, dtype)`` gives the C-ordered host array
        (of DALI's ``(k, j, i, C)`` shape and the output's dtype) each output is copied into,
        or None for a new one; on the GPU the copy goes straight from the device (page-locked
        arrays: one DMA transfer). The outputs are views of those arrays (see
        :meth:`medproc.pipeline.Engine.map`), but label maps of a dtype DALI does not take
        (bool, int32, int64...), cast back to it afterwards: new arrays.
    warn : bool
        Say planning's notes about a volume (e.g. ``crop_foreground`` found no voxel above its
        threshold) as warnings naming its source; they are added to the output's
        ``meta["warnings"]`` either way.

    Returns
    -------
    list
        Volumes, or ``(image, label)`` pairs when ``labels`` is given. Outputs are numpy arrays,
        or CUDA tensors when the inputs were on the GPU.
    """
    from .errors import MedprocError
    from .pipeline import Engine, Graph, Job
    from .pipeline._dtypes import _feed_dtype_of
    from .spec import check_args

    threads = {} if num_threads is None else {"num_threads": num_threads}
    check_args(spec, "resample_batch", batch_size=batch_size, **threads)
    for what, given in (("volumes", volumes), ("labels", labels)):
        if isinstance(given, Volume):
            raise UsageError(
                f"resample_batch takes a list of {what}, got one Volume: pass [volume], or "
                "use medproc.resample for one"
            )
    vols = list(volumes)
    labs = list(labels) if labels is not None else None
    for what, items in (("volumes", vols), ("labels", labs or [])):
        bad = next((n for n, v in enumerate(items) if not isinstance(v, Volume)), None)
        if bad is not None:
            raise UsageError(
                f"{what}[{bad}] is a {type(items[bad]).__name__}, not a medproc.Volume: "
                "wrap an array with medproc.Volume(array, affine)"
            )
    if labs is not None:
        if len(labs) != len(vols):
            raise UsageError(
                f"{len(vols)} volumes but {len(labs)} labels: give one label per volume"
            )
        for v, lb in zip(vols, labs):
            check_label_grid(v, lb)
            check_label_values(lb)
    for n, v in enumerate(vols):  # (the engine would say it about the batch, naming none)
        try:
            _feed_dtype_of(v.array, label=False)
        except ValueError as e:
            msg = e.message if isinstance(e, MedprocError) else str(e)
            raise ReadError(msg, v.meta.get("source") or f"volumes[{n}]") from None
    if not vols:
        return []
    on_gpu = any(v.device != "cpu" for v in vols)
    if device == "cpu" and on_gpu:
        vols = [v.numpy() for v in vols]
        labs = [lb.numpy() for lb in labs] if labs else labs
        on_gpu = False
    if into is not None and on_gpu:
        raise UsageError("into: for numpy outputs; these inputs are CUDA tensors (outputs too)")
    plans = [_plan(v, spec, bool(labs)) for v in vols]
    for v, p in zip(vols, plans):
        _check_output_size(v, p)
        if warn:
            say_notes(p, v.meta.get("source"))
    jobs = [
        Job(v.array, p, () if labs is None else (labs[n].array,))
        for n, (v, p) in enumerate(zip(vols, plans))
    ]
    # one pipeline for any number of volumes up to batch_size (the engine caches pipelines by
    # their batch size: a GPU service's batches of 1 to 8 built up to 8, ~0.1 s each)
    engine = Engine(device, batch_size=max(1, batch_size), num_threads=num_threads)
    graph = Graph.from_spec(spec, labels=0 if labs is None else 1)
    results = engine.run(jobs, graph, as_torch=on_gpu, into=into)
    out = []
    for n, (res, p, v) in enumerate(zip(results, plans, vols)):
        meta = {"resampled_from": v.meta.get("source"), "device": device}
        if p.notes:
            meta["warnings"] = [*(v.meta.get("warnings") or []), *p.notes]
        img = v.with_array(res[0], p.out_affine, **meta)
        out.append(img if labs is None else (img, labs[n].with_array(res[1], p.out_affine, **meta)))
    return out


def _plan(v: Volume, spec: Spec, labels: bool):
    """``v``'s plan, with a note when an integer ``spec.dtype`` clips its values."""
    from dataclasses import replace

    from .plan_values import dtype_clips

    p = make_plan(v.shape, v.affine, spec, v.array if spec.needs_array else None, labels=labels)
    clips = dtype_clips(v.array, spec)
    return replace(p, notes=(*p.notes, clips)) if clips else p


def tiny_volume() -> Volume:
    """An 8^3 int16 volume (2 mm, on axes) that builds a CT's pipeline in a warm-up."""
    return Volume(np.zeros((8, 8, 8), np.int16), np.diag([2.0, 2.0, 2.0, 1.0]))


def resample(
    volume: Volume,
    spacing=None,
    orientation: str | None = None,
    interp: str | None = None,
    device: str = "cpu",
    *,
    shape=None,
    spec: Spec | None = None,
    label: Volume | None = None,
    **spec_kw,
):
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
    if isinstance(spacing, Spec):
        raise UsageError("resample(volume, Spec(...)): pass the spec by name, spec=Spec(...)")
    s = _spec(spec, spacing=spacing, orientation=orientation, interp=interp, shape=shape, **spec_kw)
    for what, v in (("volume", volume), ("label", label)):  # (named as given, not volumes[0])
        if v is not None and not isinstance(v, Volume):
            raise UsageError(
                f"{what} is a {type(v).__name__}, not a medproc.Volume: wrap an array with "
                "medproc.Volume(array, affine)"
            )
    res = resample_batch([volume], s, device=device, labels=None if label is None else [label])
    return res[0]
