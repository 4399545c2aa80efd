"""Big volumes run as slabs on DALI's CPU backend (pipeline/slabs.py), cut by their output
shape alone: the outputs equal the uncut run's (images to float32 rounding of the sample points, and no
further from scipy's float64 interpolation than the uncut run is; labels exactly, ties
included), in the same memory layout."""

import numpy as np
import pytest
import torch
from scipy import ndimage

import medproc
from medproc import Spec, make_plan
from medproc.pipeline import Engine, Graph, Job, slabs
from medproc.sample_data import grid_affine

# sample points of a slab are computed from a shifted origin: float32 rounding of a point
# (~1e-5 voxel at these indices) times the steepest step of the image (1000 per voxel)
TOL = 0.05


def _volume(shape=(200, 190, 170), spacing=(1.0, 1.0, 1.0), seed=0):
    """Smooth structure plus sharp edges (a box of +1000) and noise; labels of 5 values that
    change every voxel (every nearest-neighbour tie matters)."""
    rng = np.random.default_rng(seed)
    i, j, k = np.meshgrid(*[np.arange(n, dtype=np.float32) for n in shape], indexing="ij")
    img = 100 * np.sin(i / 7) * np.cos(j / 5) + k
    img[30:90, 40:100, 20:110] += 1000
    img += rng.normal(0, 20, shape).astype(np.float32)
    lab = rng.integers(0, 5, shape).astype(np.uint8)
    aff = grid_affine(shape, spacing, (-60.0, -70.0, -40.0))
    f = np.asfortranarray  # i fastest, as the readers return volumes
    return medproc.Volume(f(img.astype(np.float32)), aff), medproc.Volume(f(lab), aff)


def _run(vol, lab, spec, threads=2, **graph_kw):
    plan = make_plan(vol.shape, vol.affine, spec)
    graph = Graph.from_spec(spec, labels=1, **graph_kw)
    eng = Engine("cpu", batch_size=1, num_threads=threads)
    ((img, out_lab),) = eng.run([Job(vol.array, plan, (lab.array,))], graph)
    return plan, graph, img, out_lab


def _uncut(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(slabs, "slab_count", lambda shape: 1)
        return _run(*args, **kw)


@pytest.mark.parametrize(
    "spec, slabs_expected",
    [
        (Spec(spacing=1.1), 3),  # linear, resize graph
        (Spec(spacing=1.2, interp="cubic"), 3),
        (Spec(spacing=1.15, antialias=True), 3),
        (Spec(spacing=(0.9, 1.3, 0.8), orientation="LPS"), 5),  # flipped axes (resize graph)
        (Spec(spacing=1.2, crop=(90, 150, 170), fill=-1000), 2),  # pads beyond the input: warp
        (Spec(spacing=1.1, orientation="ASR"), 4),  # axes permuted: the warp graph
    ],
    ids=["linear", "cubic", "antialias", "flips", "pad-fill", "permuted"],
)
def test_slabs_give_the_uncut_result(monkeypatch, spec, slabs_expected):
    vol, lab = _volume()
    plan, graph, ref, ref_lab = _uncut(monkeypatch, vol, lab, spec)
    assert slabs.slab_count(plan.out_shape) == slabs_expected  # it is cut: this test means it
    _, _, img, out_lab = _run(vol, lab, spec)
    _same_as_uncut(vol, plan, spec, img, out_lab, ref, ref_lab)


def test_nearest_neighbour_ties_land_as_in_the_uncut_run(monkeypatch):
    """0.5 -> 1 mm: every nearest-neighbour sample lies half-way between two voxels."""
    vol, lab = _volume(shape=(270, 270, 240), spacing=(0.5, 0.5, 0.5))
    spec = Spec(spacing=1.0)
    plan, _, ref, ref_lab = _uncut(monkeypatch, vol, lab, spec)
    assert slabs.slab_count(plan.out_shape) == 2
    _, _, img, out_lab = _run(vol, lab, spec)
    _same_as_uncut(vol, plan, spec, img, out_lab, ref, ref_lab)


def _same_as_uncut(vol, plan, spec, img, out_lab, ref, ref_lab):
    assert img.shape == ref.shape == tuple(plan.out_shape)
    assert img.strides == ref.strides  # the same layout (i fastest) as the uncut output
    if spec.interp == "linear":  # DALI's warp is itself ~0.06-0.25 off here: both vs scipy
        truth, inside = _linear_reference(vol, plan, spec.fill)
        ref_err = np.abs(ref - truth)[inside].max()
        assert np.abs(img - truth)[inside].max() <= 1.5 * max(ref_err, 1e-3)
        np.testing.assert_allclose(img, ref, rtol=0, atol=max(TOL, 2 * ref_err))
    else:
        np.testing.assert_allclose(img, ref, rtol=0, atol=TOL)
    np.testing.assert_array_equal(out_lab, ref_lab)
    assert out_lab.dtype == ref_lab.dtype == np.uint8


def _linear_reference(vol, plan, fill):
    """scipy's trilinear interpolation in float64 at the plan's sample points, and where the
    points lie inside the input (away from the border rules)."""
    idx = np.indices(plan.out_shape).reshape(3, -1).astype(np.float64)
    src = plan.matrix[:3, :3] @ idx + plan.matrix[:3, 3:4]
    mode = "nearest" if fill is None else "constant"
    truth = ndimage.map_coordinates(
        vol.array.astype(np.float64), src, order=1, mode=mode, cval=fill or 0.0
    )
    inside = np.all((src > 0.5) & (src < np.array(vol.shape)[:, None] - 1.5), axis=0)
    return truth.reshape(plan.out_shape), inside.reshape(plan.out_shape)


def test_the_output_does_not_depend_on_threads_or_batch():
    """How a volume is cut depends on its plan alone: -j, num_threads and batch mates change
    nothing, to the bit."""
    vol, lab = _volume()
    small, _ = _volume(shape=(40, 40, 30), seed=1)
    spec = Spec(spacing=1.1)
    (one,) = medproc.resample_batch([vol], spec, num_threads=1)
    (three,) = medproc.resample_batch([vol], spec, num_threads=3)
    _, with_mate = medproc.resample_batch([small, vol], spec, num_threads=2)
    assert np.array_equal(one.array, three.array) and np.array_equal(one.array, with_mate.array)


def test_slabs_with_channels_first_and_torch_outputs(monkeypatch):
    vol, lab = _volume()
    spec = Spec(spacing=1.1)
    plan = make_plan(vol.shape, vol.affine, spec)
    graph = Graph.from_spec(spec, labels=1, channels_first=True)
    job = [Job(torch.from_numpy(vol.array), plan, (torch.from_numpy(lab.array),))]
    with monkeypatch.context() as m:
        m.setattr(slabs, "slab_count", lambda shape: 1)
        ((ref, ref_lab),) = Engine("cpu", batch_size=1).run(job, graph, as_torch=True)
    ((img, out_lab),) = Engine("cpu", batch_size=1).run(job, graph, as_torch=True)
    assert isinstance(img, torch.Tensor) and img.shape == ref.shape == (1, *plan.out_shape)
    assert img.is_contiguous()
    torch.testing.assert_close(img, ref, rtol=0, atol=TOL)
    assert torch.equal(out_lab, ref_lab)


def test_slabs_are_joined_into_the_arrays_into_gives():
    vol, _ = _volume()
    spec = Spec(spacing=1.1)
    given = []

    def into(shape, dtype):
        given.append(np.empty(shape, dtype))
        return given[-1]

    (plain,) = medproc.resample_batch([vol], spec)
    (got,) = medproc.resample_batch([vol], spec, into=into)
    assert len(given) == 1 and given[0].shape == plain.shape[::-1] + (1,)  # (k, j, i, C)
    assert np.shares_memory(got.array, given[0])
    assert np.array_equal(got.array, plain.array)


def test_small_volumes_are_not_cut():
    vol, _ = _volume(shape=(90, 90, 80))
    plan = make_plan(vol.shape, vol.affine, Spec(spacing=1.0))  # 648,000 voxels
    job = Job(vol.array, plan, ())
    assert slabs.split([job, job], Graph()) == ([job, job], None)
    big, _ = _volume()
    job2 = Job(big.array, make_plan(big.shape, big.affine, Spec(spacing=1.0)), ())
    cut, parts = slabs.split([job, job2, job], Graph())  # 170 slices: 4 slabs, in order
    assert [p[:2] for p in parts] == [(0, 1), (1, 4), (5, 1)] and len(cut) == 6
    assert [c.plan.out_shape[2] for c in cut[1:5]] == [42, 43, 43, 42]
    assert parts[1][2] == (0, 42, 85, 128, 170)


def test_an_image_of_the_wrong_size_is_refused_before_it_is_cut():
    vol, _ = _volume()
    plan = make_plan((190, 180, 160), vol.affine, Spec(spacing=1.0))  # not vol's shape
    assert slabs.slab_count(plan.out_shape) >= 2
    with pytest.raises(ValueError, match=r"image shape \(200, 190, 170\) does not match"):
        Engine("cpu", batch_size=1).run([Job(vol.array, plan)], Graph())


def test_strong_downsampling_keeps_the_uncut_graph():
    """8x along k: the slabs' resize regions stay inside their inputs, so the batch keeps the
    resize graph (a slab reading outside would move the labels to the slower warp graph)."""
    vol, lab = _volume(shape=(200, 190, 800), spacing=(1.0, 1.0, 0.5))
    spec = Spec(spacing=(1.0, 1.0, 4.0))
    plan = make_plan(vol.shape, vol.affine, spec)
    graph = Graph.from_spec(spec, labels=1)
    assert graph.mode_for([plan], "cpu") == "resize"
    cut, _ = slabs.split([Job(vol.array, plan, (lab.array,))], graph)
    assert len(cut) >= 2 and graph.mode_for([c.plan for c in cut], "cpu") == "resize"


@pytest.mark.parametrize("seed", range(16))
def test_random_plans_give_the_uncut_result_when_cut(monkeypatch, seed):
    """Random specs (spacing, orientation, crop, fill, interpolation, antialias, channels) on
    small volumes forced into 3 slabs: the same result as uncut; labels exactly."""
    rng = np.random.default_rng(100 + seed)
    shape = tuple(int(x) for x in rng.integers(24, 48, 3))
    vol, lab = _volume(shape=shape, spacing=tuple(rng.uniform(0.6, 1.6, 3)), seed=seed)
    interp = ("linear", "cubic", "nearest")[seed % 3]
    aligned = interp == "cubic" or seed % 5 == 0  # cubic and antialias need axis-aligned plans
    kw = dict(
        spacing=tuple(float(x) for x in rng.uniform(0.5, 2.5, 3)),
        orientation=None if aligned else ("RAS", "LPS", "ASR", "PIL")[seed % 4],
        interp=interp,
        antialias=seed % 5 == 0 and interp != "nearest",
    )
    if rng.random() < 0.5:
        kw["crop"] = tuple(int(x) for x in rng.integers(20, 60, 3))
    if seed % 2 and interp != "cubic" and not kw["antialias"]:
        kw["fill"] = -1000.0
    spec = Spec(**kw)
    plan = make_plan(vol.shape, vol.affine, spec)
    if plan.out_shape[2] < 3:
        pytest.skip("fewer output slices than slabs")
    with monkeypatch.context() as m:  # the reference: one sample
        m.setattr(slabs, "slab_count", lambda shape: 1)
        _, _, ref, ref_lab = _run(vol, lab, spec)
    monkeypatch.setattr(slabs, "slab_count", lambda shape: 3)
    _, _, img, out_lab = _run(vol, lab, spec)
    assert img.shape == ref.shape and img.strides == ref.strides
    np.testing.assert_allclose(img, ref, rtol=0, atol=TOL)
    np.testing.assert_array_equal(out_lab, ref_lab)


def test_torch_outputs_of_cut_volumes_equal_the_numpy_ones():
    """as_torch on the CPU joins the slabs after (not through the runner's into)."""
    vol, lab = _volume()
    spec = Spec(spacing=1.1)
    plan = make_plan(vol.shape, vol.affine, spec)
    graph = Graph.from_spec(spec, labels=1)
    job = [Job(vol.array, plan, (lab.array,))]
    ((t_img, t_lab),) = Engine("cpu", batch_size=1).run(job, graph, as_torch=True)
    ((n_img, n_lab),) = Engine("cpu", batch_size=1).run(job, graph)
    assert isinstance(t_img, torch.Tensor) and t_img.stride() == tuple(
        s // n_img.itemsize for s in n_img.strides
    )
    assert np.array_equal(t_img.numpy(), n_img) and np.array_equal(t_lab.numpy(), n_lab)
