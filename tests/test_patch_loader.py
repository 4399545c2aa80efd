"""PatchLoader: MONAI batches of random patches from a resampled cache, crop + augmentation in
one engine pass, lesions following the voxels."""

import os
import sys

import numpy as np
import pytest

import medproc
from medproc.monai import PatchLoader

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)
import train_monai  # noqa: E402

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _tol(device, ref):
    """Absolute tolerance against a CPU reference: CPU and GPU backends agree within 1e-4 of
    the range (tests/test_resample.py::test_cpu_and_gpu_agree)."""
    return 1e-3 if device == "cpu" else max(1e-3, 1e-4 * float(np.abs(ref).max()))


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
