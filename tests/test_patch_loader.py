"""PatchLoader: MONAI batches of random patches from a resampled cache; crop + augmentation in one
engine pass; every voxel where its affine says (against medproc.resample); lesions on lesions."""

import json
import os
import re
import time

import numpy as np
import pytest
from scipy.ndimage import map_coordinates

import medproc
from medproc.monai.loader import Augment, PatchLoader, PosNeg

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = medproc.Spec(
    spacing=1.5, orientation="RAS", intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1))
)


def datalist():
    d = os.path.join(ROOT, "sample_data", "nifti")
    return [
        {"image": os.path.join(d, "images", n), "label": os.path.join(d, "labels", n)}
        for n in ("case001.nii.gz", "case002.nii.gz")
    ]


def _references(spec, dl):
    """medproc.resample of every case (CPU): the grid and voxels the cache must hold."""
    out = {}
    for c in dl:
        img, lab = medproc.resample(
            medproc.load(c["image"]), spec=spec, label=medproc.load(c["label"])
        )
        out[c["image"]] = (img, lab)
    return out


def _patch_coords(affine, ref_affine, shape):
    """Fractional indices into the reference grid of every voxel of a patch."""
    idx = np.indices(shape).reshape(3, -1).astype(np.float64)
    m = np.linalg.inv(ref_affine) @ np.asarray(affine, dtype=np.float64)
    return m[:3, :3] @ idx + m[:3, 3:4]


@pytest.mark.parametrize("device", DEVICES)
def test_every_voxel_where_its_affine_says(tmp_path, device):
    """Flips, quarter turns, rotations and scaling: each patch voxel holds the resampled
    volume's value at the world point the batch affine gives it (images trilinearly, labels
    nearest), and the batches are MONAI's (B, 1, i, j, k) MetaTensors on the device."""
    dl = datalist()
    refs = _references(SPEC, dl)
    patch = (20, 20, 12)
    loader = PatchLoader(
        dl,
        SPEC,
        patch,
        batch_size=3,
        sampling=PosNeg(pos=1, neg=1, num_samples=6),
        augment=Augment(
            flip_prob=0.5, rotate90_prob=0.5, affine_prob=0.5, range_z=0.4, scale_range=0.15
        ),
        device=device,
        cache_dir=str(tmp_path),
    )
    # the CPU reference is medproc.resample on the CPU: the GPU's nearest neighbour agrees but
    # for ties (tests/test_resample.py::test_cpu_and_gpu_agree)
    same = 1.0 if device == "cpu" else 0.999
    for e in loader.entries:  # the cache is medproc.resample's grid, indexed (i, j, k)
        img, lab = refs[e.case["image"]]
        assert e.shape == img.shape
        np.testing.assert_allclose(e.affine, img.affine, atol=1e-9)
        assert np.mean(e.host_label() == lab.array) >= same
    n = aligned = 0
    for batch in loader:
        img, lab = batch["image"], batch["label"]
        assert img.shape[1:] == (1, *patch) and img.affine.shape[1:] == (4, 4)
        assert img.device.type == ("cuda" if device == "gpu" else "cpu")
        assert str(lab.dtype) == "torch.uint8"
        for s, case in enumerate(batch["case"]):
            ref_img, ref_lab = refs[case["image"]]
            aff = img.affine[s].numpy()
            c = _patch_coords(aff, ref_img.affine, patch)
            inside = np.all((c > 0.01) & (c < np.array(ref_img.shape)[:, None] - 1.01), axis=0)
            got = img[s, 0].cpu().numpy().reshape(-1)[inside]
            want = map_coordinates(ref_img.array, c[:, inside], order=1)
            # the cache holds int16 HU (+-0.5 HU, i.e. 3.6e-4 after the window) before the window
            np.testing.assert_allclose(got, want, atol=2e-3)
            near = np.round(c[:, inside]).astype(int)
            got_lab = lab[s, 0].cpu().numpy().reshape(-1)[inside]
            assert np.mean(got_lab == ref_lab.array[tuple(near)]) > 0.995
            on_grid = np.allclose(c, np.round(c), atol=1e-6)
            if on_grid:  # crops, flips and quarter turns sample voxel centres: labels exact
                assert np.mean(got_lab == ref_lab.array[tuple(near)]) >= same
                aligned += 1
            n += 1
    assert n == len(loader.entries) * 6 == len(loader) * 3
    assert 0 < aligned < n  # both kinds of patch were checked


def _synthetic(tmp_path, name="case", shape=(40, 40, 40), fg_box=(4, 36), hu_air_half=False):
    """A volume whose foreground (label 1) is a large block: negatives drawn uniformly would
    land on it more often than not."""
    aff = np.diag([1.0, 1.0, 1.0, 1.0])
    lab = np.zeros(shape, np.uint8)
    a, b = fg_box
    lab[a:b, a:b, a:b] = 1
    img = np.full(shape, 100, np.int16)
    img[lab > 0] = 300
    if hu_air_half:  # half of the background below the threshold
        img[: shape[0] // 2][lab[: shape[0] // 2] == 0] = -1000
    ip, lp = tmp_path / f"{name}_img.nii.gz", tmp_path / f"{name}_lab.nii.gz"
    medproc.save(medproc.Volume(img, aff), ip)
    medproc.save(medproc.Volume(lab, aff), lp)
    return {"image": str(ip), "label": str(lp)}, img, lab


def _centres(loader, epochs=1):
    """(label, image) at each patch's centre voxel (patches of odd size, drawn unaugmented)."""
    p = np.array(loader.patch) // 2
    labs, imgs = [], []
    for _ in range(epochs):
        for batch in loader:
            labs += [int(x[0][tuple(p)]) for x in batch["label"]]
            imgs += [float(x[0][tuple(p)]) for x in batch["image"]]
    return np.array(labs), np.array(imgs)


def test_batched_draw_equals_the_plan_chain_per_patch():
    """``draw_patches`` computes a batch's geometry at once; each patch must be what composing
    medproc.plan's steps gives for the same draws: crop plan -> ``augmented`` (the index map)
    -> ``input_region``, plus the intensity line (flips, turns, rotations, scaling, patches
    larger than the volume on an axis)."""
    from medproc.monai.patches import crop_start, draw_patches
    from medproc.plan import Plan

    loader = PatchLoader(datalist(), SPEC, (20, 20, 12), batch_size=4, prefetch=1)
    loader.close()
    augs = [
        Augment(flip_prob=0.5),
        Augment(
            flip_prob=0.5,
            rotate90_prob=0.5,
            affine_prob=0.9,
            range_x=0.4,
            range_z=0.3,
            scale_range=0.2,
            intensity_factors=0.1,
            intensity_offsets=0.1,
            scale_intensity_prob=0.5,
            shift_intensity_prob=0.5,
        ),
    ]
    for patch in ((20, 20, 12), (64, 64, 80)):  # the second is larger than the volumes in k
        for aug in augs:
            for seed in range(6):
                entries = [loader.entries[(seed + n) % len(loader.entries)] for n in range(5)]
                regions, plans, affines = draw_patches(
                    entries, patch, loader.sampling, aug, np.random.default_rng(seed)
                )
                rng = np.random.default_rng(seed)  # the same draws, one patch at a time
                for e, region, plan, affine in zip(entries, regions, plans, affines):
                    use_fg = rng.random() < loader.sampling.pos_ratio
                    use_fg = (use_fg and e.fg.size > 0) or (not use_fg and e.n_bg == 0)
                    centre = e.voxel(e.fg_voxel(rng) if use_fg else e.bg_voxel(rng))
                    crop = np.eye(4)
                    crop[:3, 3] = crop_start(centre, e.shape, patch)
                    ref = Plan(e.shape, e.affine, patch, e.affine @ crop, crop)
                    ref = ref.augmented(aug.index_map(patch, rng))
                    ref_region, ref = ref.input_region()
                    scale, shift = aug.intensity(rng)
                    lo, hi, a, b = e.intensity
                    assert region == ref_region and plan.in_shape == ref.in_shape
                    for f in ("in_affine", "out_affine", "matrix", "motion"):
                        np.testing.assert_allclose(getattr(plan, f), getattr(ref, f), atol=1e-9)
                    np.testing.assert_allclose(
                        plan.intensity, (lo, hi, a * scale, b * scale + shift)
                    )
                    np.testing.assert_allclose(affine, ref.in_affine @ ref.matrix, atol=1e-9)


def test_pos_neg_ratio_and_background_only_negatives(tmp_path):
    """Centres as MONAI's RandCropByPosNegLabeld draws them: foreground with probability
    pos / (pos + neg) (checked against MONAI's own sampler), negatives on label 0 only: the
    foreground here is 51% of the volume, so uniform negatives would give ~0.64, not 0.25."""
    from monai.transforms.utils import generate_pos_neg_label_crop_centers, map_binary_to_indices

    case, img, lab = _synthetic(tmp_path)
    n = 800
    loader = PatchLoader(
        [case],
        medproc.Spec(),
        (5, 5, 5),
        batch_size=200,
        sampling=PosNeg(pos=1, neg=3, num_samples=n),
    )
    e = loader.entries[0]
    assert e.bg_bits is not None and e.n_bg == int((lab == 0).sum())
    assert np.array_equal(np.sort(e.fg), np.flatnonzero(lab.ravel(order="F")))
    labs, _ = _centres(loader)
    frac = labs.mean()
    sd = np.sqrt(0.25 * 0.75 / n)
    assert abs(frac - 0.25) < 4 * sd, frac
    # MONAI's sampler on the same label gives the same ratio
    fg, bg = map_binary_to_indices(lab[None], None, 0)
    rs = np.random.RandomState(0)
    centres = generate_pos_neg_label_crop_centers((5, 5, 5), n, 0.25, lab.shape, fg, bg, rs)
    monai_frac = np.mean([lab[tuple(int(x) for x in c)] > 0 for c in centres])
    assert abs(monai_frac - frac) < 6 * sd
    # negatives are uniform over the background: the share in the lower half (i < 20) of the
    # background is that half's share of background voxels
    loader2 = PatchLoader(
        [case], medproc.Spec(), (1, 1, 1), batch_size=400, sampling=PosNeg(0, 1, num_samples=n)
    )
    centres = []
    for batch in loader2:
        centres += [tuple(np.round(a[:3, 3]).astype(int)) for a in batch["image"].affine.numpy()]
    centres = np.array(centres)
    assert np.all(lab[tuple(centres.T)] == 0)
    share = np.mean(centres[:, 0] < 20)
    assert abs(share - 0.5) < 4 * np.sqrt(0.25 / n)


def test_image_threshold_restricts_negatives(tmp_path):
    """PosNeg(image_threshold=t): as MONAI's image_key/image_threshold, background centres only
    where the image (after the spec's intensity step) is above t."""
    case, img, lab = _synthetic(tmp_path, hu_air_half=True)
    spec = medproc.Spec(intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)))
    t = (0 + 1000) / 1400  # HU 0 after the window
    loader = PatchLoader(
        [case],
        spec,
        (3, 3, 3),
        batch_size=200,
        sampling=PosNeg(pos=0, neg=1, num_samples=400, image_threshold=t),
    )
    labs, imgs = _centres(loader)
    assert np.all(labs == 0)
    assert np.all(imgs > t) and np.allclose(imgs, 1100 / 1400, atol=1e-3)
    e = loader.entries[0]
    assert e.n_bg == int(((lab == 0) & (img > 0)).sum())


def test_augment_matches_monai():
    """Augment's index maps are MONAI's: the rotation/scale matrix is create_rotate @
    create_scale, a quarter turn is Rotate90(k, (0, 1)), flips are RandFlip's."""
    import torch
    from monai.transforms import Flip, Rotate90
    from monai.transforms.utils import create_rotate, create_scale

    from medproc.monai.patches import rot90_map, rotation_map

    ang, sc = (0.3, -0.2, 0.5), (1.1, 0.9, 1.05)
    m = rotation_map((9, 9, 9), ang, sc)
    np.testing.assert_allclose(m[:3, :3], (create_rotate(3, ang) @ create_scale(3, sc))[:3, :3])
    np.testing.assert_allclose(m @ [4, 4, 4, 1], [4, 4, 4, 1])  # about the patch centre
    x = np.arange(6 * 6 * 4, dtype=np.float32).reshape(6, 6, 4)
    idx = np.indices(x.shape).reshape(3, -1)
    hom = np.vstack([idx, np.ones(idx.shape[1])])

    def apply(t):
        src = np.round(t @ hom).astype(int)[:3]
        return x[tuple(src)].reshape(x.shape)

    for k in (1, 2, 3):
        want = Rotate90(k, (0, 1))(torch.from_numpy(x[None]))[0].numpy()
        np.testing.assert_array_equal(apply(rot90_map(x.shape, k)), want)
    rng = np.random.default_rng(0)
    t = Augment(flip_prob=(1.0, 0.0, 1.0)).index_map(x.shape, rng)
    want = Flip(spatial_axis=(0, 2))(torch.from_numpy(x[None]))[0].numpy()
    np.testing.assert_array_equal(apply(t), want)
    # MONAI's probabilities: affine_prob 0.1 by default, the ranges in radians
    a = Augment(range_x=0.2)
    draws = [a.index_map((9, 9, 9), rng) for _ in range(2000)]
    rotated = np.mean([not np.allclose(d, np.eye(4)) for d in draws])
    assert abs(rotated - 0.1) < 4 * np.sqrt(0.09 / 2000)
    angles = [np.arctan2(d[2, 1], d[2, 2]) for d in draws if not np.allclose(d, np.eye(4))]
    assert max(np.abs(angles)) <= 0.2 and max(np.abs(angles)) > 0.15


def test_intensity_augmentation(tmp_path):
    """RandScaleIntensityd + RandShiftIntensityd: each patch is x * (1 + f) + o with f, o in
    their ranges, on top of the spec's window."""
    case, img, lab = _synthetic(tmp_path)
    spec = medproc.Spec(intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)))
    loader = PatchLoader(
        [case],
        spec,
        (8, 8, 8),
        batch_size=16,
        sampling=PosNeg(pos=1, neg=1, num_samples=64),
        augment=Augment(
            scale_intensity_prob=1.0,
            intensity_factors=0.2,
            shift_intensity_prob=0.5,
            intensity_offsets=0.1,
        ),
    )
    scales, shifts = [], []
    for batch in loader:
        for s in range(batch["image"].shape[0]):
            x = batch["image"][s, 0].numpy().ravel()
            aff = batch["image"].affine[s].numpy()
            c = np.round(_patch_coords(aff, np.eye(4), (8, 8, 8))).astype(int)
            ref = (img[tuple(c)].astype(np.float64) + 1000) / 1400
            if np.ptp(ref) == 0:
                continue
            a, b = np.polyfit(ref, x, 1)
            np.testing.assert_allclose(x, a * ref + b, atol=1e-5)
            scales.append(a)
            shifts.append(b)
    scales, shifts = np.array(scales), np.array(shifts)
    assert len(scales) > 10
    assert np.all(np.abs(scales - 1) <= 0.2 + 1e-6) and np.std(scales) > 0.05
    assert np.all(np.abs(shifts) <= 0.1 + 1e-6)
    unshifted = np.mean(np.abs(shifts) < 1e-6)
    assert 0.2 < unshifted < 0.8  # prob 0.5


@pytest.mark.parametrize("device", DEVICES)
def test_lesions_follow_augmentation(tmp_path, device):
    """A lesion's centre_voxel on the patch grid is where its voxels landed, after flips,
    quarter turns and rotation; affine @ center_voxel == center_world_ras."""
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
        sampling=PosNeg(pos=1, neg=0, num_samples=6),
        augment=Augment(flip_prob=0.5, rotate90_prob=0.5, affine_prob=1.0, range_z=0.35),
        device=device,
    )
    checked = 0
    for batch in loader:
        for s in range(batch["label"].shape[0]):
            lb = batch["label"][s, 0].cpu().numpy()
            aff = batch["image"].affine[s].numpy()
            for n, les in enumerate(batch["lesions"][s], 1):
                np.testing.assert_allclose(
                    aff[:3, :3] @ les["center_voxel"] + aff[:3, 3],
                    les["center_world_ras"],
                    atol=1e-3,  # center_voxel is rounded to 1e-4 voxel
                )
                pts = np.argwhere(lb == n)
                if les["inside"] and len(pts) > 0.9 * (4 / 3 * np.pi * 10**3):  # whole lesion
                    assert np.abs(np.array(les["center_voxel"]) - pts.mean(0)).max() <= 0.5
                    checked += 1
    assert checked > 0


def test_sharding_equal_steps_no_repeats(tmp_path):
    """Shards are disjoint (case n on shard n % num_shards), cover the datalist, give the same
    number of batches per epoch (DDP ranks stay in step) and repeat no case within an epoch."""
    dl = [
        _synthetic(tmp_path, name=f"c{n}", shape=(12, 12, 12), fg_box=(3, 8))[0] for n in range(5)
    ]
    shards = [
        PatchLoader(
            dl,
            medproc.Spec(),
            (4, 4, 4),
            batch_size=2,
            sampling=PosNeg(num_samples=2),
            shard_id=i,
            num_shards=2,
        )
        for i in range(2)
    ]
    assert [len(s.cases) for s in shards] == [3, 2]
    assert shards[0].cases == dl[0::2] and shards[1].cases == dl[1::2]
    assert len(shards[0]) == len(shards[1]) == 2  # 2 volumes x 2 samples / batch 2
    for _epoch in range(3):
        seen = []
        for s in shards:
            cases = [c["image"] for b in s for c in b["case"]]
            assert len(cases) == 4
            assert all(cases.count(c) == 2 for c in set(cases))  # num_samples, once per epoch
            assert set(cases) <= {c["image"] for c in s.cases}
            seen.append(set(cases))
        assert not seen[0] & seen[1]
    with pytest.raises(ValueError, match="shard_id"):
        PatchLoader(dl, medproc.Spec(), (4, 4, 4), shard_id=2, num_shards=2)


def test_cache_dir_reused_and_invalidated(tmp_path):
    """With cache_dir, a second loader maps the first one's entries (no rebuild); a changed
    source file is rebuilt."""
    case, img, lab = _synthetic(tmp_path, shape=(16, 16, 16), fg_box=(4, 10))
    kw = dict(spec=medproc.Spec(spacing=2.0), patch_size=(4, 4, 4), cache_dir=str(tmp_path / "c"))
    a = PatchLoader([case], **kw)
    b = PatchLoader([case], **kw)
    assert isinstance(b.entries[0].image, np.memmap)
    np.testing.assert_array_equal(a.entries[0].host_image(), b.entries[0].host_image())
    files = sorted(os.listdir(tmp_path / "c"))
    medproc.save(medproc.Volume(np.flip(lab, 0).copy(), np.eye(4)), case["label"])
    c = PatchLoader([case], **kw)
    assert len(os.listdir(tmp_path / "c")) == 2 * len(files)
    assert not np.array_equal(c.entries[0].host_label(), a.entries[0].host_label())


def test_decathlon_json_and_decollate(tmp_path):
    from monai.data import decollate_batch

    doc = {
        "training": [
            {
                "image": os.path.relpath(c["image"], tmp_path),
                "label": os.path.relpath(c["label"], tmp_path),
            }
            for c in datalist()
        ]
    }
    (tmp_path / "dataset.json").write_text(json.dumps(doc))
    loader = PatchLoader(str(tmp_path / "dataset.json"), medproc.Spec(spacing=3.0), (8, 8, 8))
    assert len(loader.cases) == 2
    batch = next(iter(loader))
    assert batch["image"].shape == (2, 1, 8, 8, 8)
    items = decollate_batch({"image": batch["image"], "label": batch["label"]})
    assert len(items) == 2 and items[0]["image"].shape == (1, 8, 8, 8)
    np.testing.assert_allclose(items[1]["image"].affine, batch["image"].affine[1])


def test_arguments_checked():
    with pytest.raises(ValueError, match="pos and neg"):
        PosNeg(pos=0, neg=0)
    with pytest.raises(ValueError, match="flip_prob"):
        Augment(flip_prob=1.5)
    with pytest.raises(ValueError, match="scale_range"):
        Augment(scale_range=(0.1, 0.2))
    with pytest.raises(ValueError, match="cache='gpu'"):
        PatchLoader(datalist(), SPEC, (8, 8, 8), cache="gpu")
    with pytest.raises(ValueError, match="square"):
        PatchLoader(datalist(), SPEC, (8, 6, 8), augment=Augment(rotate90_prob=0.5))
    with pytest.raises(TypeError, match="PosNeg"):
        PatchLoader(datalist(), SPEC, (8, 8, 8), sampling={"pos": 1})
    for n in (0, -2, 1.5, True):  # (0 gave batches of 1, silently)
        with pytest.raises(ValueError, match="batch_size must be a whole number >= 1"):
            PatchLoader(datalist(), SPEC, (8, 8, 8), batch_size=n)
    # (a NaN size raised numpy's "cannot convert float NaN", 100000 DALI's bad_alloc, and
    # num_threads=0 / prefetch=0 were taken as given)
    # (then a prober's: 10**20 and None were bare TypeErrors, num_threads=10**9 DALI's
    # bad_alloc at the first batch)
    for size in (float("nan"), (8, 8, float("inf")), (8, 8, 7.5), "8", (8, 8), None, True, 0):
        with pytest.raises(
            medproc.UsageError, match="patch_size must be (one number or three|wh|>)"
        ):
            PatchLoader(datalist(), SPEC, size)
    for size in (100000, 10**20, [2**64, 1, 1]):
        with pytest.raises(medproc.UsageError, match=r"patch_size \(\d+, \d+, \d+\) x batch_size"):
            PatchLoader(datalist(), SPEC, size)
    for name in ("num_threads", "prefetch"):
        for n in (0, -1, 2.0, True):
            with pytest.raises(ValueError, match=f"PatchLoader: {name} must be a whole number"):
                PatchLoader(datalist(), SPEC, (8, 8, 8), **{name: n})
    with pytest.raises(
        medproc.UsageError, match="num_threads must be a whole number from 1 to 1024"
    ):
        PatchLoader(datalist(), SPEC, (8, 8, 8), num_threads=10**9)
    loader = PatchLoader(datalist(), SPEC, np.array(8), num_threads=np.int64(1))
    assert loader.patch == (8, 8, 8) and loader._engine.num_threads == 1
    loader.close()


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"training": [', r"not valid JSON \(Expecting value: line 1 column 15"),
        ('{"validation": []}', 'not a decathlon datalist: .*"training"'),
        ('{"training": "a.nii"}', "not a decathlon datalist: .*must be a dict"),
        ("\udcff", "not a text file"),
        (None, "is a folder"),
        ('{"training": ' + "[" * 100000 + "]" * 100000 + "}", "its JSON is nested too deeply"),
    ],
)
def test_a_malformed_datalist_file_is_a_read_error_naming_it(tmp_path, text, says):
    """MONAI's reader raised JSONDecodeError "Expecting value: line 1 column 15" or TypeError
    "Every item in items must be a dict", naming no file."""
    path = tmp_path / "datalist.json"
    if text is None:
        path.mkdir()
    else:
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(medproc.ReadError, match=f"^{re.escape(str(path))}: {says}"):
        PatchLoader(str(path), SPEC, (8, 8, 8))


@pytest.mark.parametrize(
    "cases, says",
    [
        ([], "the datalist holds no case"),  # (was "0 cases cannot fill 1 shards")
        ([{"image": ""}], "case 0: 'image' is an empty path"),  # (MONAI: the file's folder)
        ([{"image": "a.nii.gz", "label": "  "}], "case 0: 'label' is an empty path"),
        ([{"image": "a.nii.gz", "label": 3}], r"case 0 \('.*a.nii.gz'\): 'label' must be a file"),
        # (a second prober's: "label": null was "has no 'label' but has 'label'")
        (
            [{"image": "a.nii.gz", "label": None}, {"image": "b", "lable": "c"}],
            "case 1 has no 'label' but has 'lable'",
        ),
    ],
)
def test_a_datalist_file_s_case_errors_name_the_file(tmp_path, cases, says, monkeypatch):
    path = tmp_path / "datalist.json"
    path.write_text(json.dumps({"training": cases}))
    with pytest.raises(medproc.UsageError, match=f"^PatchLoader: {re.escape(str(path))}: {says}"):
        PatchLoader(str(path), SPEC, (8, 8, 8))
    monkeypatch.chdir(tmp_path)  # (given relative, "" became "." unsaid: a review's)
    with pytest.raises(medproc.UsageError, match=f"^PatchLoader: datalist.json: {says}"):
        PatchLoader("datalist.json", SPEC, (8, 8, 8))


def test_a_detection_datalist_is_a_clear_error_naming_the_case(tmp_path):
    """MONAI's detection datalists hold box labels (a list) under "label": PatchLoader wants a
    label map's path there, and says so before reading anything."""
    cases = datalist()
    det = [{"image": c["image"], "box": [[0, 0, 0, 4, 4, 4]], "label": [0]} for c in cases]
    (tmp_path / "det.json").write_text(json.dumps({"training": det}))
    with pytest.raises(medproc.UsageError, match=r"case 0 .*'label' must be a file path, got list"):
        PatchLoader(str(tmp_path / "det.json"), SPEC, (8, 8, 8))
    with pytest.raises(medproc.UsageError, match="detection datalist.*'lesions'"):
        PatchLoader(det, SPEC, (8, 8, 8))
    with pytest.raises(medproc.UsageError, match=r"case 1 .*'image' must be a file path, got int"):
        PatchLoader([cases[0], {"image": 3}], SPEC, (8, 8, 8))
    with pytest.raises(medproc.UsageError, match="case 0 is a str"):
        PatchLoader(["a.nii.gz"], SPEC, (8, 8, 8))


def test_a_misspelt_label_key_or_a_wrong_lesions_value_is_said_before_reading(tmp_path):
    """{"image": ..., "lable": ...} gave all-zero labels without a word; "lesions" given as a
    path failed at the first batch in the loader's thread; a dict datalist was 'case 0 is a
    str'."""
    cases = datalist()
    typo = [{"image": c["image"], "lable": c["label"]} for c in cases]
    with pytest.raises(medproc.UsageError, match="case 0 has no 'label' but has 'lable'"):
        PatchLoader(typo, SPEC, (8, 8, 8))
    les = [{**c, "lesions": "lesions.csv"} for c in cases]
    with pytest.raises(medproc.UsageError, match="case 0: lesions must be a medproc"):
        PatchLoader(les, SPEC, (8, 8, 8))
    with pytest.raises(medproc.UsageError, match="the datalist is a dict"):
        PatchLoader(cases[0], SPEC, (8, 8, 8))
    with pytest.warns(medproc.MedprocWarning, match="1 of 2 cases have no 'label'"):
        PatchLoader([cases[0], {"image": cases[1]["image"]}], SPEC, (8, 8, 8)).close()


def _engine_threads() -> int:
    import threading

    return sum(t.name == "medproc-engine" and t.is_alive() for t in threading.enumerate())


def test_runs_ahead_across_epochs_and_keeps_each_epoch_whole(tmp_path, monkeypatch):
    """The engine's thread goes on into the next epoch while the loop finishes this one (no
    refill wait at each epoch), yet every epoch is ``len(loader)`` batches with each volume
    ``num_samples`` times; an epoch left early is dropped, not carried into the next; a
    loader no longer used stops its thread."""
    import gc
    import time

    dl = [
        _synthetic(tmp_path, name=f"c{n}", shape=(12, 12, 12), fg_box=(3, 8))[0] for n in range(3)
    ]
    before = _engine_threads()
    loader = PatchLoader(
        dl, medproc.Spec(), (4, 4, 4), batch_size=2, sampling=PosNeg(num_samples=2), prefetch=2
    )
    assert len(loader) == 3
    for _epoch in range(3):
        cases = [c["image"] for b in loader for c in b["case"]]
        assert len(cases) == 6 and all(cases.count(c["image"]) == 2 for c in dl)
    deadline = time.monotonic() + 10
    while loader.batches_made <= 3 * 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    # the 4th epoch's first batches, made ahead: the queue's 2, one waiting to go in, one fed
    assert 3 * 3 < loader.batches_made <= 3 * 3 + 2 + 2
    orders = []  # each epoch's drawn order, as the engine's thread draws it
    real = PatchLoader._epoch_order

    def spy(self):
        orders.append(real(self))
        return orders[-1]

    monkeypatch.setattr(PatchLoader, "_epoch_order", spy)  # on the class: no cycle
    stale = iter(loader)
    first = next(stale)  # left early...
    assert len(first["case"]) == 2
    drawn = len(orders)
    cases = [c["image"] for b in loader for c in b["case"]]  # ...so this epoch is afresh:
    fresh = [loader.entries[v].case["image"] for batch in orders[drawn] for v in batch]
    assert cases == fresh  # the order drawn after the break, none of the left one
    assert len(cases) == 6 and all(cases.count(c["image"]) == 2 for c in dl)
    with pytest.raises(RuntimeError, match="newer one"):
        next(stale)
    done = iter(loader)  # an iterator at the end of its epoch takes nothing from the next
    assert len([next(done) for _ in range(len(loader))]) == 3
    assert sum(1 for _ in loader) == 3
    with pytest.raises(RuntimeError, match="newer one"):
        next(done)
    assert _engine_threads() == before + 1
    for i, _batch in enumerate(loader):  # close() in the loop ends the epoch quietly
        if i == 0:
            loader.close()
    assert i == 0 and _engine_threads() == before  # close() stopped the thread
    assert sum(1 for _ in loader) == 3  # and iterating again starts it anew
    del loader, first, stale, done, _batch
    gc.collect()
    deadline = time.monotonic() + 10
    while _engine_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _engine_threads() == before


def test_a_datalist_with_boxes_but_no_lesions_is_said(tmp_path):
    """'box' is a detection datalist's: PatchLoader reads lesions from 'lesions' only, and
    says so instead of training on patches without them."""
    cases = [{**c, "box": [[0, 0, 0, 4, 4, 4]]} for c in datalist()]
    with pytest.warns(medproc.MedprocWarning, match="2 case.*hold 'box'.*'lesions'"):
        PatchLoader(cases, SPEC, (8, 8, 8))


def test_bad_sampling_and_augmentation_values_are_refused_at_construction():
    """inf/NaN ranges failed at the first batch with numpy's OverflowError naming nothing;
    PosNeg(pos=nan) gave background-only patches; patch_size=16 was a TypeError and 16.5 was
    cut to 16."""
    with pytest.raises(ValueError, match="Augment.range_x must be finite"):
        Augment(affine_prob=1, range_x=float("inf"))
    with pytest.raises(ValueError, match="Augment.intensity_factors must be finite"):
        Augment(scale_intensity_prob=1, intensity_factors=float("nan"))
    with pytest.raises(ValueError, match="PosNeg: pos and neg must be finite"):
        PosNeg(pos=float("nan"))
    with pytest.raises(ValueError, match="patch_size must be whole numbers of voxels"):
        PatchLoader(datalist(), SPEC, (16.5, 16, 16))
    loader = PatchLoader(datalist(), SPEC, 8)  # one int: a cube, as MONAI's spatial_size
    assert loader.patch == (8, 8, 8)
    loader.close()


def test_closing_the_loader_from_another_thread_mid_epoch_is_an_error_not_a_short_epoch():
    """close() from another thread ended the loop normally after 3 of 100 batches: a truncated
    epoch looked complete."""
    import threading

    loader = PatchLoader(datalist(), SPEC, (8, 8, 8), 1, device="cpu")
    it = iter(loader)
    next(it)
    threading.Thread(target=loader.close).start()
    time.sleep(0.5)
    with pytest.raises(RuntimeError, match=f"closed during the epoch, after 1 of {len(loader)}"):
        for _ in it:
            pass
    assert len(list(loader)) == len(loader)  # iterating again starts anew
    loader.close()


def test_a_case_listed_twice_is_cached_once_and_drawn_twice():
    """Oversampling by listing a case twice failed: 'the cache entry of ... was not written'
    (the second build found the first one's temporary gone)."""
    loader = PatchLoader(datalist() * 2, SPEC, (8, 8, 8), 1, device="cpu")
    batches = list(loader)
    assert len(batches) == 4
    drawn = sorted(str(b["case"][0]["image"]) for b in batches)
    assert drawn == sorted(str(c["image"]) for c in datalist() * 2)
    loader.close()


def test_a_second_thread_is_refused_while_the_first_waits_for_a_batch(monkeypatch):
    """Two threads iterating one loader both failed, one with a bare 'generator already
    executing' (a prober's script), and so did close() from another thread while the loop
    waited for a batch. A second thread's iteration is now refused, naming the rule, and the
    first thread's epoch goes on whole; close() from another thread then ends the waiting
    loop with the truncated-epoch error."""
    import threading

    gate = threading.Event()
    real = PatchLoader._item

    def held(self, indices):  # (the engine's thread waits here: the loop waits for a batch)
        gate.wait(120)  # (longer than the wait below: the loop is seen waiting, or fails)
        return real(self, indices)

    monkeypatch.setattr(PatchLoader, "_item", held)
    loader = PatchLoader(datalist(), SPEC, (8, 8, 8), 1, device="cpu")
    for closing in (False, True):
        gate.clear()
        got = []

        def loop(got=got):
            try:
                got.append(sum(1 for _ in loader))
            except RuntimeError as e:
                got.append(str(e))

        first = threading.Thread(target=loop)
        first.start()
        deadline = time.monotonic() + 60  # (10, then 30 s were once too short on a loaded box)
        while not (loader._feed is not None and loader._feed.gi_running):
            assert time.monotonic() < deadline, "the loop never waited for a batch"
            time.sleep(0.01)
        if closing:
            loader.close()
        else:
            with pytest.raises(RuntimeError, match="another thread is iterating this loader"):
                next(iter(loader))
        gate.set()
        first.join(30)
        if closing:
            # (after 0 or 1 batches: the engine may have made the epoch's first ahead)
            assert got and re.search(r"closed during the epoch, after [01] of", str(got[0]))
        else:
            assert got == [len(loader)]
    assert sum(1 for _ in loader) == len(loader)  # iterating again starts anew
    loader.close()


def test_a_second_thread_is_refused_while_the_first_is_in_its_loop_body():
    """The refusal held only while the first thread waited inside the loader; a training
    step between batches let a second thread in, and the first then failed (review). The
    thread in an epoch owns it until the epoch ends or is left."""
    import threading

    loader = PatchLoader(datalist(), SPEC, (8, 8, 8), 1, device="cpu")
    inside, go, got = threading.Event(), threading.Event(), []

    def loop():
        for n, _ in enumerate(loader):
            if n == 0:
                inside.set()
                go.wait(30)  # (a training step)
        got.append(n + 1)

    first = threading.Thread(target=loop)
    first.start()
    assert inside.wait(30)
    with pytest.raises(RuntimeError, match="another thread is iterating this loader"):
        next(iter(loader))
    go.set()
    first.join(30)
    assert got == [len(loader)]
    stale = iter(loader)  # an epoch left in this thread...
    next(stale)
    del stale  # ...frees the loader for another thread
    other = []
    t = threading.Thread(target=lambda: other.append(sum(1 for _ in loader)))
    t.start()
    t.join(30)
    assert other == [len(loader)]
    loader.close()
