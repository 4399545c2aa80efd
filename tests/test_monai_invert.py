"""medproc's Resampled as a MONAI InvertibleTransform, judged by MONAI itself: its Invertd,
Compose, CacheDataset, DataLoader workers, list_data_collate, decollate_batch and SaveImaged.

Spacings are finer than the sources' (3 x 3 x 2 and 3 x 3 x 3 mm) and chosen so that no output
voxel centre lies exactly half-way between two input voxels (where nearest neighbour may go
either way): nearest-neighbour label maps then survive resample + inverse exactly.
"""

import os

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.data import CacheDataset, DataLoader, decollate_batch, list_data_collate
from monai.transforms import (
    Compose,
    EnsureTyped,
    Invertd,
    LoadImaged,
    Orientationd,
    RandFlipd,
    SaveImaged,
    Spacingd,
)

import medproc
from medproc.monai import LoadVolumed, Resampled, plan_of

K = ["image", "label"]
SPACING = (2.4, 2.4, 1.6)


@pytest.fixture(scope="module")
def files(sample_data):
    root = os.path.join(sample_data, "nifti")
    return [
        {"image": f"{root}/images/case00{n}.nii.gz", "label": f"{root}/labels/case00{n}.nii.gz"}
        for n in (1, 2)
    ]


def _source(case):
    return LoadImaged(K, ensure_channel_first=True, image_only=True)(dict(case))


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _compose(resample, orientation_first=True):
    spatial = [Orientationd(K, "RAS"), resample]
    return Compose(
        [
            LoadImaged(K, ensure_channel_first=True, image_only=True),
            *(spatial if orientation_first else spatial[::-1]),
            RandFlipd(K, prob=1.0, spatial_axis=(0, 2)),
            EnsureTyped(K),
        ]
    )


@pytest.mark.parametrize("orientation_first", [True, False])
@pytest.mark.parametrize("grid", ["centred", "monai"])
def test_monai_invertd_undoes_a_compose_of_monai_and_medproc(files, grid, orientation_first):
    spec = medproc.Spec(spacing=SPACING, grid=grid)
    ours = _compose(Resampled(K, spec, mode=("bilinear", "nearest")), orientation_first)
    ref = _compose(Spacingd(K, SPACING, mode=("bilinear", "nearest")), orientation_first)
    d, r = ours(dict(files[0])), ref(dict(files[0]))
    ops = [op["class"] for op in d["image"].applied_operations]
    want = ["Orientation", "Resampled"] if orientation_first else ["Resampled", "Orientation"]
    assert ops == [*want, "RandFlipd"]  # the record of MONAI's transforms is kept, in order
    if grid == "monai":  # Spacingd's grid, so the whole chain equals MONAI's
        assert d["image"].shape == r["image"].shape
        np.testing.assert_allclose(d["image"].affine, r["image"].affine, atol=1e-6)
        assert _rel(d["image"], r["image"]) <= 1e-5

    inv = dict(transform=ours, orig_keys=K, nearest_interp=[False, True])
    back = Invertd(K, **inv)(d)
    back_ref = Invertd(K, **{**inv, "transform": ref})(r)
    src = _source(files[0])
    for k in K:
        assert back[k].shape == src[k].shape
        np.testing.assert_allclose(back[k].affine, src[k].affine, atol=1e-6)
        assert back[k].applied_operations == []
        assert back[k].meta["filename_or_obj"] == src[k].meta["filename_or_obj"]
    np.testing.assert_array_equal(back["label"], src["label"])  # labels exactly
    assert back["image"].dtype == torch.float32
    if grid == "monai":  # the same voxels as MONAI's own inverse
        assert _rel(back["image"], back_ref["image"]) <= 1e-5
    else:  # as close to the source as MONAI's own round trip
        assert _rel(back["image"], src["image"]) <= 1.1 * _rel(back_ref["image"], src["image"])


def test_cache_dataset_workers_collate_decollate_and_invert(files, tmp_path):
    """CacheDataset (threads) + DataLoader(num_workers=2) + list_data_collate: nothing in the
    samples that default_collate cannot batch; decollate_batch gives back each case with its own
    metadata and record, and Invertd + SaveImaged(resample=True) write each case under its own
    name, in its source geometry."""
    spec = medproc.Spec(shape=(128, 128, 64), orientation="RAS")  # one size: the cases batch
    pipe = Compose(
        [
            LoadVolumed(K),
            Resampled(K, spec, mode=("bilinear", "nearest")),
            RandFlipd(K, prob=0.5, spatial_axis=(0, 1)),
            EnsureTyped(K),
        ]
    )
    ds = CacheDataset(files, pipe, num_workers=2, progress=False)
    torch.utils.data.default_collate([ds[0], ds[1]])  # plain torch collation works too
    (batch,) = list(DataLoader(ds, batch_size=2, num_workers=2, collate_fn=list_data_collate))
    assert batch["image"].shape == (2, 1, 128, 128, 64) and batch["label"].dtype == torch.uint8
    save = SaveImaged(
        "label", output_dir=str(tmp_path), output_postfix="seg", resample=True, print_log=False
    )
    for case, item in zip(files, decollate_batch(batch)):
        src = _source(case)
        for k in K:
            assert item[k].meta["filename_or_obj"] == case[k]
            np.testing.assert_array_equal(item[k].meta["spatial_shape"], src[k].shape[1:])
            np.testing.assert_allclose(item[k].meta["original_affine"], src[k].affine, atol=1e-9)
            assert [op["class"] for op in item[k].applied_operations] == ["Resampled", "RandFlipd"]
        back = Invertd(K, transform=pipe, orig_keys=K, nearest_interp=[False, True])(item)
        np.testing.assert_array_equal(back["label"], src["label"])
        save(back)
    for case in files:
        stem = os.path.basename(case["label"]).split(".")[0]
        written, source = nib.load(tmp_path / stem / f"{stem}_seg.nii.gz"), nib.load(case["label"])
        assert written.shape == source.shape
        np.testing.assert_allclose(written.affine, source.affine, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(written.dataobj), np.asarray(source.dataobj))


def test_saveimaged_resample_true_writes_each_case_in_its_source_geometry(files, tmp_path):
    """Without inverting: the MetaTensors keep original_affine and spatial_shape, so MONAI's
    writer itself puts images and labels back in the source geometry, each case by its name."""
    spec = medproc.Spec(spacing=SPACING, orientation="RAS")
    pipe = Compose([LoadVolumed(K), Resampled(K, spec, mode=("bilinear", "nearest"))])
    for case in files:
        d = pipe(dict(case))
        for k, post in (("image", "img"), ("label", "seg")):
            kw = dict(output_postfix=post, resample=True, print_log=False)
            SaveImaged(k, output_dir=str(tmp_path), mode="nearest", **kw)(d)
    for case in files:
        stem = os.path.basename(case["image"]).split(".")[0]
        for k, post in (("image", "img"), ("label", "seg")):
            written = nib.load(tmp_path / stem / f"{stem}_{post}.nii.gz")
            source = nib.load(case[k])
            assert written.shape == source.shape
            np.testing.assert_allclose(written.affine, source.affine, atol=1e-5)
        np.testing.assert_array_equal(
            np.asarray(nib.load(tmp_path / stem / f"{stem}_seg.nii.gz").dataobj),
            np.asarray(nib.load(case["label"]).dataobj),
        )


def test_per_key_modes_keep_a_second_image_and_its_own_statistics(files):
    """Per-key mode as MONAI's: a second image is interpolated (not taken for a label map),
    gets the spec's dtype and its own intensity statistics; the label keeps its dtype."""
    src = LoadVolumed(K)(dict(files[0]))
    src["image2"] = src["image"].float() * 2 + 100  # another image of the case, other units
    spec = medproc.Spec(spacing=SPACING, grid="monai", intensity=medproc.Intensity(zscore=True))
    keys = ["image", "image2", "label"]
    d = Resampled(keys, spec, mode=("bilinear", "bilinear", "nearest"))(dict(src))
    assert d["image"].dtype == d["image2"].dtype == torch.float32
    assert d["label"].dtype == torch.uint8
    np.testing.assert_allclose(d["image2"], d["image"], atol=1e-3)  # each z-scored on its own
    plain = medproc.Spec(spacing=SPACING, grid="monai")
    ours = Resampled(keys, plain, mode=("bilinear", "bilinear", "nearest"))(dict(src))
    ref = Spacingd(keys, SPACING, mode=("bilinear", "bilinear", "nearest"))(dict(src))
    assert _rel(ours["image2"], ref["image2"]) <= 1e-5  # MONAI's values, not a label's
    np.testing.assert_array_equal(ours["label"], ref["label"])
    # the default (no mode): the first key is the image, the others label maps
    default = Resampled(keys, plain)(dict(src))
    assert default["image2"].dtype == torch.float32 and default["label"].dtype == torch.uint8
    np.testing.assert_array_equal(np.unique(default["image2"]), np.unique(src["image2"]))


def test_plan_of_and_clear_errors(files):
    d = LoadVolumed(K)(dict(files[0]))
    spec = medproc.Spec(spacing=SPACING, orientation="RAS")
    resample = Resampled(K, spec)
    out = resample(dict(d))
    plan = plan_of(out["image"])
    assert plan.out_shape == tuple(out["image"].shape[1:])
    np.testing.assert_allclose(plan.out_affine, out["image"].affine, atol=1e-9)
    with pytest.raises(ValueError, match="mode for key 'label'"):
        Resampled(K, spec, mode=("bilinear", "spline"))
    bad = dict(d, label=d["label"][:, :50])
    with pytest.raises(ValueError, match="key 'label' is not on the grid of key 'image'"):
        Resampled(K, spec)(bad)
    with pytest.raises(ValueError, match="channel-first"):
        Resampled(["image"], spec)({"image": d["image"][0]})
    plain = dict(out, image=out["image"].as_tensor()[:, :20])
    with pytest.raises(ValueError, match="MetaTensor"):  # (MONAI says it, popping the record)
        resample.inverse(plain)
    # medproc.monai.invert takes the MetaTensor a MONAI user holds (it said "'numpy.ndarray'
    # object has no attribute 'array'"), and gives what to_volume's Volume gives
    from medproc.monai import invert, to_volume

    by_tensor = invert(out["label"], plan)
    by_volume = invert(to_volume(out["label"]), plan)
    np.testing.assert_array_equal(np.asarray(by_tensor.array), np.asarray(by_volume.array))
    np.testing.assert_allclose(by_tensor.affine, d["label"].affine, atol=1e-6)
    with pytest.raises(TypeError, match="medproc.Volume or a MONAI MetaTensor"):
        invert(out["label"].numpy(), plan)


def test_an_inverse_after_a_size_change_goes_by_the_metatensors_affine(files):
    """pad_list_data_collate pads a batch's smaller volume and Invertd hands the prediction the
    padded image's affine: Resampled.inverse refused the size (a MONAI user's validation loop),
    where MONAI's own inverses go through world space. Now the padded case inverts to what the
    unpadded one does (labels exactly), and so does a flip applied after Resampled and left on
    the stack (its affine says where the voxels lie)."""
    import copy

    from monai.data import pad_list_data_collate

    spec = medproc.Spec(spacing=SPACING, orientation="RAS")
    resample = Resampled(K, spec, mode=("bilinear", "nearest"))
    outs = [resample(LoadVolumed(K)(dict(f))) for f in files]
    direct = [resample.inverse(copy.deepcopy(o)) for o in outs]
    items = decollate_batch(pad_list_data_collate(copy.deepcopy(outs)))
    padded = [
        n for n, (i, o) in enumerate(zip(items, outs)) if i["image"].shape != o["image"].shape
    ]
    assert padded  # (the sample cases differ in size)
    for n in padded:
        back = resample.inverse(items[n])
        assert back["label"].shape == direct[n]["label"].shape
        np.testing.assert_allclose(back["label"].affine, direct[n]["label"].affine, atol=1e-6)
        np.testing.assert_array_equal(back["label"].numpy(), direct[n]["label"].numpy())
        assert _rel(back["image"].numpy(), direct[n]["image"].numpy()) < 1e-5
    flipped = RandFlipd(K, prob=1.0, spatial_axis=0)(copy.deepcopy(outs[0]))
    cut = dict(flipped, label=flipped["label"][:, 3:])  # (a MetaTensor slice keeps its affine)
    cut["label"].affine = flipped["label"].affine @ torch.tensor(
        [[1, 0, 0, 3], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.float64
    )
    both = resample.inverse(cut)
    back = both["label"].numpy()
    ref = direct[0]["label"].numpy()
    covered = back != 0
    assert covered.sum() > 0.5 * (ref != 0).sum()
    np.testing.assert_array_equal(back[covered], ref[covered])
    # the flipped image kept its size: its affine (not the plan's) says where it lies
    assert _rel(both["image"].numpy(), direct[0]["image"].numpy()) < 1e-5
    # a MetaTensor of another size on a grid of other spacings (a hand-built identity affine):
    # no such change, refused
    stale = copy.deepcopy(outs[0])
    stale["image"] = stale["image"][:, 2:]
    stale["image"].affine = torch.eye(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="an affine of other spacings"):
        resample.inverse(stale)


@pytest.mark.gpu
def test_gpu_gives_cuda_metatensors_and_inverts_on_the_gpu(files):
    spec = medproc.Spec(spacing=SPACING, orientation="RAS", grid="monai")
    cpu = Compose([LoadVolumed(K), Resampled(K, spec, mode=("bilinear", "nearest"))])
    gpu = Compose(
        [
            LoadVolumed(K, device="gpu"),
            Resampled(K, spec, mode=("bilinear", "nearest"), device="gpu"),
        ]
    )
    c, g = cpu(dict(files[0])), gpu(dict(files[0]))
    for k in K:
        assert g[k].is_cuda and g[k].dtype == c[k].dtype and g[k].shape == c[k].shape
        np.testing.assert_allclose(g[k].affine, c[k].affine, atol=1e-9)
    assert _rel(g["image"].cpu(), c["image"]) <= 1e-4
    assert (g["label"].cpu() == c["label"]).float().mean() >= 0.999
    back = Invertd(K, transform=gpu, orig_keys=K, nearest_interp=[False, True])(g)
    src = _source(files[0])
    for k in K:
        assert back[k].is_cuda and back[k].shape == src[k].shape
        np.testing.assert_allclose(back[k].affine, src[k].affine, atol=1e-6)
    assert (back["label"].cpu() == src["label"]).float().mean() >= 0.999
