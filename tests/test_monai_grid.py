"""``Spec(grid="monai")`` against MONAI's Orientationd + Spacingd on real volumes: the same
shape, the same affine (1e-6 mm) and the same voxels (relative L2 <= 1e-5)."""

import os

import numpy as np
import pytest
from monai.transforms import Compose, LoadImaged, Orientationd, Spacingd

import medproc
from medproc.monai import LoadVolumed, Resampled, to_metatensor

K = ["image", "label"]


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _monai(spacing, keys=K):
    return Compose(
        [
            Orientationd(keys, "RAS"),
            Spacingd(keys, spacing, mode=("bilinear", "nearest")[: len(keys)]),
        ]
    )


def _ours(spacing, keys=K, grid="monai"):
    spec = medproc.Spec(spacing=spacing, orientation="RAS", grid=grid)
    return Resampled(keys, spec, mode=("bilinear", "nearest")[: len(keys)])


def _agree(ours, ref, shape=None):
    if shape is not None:
        assert tuple(ours.shape[1:]) == shape
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours.affine, ref.affine, atol=1e-6)
    assert _rel(ours, ref) <= 1e-5


def test_lung1_matches_spacingd(pyradiomics_data):
    """pyradiomics' lung1 (0.57 x 0.57 x 5 mm, LPS) at 1.5 mm: MONAI's grid is 195 x 195 x 158
    from the first voxel; medproc's centred grid is 195 x 195 x 160, its first voxel 1.75 mm
    away along k (0.21 mm in-plane)."""
    path = os.path.join(pyradiomics_data, "lung1_{}.nrrd")
    d = {k: to_metatensor(medproc.load(path.format(k))) for k in K}
    ref = _monai(1.5)(dict(d))
    ours = _ours(1.5)(dict(d))
    _agree(ours["image"], ref["image"], shape=(195, 195, 158))
    assert ours["label"].dtype == d["label"].dtype
    # nearest neighbour: the 1.5 / 5 mm slice steps put some samples exactly half-way
    assert (ours["label"].numpy() == ref["label"].numpy()).mean() >= 0.999
    centred = _ours(1.5, grid="centred")(dict(d))
    assert tuple(centred["image"].shape[1:]) == (195, 195, 160)
    first = centred["image"].affine.numpy()[:3, 3] - ours["image"].affine.numpy()[:3, 3]
    np.testing.assert_allclose(np.abs(first), [0.215, 0.215, 1.75], atol=0.001)


@pytest.mark.parametrize("spacing", [2.0, (1.3, 2.7, 2.2)])
@pytest.mark.parametrize("case", ["case001", "case002"])
def test_sample_data_loadimaged_chain_and_medproc_chain_agree(sample_data, case, spacing):
    """The migration: LoadImaged -> Orientationd -> Spacingd replaced by LoadVolumed ->
    Resampled(grid="monai") gives the same tensors."""
    root = os.path.join(sample_data, "nifti")
    files = {k: os.path.join(root, f"{k}s", f"{case}.nii.gz") for k in K}
    ref = Compose([LoadImaged(K, ensure_channel_first=True), _monai(spacing)])(dict(files))
    ours = Compose([LoadVolumed(K), _ours(spacing)])(dict(files))
    _agree(ours["image"], ref["image"])
    assert ours["label"].shape == ref["label"].shape
    assert (ours["label"].numpy() == ref["label"].numpy()).mean() >= 0.999


def test_oblique_dicom_matches_spacingd(sample_data):
    """An oblique series: MONAI keeps its directions, so does grid="monai"."""
    vol = medproc.load(os.path.join(sample_data, "dicom", "ct_oblique"))
    d = {"image": to_metatensor(vol)}
    ref = _monai(1.7, ["image"])(dict(d))
    ours = _ours(1.7, ["image"])(dict(d))
    _agree(ours["image"], ref["image"])


@pytest.mark.gpu
def test_lung1_matches_spacingd_on_the_gpu(pyradiomics_data):
    """The same on the GPU: CUDA MetaTensors, MONAI's grid and voxels."""
    path = os.path.join(pyradiomics_data, "lung1_{}.nrrd")
    d = {k: to_metatensor(medproc.load(path.format(k))) for k in K}
    ref = _monai(1.5)(dict(d))
    spec = medproc.Spec(spacing=1.5, orientation="RAS", grid="monai")
    ours = Resampled(K, spec, mode=("bilinear", "nearest"), device="gpu")(dict(d))
    assert ours["image"].is_cuda and ours["label"].is_cuda
    _agree(ours["image"].cpu(), ref["image"], shape=(195, 195, 158))
    assert (ours["label"].cpu().numpy() == ref["label"].numpy()).mean() >= 0.999
