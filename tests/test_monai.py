"""MONAI compatibility, proven by MONAI itself: its reader, its metadata, its Compose and
Invertd, UNet, DiceCELoss, sliding_window_inference; medproc's loader and transforms in between.
(More in test_monai_invert.py, test_monai_grid.py and test_monai_training.py.)"""

import os
import sys
import warnings

import numpy as np
import pytest

import medproc
from medproc.monai import LoadVolumed, Resampled, to_metatensor, to_volume

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _datalist(sample_data):
    root = os.path.join(sample_data, "nifti")
    return [
        {"image": f"{root}/images/case00{n}.nii.gz", "label": f"{root}/labels/case00{n}.nii.gz"}
        for n in (1, 2)
    ]


def _tol(device, ref):
    """Absolute tolerance against a CPU reference: CPU and GPU backends agree within 1e-4 of
    the range (tests/test_resample.py::test_cpu_and_gpu_agree)."""
    return 1e-3 if device == "cpu" else max(1e-3, 1e-4 * float(np.abs(ref).max()))


def test_metatensor_matches_monai_loadimage(sample_data):
    from monai.transforms import EnsureChannelFirst, LoadImage

    path = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    ref = EnsureChannelFirst()(LoadImage(reader="NibabelReader", image_only=True)(path))
    vol = medproc.load(path)
    mine = to_metatensor(vol)
    assert mine.shape == ref.shape == (1, *vol.shape)  # (C, i, j, k): the Volume's own order
    np.testing.assert_array_equal(mine.numpy(), ref.numpy())
    np.testing.assert_allclose(mine.affine.numpy(), ref.affine.numpy(), atol=1e-6)
    np.testing.assert_array_equal(mine.affine.numpy(), vol.affine)  # the Volume's affine as is
    back = to_volume(mine)
    np.testing.assert_array_equal(back.array, medproc.load(path).array)
    np.testing.assert_array_equal(back.affine, vol.affine)
    # CPU tensors come back as numpy views of the same memory (no copy either way)
    assert isinstance(back.array, np.ndarray) and np.shares_memory(back.array, vol.array)


def test_loadvolumed_writes_the_metadata_loadimaged_writes(sample_data):
    """What SaveImage(d) reads to name a file and put it back where it came from, per key."""
    from monai.transforms import LoadImaged

    case = _datalist(sample_data)[0]
    ref = LoadImaged(["image", "label"], ensure_channel_first=True)(dict(case))
    mine = LoadVolumed(["image", "label"])(dict(case))
    for key in ("image", "label"):
        m, r = mine[key].meta, ref[key].meta
        assert m["filename_or_obj"] == r["filename_or_obj"] == case[key]
        np.testing.assert_allclose(m["original_affine"], r["original_affine"], atol=1e-6)
        np.testing.assert_allclose(mine[key].affine, ref[key].affine, atol=1e-6)
        np.testing.assert_array_equal(m["spatial_shape"], r["spatial_shape"])
        assert np.isnan(m["original_channel_dim"]) and np.isnan(r["original_channel_dim"])
        assert m["space"] == r["space"] == "RAS"
        assert mine[key].applied_operations == []
        np.testing.assert_allclose(m["pixdim"][1:4], r["pixdim"][1:4], atol=1e-6)  # spacing
    out = Resampled(["image", "label"], medproc.Spec(spacing=(2.5, 2.0, 3.0)))(mine)
    for key in ("image", "label"):
        np.testing.assert_allclose(out[key].meta["pixdim"][1:4], (2.5, 2.0, 3.0), atol=1e-6)


def test_compose_mixes_monai_and_medproc(sample_data):
    from monai.transforms import Compose, EnsureTyped, RandSpatialCropd, ScaleIntensityRanged

    spec = medproc.Spec(spacing=2.0, orientation="RAS")
    case = _datalist(sample_data)[1]
    pipe = Compose(
        [
            LoadVolumed(["image", "label"]),
            Resampled(["image", "label"], spec),
            ScaleIntensityRanged("image", -1000, 400, 0.0, 1.0, clip=True),
            RandSpatialCropd(["image", "label"], (32, 32, 32), random_size=False),
            EnsureTyped(["image", "label"]),
        ]
    )
    d = pipe(dict(case))
    assert d["image"].shape == (1, 32, 32, 32) and d["label"].shape == (1, 32, 32, 32)
    assert 0 <= float(d["image"].min()) and float(d["image"].max()) <= 1
    # before the crop, Resampled's output is medproc.resample's, on the same affine
    d0 = Compose([LoadVolumed(["image", "label"]), Resampled(["image", "label"], spec)])(dict(case))
    ref, ref_lab = medproc.resample(
        medproc.load(case["image"]), spec=spec, label=medproc.load(case["label"])
    )
    np.testing.assert_allclose(to_volume(d0["image"]).array, ref.array, atol=1e-3)
    np.testing.assert_array_equal(to_volume(d0["label"]).array, ref_lab.array)
    np.testing.assert_allclose(d0["image"].affine.numpy(), ref.affine, atol=1e-9)
    np.testing.assert_allclose(d0["label"].affine.numpy(), ref.affine, atol=1e-9)
    assert d0["image"].shape == (1, *ref.shape) and d0["label"].shape == (1, *ref_lab.shape)


def test_without_tracked_metadata_outputs_are_plain_tensors_on_the_right_grid(sample_data):
    """Under monai.data.set_track_meta(False) MONAI's transforms give plain tensors, and so do
    LoadVolumed, Resampled and PatchLoader; the affine is kept under "<key>_meta_dict", so
    Resampled still resamples on the true grid (MONAI's Spacingd assumes an identity affine
    there): the same voxels and affine as with metadata tracked."""
    import torch
    from monai.data import set_track_meta

    from medproc.monai import PatchLoader

    spec = medproc.Spec(spacing=2.0, orientation="RAS")
    case = _datalist(sample_data)[1]
    tracked = Resampled(["image", "label"], spec)(LoadVolumed(["image", "label"])(dict(case)))
    set_track_meta(False)
    try:
        loaded = LoadVolumed(["image", "label"])(dict(case))
        plain = Resampled(["image", "label"], spec)(loaded)
        batch = next(iter(PatchLoader([dict(case)], spec, (16, 16, 16), batch_size=1)))
    finally:
        set_track_meta(True)
    for d in (loaded, plain, batch):
        for key in ("image", "label"):
            assert type(d[key]) is torch.Tensor, (key, type(d[key]))
    for key in ("image", "label"):
        np.testing.assert_array_equal(plain[key].numpy(), tracked[key].as_tensor().numpy())
        meta = plain[f"{key}_meta_dict"]
        np.testing.assert_array_equal(meta["affine"].numpy(), tracked[key].affine.numpy())
        assert meta["filename_or_obj"] == case[key]
        np.testing.assert_allclose(meta["pixdim"][1:4], (2.0, 2.0, 2.0))
    set_track_meta(False)
    try:  # a MONAI transform between changes the grid and leaves the stored affine behind
        from monai.transforms import Spacingd

        stale = Spacingd("image", pixdim=3.0)(LoadVolumed(["image"])(dict(case)))
        with pytest.raises(ValueError, match="holds the affine of a"):
            Resampled(["image"], spec)(stale)
    finally:
        set_track_meta(True)
    n = batch["image"].shape[0]
    assert batch["image"].shape == (n, 1, 16, 16, 16) and batch["label"].shape[0] == n
    assert batch["image_meta_dict"]["affine"].shape == (n, 4, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_load_resample_invert_on_the_device(sample_data, device):
    """LoadVolumed(device=...) and Resampled(device=...): MetaTensors (C, i, j, k) on the device
    (CUDA tensors stay tensors through to_volume), the same voxels and affine as
    medproc.resample on the CPU; MONAI's Invertd puts the label back on the source grid."""
    import torch
    from monai.transforms import Compose, Invertd

    spec = medproc.Spec(spacing=2.0, orientation="RAS")
    case = _datalist(sample_data)[1]
    pipe = Compose(
        [
            LoadVolumed(["image", "label"], device=device),
            Resampled(["image", "label"], spec, device=device),
        ]
    )
    d = pipe(dict(case))
    ref, ref_lab = medproc.resample(
        medproc.load(case["image"]), spec=spec, label=medproc.load(case["label"])
    )
    want = "cuda" if device == "gpu" else "cpu"
    for key, r in (("image", ref), ("label", ref_lab)):
        assert d[key].device.type == want and d[key].shape == (1, *r.shape)
        np.testing.assert_allclose(d[key].affine.numpy(), r.affine, atol=1e-9)
    v = to_volume(d["image"])
    assert v.shape == ref.shape
    assert isinstance(v.array, torch.Tensor if device == "gpu" else np.ndarray)
    np.testing.assert_allclose(v.numpy().array, ref.array, atol=_tol(device, ref.array))
    lab = to_volume(d["label"]).numpy().array
    assert lab.dtype == ref_lab.array.dtype
    if device == "cpu":
        np.testing.assert_array_equal(lab, ref_lab.array)
    else:  # nearest neighbour: ties at exactly half-way may go either way on another backend
        assert (lab == ref_lab.array).mean() >= 0.999
    out = Invertd(["label"], transform=pipe, orig_keys=["label"])(d)["label"]
    assert out.device.type == want
    back = to_volume(out).numpy()
    src_lab = medproc.load(case["label"])
    assert back.shape == src_lab.shape and back.array.dtype == src_lab.array.dtype
    np.testing.assert_allclose(back.affine, src_lab.affine, atol=1e-6)
    truth, inv = src_lab.array > 0, back.array > 0
    assert 2 * (inv & truth).sum() / (inv.sum() + truth.sum()) >= 0.9


def test_the_old_invertd_is_deprecated_and_still_works(sample_data):
    """medproc.monai.Invertd (MONAI's name, another meaning) warns and points to MONAI's; it is
    not in ``import *``, and until it goes it reads the plan from applied_operations."""
    from monai.transforms import Compose

    import medproc.monai as mm

    assert "Invertd" not in mm.__all__
    case = _datalist(sample_data)[0]
    spec = medproc.Spec(spacing=2.0, orientation="RAS")
    d = Resampled(["image", "label"], spec)(LoadVolumed(["image", "label"])(dict(case)))
    with pytest.warns(DeprecationWarning, match="monai.transforms.Invertd"):
        old = mm.Invertd(["label"], plan_key="image_plan")
    back = to_volume(old(d)["label"])
    np.testing.assert_allclose(back.affine, medproc.load(case["label"]).affine, atol=1e-6)
    # called MONAI's way (a MONAI user's finding: a bare TypeError)
    with pytest.raises(TypeError, match="'orig_keys', 'transform'.*import Invertd from monai"):
        mm.Invertd(["label"], transform=None, orig_keys="image")
    with pytest.raises(TypeError, match="got a Compose: that is monai.transforms.Invertd's"):
        mm.Invertd("label", Compose([]), "image")  # (positionally)
    with pytest.raises(TypeError, match="unexpected keyword argument 'plan_kye'$"):
        mm.Invertd(["label"], plan_kye="image_plan")  # (its own keyword mistyped)


@pytest.mark.parametrize("device", DEVICES)
def test_monai_unet_trains_infers_and_inverts(tmp_path, device):
    sys.path.insert(0, EXAMPLES)
    import train_monai

    net, losses = train_monai.train(steps=40, device=device, cache_dir=str(tmp_path / "cache"))
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    case = train_monai.datalist()[0]
    d, back = train_monai.infer_and_invert(net, case, str(tmp_path / "pred.nii.gz"), device)
    src = medproc.load(case["image"])
    saved = medproc.load(tmp_path / "pred.nii.gz")
    assert saved.shape == src.shape
    np.testing.assert_allclose(saved.affine, src.affine, atol=1e-6)
    # the ground-truth label, sent through the same resample + inverse, lands back on itself
    truth = medproc.load(case["label"]).array > 0
    inv_label = to_volume(d["label"]).array > 0
    dice = 2 * (inv_label & truth).sum() / (inv_label.sum() + truth.sum())
    assert dice >= 0.9, dice
    # and the trained network found the lesions: its prediction overlaps them
    pred = saved.array > 0
    assert (pred & truth).sum() > 0.2 * truth.sum()


def test_loadvolumed_finds_lesions_by_the_full_stem_and_the_series_uid(sample_data, tmp_path):
    """The stem was cut at the first dot (case.001 took case "case"'s lesions), and a DICOM
    folder's lesions keyed by SeriesInstanceUID (sample_data/lesions.csv) were never found."""
    import shutil
    from pathlib import Path

    shutil.copy(
        os.path.join(sample_data, "nifti", "images", "case001.nii.gz"), tmp_path / "case.001.nii.gz"
    )
    les = tmp_path / "les.csv"
    les.write_text(
        "seriesuid,coordX,coordY,coordZ,diameter_mm\ncase,-62,-10,5,14\ncase.001,75,15,-20,10\n"
    )
    d = LoadVolumed(["image"], lesion_key="l")(
        {"image": str(tmp_path / "case.001.nii.gz"), "l": Path(les)}
    )
    assert d["l"].ids == ["les.csv:3"]
    d = LoadVolumed(["image"], lesion_key="l")(
        {
            "image": os.path.join(sample_data, "dicom", "ct_axial"),
            "l": os.path.join(sample_data, "lesions.csv"),
        }
    )
    assert d["l"].ids == ["lesions.csv:2", "lesions.csv:3"]


def test_monai_helpers_name_what_they_take():
    import torch

    from medproc.monai import plan_of

    with pytest.raises(TypeError, match="to_metatensor takes a medproc.Volume, got ndarray"):
        to_metatensor(np.zeros((3, 3, 3)))
    with pytest.raises(TypeError, match="plan_of takes the MetaTensor Resampled gave"):
        plan_of(torch.zeros(1, 3, 3, 3))


def test_the_common_mistakes_of_a_monai_script_are_named(sample_data):
    """A tutorial's EnsureChannelFirstd kept after LoadVolumed (a channel twice) and the keys
    given label first without mode= (the label resampled as the image)."""
    from monai.transforms import Compose, EnsureChannelFirstd

    img = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    lab = os.path.join(sample_data, "nifti", "labels", "case001.nii.gz")
    spec = medproc.Spec(spacing=3.0)
    keys = ["image", "label"]
    twice = Compose([LoadVolumed(keys), EnsureChannelFirstd(keys), Resampled(keys, spec)])
    with pytest.raises(RuntimeError) as got:  # (MONAI's Compose chains the transform's error)
        twice({"image": img, "label": lab})
    said = str(got.value.__cause__)
    assert "a channel was added twice" in said and "remove EnsureChannelFirstd" in said
    with pytest.warns(medproc.errors.MedprocWarning, match="the others as label maps"):
        Resampled(["label", "image"], spec)


def test_a_channel_last_or_2d_image_is_named_for_what_it_is(tmp_path):
    """A (i, j, k, 1) MetaTensor (LoadImaged of a 4-D NIfTI, no EnsureChannelFirstd) was
    resampled as 40 channels of (j, k, 1) without a word, as MONAI does it: said. A 2-D image
    with its channel first was told to add EnsureChannelFirstd, which it had (a prober's)."""
    import nibabel as nib
    import torch
    from monai.data import MetaTensor
    from monai.transforms import LoadImaged

    path = os.path.join(tmp_path, "last.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros((40, 27, 20, 1), np.float32), np.eye(4)), path)
    last = LoadImaged(["image"])({"image": path})["image"]  # (its last axis kept last)
    with pytest.warns(medproc.errors.MedprocWarning, match=r"\(40, 27, 20, 1\) .* channel-last"):
        assert to_volume(last).shape[:3] == (27, 20, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (channels first, as made or a few of them: no word)
        to_volume(MetaTensor(torch.zeros(40, 27, 20, 1), affine=torch.eye(4)))
        to_volume(MetaTensor(torch.zeros(3, 27, 20, 1), affine=torch.eye(4)))
    with pytest.raises(ValueError, match=r"\(1, 40, 40\): a 2-D image with its channel first"):
        to_volume(MetaTensor(torch.zeros(1, 40, 40), affine=torch.eye(4)))


def test_loadvolumed_names_the_key_of_a_value_that_is_no_path():
    """{"image": None} (a datalist's missing file) said 'path must be a str or path-like',
    naming no key."""
    with pytest.raises(medproc.UsageError, match=r"sample\['image'\] must be a file or folder"):
        LoadVolumed(["image"])({"image": None})


def test_loadvolumed_takes_loadimageds_switches_where_they_mean_what_it_does(sample_data):
    path = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    plain = LoadVolumed("image")({"image": path})["image"]
    same = LoadVolumed("image", ensure_channel_first=True, image_only=True)({"image": path})
    assert same["image"].shape == plain.shape and np.array_equal(same["image"], plain)
    with pytest.raises(ValueError, match="always puts the channel first"):
        LoadVolumed("image", ensure_channel_first=False)
    with pytest.raises(ValueError, match="gives MetaTensors"):
        LoadVolumed("image", image_only=False)


def test_bfloat16_voxels_are_resampled_and_inverted_as_float32_and_complex_refused():
    """An autocast prediction (bfloat16) was refused, where MONAI's Invertd inverts it: float32
    holds it exactly, so it is taken as float32. Complex voxels stay refused, naming the key
    (torch's "unsupported ScalarType" named neither)."""
    import torch
    from monai.data import MetaTensor

    from medproc.monai import Resampled

    rng = np.random.default_rng(0)
    vals = torch.from_numpy(rng.normal(size=(1, 12, 10, 8)).astype(np.float32))
    aff = torch.diag(torch.tensor([1.0, 1.2, 1.5, 1.0], dtype=torch.float64))
    r = Resampled(["image"], spec=medproc.Spec(spacing=2.0), device="cpu")
    half = r({"image": MetaTensor(vals.to(torch.bfloat16), affine=aff)})["image"]
    full = r({"image": MetaTensor(vals.to(torch.bfloat16).float(), affine=aff)})["image"]
    assert half.dtype == torch.float32 and torch.equal(half.as_tensor(), full.as_tensor())
    pred = half.clone().to(torch.bfloat16)  # (the applied operations kept)
    back = r.inverse({"image": pred})["image"]
    want = r.inverse({"image": half.clone().to(torch.bfloat16).float()})["image"]
    assert back.shape == vals.shape and back.dtype == torch.float32
    assert torch.equal(back.as_tensor(), want.as_tensor())
    d = {"image": MetaTensor(torch.zeros(1, 6, 6, 6, dtype=torch.complex64), affine=torch.eye(4))}
    with pytest.raises(ValueError, match=r"key 'image'.*complex64.*float32"):
        r(d)


def test_a_lesion_file_listing_the_case_under_a_near_name_is_said(sample_data, tmp_path):
    """nnU-Net's case001_0000.nii.gz against a lesion file keyed case001: its lesions were
    dropped without a word. Said; a case the file does not list at all (a negative) is not."""
    import json
    import shutil
    import warnings

    src = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    les = tmp_path / "l.json"
    les.write_text(json.dumps({"cases": [{"image": "case001.nii.gz", "points": [[0, 0, 0, 5]]}]}))
    for name, said in (("case001_0000.nii.gz", True), ("case002.nii.gz", False)):
        shutil.copy(src, tmp_path / name)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            d = LoadVolumed(["image"], lesion_key="l")({"image": str(tmp_path / name), "l": les})
        assert len(d["l"].centers) == 0
        near = [w for w in got if "no lesions listed for" in str(w.message)]
        assert bool(near) == said, [str(w.message) for w in got]
        if said:
            assert "'case001_0000', but 'case001' is" in str(near[0].message)


def test_a_label_map_given_an_images_mode_is_said_and_roles_named_backwards_too(sample_data):
    """mode='bilinear' for every key with an intensity step clipped and scaled a 0/1/2 label
    map to 0.714-0.716 everywhere without a word (a MONAI user's habit: MONAI's intensity
    transforms touch only the keys they name). Said once per transform; a second image of many
    values is not; keys named the other way round (label first) are said as 'image' second was."""
    root = os.path.join(sample_data, "nifti")
    case = {"image": f"{root}/images/case001.nii.gz", "label": f"{root}/labels/case001.nii.gz"}
    d = LoadVolumed(["image", "label"])(case)
    spec = medproc.Spec(spacing=3, intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)))
    r = Resampled(["image", "label"], spec, mode="bilinear")
    with pytest.warns(medproc.errors.MedprocWarning, match="key 'label' looks like a label map"):
        r(dict(d))
    with warnings.catch_warnings():
        warnings.simplefilter("error", medproc.errors.MedprocWarning)
        r(dict(d))  # (once)
        two = Resampled(["image", "ct2"], spec, mode="bilinear")
        two({**d, "ct2": d["image"].clone()})  # a second image: nothing to say
        out = Resampled(["image", "label"], spec, mode=("bilinear", "nearest"))(dict(d))
    assert set(np.unique(out["label"].numpy())) <= set(np.unique(d["label"].numpy()))
    # without an intensity step too: interpolated into values between its classes, which the
    # docs said was warned about (a MONAI user's finding: it was said only with a step)
    plain = medproc.Spec(spacing=1.5)
    with pytest.warns(medproc.errors.MedprocWarning, match=r"it is interpolated \(values betw"):
        mixed = Resampled(["image", "label"], plain, mode="bilinear")(dict(d))["label"]
    assert not np.all(np.mod(mixed.numpy(), 1) == 0)  # (what the warning is about)
    with pytest.warns(medproc.errors.MedprocWarning, match="the first key \\('seg'\\)"):
        Resampled(["seg", "img"], spec)
    # a label map on its own, without mode= (the first key is the image): the same window was
    # applied without a word (a MONAI user's finding)
    with pytest.warns(medproc.errors.MedprocWarning, match="key 'label' looks like a label map"):
        Resampled("label", spec)(dict(d))
    with warnings.catch_warnings():
        warnings.simplefilter("error", medproc.errors.MedprocWarning)
        Resampled("label", spec, mode="nearest")(dict(d))
        Resampled("image", spec)(dict(d))  # (a CT image: whole numbers, not named like a label)


def test_modes_of_the_wrong_count_name_resampled_and_its_keys():
    """A MONAI user's finding: MONAI's error ("Sequence must have length 2, got 1") named
    neither the transform nor its keys."""
    spec = medproc.Spec(spacing=1.5)
    with pytest.raises(ValueError, match="mode=\\('bilinear',\\) for keys \\['image', 'label'\\]"):
        Resampled(["image", "label"], spec, mode=("bilinear",))


def test_each_key_is_judged_a_label_map_once(sample_data, monkeypatch):
    """The check of a key given an image's mode looks at its values once per transform, not on
    every sample (a reviewer's finding: a second int16 image was sampled on every call)."""
    from medproc.monai import _key_roles

    case = _datalist(sample_data)[0]
    d = LoadVolumed(["image"])({"image": case["image"]})
    calls = []
    real = _key_roles._values
    monkeypatch.setattr(_key_roles, "_values", lambda a: calls.append(1) or real(a))
    r = Resampled(["image", "ct2"], medproc.Spec(spacing=3), mode="bilinear")
    for _ in range(3):
        r({**d, "ct2": d["image"].clone()})
    assert len(calls) == 1


def test_spacingd_s_arguments_are_refused_saying_where_the_spec_takes_them():
    """Spacingd's keywords moved over to Resampled gave a bare TypeError."""
    spec = medproc.Spec(spacing=1.5)
    Resampled("image", spec, padding_mode="border", align_corners=False)  # (no effect)
    with pytest.raises(TypeError, match="Spacingd's pixdim=.*Spec\\(spacing=pixdim"):
        Resampled("image", spec, pixdim=(1.5, 1.5, 2.0))
    with pytest.raises(TypeError, match="padding_mode='zeros'.*Spec\\(fill=0\\)"):
        Resampled("image", spec, padding_mode="zeros")
    with pytest.raises(TypeError, match="argument 'mdoe' \\(did you mean 'mode'\\?\\)"):
        Resampled("image", spec, mdoe="nearest")


@pytest.mark.parametrize("device", DEVICES)
def test_a_second_image_taken_for_a_label_map_by_the_default_mode_is_said(sample_data, device):
    """Keys t1, t2, seg without mode= (BraTS: a key per modality): t2 was resampled with
    nearest neighbour, kept int16 and skipped the intensity step, unsaid (a MONAI user's
    finding: MONAI's Spacingd interpolates every key unless told). Said on the first sample,
    naming the key and a mode to pass; image + label, and an explicit mode, say nothing."""
    import torch
    from monai.data import MetaTensor

    root = os.path.join(sample_data, "nifti")
    case = {"t1": f"{root}/images/case001.nii.gz", "seg": f"{root}/labels/case001.nii.gz"}
    d = LoadVolumed(["t1", "seg"], device=device)(case)
    d["t2"] = d["t1"].clone()
    spec = medproc.Spec(spacing=3, intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)))
    r = Resampled(["t1", "t2", "seg"], spec, device=device)
    with pytest.warns(
        medproc.errors.MedprocWarning,
        match=r"key 't2' is resampled as a label map .* looks like an image \(\d+\+ distinct "
        r"values\); pass mode= per key, e.g. mode=\('bilinear', 'bilinear', 'nearest'\)",
    ):
        out = r(dict(d))
    assert out["t2"].dtype == d["t2"].dtype  # (what the default does: said, not changed)
    floats = {**d, "t2": d["t1"].float() * 0.37}  # fractional values, few or many
    with pytest.warns(medproc.errors.MedprocWarning, match="'t2'.*fractional values"):
        Resampled(["t1", "t2", "seg"], spec, device=device)(dict(floats))
    with warnings.catch_warnings():
        warnings.simplefilter("error", medproc.errors.MedprocWarning)
        r(dict(d))  # (the first sample only)
        Resampled(["t1", "seg"], spec, device=device)(dict(d))
        modes = ("bilinear", "bilinear", "nearest")
        Resampled(["t1", "t2", "seg"], spec, mode=modes, device=device)(dict(d))
        seg = d["seg"]  # 400 regions: a label map, not an image (nor said to be one)
        regions = torch.arange(seg.numel(), device=seg.device).reshape(seg.shape) % 400
        parc = MetaTensor(regions.to(torch.int16), affine=seg.affine, meta=dict(seg.meta))
        Resampled(["t1", "parc"], spec, device=device)({**d, "parc": parc})
    # (a reviewer's cases) allow_missing_keys: t1 missing, t2 is taken for a label map, and a
    # first sample without t2 does not use the check up; the advice has a mode per key
    gappy = Resampled(["t1", "t2", "seg"], spec, device=device, allow_missing_keys=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", medproc.errors.MedprocWarning)
        gappy({k: d[k] for k in ("t1", "seg")})
    with pytest.warns(medproc.errors.MedprocWarning, match=r"key 't2'.*'bilinear', 'bilinear', "):
        gappy({k: d[k] for k in ("t2", "seg")})


@pytest.mark.parametrize("device", DEVICES)
def test_loadvolumed_casts_like_loadimaged_dtype_and_names_loadimaged_only_arguments(
    sample_data, device
):
    """A MONAI user's findings: int16 voxels truncated a later RandShiftIntensityd's offsets and
    a uint8 label broke BCEWithLogitsLoss, with no LoadImaged-like dtype= to ask for float; and
    the LUNA16 recipe's LoadImaged(meta_key_postfix=...) gave a bare TypeError."""
    import torch
    from monai.transforms import RandShiftIntensityd

    root = os.path.join(sample_data, "nifti")
    case = {"image": f"{root}/images/case001.nii.gz", "label": f"{root}/labels/case001.nii.gz"}
    kept = LoadVolumed(["image", "label"], device=device)(case)
    d = LoadVolumed(["image", "label"], dtype=np.float32, device=device)(case)
    assert d["image"].dtype == d["label"].dtype == torch.float32
    assert d["image"].device == kept["image"].device and kept["image"].dtype == torch.int16
    np.testing.assert_array_equal(
        d["image"].cpu().numpy(), kept["image"].cpu().numpy().astype(np.float32)
    )
    assert d["image"].meta["filename_or_obj"] == kept["image"].meta["filename_or_obj"]
    shift = RandShiftIntensityd("image", offsets=0.3, prob=1.0)
    shift.set_random_state(0)
    moved = shift(dict(d))["image"] - d["image"]
    assert 0 < float(moved.abs().max()) < 0.3 and float(moved.std()) < 1e-3  # not truncated
    loss = torch.nn.BCEWithLogitsLoss()(torch.zeros_like(d["label"]), (d["label"] > 0).float())
    assert torch.isfinite(loss)
    torch.nn.BCEWithLogitsLoss()(torch.zeros_like(d["label"]), d["label"].clamp(0, 1))
    LoadVolumed(["image"], meta_key_postfix="meta_dict", reader=None)  # (defaults: no effect)
    with pytest.raises(TypeError, match="LoadImaged's meta_key_postfix='m'.*drop the argument"):
        LoadVolumed(["image"], meta_key_postfix="m")
    with pytest.raises(TypeError, match="LoadImaged's reader='ITKReader': medproc's own readers"):
        LoadVolumed(["image"], reader="ITKReader")
    with pytest.raises(TypeError, match="argument 'serise' \\(did you mean 'series'\\?\\)"):
        LoadVolumed(["image"], serise=2)
    from monai.data import set_track_meta

    set_track_meta(False)  # (a crash: the cast came after wrapping; a reviewer's finding)
    try:
        plain = LoadVolumed(["image"], dtype=np.float32, device=device)(case)
        assert plain["image"].dtype == torch.float32 and "image_meta_dict" in plain
    finally:
        set_track_meta(True)


@pytest.mark.parametrize("device", DEVICES)
def test_a_list_of_files_under_one_key_is_stacked_as_channels(tmp_path, device):
    """BraTS datalists give each case's modalities as a list under "image"; LoadImaged stacks
    them as channels, LoadVolumed refused the list (a MONAI user's finding). Now stacked on
    the first file's grid (mixed dtypes promoted as numpy does), resampled channel by channel
    by Resampled; a file off that grid, or a 4-D one, is refused naming it."""
    import nibabel as nib
    import torch

    aff = np.diag([2.0, 2.0, 3.0, 1.0])
    rng = np.random.default_rng(0)
    t1 = rng.integers(0, 900, (20, 18, 12)).astype(np.int16)
    t2 = rng.random((20, 18, 12)).astype(np.float32)
    paths = []
    for n, a in (("t1", t1), ("t2", t2)):
        paths.append(str(tmp_path / f"{n}.nii.gz"))
        nib.save(nib.Nifti1Image(a, aff), paths[-1])
    d = LoadVolumed("image", device=device)({"image": paths})
    x = d["image"]
    assert x.shape == (2, 20, 18, 12) and x.dtype == torch.float32
    np.testing.assert_array_equal(x[0].cpu().numpy(), t1)
    np.testing.assert_array_equal(x[1].cpu().numpy(), t2)
    np.testing.assert_allclose(x.affine.numpy(), aff)
    assert x.meta["filename_or_obj"] == paths[0]
    out = Resampled("image", medproc.Spec(spacing=4.0), device=device)(d)["image"]
    one = Resampled("image", medproc.Spec(spacing=4.0), device=device)(
        LoadVolumed("image", device=device)({"image": paths[1]})
    )["image"]
    np.testing.assert_allclose(out[1].cpu().numpy(), one[0].cpu().numpy(), rtol=1e-6)
    off = str(tmp_path / "off.nii.gz")
    nib.save(nib.Nifti1Image(t2, np.diag([2.0, 2.0, 3.5, 1.0])), off)
    with pytest.raises(
        medproc.UsageError, match=r"sample\['image'\]\[1\] \(.*off.nii.gz\) is not on"
    ):
        LoadVolumed("image")({"image": [paths[0], off]})
    four = str(tmp_path / "four.nii.gz")
    nib.save(nib.Nifti1Image(np.stack([t2, t2], -1), aff), four)
    with pytest.raises(ValueError, match=r"sample\['image'\]\[1\] .*a list holds 3-D volumes"):
        LoadVolumed("image")({"image": [paths[0], four]})
