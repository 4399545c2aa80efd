"""Plans: the output grid rule and the output affine, exact in float64."""

import warnings

import numpy as np
import pytest

import medproc
from medproc import Spec, make_plan
from medproc.geometry import apply_affine, axcodes, spacing_of
from medproc.sample_data import grid_affine

# voxels (i, j, k) = (column, row, slice): 50 columns of 0.9 mm, 64 rows of 0.7 mm, 40 slices of 2.5 mm
SHAPE = (50, 64, 40)
OBLIQUE = grid_affine(
    SHAPE,
    (0.9, 0.7, 2.5),
    (10.0, -30.0, 55.0),
    iop=(0.9659258, 0.0, -0.258819, 0.1830127, 0.7071068, 0.6830127),
)


@pytest.mark.parametrize("orientation", [None, "RAS", "LPS", "PIR", "SAL"])
@pytest.mark.parametrize("spacing", [1.5, (1.0, 2.0, 3.0), (0.5, 0.7, 4.0)])
def test_grid_rule_and_exact_affine(orientation, spacing):
    shape, A = SHAPE, OBLIQUE
    p = make_plan(shape, A, Spec(spacing=spacing, orientation=orientation))
    sp = np.broadcast_to(np.asarray(spacing, float), (3,))  # (i, j, k), as the spec gives it
    np.testing.assert_allclose(spacing_of(p.out_affine), sp, atol=1e-12)
    # the one matrix: A_in @ M == A_out exactly (1e-6 mm at the far corner)
    corner = np.array(p.out_shape, float) - 1
    np.testing.assert_allclose(
        apply_affine(A @ p.matrix, corner), apply_affine(p.out_affine, corner), atol=1e-6
    )
    # centre of the field of view preserved
    c_in = apply_affine(A, (np.array(shape) - 1) / 2)
    c_out = apply_affine(p.out_affine, (np.array(p.out_shape) - 1) / 2)
    np.testing.assert_allclose(c_out, c_in, atol=1e-9)
    # n_out = floor(n_in * s_in / s_out + 1/2) along the source axis of each output axis
    src = np.argmax(np.abs(p.matrix[:3, :3]), axis=0)
    expect = np.floor(np.array(shape)[src] * spacing_of(A)[src] / sp + 0.5)
    np.testing.assert_array_equal(p.out_shape, expect)
    if orientation:
        # closest axes: the obliquity is kept, so the codes are those asked for
        assert axcodes(p.out_affine) == orientation
    # directions are the input's (possibly permuted/flipped): still the same oblique frame
    d_in = A[:3, :3] / spacing_of(A)
    d_out = p.out_affine[:3, :3] / spacing_of(p.out_affine)
    assert np.allclose(np.abs(d_in.T @ d_out).max(0), 1)


def test_shape_keeps_field_of_view_exactly():
    A = np.diag([0.5, 1.0, 2.0, 1])
    p = make_plan((40, 20, 10), A, Spec(shape=(7, 13, 3)))
    assert p.out_shape == (7, 13, 3)
    fov_in = np.array([40, 20, 10]) * [0.5, 1.0, 2.0]
    np.testing.assert_allclose(np.array(p.out_shape) * spacing_of(p.out_affine), fov_in, atol=1e-12)


def test_crop_and_pad_are_centred():
    A = np.eye(4)
    p = make_plan((10, 10, 10), A, Spec(crop=(4, 14, 10)))
    assert p.out_shape == (4, 14, 10)
    np.testing.assert_allclose(p.matrix[:3, 3], [3, -2, 0])


def test_crop_foreground_box():
    arr = np.zeros((20, 30, 40), np.int16)
    arr[5:9, 10:20, 3:7] = 100
    p = make_plan(arr.shape, np.eye(4), Spec(crop_foreground=50), arr)
    assert p.out_shape == (4, 10, 4)
    np.testing.assert_allclose(p.matrix[:3, 3], [5, 10, 3])
    pm = make_plan(arr.shape, np.diag([2.0, 2, 2, 1]), Spec(crop_foreground=50, margin=4.0), arr)
    assert pm.out_shape == (8, 14, 8)


def test_intensity_params():
    arr = np.arange(1000, dtype=np.float32).reshape(10, 10, 10)
    p = make_plan(
        arr.shape, np.eye(4), Spec(intensity=medproc.Intensity(clip=(100, 300), scale=(0, 1))), arr
    )
    lo, hi, a, b = p.intensity
    assert (lo, hi) == (100, 300) and a * 100 + b == 0 and abs(a * 300 + b - 1) < 1e-12
    p = make_plan(
        arr.shape,
        np.eye(4),
        Spec(intensity=medproc.Intensity(percentiles=(1, 99), zscore=True)),
        arr,
    )
    lo, hi, a, b = p.intensity
    np.testing.assert_allclose([lo, hi], np.percentile(arr, [1, 99]))
    z = np.clip(arr, lo, hi) * a + b
    assert abs(z.mean()) < 1e-6 and abs(z.std() - 1) < 1e-6


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"spacing": 0}, "> 0"),
        ({"spacing": (1, 2)}, "three"),
        ({"orientation": "RAR"}, "one of"),
        ({"interp": "bilinear"}, "interp"),
        ({"spacing": 1, "shape": (2, 2, 2)}, "not both"),
        ({"crop": (1.5, 2, 2)}, "whole numbers"),
        ({"grid": "centered"}, "spells it 'centred'"),
        ({"grid": "itk"}, "grid must be one of"),
        ({"spacing": True}, "one number or three"),
        ({"spacing": "1.5"}, "spacing must be one number or three"),  # as margin="1.5"
        ({"spacing": 1e9}, "spacing must be 0.001 to 100000 mm"),  # (unreadable outputs)
        ({"spacing": (1, 1, 1e-9)}, "spacing must be 0.001 to 100000 mm"),
        ({"spacing": 1.5 + 0j}, "spacing must be one number or three"),
        ({"spacing": (1, "a", 3)}, "spacing must be one number or three"),
        ({"shape": (8, 8, np.bool_(True))}, "shape must be one number or three"),
        ({"orientation": 5}, "must be a string"),
        ({"intensity": "zscore"}, "must be a medproc.Intensity"),
        ({"crop_foreground": float("nan")}, "crop_foreground must be one finite threshold"),
        ({"crop_foreground": "-500"}, "crop_foreground must be one finite threshold"),
        ({"crop_foreground": 1 + 2j}, "crop_foreground must be one finite threshold"),
        ({"margin": -50}, "margin must be one finite number of mm >= 0"),
        ({"margin": (1, 2)}, "margin must be one finite number of mm >= 0"),
        ({"margin": np.bool_(True)}, "margin must be one finite number of mm >= 0"),
        ({"margin": np.array(True)}, "margin must be one finite number of mm >= 0"),
        ({"margin": np.array("5")}, "margin must be one finite number of mm >= 0"),
        ({"crop_foreground": 10**400}, r"crop_foreground must be one finite threshold, got 1000"),
        ({"intensity": medproc.Intensity}, "must be a medproc.Intensity"),
    ],
)
def test_spec_validation(kw, match):
    """UsageError, as the docs say (it is a ValueError too)."""
    with pytest.raises(medproc.UsageError, match=match):
        Spec(**kw)


def test_input_region_gives_the_same_output():
    from medproc.pipeline import Engine, Graph, Job
    from medproc.plan import affine_map

    rng = np.random.default_rng(1)
    arr = rng.normal(size=SHAPE).astype(np.float32)
    p = make_plan(arr.shape, OBLIQUE, Spec(spacing=1.2, orientation="RAS", crop=(20, 16, 12)))
    p = p.augmented(affine_map(p.out_shape, [1.2] * 3, rotate_deg=(20, -5, 10)))
    region, small = p.input_region()
    assert np.prod(small.in_shape) < 0.3 * arr.size
    eng, graph = Engine("cpu", batch_size=1), Graph(interp="linear")
    ((part,),) = eng.run([Job(np.ascontiguousarray(arr[region]), small)], graph)
    ((whole,),) = eng.run([Job(arr, p)], graph)
    assert part.shape == whole.shape == p.out_shape
    np.testing.assert_allclose(part, whole, atol=2e-4)  # float32 coordinates in DALI
    np.testing.assert_allclose(small.in_affine @ small.matrix, p.in_affine @ p.matrix, atol=1e-9)


def test_sheared_input_reorthogonalises_k():
    """Gantry tilt: i and j (a slice's rows and columns) keep their directions; k becomes their
    normal, with the slice step measured along it."""
    shape = (40, 48, 30)
    aff = grid_affine(shape, (1.0, 1.0, 2.0), (0.0, 0.0, 0.0), tilt_deg=15)
    p = make_plan(shape, aff, Spec(spacing=1.3))
    assert not p.axis_aligned
    d_in = aff[:3, :3] / spacing_of(aff)
    d_out = p.out_affine[:3, :3] / spacing_of(p.out_affine)
    np.testing.assert_allclose(d_out[:, :2], d_in[:, :2], atol=1e-12)
    normal = np.cross(d_in[:, 0], d_in[:, 1])
    np.testing.assert_allclose(d_out[:, 2], normal / np.linalg.norm(normal), atol=1e-12)
    np.testing.assert_allclose(spacing_of(p.out_affine), [1.3, 1.3, 1.3], atol=1e-12)
    # the grid rule with the slice step along the normal (2 mm, not the tilted 2 / cos 15)
    assert p.out_shape == tuple(
        int(x) for x in np.floor(np.array(shape) * [1.0, 1.0, 2.0] / 1.3 + 0.5)
    )
    corner = np.array(p.out_shape, float) - 1
    np.testing.assert_allclose(
        apply_affine(aff @ p.matrix, corner), apply_affine(p.out_affine, corner), atol=1e-6
    )


def test_a_shear_inside_the_i_j_plane_keeps_every_slice():
    """A sheared sform whose j leans towards i (not a gantry tilt, where only k leans) kept
    j's length as its spacing and made k's det/(si*sj): 8 slices of 1 mm came out as 3 (a
    prober's file). The output must span the input's extent along each new axis (within a
    voxel), and resampling a volume whose value is its world z must give back world z."""
    A = np.array([[1, 0.9, 0, 0], [0, 0.3, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])
    shape = (10, 12, 8)
    p = make_plan(shape, A, Spec(spacing=1.0))
    ijk = np.indices(shape).reshape(3, -1).T
    w_in = apply_affine(A, ijk)
    w_out = apply_affine(p.out_affine, np.indices(p.out_shape).reshape(3, -1).T)
    for ax in (1, 2):  # the world y and z extents (x is where the parallelogram leans)
        assert abs(w_out[:, ax].min() - w_in[:, ax].min()) <= 0.5 + 1e-9
        assert abs(w_out[:, ax].max() - w_in[:, ax].max()) <= 0.5 + 1e-9
    z = np.broadcast_to(np.arange(8, dtype=np.float32), shape).copy()
    out = medproc.resample(medproc.Volume(z, A), spacing=1.0, device="cpu")
    wz = apply_affine(out.affine, np.indices(out.shape).reshape(3, -1).T)[:, 2]
    np.testing.assert_allclose(out.array.reshape(-1), wz, atol=1e-5)


def test_inverse_plan_maps_the_output_back():
    p = make_plan(SHAPE, OBLIQUE, Spec(spacing=1.2, orientation="RAS", crop=(40, 30, 50)))
    q = p.inverse()
    assert q.in_shape == p.out_shape and q.out_shape == p.in_shape
    np.testing.assert_array_equal(q.in_affine, p.out_affine)
    np.testing.assert_array_equal(q.out_affine, p.in_affine)
    np.testing.assert_allclose(q.matrix @ p.matrix, np.eye(4), atol=1e-12)
    corner = np.array(q.out_shape, float) - 1
    np.testing.assert_allclose(
        apply_affine(q.in_affine @ q.matrix, corner), apply_affine(q.out_affine, corner), atol=1e-6
    )


@pytest.mark.parametrize(
    "kw, needs",
    [
        ({"spacing": 1.0}, False),
        ({"crop_foreground": -500}, True),
        ({"intensity": medproc.Intensity(clip=(-1000, 400), scale=(0, 1))}, False),
        ({"intensity": medproc.Intensity(percentiles=(1, 99))}, True),
        ({"intensity": medproc.Intensity(zscore=True)}, True),
        ({"intensity": medproc.Intensity(scale=(0, 1))}, True),
    ],
)
def test_spec_needs_array(kw, needs):
    spec = Spec(**kw)
    assert spec.needs_array is needs
    if not needs:  # planning without the voxels works
        make_plan(SHAPE, OBLIQUE, spec)
    else:
        with pytest.raises(ValueError, match="need"):
            make_plan(SHAPE, OBLIQUE, spec)


TILTED = grid_affine(SHAPE, (1.0, 1.0, 2.0), (3.0, 4.0, 5.0), tilt_deg=15)
SAGITTAL = grid_affine(SHAPE, (0.8, 0.9, 1.1), (1.0, 2.0, 3.0), iop=(0, 1, 0, 0, 0, -1))


@pytest.mark.parametrize("affine", [OBLIQUE, TILTED, SAGITTAL], ids=["oblique", "tilt", "sag"])
@pytest.mark.parametrize("orientation", [None, "RAS", "PIR"])
@pytest.mark.parametrize("spacing", [1.5, (0.5, 0.7, 4.0), (0.9, 0.7, 2.5), 2 / 3])
def test_monai_grid_is_orientationd_then_spacingd(affine, orientation, spacing):
    """grid="monai": the shape and affine MONAI's Orientation + Spacing compute (asked lazily:
    MONAI's own geometry, no resampling), on oblique, gantry-tilted and sagittal inputs."""
    torch = pytest.importorskip("torch")
    monai = pytest.importorskip("monai")
    x = monai.data.MetaTensor(torch.zeros((1, *SHAPE)), affine=torch.as_tensor(affine))
    if orientation:
        x = monai.transforms.Orientation(orientation, lazy=True)(x)
    x = monai.transforms.Spacing(pixdim=spacing, lazy=True)(x)
    p = make_plan(SHAPE, affine, Spec(spacing=spacing, orientation=orientation, grid="monai"))
    assert p.out_shape == tuple(int(n) for n in x.peek_pending_shape())
    np.testing.assert_allclose(p.out_affine, x.peek_pending_affine().numpy(), atol=1e-6)
    corner = np.array(p.out_shape, float) - 1  # still one exact matrix
    np.testing.assert_allclose(
        apply_affine(affine @ p.matrix, corner), apply_affine(p.out_affine, corner), atol=1e-6
    )


def test_monai_grid_keeps_the_first_voxel_and_rounds_half_to_even():
    """n_out = round((n - 1) * s_in / s_out + 1) with numpy's round (half to even), from the
    first voxel centre; pyradiomics' lung1 geometry: 158 slices where the centred rule has 160."""
    a = np.diag([3.0, 3.0, 2.0, 1.0])
    a[:3, 3] = (10.0, -20.0, 30.0)
    m = make_plan((100, 100, 36), a, Spec(spacing=(2.0, 2.0, 2.4), grid="monai"))
    assert m.out_shape == (150, 150, 30)  # 149.5 -> 150, 30.17 -> 30
    np.testing.assert_array_equal(m.out_affine[:3, 3], a[:3, 3])  # the first voxel stays
    assert make_plan((4, 6, 8), np.eye(4), Spec(spacing=2, grid="monai")).out_shape == (2, 4, 4)
    lung = np.diag([0.57, 0.57, 5.0, 1.0])
    assert make_plan((512, 512, 48), lung, Spec(spacing=1.5, grid="monai")).out_shape[2] == 158
    assert make_plan((512, 512, 48), lung, Spec(spacing=1.5)).out_shape[2] == 160


@pytest.mark.parametrize("kw", [{"shape": (40, 30, 20)}, {}, {"orientation": "RAS"}])
def test_grids_agree_without_a_new_spacing(kw):
    """shape= keeps the field of view under both conventions (MONAI's Resized does too), and
    an unchanged spacing is the identity (or a pure reorientation) under both."""
    c = make_plan(SHAPE, OBLIQUE, Spec(**kw))
    m = make_plan(SHAPE, OBLIQUE, Spec(grid="monai", **kw))
    assert c.out_shape == m.out_shape
    np.testing.assert_allclose(c.matrix, m.matrix, atol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_intensity_statistics_ignore_non_finite_voxels(bad):
    """One NaN (load(..., nan="keep")) or inf voxel made every statistic, and so every output
    voxel, NaN or 0: the statistics come from the finite voxels (against numpy's own)."""
    rng = np.random.default_rng(0)
    a = rng.random((12, 12, 12)).astype(np.float32)
    a[3, 3, 3] = bad
    finite = a[np.isfinite(a)].astype(np.float64)
    spec = Spec(intensity=medproc.Intensity(zscore=True))
    lo, hi, scale, offset = make_plan(a.shape, np.eye(4), spec, a).intensity
    assert np.isclose(scale, 1 / finite.std()) and np.isclose(offset, -finite.mean() / finite.std())
    out = medproc.resample(medproc.Volume(a, np.eye(4)), spacing=2.0, intensity=spec.intensity)
    assert np.isfinite(out.array).mean() > 0.9


def test_integer_images_beyond_float32_exactness_are_refused():
    """DALI computes in float32: 2^24 + 1 came back as 2^24 from a nearest-neighbour resample."""
    vol = medproc.Volume(np.full((8, 8, 8), 2**24 + 1, np.int32), np.diag([2.0, 2, 2, 1]))
    with pytest.raises(ValueError, match="cannot be resampled exactly"):
        medproc.resample(vol, spacing=1.0, interp="nearest", dtype="int32")
    ok = medproc.Volume(np.full((8, 8, 8), 2**24 - 3, np.int32), vol.affine)
    assert int(medproc.resample(ok, spacing=1.0, interp="nearest", dtype="int32").array.max()) == (
        2**24 - 3
    )


def test_a_foreground_threshold_above_every_voxel_says_it_did_not_crop():
    """The plan says it in its notes; resample_batch says them as a warning naming the volume,
    and records them in the output's warnings (warn=False: recorded only)."""
    a = np.zeros((10, 10, 10), np.float32)
    p = make_plan(a.shape, np.eye(4), Spec(crop_foreground=5.0), a)
    assert p.out_shape == (10, 10, 10)
    assert p.notes == ("crop_foreground: no voxel is above 5.0: not cropped",)
    v = medproc.Volume(a, np.eye(4), {"source": "/x/a.nii"})
    with pytest.warns(medproc.errors.MedprocWarning, match="/x/a.nii: crop_foreground: no voxel"):
        (out,) = medproc.resample_batch([v], Spec(crop_foreground=5.0))
    assert out.meta["warnings"] == [p.notes[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,) = medproc.resample_batch([v], Spec(crop_foreground=5.0), warn=False)
    assert out.meta["warnings"] == [p.notes[0]]


def test_volumes_refuse_empty_arrays_complex_affines_and_unknown_devices():
    with pytest.raises(ValueError, match="empty"):
        medproc.Volume(np.zeros((0, 5, 5)), np.eye(4))
    with pytest.raises(ValueError, match="must be real"):
        medproc.Volume(np.zeros((5, 5, 5)), np.eye(4) * (1 + 1j))
    v = medproc.Volume(np.zeros((5, 5, 5)), np.eye(4))
    with pytest.raises(medproc.UsageError, match="device must be 'cpu', 'gpu', 'cuda' or"):
        v.to("tpu")
    import torch

    assert v.to(torch.device("cpu")).device == "cpu"  # a torch.device by its name
    if not torch.cuda.is_available():  # valid names get past the check, to the GPU's absence
        for d in ("gpu", "cuda", "cuda:1", torch.device("cuda")):
            with pytest.raises(RuntimeError, match="no CUDA GPU"):
                v.to(d)


def test_float64_images_beyond_float32_are_refused_not_made_inf():
    a = np.ones((6, 6, 6))
    a[0, 0, 0] = 1e300
    with pytest.raises(ValueError, match="float64 values reach 1e.300, beyond float32's range"):
        medproc.resample(medproc.Volume(a, np.eye(4)), spacing=2.0)
    a[1, 1, 1] = np.nan  # NaN beside it: the finite values are still checked
    with pytest.raises(ValueError, match="beyond float32's range"):
        medproc.resample(medproc.Volume(a, np.eye(4)), spacing=2.0)
    # float32's largest value is not beyond it; inf and NaN alone are not refused (they stay
    # inf/NaN in float32, no value is lost)
    a = np.ones((6, 6, 6))
    a[0, 0, 0] = float(np.finfo(np.float32).max)
    out = medproc.resample(medproc.Volume(a, np.eye(4)), spacing=1.0).array
    assert np.isfinite(out).all() and out.max() == np.finfo(np.float32).max
    a[0, 0, 0] = np.inf
    medproc.resample(medproc.Volume(a, np.eye(4)), spacing=1.0)


def test_the_float32_range_rule_covers_torch_longdouble_and_the_loaders(tmp_path):
    import nibabel as nib
    import torch

    from medproc._float32 import beyond_float32

    t = torch.ones(4, 4, 4, dtype=torch.float64)
    t[0, 0, 0], t[1, 1, 1] = 1e39, float("nan")
    assert "reach 1e+39" in beyond_float32(t)
    assert beyond_float32(t.float()) is None  # (float32 already: nothing to lose)
    long = np.ones((4, 4, 4), dtype=np.longdouble)
    long[0, 0, 0] = 1e39
    assert beyond_float32(long)
    # a file with NaN and a huge value: refused whatever the NaN policy, naming the file
    a = np.ones((4, 4, 4))
    a[0, 0, 0], a[1, 1, 1] = 1e39, np.nan
    nib.save(nib.Nifti1Image(a, np.eye(4)), tmp_path / "huge.nii.gz")
    for nan in ("zero", "keep"):
        with pytest.raises(medproc.ReadError, match="huge.nii.gz: float64 values reach 1e.39"):
            medproc.load(tmp_path / "huge.nii.gz", nan=nan)


@pytest.mark.parametrize(
    "bad, says",
    [
        (np.eye(3), "must be a 4x4 matrix"),
        (np.full((4, 4), np.nan), "NaN or inf"),
        (np.diag([1.0, 0.0, 1.0, 1.0]), "singular"),
    ],
)
def test_an_augmentation_that_is_not_an_invertible_affine_is_refused(bad, says):
    """A user's augment() result: refused before any annotation is moved by it."""
    plan = make_plan((10, 10, 10), np.eye(4), Spec(spacing=2))
    with pytest.raises(ValueError, match=f"augmentation's index map.*{says}"):
        plan.augmented(bad)


def test_lesions_that_are_a_whole_table_are_refused_with_advice():
    plan = make_plan((10, 10, 10), np.eye(4), Spec(spacing=2))
    with pytest.raises(TypeError, match="got dict: a table of all cases"):
        plan.lesions_on_grid({"1.2.3": None})


def test_a_huge_margin_keeps_the_whole_grid_and_huge_numbers_are_refused():
    a = np.zeros((20, 20, 20), np.float32)
    a[5:10, 5:10, 5:10] = 100
    v = medproc.Volume(a, np.eye(4))
    spec = Spec(spacing=1, crop_foreground=50, margin=1e20)
    assert medproc.resample(v, spec=spec).shape == (20, 20, 20)  # (it gave (1, 1, 1))
    with pytest.raises(ValueError, match="world_to_voxel: expected RAS mm points"):
        v.world_to_voxel([10**400, 0, 0])
    plan = make_plan((10, 10, 10), np.eye(4), Spec(spacing=2))
    with pytest.raises(ValueError, match="must be a 4x4 matrix, got None"):
        plan.augmented(None)
    with pytest.raises(medproc.UsageError, match="pass the spec by name"):
        medproc.resample(v, Spec(spacing=2))


def test_device_names_are_checked_exactly_with_a_hint_for_cuda():
    from medproc.errors import check_device

    for bad in ("cuda:00", "cuda:\u00b2", "cuda:-1", "GPU", None, 0, b"cpu"):
        with pytest.raises(medproc.UsageError, match="device must be"):
            check_device(bad, cuda=True)
    assert check_device("cuda:1", cuda=True) == "cuda:1"
    with pytest.raises(medproc.UsageError, match="'gpu' is the current CUDA device; pick another"):
        check_device("cuda:1")


@pytest.mark.parametrize(
    "kw",
    [
        {"clip": (-1e39, 1e39)},  # beyond float32, which the pipelines compute in
        {"clip": (float("-inf"), 400)},
        {"clip": ("a", "b")},
        {"clip": (-1000, "400")},
        {"clip": (400, -1000)},
        {"scale": (0, 1, 2)},
        {"scale": "01"},
    ],
)
def test_intensity_bounds_are_two_finite_float32_numbers(kw):
    with pytest.raises(medproc.UsageError, match=r"Intensity\.\w+ must be \(lo, hi\) with lo < hi"):
        medproc.Intensity(**kw)


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"dtype": "bool"}, "dtype must be one of"),
        ({"dtype": "complex64"}, "dtype must be one of"),
        ({"dtype": object}, "dtype must be one of"),
        ({"antialias": "yes"}, "antialias must be True or False"),
        ({"antialias": 1}, "antialias must be True or False"),
    ],
)
def test_spec_refuses_dtypes_the_pipeline_cannot_write_and_switches_that_are_not_bools(kw, says):
    from medproc.errors import UsageError

    with pytest.raises(UsageError, match=says):
        Spec(spacing=2.0, **kw)
    with pytest.raises(UsageError, match="zscore must be True or False"):
        medproc.Intensity(zscore="no")
    assert Spec(spacing=2.0, dtype="int16", antialias=True).dtype == "int16"


def test_an_affine_whose_spacings_overflow_is_refused_at_construction():
    """Volume(arr, diag(1e300, ...)) was accepted; its repr and orientation then failed inside
    nibabel with a TypeError (the spacings overflow to inf). A large but finite one is kept."""
    a = np.zeros((2, 2, 2), np.float32)
    with pytest.raises(ValueError, match="too large: its spacings or their product overflow"):
        medproc.Volume(a, np.diag([1e300, 1e300, 1e300, 1.0]))
    v = medproc.Volume(a, np.diag([1e100, 1e100, 1e100, 1.0]))
    assert v.orientation == "RAS" and "1e+100" in repr(v)
