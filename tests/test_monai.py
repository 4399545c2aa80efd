"""MONAI compatibility, proven by MONAI itself: its reader, its Compose, UNet, DiceCELoss,
sliding_window_inference; medproc's loader, transforms and inverse in between."""

import os
import sys

import numpy as np
import pytest

import medproc
from medproc.monai import LoadVolumed, PatchLoader, Resampled, to_metatensor, to_volume

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
def test_patch_loader_geometry(tmp_path, device):
    spec = medproc.Spec(spacing=1.5, orientation="RAS")
    loader = PatchLoader(
        train_monai.datalist(),
        spec,
        (24, 20, 16),
        batch_size=3,
        num_samples=3,
        flip_prob=0.0,
        device=device,
        cache_dir=str(tmp_path),
    )
    vols = {v["case"]["image"]: v for v in loader.volumes}
    for path, v in vols.items():  # the cache holds medproc.resample's output, indexed (i, j, k)
        ref = medproc.resample(medproc.load(path), spec=spec)  # on the CPU
        assert v["image"].shape == ref.shape
        np.testing.assert_allclose(v["affine"], ref.affine, atol=1e-6)
        np.testing.assert_allclose(np.asarray(v["image"]), ref.array, atol=_tol(device, ref.array))
    n = 0
    for batch in loader:
        img, lab = batch["image"], batch["label"]
        assert img.shape[1:] == (1, 24, 20, 16) and img.affine.shape[1:] == (4, 4)
        assert img.device.type == ("cuda" if device == "gpu" else "cpu")
        for s, case in enumerate(batch["case"]):
            v = vols[case["image"]]
            aff = img.affine[s].numpy()
            # voxel (i, j, k) of the patch holds the cached volume's value at the same world point
            for ijk in [(0, 0, 0), (23, 19, 15), (5, 11, 7)]:
                world = aff[:3, :3] @ ijk + aff[:3, 3]
                idx = np.round(
                    np.linalg.solve(v["affine"][:3, :3], world - v["affine"][:3, 3])
                ).astype(int)
                assert abs(float(img[s, 0][ijk]) - float(v["image"][tuple(idx)])) < 1e-3
                assert int(lab[s, 0][ijk]) == int(v["label"][tuple(idx)])
            n += 1
    assert n == len(loader.volumes) * 3
    # pos/neg: with pos only, every patch holds foreground
    pos = PatchLoader(
        train_monai.datalist(),
        spec,
        (16, 16, 16),
        batch_size=2,
        num_samples=4,
        pos=1,
        neg=0,
        device=device,
        cache_dir=str(tmp_path),
        rotate_range=20,
        scale_range=0.1,
    )
    for batch in pos:
        assert all(int(x.sum()) > 0 for x in batch["label"])


@pytest.mark.parametrize("device", DEVICES)
def test_patch_loader_lesions_follow_augmentation(tmp_path, device):
    from test_annotations import oblique_case

    img, lab, lesions = oblique_case()
    medproc.save(img, tmp_path / "img.nii.gz")
    medproc.save(lab, tmp_path / "lab.nii.gz")
    dl = [
        {
            "image": str(tmp_path / "img.nii.gz"),
            "label": str(tmp_path / "lab.nii.gz"),
            "lesions": lesions,
        }
    ]
    loader = PatchLoader(
        dl,
        medproc.Spec(spacing=1.0),
        (40, 40, 40),
        batch_size=2,
        num_samples=6,
        pos=1,
        neg=0,
        flip_prob=0.5,
        rot90_prob=0.5,
        rotate_range=20,
        device=device,
        cache_dir=str(tmp_path / "c"),
    )
    checked = 0
    for batch in loader:
        for s in range(batch["label"].shape[0]):
            lb = batch["label"][s, 0].cpu().numpy()
            for n, les in enumerate(batch["lesions"][s], 1):
                pts = np.argwhere(lb == n)
                if les["inside"] and len(pts) > 0.9 * (
                    4 / 3 * np.pi * 10**3
                ):  # whole lesion in the patch
                    # (i, j, k) of the patch, the order of argwhere on the (i, j, k) label
                    assert np.abs(np.array(les["center_voxel"]) - pts.mean(0)).max() <= 0.5
                    checked += 1
    assert checked > 0


def test_sharding_partitions_cases(tmp_path):
    dl = train_monai.datalist() * 3  # 6 cases
    spec = medproc.Spec(spacing=3.0)
    shards = [
        PatchLoader(dl, spec, (8, 8, 8), shard_id=i, num_shards=2, cache_dir=str(tmp_path))
        for i in range(2)
    ]
    assert [len(s.cases) for s in shards] == [3, 3]
    assert shards[0].cases + shards[1].cases != dl  # interleaved, not halves
    with pytest.raises(ValueError, match="shard_id"):
        PatchLoader(dl, spec, (8, 8, 8), shard_id=2, num_shards=2, cache_dir=str(tmp_path))


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


def test_decathlon_json(tmp_path, sample_data):
    import json

    doc = {
        "training": [
            {
                "image": os.path.relpath(c["image"], tmp_path),
                "label": os.path.relpath(c["label"], tmp_path),
            }
            for c in train_monai.datalist()
        ]
    }
    (tmp_path / "dataset.json").write_text(json.dumps(doc))
    loader = PatchLoader(
        str(tmp_path / "dataset.json"),
        medproc.Spec(spacing=3.0),
        (8, 8, 8),
        cache_dir=str(tmp_path / "c"),
        base_dir=str(tmp_path),
    )
    assert len(loader.cases) == 2 and next(iter(loader))["image"].shape == (2, 1, 8, 8, 8)
