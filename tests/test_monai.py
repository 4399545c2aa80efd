"""MONAI compatibility, proven by MONAI itself: its reader, its Compose, UNet, DiceCELoss,
sliding_window_inference; medproc's loader, transforms and inverse in between."""

import os
import sys

import numpy as np
import pytest

import medproc
from medproc.monai import LoadVolumed, Resampled, to_metatensor, to_volume

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)
import train_monai  # noqa: E402

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


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


def test_compose_mixes_monai_and_medproc(sample_data):
    from monai.transforms import Compose, EnsureTyped, RandSpatialCropd, ScaleIntensityRanged

    spec = medproc.Spec(spacing=2.0, orientation="RAS")
    case = train_monai.datalist()[1]
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


@pytest.mark.parametrize("device", DEVICES)
def test_load_resample_invert_on_the_device(device):
    """LoadVolumed(device=...) and Resampled(device=...): MetaTensors (C, i, j, k) on the device
    (CUDA tensors stay tensors through to_volume), the same voxels and affine as
    medproc.resample on the CPU; Invertd puts the label back on the source grid."""
    import torch
    from monai.transforms import Compose

    from medproc.monai import Invertd

    spec = medproc.Spec(spacing=2.0, orientation="RAS")
    case = train_monai.datalist()[1]
    d = Compose(
        [
            LoadVolumed(["image", "label"], device=device),
            Resampled(["image", "label"], spec, device=device),
        ]
    )(dict(case))
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
    back = to_volume(Invertd(["label"], plan_key="image_plan", device=device)(d)["label"]).numpy()
    src_lab = medproc.load(case["label"])
    assert back.shape == src_lab.shape
    np.testing.assert_allclose(back.affine, src_lab.affine, atol=1e-6)
    truth, inv = src_lab.array > 0, back.array > 0
    assert 2 * (inv & truth).sum() / (inv.sum() + truth.sum()) >= 0.9


@pytest.mark.parametrize("device", DEVICES)
def test_monai_unet_trains_infers_and_inverts(tmp_path, device):
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
