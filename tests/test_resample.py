"""Resampled voxels against independent resamplers (SimpleITK, scipy) on medproc's grid.

Tolerances (from issue #3): linear within relative L2 <= 1e-3 in the interior (voxels whose
source position lies at least one voxel inside the input); nearest-neighbour labels agree on
>= 99.5% of voxels (ties at exactly half-way may go either way); affines exact to 1e-6 mm.
The same tests run on DALI's CPU backend here and on the GPU (-m gpu) on the H200.
"""

import os

import numpy as np
import pytest
import scipy.ndimage as ndi
import SimpleITK as sitk
from world import sitk_array

import medproc
from medproc import Intensity, Spec, make_plan
from medproc.geometry import apply_affine
from medproc.io.sitk_io import resample_filter, to_sitk
from medproc.sample_data import ct_phantom, grid_affine

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def sitk_reference(vol, out_affine, out_shape, interp):
    """SimpleITK's ResampleImageFilter of ``vol`` onto medproc's output grid, indexed (i, j, k)
    (``GetArrayFromImage`` is (z, y, x) = (k, j, i))."""
    f = resample_filter(
        out_affine, out_shape, interp, sitk.sitkFloat64 if interp == "linear" else sitk.sitkUInt8
    )
    src = to_sitk(vol.with_array(vol.array.astype(np.float64) if interp == "linear" else vol.array))
    ref = sitk_array(f.Execute(src))
    assert ref.shape == tuple(out_shape)
    return ref


def interior(plan, margin=1.0):
    idx = np.indices(plan.out_shape).reshape(3, -1).T.astype(np.float64)
    src = apply_affine(plan.matrix, idx)
    ok = np.all((src >= margin) & (src <= np.array(plan.in_shape) - 1 - margin), axis=1)
    return ok.reshape(plan.out_shape)


def rel_l2(a, b, mask):
    return np.linalg.norm((a - b)[mask]) / np.linalg.norm(b[mask])


def _synthetic(oblique=True, shape=(70, 80, 36)):
    """(i, j, k) = 70 columns of 1.1 mm, 80 rows of 1.4 mm, 36 slices of 3 mm."""
    iop = (
        (0.9659258, 0.0, -0.258819, 0.1830127, 0.7071068, 0.6830127)
        if oblique
        else (1, 0, 0, 0, 1, 0)
    )
    aff = grid_affine(shape, (1.1, 1.4, 3.0), (-40.0, -60.0, -30.0), iop=iop)
    from medproc.sample_data import Lesion

    centre = apply_affine(aff, (np.array(shape) - 1) / 2) * [-1, -1, 1]
    les = [Lesion(tuple(centre), 25.0, 80.0)]
    img, lab = ct_phantom(shape, aff, les)
    img = ndi.gaussian_filter(img.astype(np.float32), 1.0)  # band-limited: interpolators agree
    return medproc.Volume(img, aff), medproc.Volume(lab, aff)


CASES = {
    "synthetic-oblique-RAS": (lambda: _synthetic(True), dict(spacing=1.5, orientation="RAS")),
    "synthetic-oblique-PIR": (
        lambda: _synthetic(True),
        dict(spacing=(2.0, 1.2, 1.7), orientation="PIR"),
    ),
    "synthetic-axial-aniso": (lambda: _synthetic(False), dict(spacing=(0.8, 2.0, 1.25))),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_linear_and_nearest_match_simpleitk(case, device):
    make, kw = CASES[case]
    img, lab = make()
    out, out_lab = medproc.resample(img, device=device, label=lab, **kw)
    plan = make_plan(img.shape, img.affine, Spec(**kw))
    np.testing.assert_allclose(out.affine, plan.out_affine, atol=1e-6)
    ref = sitk_reference(img, out.affine, out.shape, "linear")
    mask = interior(plan)
    assert mask.mean() > 0.2
    assert rel_l2(out.array.astype(np.float64), ref, mask) <= 1e-3
    ref_lab = sitk_reference(lab, out.affine, out.shape, "nearest")
    agree = (out_lab.array == ref_lab)[mask].mean()
    assert agree >= 0.995, agree
    assert out_lab.array.dtype == np.uint8 and set(np.unique(out_lab.array)) <= {0, 1}


@pytest.mark.parametrize("device", DEVICES)
def test_real_oblique_nifti(device):
    """nibabel's example4d (oblique, sform = qform), first volume, to 2 mm RAS."""
    from nibabel.testing import data_path

    v4 = medproc.load(os.path.join(data_path, "example4d.nii.gz"))
    vol = v4.with_array(np.ascontiguousarray(v4.array[..., 0]).astype(np.float32))
    out = medproc.resample(vol, spacing=2.0, orientation="RAS", device=device)
    plan = make_plan(vol.shape, vol.affine, Spec(spacing=2.0, orientation="RAS"))
    ref = sitk_reference(vol, out.affine, out.shape, "linear")
    mask = interior(plan)
    assert rel_l2(out.array.astype(np.float64), ref, mask) <= 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_real_ct_with_tumour_label(pyradiomics_data, device):
    img = medproc.load(os.path.join(pyradiomics_data, "lung1_image.nrrd"))
    lab = medproc.load(os.path.join(pyradiomics_data, "lung1_label.nrrd"))
    out, out_lab = medproc.resample(
        img, spacing=(1.5, 1.5, 2.0), orientation="RAS", label=lab, device=device
    )
    plan = make_plan(img.shape, img.affine, Spec(spacing=(1.5, 1.5, 2.0), orientation="RAS"))
    mask = interior(plan)
    ref = sitk_reference(img, out.affine, out.shape, "linear")
    assert rel_l2(out.array.astype(np.float64), ref, mask) <= 1e-3
    ref_lab = sitk_reference(lab, out.affine, out.shape, "nearest")
    assert (out_lab.array == ref_lab)[mask].mean() >= 0.995
    # the tumour keeps its volume and its centroid (world mm)
    vox_in, vox_out = np.prod(lab.spacing), np.prod(out_lab.spacing)
    assert abs((out_lab.array > 0).sum() * vox_out / ((lab.array > 0).sum() * vox_in) - 1) < 0.05
    c_in = lab.voxel_to_world(np.argwhere(lab.array > 0).mean(0))
    c_out = out_lab.voxel_to_world(np.argwhere(out_lab.array > 0).mean(0))
    assert np.abs(c_in - c_out).max() < 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_sheared_input_against_scipy(device):
    """A gantry-tilted (sheared) grid: SimpleITK cannot hold it, scipy can sample it."""
    shape = (40, 48, 30)
    aff = grid_affine(shape, (1.0, 1.0, 2.0), (0, 0, 0), tilt_deg=15)
    rng = np.random.default_rng(0)
    arr = ndi.gaussian_filter(rng.normal(size=shape), 2).astype(np.float32)
    vol = medproc.Volume(arr, aff)
    out = medproc.resample(vol, spacing=1.3, device=device)
    plan = make_plan(shape, aff, Spec(spacing=1.3))
    assert not plan.axis_aligned
    assert out.shape == plan.out_shape
    np.testing.assert_allclose(out.affine, plan.out_affine, atol=1e-6)
    ref = ndi.affine_transform(
        arr.astype(np.float64),
        plan.matrix[:3, :3],
        plan.matrix[:3, 3],
        output_shape=plan.out_shape,
        order=1,
        mode="nearest",
    )
    assert rel_l2(out.array.astype(np.float64), ref, interior(plan)) <= 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_intensity_and_dtype(device):
    img, _ = _synthetic(False)
    out = medproc.resample(
        img,
        spacing=2.0,
        device=device,
        dtype="float16",
        intensity=Intensity(clip=(-1000, 400), scale=(-1, 1)),
    )
    assert out.array.dtype == np.float16
    ref = medproc.resample(img, spacing=2.0, device=device).array
    expect = np.clip(ref, -1000, 400) * (2 / 1400) + (-1 - (2 / 1400) * -1000)
    np.testing.assert_allclose(out.array.astype(np.float32), expect, atol=2e-3)
    z = medproc.resample(img, spacing=2.0, device=device, intensity=Intensity(zscore=True)).array
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.05


@pytest.mark.parametrize("n", [2**31, 2**31 + 5])
def test_an_output_axis_beyond_32_bits_is_refused_not_returned_as_one_voxel(n):
    """shape=(2**31, 1, 1) fitted the memory cap (8 GiB) and came back a (1, 1, 1) array
    under an affine of 9e-9 mm voxels (a prober's call)."""
    img = medproc.Volume(np.zeros((4, 4, 4), np.float32), np.eye(4))
    img.meta["source"] = "tiny.nii"
    with pytest.raises(medproc.errors.UsageError, match=r"tiny.nii.*2\^31 voxels or more"):
        medproc.resample(img, shape=(n, 1, 1), device="cpu")


def test_an_integer_dtype_that_saturates_is_said_by_the_library_too():
    """The library says what the CLI says: an int8 output of CT clips most of its values (a
    warning naming the volume and the output's meta), and the saturated voxels are exactly
    numpy's clip of the float result; a window mapped into the type's range says nothing."""
    img, _ = _synthetic(False)
    img.meta["source"] = "ct.nii.gz"
    with pytest.warns(medproc.errors.MedprocWarning, match=r"ct.nii.gz: .*reach the int8 output"):
        out = medproc.resample(img, spacing=2.0, device="cpu", dtype="int8")
    assert any("those outside are clipped" in w for w in out.meta["warnings"])
    ref = medproc.resample(img, spacing=2.0, device="cpu").array
    np.testing.assert_array_equal(out.array, np.clip(np.round(ref), -128, 127).astype(np.int8))
    fits = Intensity(clip=(-1000, 400), scale=(0, 100))
    out = medproc.resample(img, spacing=2.0, device="cpu", dtype="int8", intensity=fits)
    assert not any("clipped" in w for w in out.meta.get("warnings") or [])


@pytest.mark.parametrize("device", DEVICES)
def test_cubic_and_antialias(device):
    img, _ = _synthetic(False)
    plan = make_plan(img.shape, img.affine, Spec(spacing=2.0))
    mask = interior(plan, 2)
    ref3 = ndi.affine_transform(
        img.array.astype(np.float64),
        np.diag(plan.matrix)[:3],
        plan.matrix[:3, 3],
        output_shape=plan.out_shape,
        order=3,
        mode="nearest",
    )
    cub = medproc.resample(img, spacing=2.0, interp="cubic", device=device)
    assert rel_l2(cub.array.astype(np.float64), ref3, mask) <= 2e-2
    down = medproc.resample(img, spacing=4.0, antialias=True, device=device)
    plain = medproc.resample(img, spacing=4.0, device=device)

    # antialiasing smooths: less high-frequency energy than point sampling
    def lap(a):
        return np.abs(ndi.laplace(a.astype(np.float64))).mean()

    assert lap(down.array) < lap(plain.array)
    with pytest.raises(ValueError, match="axis-aligned"):
        medproc.resample(
            _synthetic(True)[0], spacing=2.0, orientation="PIR", interp="cubic", device=device
        )


@pytest.mark.parametrize("device", DEVICES)
def test_batch_equals_per_item(device):
    vols = [_synthetic(True, shape=s)[0] for s in [(30, 40, 20), (36, 32, 24), (40, 44, 16)]]
    spec = Spec(spacing=1.7, orientation="RAS")
    batch = medproc.resample_batch(vols, spec, device=device, batch_size=2)
    for v, b in zip(vols, batch):
        one = medproc.resample(v, spec=spec, device=device)
        np.testing.assert_array_equal(one.affine, b.affine)
        if device == "cpu":
            np.testing.assert_array_equal(one.array, b.array)
        else:  # the GPU kernel's float rounding depends on the batch (measured: <= 1e-5 relative)
            np.testing.assert_allclose(
                one.array, b.array, rtol=0, atol=1e-5 * np.abs(one.array).max()
            )


def test_label_must_share_the_image_grid():
    img, lab = _synthetic(False)
    with pytest.raises(ValueError, match="is not on the grid of"):
        medproc.resample(img, 2.0, label=lab.with_array(lab.array[:, :, :-1]))  # a slice short


@pytest.mark.gpu
def test_cpu_and_gpu_agree():
    img, lab = _synthetic(True)
    for kw in [
        dict(spacing=1.5, orientation="RAS"),
        dict(spacing=(2.0, 1.2, 1.7), orientation="PIR"),
        dict(spacing=1.1, crop=(64, 64, 40)),
    ]:
        c, cl = medproc.resample(img, device="cpu", label=lab, **kw)
        g, gl = medproc.resample(img, device="gpu", label=lab, **kw)
        np.testing.assert_array_equal(c.affine, g.affine)
        scale = np.abs(c.array).max()
        assert np.abs(c.array - g.array).max() <= 1e-4 * scale
        assert (cl.array == gl.array).mean() >= 0.999


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("series", ["ct_axial", "ct_oblique"])
def test_own_spacing_is_the_identity(sample_data, series, device):
    """Anisotropic input (ct_axial: 2.9 x 2.9 x 2.5 mm, ct_oblique: 3.2 x 3.2 x 3.0 mm): its own
    spacing gives its own grid and voxels back; a spec's spacing is (i, j, k), in that order."""
    v = medproc.load(os.path.join(sample_data, "dicom", series))
    assert v.spacing[0] == pytest.approx(v.spacing[1]) and abs(v.spacing[2] - v.spacing[0]) > 0.1
    same = medproc.resample(v, spacing=v.spacing, device=device)
    assert same.shape == v.shape
    np.testing.assert_allclose(same.affine, v.affine, atol=1e-6)
    assert same.orientation == v.orientation
    np.testing.assert_array_equal(same.array, v.array.astype(same.array.dtype))
    # (1, 1, 3): 1 mm along i and j, 3 mm along k (the slices), not reversed
    out = medproc.resample(v, spec=Spec(spacing=(1, 1, 3)), device=device)
    np.testing.assert_allclose(out.spacing, [1.0, 1.0, 3.0], atol=1e-9)
    fov = np.array(v.shape) * v.spacing
    assert out.shape == tuple(int(x) for x in np.floor(fov / [1.0, 1.0, 3.0] + 0.5))
    assert out.shape[2] <= v.shape[2] < out.shape[0]  # 3 mm along the slices, 1 mm in-plane
    np.testing.assert_allclose(
        out.affine[:3, :3] / out.spacing, v.affine[:3, :3] / v.spacing, atol=1e-9
    )
    plan = make_plan(v.shape, v.affine, Spec(spacing=(1, 1, 3)))
    assert plan.out_shape == out.shape
    np.testing.assert_allclose(out.affine, plan.out_affine, atol=1e-6)


def test_an_absurd_output_grid_is_refused_before_any_allocation(sample_data):
    import os

    v = medproc.load(os.path.join(sample_data, "dicom", "ct_axial"))
    with pytest.raises(medproc.UsageError, match="output grid would be .* coarser spacing"):
        medproc.resample(v, spacing=0.001)
    lab = v.with_array(np.zeros(v.shape[:2] + (3,), np.uint8))
    with pytest.raises(medproc.UsageError, match="is not on the grid of"):
        medproc.resample(v, spacing=3.0, label=lab)


@pytest.mark.parametrize("fill", [np.nan, 0.5, 4e4, -1024.0])
def test_fill_values_an_integer_input_cannot_hold_are_kept(fill):
    """DALI casts the fill to the input's type: an int16 CT padded with NaN, 0.5 or 4e4 got 0,
    1 and 32767 (NaN's 0 reads as water). The padding holds the fill as given."""
    arr = np.full((20, 20, 10), 7, np.int16)
    out = medproc.resample(
        medproc.Volume(arr, np.eye(4)), crop=(30, 30, 10), fill=fill, device="cpu"
    ).numpy()
    pad, inside = np.asarray(out.array)[0, 0, 5], np.asarray(out.array)[15, 15, 5]
    assert (np.isnan(pad) if np.isnan(fill) else pad == fill) and inside == 7


def test_wrong_argument_types_are_named():
    """They came out of numpy, DALI or AttributeError ('needs_array', 'affine')."""
    vol = medproc.Volume(np.zeros((4, 4, 4), np.int16), np.eye(4))
    with pytest.raises(medproc.UsageError, match=r"^volume is a ndarray, not a medproc.Volume"):
        medproc.resample(np.zeros((4, 4, 4)), spacing=2.0)
    with pytest.raises(medproc.UsageError, match=r"^label is a ndarray, not a medproc.Volume"):
        medproc.resample(vol, spacing=2.0, label=np.zeros((4, 4, 4)))
    with pytest.raises(medproc.UsageError, match=r"volumes\[1\] is a ndarray, not a medproc"):
        medproc.resample_batch([vol, np.zeros((4, 4, 4))], medproc.Spec())
    with pytest.raises(medproc.UsageError, match="spec must be a medproc.Spec, got NoneType"):
        medproc.resample_batch([vol], None)
    for n in (0, -1, 1.5, True):
        with pytest.raises(medproc.UsageError, match="batch_size must be a whole number >= 1"):
            medproc.resample_batch([vol], medproc.Spec(), batch_size=n)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_label_maps_of_whole_numbers_are_resampled_exactly(dtype):
    """float32 label maps were taken and float64 ones refused; both now hold whole numbers
    (come back exactly, in their dtype) or are refused naming a value that is not one."""
    img = medproc.Volume(np.zeros((12, 12, 12), np.float32), np.eye(4))
    lab = np.zeros((12, 12, 12), dtype)
    lab[2:10, 2:10, 2:10] = 7
    _, out = medproc.resample(img, spacing=2.0, label=medproc.Volume(lab, np.eye(4)))
    assert out.dtype == np.dtype(dtype) and set(np.unique(out.array)) == {0, 7}
    lab[0, 0, 0] = 0.5
    with pytest.raises(ValueError, match="whole numbers .* value 0.5"):
        medproc.resample(img, spacing=2.0, label=medproc.Volume(lab, np.eye(4)))


def test_num_threads_must_be_a_whole_number():
    vol = medproc.Volume(np.zeros((4, 4, 4), np.int16), np.eye(4))
    with pytest.raises(medproc.UsageError, match="num_threads must be a whole number >= 1"):
        medproc.resample_batch([vol], medproc.Spec(), num_threads=-3)


def test_resample_batch_misuse_gets_a_usage_message_not_an_internal_error(tmp_path):
    import numpy as np

    v = medproc.Volume(np.zeros((8, 8, 8), np.float32), np.eye(4))
    with pytest.raises(medproc.UsageError, match="takes a list of volumes, got one Volume"):
        medproc.resample_batch(v, medproc.Spec(spacing=2))
    with pytest.raises(TypeError, match="into\\(\\) must give a numpy array or None, got list"):
        medproc.resample_batch([v], medproc.Spec(spacing=2), into=lambda s, d: [0])
    medproc.save(v, str(tmp_path / "a.nii.gz"))
    with pytest.raises(medproc.UsageError, match="is one image file"):
        medproc.load(str(tmp_path / "a.nii.gz"), series="x")


def test_label_maps_of_mixed_dtypes_in_one_batch_each_keep_their_own():
    """One batch fed labels of one dtype and gave every label the first one's back: an int16
    300 beside a uint8 label came back 44, a -1 came back 255 (found by an API probe)."""
    aff = np.diag([1.7, 1.3, 2.2, 1.0])
    labs = []
    for value, dtype in ((1, np.uint8), (300, np.int16), (-1, np.int16), (70000, np.int32)):
        a = np.zeros((8, 8, 8), dtype)
        a[2:6, 2:6, 2:6] = value
        labs.append(medproc.Volume(a, aff))
    imgs = [medproc.Volume(np.ones((8, 8, 8), np.float32), aff) for _ in labs]
    for order in (labs, labs[::-1]):
        out = medproc.resample_batch(imgs, medproc.Spec(spacing=1.5), labels=order, device="cpu")
        for lab, (_, got) in zip(order, out):
            alone = medproc.resample(imgs[0], spacing=1.5, label=lab)[1]
            assert got.array.dtype == lab.array.dtype
            np.testing.assert_array_equal(got.array, alone.array)


@pytest.mark.parametrize("value", [7.0, 1000.0])
def test_a_constant_volume_z_scores_and_scales_to_the_low_end_not_noise(value):
    """Its deviation (range) is 0: dividing by the 1e-8 floor blew interpolation's rounding
    (1 ulp) up to 64, 128, 8192. z-score gives 0 there, as MONAI's NormalizeIntensity does;
    scale without a window the low end of its range (MONAI's ScaleIntensity gives the input
    times that low end)."""
    import torch
    from monai.transforms import NormalizeIntensity

    vol = medproc.Volume(np.full((8, 8, 8), value, np.float32), np.diag([1.7, 1.3, 2.2, 1.0]))
    ref = NormalizeIntensity()(torch.full((1, 8, 8, 8), value))
    for it, want in (
        (medproc.Intensity(zscore=True), np.unique(ref.numpy()).tolist()),
        (medproc.Intensity(scale=(-1.0, 1.0)), [-1.0]),
    ):
        out = medproc.resample(vol, spec=medproc.Spec(spacing=1.5, intensity=it))
        assert np.unique(np.asarray(out.array)).tolist() == want
    # only one value is flat: 1000 and 1000.001 (a relative threshold took them for one)
    two = np.full((8, 8, 8), 1000.0, np.float32)
    two[:4] = np.float32(1000.001)
    spec = medproc.Spec(spacing=1.5, intensity=medproc.Intensity(scale=(0.0, 1.0)))
    out = np.asarray(medproc.resample(medproc.Volume(two, vol.affine), spec=spec).array)
    assert out.min() < 0.1 and out.max() > 0.9  # (float32 resolves 1000.001 to ~6%: not 0)
    # an image of values around 1e-9 that vary is z-scored
    tiny = np.random.default_rng(0).random((8, 8, 8)).astype(np.float32) * 1e-9
    spec = medproc.Spec(spacing=1.5, intensity=medproc.Intensity(zscore=True))
    out = np.asarray(medproc.resample(medproc.Volume(tiny, vol.affine), spec=spec).array)
    assert out.std() > 0.3 and abs(out.mean()) < 0.2


def test_api_misuse_found_by_a_probe_is_refused_or_handled():
    """Spec(fill=) is checked like the other fields ('x' failed deep inside, 1e40 padded with
    NaN); big-endian arrays save to NRRD/MHA (SimpleITK refused '>i2' with a bare TypeError);
    the proxy's transform says it takes Volumes (a MetaTensor was read as 20 channels)."""
    import tempfile

    import torch
    from monai.data import MetaTensor

    from medproc.proxy import ProxyTransform

    for bad in ("x", 1e40, float("inf"), True, np.complex64(1 + 2j)):
        with pytest.raises(medproc.UsageError, match="fill must be a number float32 holds"):
            medproc.Spec(spacing=2.0, fill=bad)
    assert type(medproc.Spec(fill=np.float32(-1024)).fill) is float  # (JSON-recorded)
    medproc.Spec(fill=float(np.finfo(np.float32).max))  # (float32 holds it)
    with pytest.raises(
        medproc.UsageError, match="fill=NaN cannot mark the padding of an output of dtype int16"
    ):
        medproc.Spec(spacing=2.0, fill=float("nan"), dtype="int16")  # (it padded with 0)
    assert np.isnan(medproc.Spec(fill=float("nan"), dtype="float16").fill)
    # (a prober's: cubic with a fill value failed in DALI's warp, "Only nearest and linear
    # interpolation is supported"; antialias with one was not antialiased, unsaid)
    for kw in ({"interp": "cubic"}, {"antialias": True}):
        with pytest.raises(medproc.UsageError, match=r"fill=0.0 with (interp=cubic|antialias)"):
            medproc.Spec(spacing=2.0, fill=0.0, **kw)
    be = np.arange(60, dtype=">i2").reshape(3, 4, 5)
    with tempfile.TemporaryDirectory() as d:
        for ext in ("nrrd", "mha"):
            p = os.path.join(d, f"be.{ext}")
            medproc.save(medproc.Volume(be, np.diag([1.0, 2.0, 3.0, 1.0])), p)
            np.testing.assert_array_equal(medproc.load(p).array, be)
    t = ProxyTransform(medproc.Spec(spacing=2.0))
    image = MetaTensor(torch.zeros(1, 6, 6, 6))
    for sample in ({"image": image}, {"image": np.zeros((6, 6, 6))}):
        with pytest.raises(medproc.UsageError, match=r"sample\['image'\] must be a medproc.Volume"):
            t(sample)
    with pytest.raises(medproc.UsageError, match="takes a dict with an 'image' Volume"):
        t(medproc.Volume(np.zeros((6, 6, 6)), np.eye(4)))


def test_a_volume_the_engine_cannot_take_is_named_in_a_batch():
    """uint64 values beyond 2^24 failed the whole resample_batch with a message naming no
    volume (a prober's call): the error names its source, or its index when built by hand."""
    big = np.arange(27, dtype=np.uint64).reshape(3, 3, 3) * 2**40
    good = medproc.Volume(np.zeros((3, 3, 3), np.int16), np.eye(4))
    with pytest.raises(medproc.errors.ReadError, match=r"^volumes\[1\]: uint64 image values"):
        medproc.resample_batch([good, medproc.Volume(big, np.eye(4)), good], Spec(spacing=2))
    named = medproc.Volume(big, np.eye(4))
    named.meta["source"] = "big.nii"
    with pytest.raises(medproc.errors.ReadError, match=r"^big.nii: uint64 image values"):
        medproc.resample(named, spacing=2)


def test_a_shape_whose_spacing_cannot_be_read_back_is_refused_before_resampling(tmp_path):
    """shape=(10000, 8, 8) of an 8 mm extent made 0.0008 mm voxels: the output was written and
    medproc.load then refused it (spacing below 0.001 mm). The readers' range is checked when
    planning, naming the volume; a shape inside the range resamples and reads back."""
    img = medproc.Volume(np.zeros((8, 8, 8), np.float32), np.eye(4))
    img.meta["source"] = "tiny.nii"
    with pytest.raises(medproc.errors.UsageError, match=r"tiny.nii.*0.0008x1x1 mm.*read back"):
        medproc.resample(img, shape=(10000, 8, 8), device="cpu")
    out = medproc.resample(img, shape=(8000, 8, 8), device="cpu")  # 0.001 mm: the edge
    medproc.save(out, str(tmp_path / "edge.nii.gz"))
    back = medproc.load(str(tmp_path / "edge.nii.gz"))
    np.testing.assert_allclose(back.spacing, [0.001, 1, 1], rtol=1e-6)


def test_an_input_already_below_the_spacing_range_may_keep_its_spacing():
    """A micro-CT volume in memory at 0.0005 mm, only reoriented, was refused by the check
    for shapes that make an unreadable spacing (review): only a spacing the resample makes
    is refused."""
    img = medproc.Volume(np.zeros((8, 8, 8), np.float32), np.diag([5e-4, 5e-4, 5e-4, 1]))
    out = medproc.resample(img, orientation="LPS", device="cpu")
    np.testing.assert_allclose(out.spacing, [5e-4] * 3)
