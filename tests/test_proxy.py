"""The proxy layer: DataLoader workers plan and map lesions, one pipeline resamples.

Both routes run the same assertions: the engine route (default; workers hand voxels over in
shared memory, the engine finishes batches in a background thread) on the CPU (CI) and the GPU,
and DALI Proxy's DALIServer on the GPU (-m gpu, H200). Batches are (B, C, i, j, k), as MONAI
collates images.
"""

import numpy as np
import pytest
import torch
from test_annotations import oblique_case

import medproc
from medproc.pipeline import Engine, Graph, Job
from medproc.plan import affine_map, flip_map
from medproc.proxy import ProxyServer, ProxyTransform

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _case(i):
    """Sample i: (i, j, k) = 50 columns, 60 rows, 30 + i slices (a different input per sample)."""
    return oblique_case(shape=(50, 60, 30 + i))


class CaseDataset(torch.utils.data.Dataset):
    """What a user's dataset looks like: Python reads/parses, the transform comes last."""

    def __init__(self, n, transform):
        self.n, self.transform = n, transform

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img, lab, lesions = _case(i)
        return self.transform({"image": img, "label": lab, "lesions": lesions, "index": i})


def augment(plan, rng):
    # a flip of i and a rotation about i (voxel axes (i, j, k) = 0, 1, 2)
    return flip_map(plan.out_shape, [0]) @ affine_map(
        plan.out_shape, [1.5] * 3, rotate_deg=(10, 0, 0)
    )


def _reference(src, src_lab, plan):
    """This sample resampled directly with its plan (the whole input, the engine on the CPU):
    ``(image, label)`` indexed (i, j, k)."""
    ((img, lab),) = Engine("cpu", batch_size=1).run(
        [Job(src.array, plan, (src_lab.array,))], Graph(labels=1, interp="linear")
    )
    return img, lab


ROUTES = [
    ("cpu", "engine", 0, "auto"),
    ("cpu", "engine", 2, "server"),
    ("cpu", "engine", 2, "workers"),
    pytest.param("gpu", "engine", 0, "auto", marks=pytest.mark.gpu),
    pytest.param("gpu", "engine", 8, "auto", marks=pytest.mark.gpu),
    pytest.param("gpu", "dali-proxy", 0, "auto", marks=pytest.mark.gpu),
    pytest.param("gpu", "dali-proxy", 8, "auto", marks=pytest.mark.gpu),
]
#: where the CPU's loaders with workers resample: one pipeline here, or one per worker
WHERE = ["server", "workers"]


@pytest.mark.parametrize(("device", "route", "workers", "where"), ROUTES)
def test_proxy_batches_in_order_with_lesions_on_lesions(device, route, workers, where):
    spec = medproc.Spec(spacing=1.5, orientation="RAS", crop=(48, 56, 40))
    kw = {"route": route, "resample_in": where}
    with ProxyServer(
        spec, device=device, batch_size=3, with_label=True, augment=augment, **kw
    ) as server:
        assert server.uses_dali_proxy == (route == "dali-proxy")
        ds = CaseDataset(7, server.transform)
        seen = []
        for batch in server.loader(ds, batch_size=3, num_workers=workers):
            n = len(batch["index"])
            assert batch["image"].shape == (n, 1, 48, 56, 40)  # (B, C, i, j, k) = spec.crop
            assert (
                batch["label"].shape == (n, 1, 48, 56, 40) and batch["label"].dtype == torch.uint8
            )
            assert batch["image"].device.type == ("cuda" if device == "gpu" else "cpu")
            assert batch["affine"].shape == (n, 4, 4) and batch["affine"].dtype == torch.float64
            for s in range(n):
                i = int(batch["index"][s])
                seen.append(i)
                lab = batch["label"][s, 0].cpu().numpy()
                img = batch["image"][s, 0].cpu().numpy()
                # same voxels as resampling this sample directly with its plan
                src, src_lab, lesions = _case(i)
                base = medproc.make_plan(src.shape, src.affine, spec)
                plan = base.augmented(augment(base, None))
                assert plan.out_shape == (48, 56, 40)
                np.testing.assert_allclose(batch["affine"][s].numpy(), plan.out_affine)
                ref_img, ref_lab = _reference(src, src_lab, plan)
                assert ref_img.shape == img.shape and ref_lab.shape == lab.shape
                assert np.abs(img - ref_img).max() <= 1e-3 * np.abs(ref_img).max()
                assert (lab == ref_lab).mean() >= 0.999
                assert set(np.unique(lab).tolist()) <= {0, 1, 2}  # label values, nothing else
                assert len(batch["lesions"][s]) == 2
                for k, les in enumerate(batch["lesions"][s], 1):
                    assert les["inside"]
                    centroid = np.argwhere(lab == k).mean(0)  # (i, j, k)
                    assert np.abs(np.array(les["center_voxel"]) - centroid).max() <= 0.5
                    # affine @ center_voxel is the lesion's (moved) world centre
                    world = batch["affine"][s].numpy() @ np.array([*les["center_voxel"], 1.0])
                    np.testing.assert_allclose(world[:3], les["center_world_ras"], atol=1e-3)
                    # and the lesion is bright in the image there
                    assert img[tuple(np.round(les["center_voxel"]).astype(int))] > 0
        assert seen == list(range(7))  # every sample, in order


@pytest.mark.parametrize("device", DEVICES)
def test_proxy_applies_the_spec_intensity(device):
    spec = medproc.Spec(
        spacing=1.5,
        orientation="RAS",
        crop=(48, 56, 40),
        intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)),
    )
    with ProxyServer(spec, device=device, batch_size=2, with_label=True) as server:
        ds = CaseDataset(3, server.transform)
        n = 0
        for batch in server.loader(ds, batch_size=2, num_workers=0):
            for s in range(len(batch["index"])):
                i = int(batch["index"][s])
                img = batch["image"][s, 0].cpu().numpy()
                assert img.min() >= 0 and img.max() <= 1 and img.max() > 0.5
                src, src_lab, _ = _case(i)
                plan = medproc.make_plan(src.shape, src.affine, spec)
                assert plan.intensity is not None
                ref_img, ref_lab = _reference(src, src_lab, plan)
                assert np.abs(img - ref_img).max() <= 1e-3 * np.abs(ref_img).max()  # as above
                lab = batch["label"][s, 0].cpu().numpy()  # labels get no intensity step
                assert (lab == ref_lab).mean() >= 0.999 and set(np.unique(lab).tolist()) == {
                    0,
                    1,
                    2,
                }
                n += 1
        assert n == 3


def test_dali_proxy_route_needs_a_fixed_output_size():
    with pytest.raises(ValueError, match="fixed output size"):
        ProxyServer(medproc.Spec(spacing=1.5), route="dali-proxy")


@pytest.mark.parametrize("device", DEVICES)
def test_whole_volumes_of_different_sizes_come_back_as_lists(device):
    """Detection/inference: whole volumes resampled to 1.5 mm + intensity, sizes differ."""
    spec = medproc.Spec(
        spacing=1.5, orientation="RAS", intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1))
    )
    with ProxyServer(spec, device=device, batch_size=2, with_label=True) as server:
        ds = CaseDataset(4, server.transform)
        seen = []
        for batch in server.loader(ds, batch_size=2, num_workers=2):
            assert isinstance(batch["image"], list)
            for s, img in enumerate(batch["image"]):
                i = int(batch["index"][s])
                seen.append(i)
                src, src_lab, _ = _case(i)
                plan = medproc.make_plan(src.shape, src.affine, spec)
                assert tuple(img.shape) == (1, *plan.out_shape)
                ref_img, ref_lab = _reference(src, src_lab, plan)
                got = img[0].cpu().numpy()
                assert np.abs(got - ref_img).max() <= 1e-3
                assert (batch["label"][s][0].cpu().numpy() == ref_lab).mean() >= 0.999
        assert seen == [0, 1, 2, 3]


def test_boxes_come_in_monai_detection_format():
    from monai.data.box_utils import convert_box_mode

    spec = medproc.Spec(spacing=1.5, orientation="RAS", crop=(48, 56, 40))
    with ProxyServer(spec, device="cpu", batch_size=2, with_label=True, augment=augment) as server:
        batch = next(iter(server.loader(CaseDataset(2, server.transform), batch_size=2)))
    for s in range(2):
        boxes, world = batch["boxes"][s], batch["boxes_world"][s]
        assert boxes.shape == (2, 6) and batch["box_labels"][s].shape == (2,)
        ccc = convert_box_mode(boxes, src_mode="xyzxyz", dst_mode="cccwhd")
        lab = batch["label"][s, 0].numpy()
        for k, les in enumerate(batch["lesions"][s], 1):
            np.testing.assert_allclose(ccc[k - 1, :3].numpy(), les["center_voxel"], atol=1e-3)
            # the label's voxels of this lesion lie inside its box (half a voxel of slack)
            pts = np.argwhere(lab == k)
            assert (pts >= boxes[k - 1, :3].numpy() - 0.5).all()
            assert (pts <= boxes[k - 1, 3:].numpy() + 0.5).all()
            wc = convert_box_mode(world, src_mode="xyzxyz", dst_mode="cccwhd")[k - 1, :3]
            np.testing.assert_allclose(wc.numpy(), les["center_world_ras"], atol=1e-3)


class _FarLesion(CaseDataset):
    """The cases with a third lesion 20 cm above the first, off every grid."""

    def __getitem__(self, i):
        from medproc.annotations import Lesions

        img, lab, les = _case(i)
        far = les.centers[0] + [0.0, 0.0, 200.0]
        les = Lesions(np.r_[les.centers, [far]], np.r_[les.sizes, [[5.0] * 3]])
        return self.transform({"image": img, "label": lab, "lesions": les, "index": i})


def _boxes_on_crop(crop):
    """Check one crop (see the test below); returns how many boxes it clipped and removed."""
    from medproc.annotations.boxes import lesion_boxes

    spec = medproc.Spec(spacing=1.5, orientation="RAS", crop=crop)
    with ProxyServer(spec, device="cpu", batch_size=2, with_label=True, augment=augment) as server:
        batch = next(iter(server.loader(_FarLesion(2, server.transform), batch_size=2)))
    ext = np.asarray(crop) - 0.5
    seen = {"clipped": 0, "removed": 0}
    for s in range(2):
        lesions, lab = batch["lesions"][s], batch["label"][s, 0].numpy()
        boxes, kept = batch["boxes"][s].numpy(), batch["box_lesion"][s].numpy()
        assert len(lesions) == 3 and boxes.shape == (len(kept), 6)
        assert batch["box_labels"][s].shape == batch["boxes_world"][s].shape[:1] == kept.shape
        whole, _, _ = lesion_boxes(lesions)  # every lesion, unclipped
        for k in range(len(lesions)):
            pts = np.argwhere(lab == k + 1)
            if k not in kept:
                assert len(pts) == 0, (k, len(pts))  # no lesion on the crop lost its box
                lo, hi = np.maximum(whole[k, :3], -0.5), np.minimum(whole[k, 3:], ext)
                assert np.any(np.ceil(lo) > np.floor(hi))  # it holds no voxel centre
                seen["removed"] += 1
                continue
            b = boxes[list(kept).index(k)]
            np.testing.assert_allclose(b[:3], np.maximum(whole[k, :3], -0.5), atol=1e-4)
            np.testing.assert_allclose(b[3:], np.minimum(whole[k, 3:], ext), atol=1e-4)
            assert (b[:3] >= -0.5 - 1e-6).all() and (b[3:] <= ext + 1e-6).all()
            assert (pts >= b[:3] - 0.5).all() and (pts <= b[3:] + 0.5).all()
            seen["clipped"] += bool(np.any(b != whole[k]))
    return seen


def test_boxes_are_the_ground_truth_on_the_crop_clipped_to_it():
    """Crops that cut lesions or leave them out: ``boxes`` hold what lies on the output grid,
    clipped to its extent (see test_clip_boxes_against_monai); every lesion with
    label voxels in the output keeps its box; ``lesions`` keeps all of them. The crops clip
    and remove some boxes (so this cannot pass by doing neither)."""
    seen = [_boxes_on_crop(c) for c in [(20, 20, 20), (30, 36, 16), (12, 48, 40), (2, 2, 2)]]
    assert sum(x["clipped"] for x in seen) > 0 and sum(x["removed"] for x in seen) > 0, seen


class _Crashing(CaseDataset):
    def __getitem__(self, i):
        import os

        if i == 3:
            os._exit(3)  # a worker dies (segfault, OOM kill...)
        return super().__getitem__(i)


def test_workers_are_forked_whatever_python_s_default_and_another_context_is_refused():
    """The transfer arena is shared with forked workers: spawn/forkserver (Python 3.14's
    default) failed with "cannot pickle 'mmap.mmap' object"."""
    import multiprocessing as mp

    with ProxyServer(medproc.Spec(spacing=1.5, crop=(8, 8, 8)), device="cpu") as server:
        ds = CaseDataset(2, server.transform)
        for ctx in ("spawn", mp.get_context("forkserver")):
            with pytest.raises(ValueError, match="proxy's workers must be forked"):
                server.loader(ds, batch_size=1, num_workers=2, multiprocessing_context=ctx)
        loader = server.loader(ds, batch_size=1, num_workers=2)  # unset: fork
        assert loader.loader.multiprocessing_context.get_start_method() == "fork"
        assert len(list(loader)) == 2


def test_a_worker_crash_is_a_clear_error_not_a_hang():
    import time

    server = ProxyServer(medproc.Spec(spacing=1.5, crop=(8, 8, 8)), device="cpu")
    t = time.perf_counter()
    with pytest.raises(RuntimeError, match="(?i)worker"):
        for _ in server.loader(_Crashing(6, server.transform), batch_size=1, num_workers=2):
            pass
    assert time.perf_counter() - t < 60


def test_the_transfer_arena_hands_boxes_over_without_copies_and_recycles_pieces():
    from medproc._proxy_arena import Arena

    region = np.asfortranarray(np.arange(20 * 30 * 10, dtype=np.int16).reshape(20, 30, 10))
    arena = Arena(nbytes=2 * region.nbytes + 4096, entries=3, pin=False)
    a = arena.put(region[2:18, 3:29, 1:9])
    b = arena.put(region)
    assert a is not None and b is not None
    assert arena.put(region) is None  # no gap of its size left: the caller falls back
    np.testing.assert_array_equal(arena.tensor(a).numpy(), region[2:18, 3:29, 1:9])
    np.testing.assert_array_equal(arena.tensor(b).numpy(), region)
    t = arena.tensor(b)
    assert tuple(t.shape) == region.shape and t.permute(2, 1, 0).is_contiguous()  # DALI's layout
    arena.release(a)
    c = arena.put(region[:10])  # fits the gap a left
    assert c is not None and c.offset == a.offset
    np.testing.assert_array_equal(arena.tensor(c).numpy(), region[:10])
    np.testing.assert_array_equal(arena.tensor(b).numpy(), region)  # b untouched
    assert arena.put(np.zeros((100, 100, 10), np.int16)) is None  # bigger than the arena
    d = arena.put(region[:1, :1, :1])  # the last entry
    assert d is not None and arena.put(region[:1, :1, :1]) is None  # every entry taken
    for s in (b, c, d):
        arena.release(s)
    assert arena.put(region) is not None and arena.put(region) is not None  # all free again


def test_arena_pieces_never_overlap_under_random_takes_and_releases():
    from medproc._proxy_arena import Arena

    rng = np.random.default_rng(0)
    arena = Arena(nbytes=1 << 20, entries=16, pin=False)
    live = {}
    for step in range(400):
        if live and rng.random() < 0.45:
            k = list(live)[int(rng.integers(len(live)))]
            slot, arr = live.pop(k)
            np.testing.assert_array_equal(arena.tensor(slot).numpy(), arr)  # intact
            arena.release(slot)
            continue
        arr = rng.integers(0, 1000, tuple(rng.integers(1, 40, 3)), dtype=np.int16)
        slot = arena.put(np.asfortranarray(arr))
        if slot is not None:
            live[step] = (slot, arr)
    spans = sorted((s.offset, s.offset + a.nbytes) for s, a in live.values())
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))


class MaskDataset(torch.utils.data.Dataset):
    """One image with a DICOM SEG or RTSTRUCT mask as its label, read in the worker."""

    def __init__(self, n, transform, read):
        self.n, self.transform, self.read = n, transform, read

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img, lab = self.read()
        return self.transform({"image": img, "label": lab, "index": i})


def _seg():
    from pydicom.data import get_testdata_file

    from medproc.annotations import read_seg

    path = get_testdata_file("liver.dcm")
    seg = read_seg(path)
    img = medproc.Volume(seg.array.astype(np.float32) * 100, seg.affine)
    return img, seg


@pytest.mark.parametrize("kind", ["seg", "rtstruct"])
def test_dicom_seg_and_rtstruct_masks_go_through_the_proxy_exactly(kind, tmp_path, quiet):
    """Label maps read from DICOM SEG and RTSTRUCT, through the proxy's workers and its
    resample + crop + flip + rotation: the same voxels as an independent nearest-neighbour
    resampling of the mask (scipy) with the sample's plan."""
    import functools

    from scipy import ndimage
    from test_annotations import rtstruct_case

    from medproc.annotations import read_rtstruct

    if kind == "seg":
        read = _seg
    else:
        p, vol, _ = rtstruct_case(tmp_path)
        read = functools.partial(lambda p, v: (v, read_rtstruct(p, v, roi="gtv")), p, vol)
    img, mask = read()
    values = set(np.unique(mask.array).tolist())
    assert len(values) == 2 and mask.array.any()
    spec = medproc.Spec(spacing=1.5, orientation="RAS", crop=(40, 40, 16))
    with ProxyServer(spec, device="cpu", batch_size=2, with_label=True, augment=augment) as server:
        plan = server.transform.plan({"image": img})
        ref = ndimage.affine_transform(
            mask.array, plan.matrix[:3, :3], plan.matrix[:3, 3], plan.out_shape, order=0
        )
        # compare where the sample point lies a voxel inside the input: at its edges the
        # conventions for "outside" differ (DALI: beyond the voxel's half; scipy: beyond its
        # centre), and a SEG of 3 slices is mostly edge
        grid = np.indices(plan.out_shape).reshape(3, -1)
        src = plan.matrix[:3, :3] @ grid + plan.matrix[:3, 3:4]
        hi = np.array(mask.shape)[:, None] - 1.5
        inside = ((src >= 0.5) & (src <= hi)).all(0).reshape(plan.out_shape)
        assert ref[inside].sum() > 100  # the crop holds the mask
        n = 0
        for batch in server.loader(
            MaskDataset(4, server.transform, read), batch_size=2, num_workers=2
        ):
            for s in range(batch["label"].shape[0]):
                lab = batch["label"][s, 0].numpy()
                assert set(np.unique(lab).tolist()) <= values  # mask values, nothing else
                assert (lab == ref)[inside].mean() >= 0.995  # nearest-neighbour ties aside
                n += 1
        assert n == 4


@pytest.mark.parametrize("shift", ["shape", "affine"])
def test_a_label_off_the_image_grid_is_refused_naming_it(shift):
    """A label cut short or moved 10 mm would be resampled with the image's plan and land off
    its lesions: refused, as medproc.resample refuses it."""
    img, lab, _ = _case(0)
    if shift == "shape":
        lab = medproc.Volume(lab.array[:20], lab.affine, {"source": "lab.nii.gz"})
    else:
        moved = lab.affine.copy()
        moved[0, 3] += 10
        lab = medproc.Volume(lab.array, moved, {"source": "lab.nii.gz"})
    with ProxyServer(medproc.Spec(spacing=2.0), device="cpu", batch_size=1, with_label=True) as s:
        with pytest.raises(medproc.errors.UsageError, match="lab.nii.gz is not on the grid"):
            s.transform({"image": img, "label": lab})


def test_server_arguments_are_checked_when_made():
    """ProxyServer(None) raised AttributeError 'antialias', batch_size=0 was accepted, and a
    loader batch larger than the server's came back as DALI's external-source error."""
    with pytest.raises(medproc.UsageError, match="spec must be a medproc.Spec"):
        ProxyServer(None, device="cpu")
    with pytest.raises(medproc.UsageError, match="batch_size must be a whole number >= 1"):
        ProxyServer(medproc.Spec(spacing=2.0), device="cpu", batch_size=0)
    with ProxyServer(medproc.Spec(spacing=2.0), device="cpu", batch_size=2) as server:
        with pytest.raises(
            ValueError,
            match="batch_size must be a whole number from 1 to the server's batch_size 2, got 5",
        ):
            server.loader([], batch_size=5)
        # (None, the loader's own default, was refused as "got None")
        loader = server.loader(CaseDataset(2, server.transform))
        assert [len(b["image"]) for b in loader] == [2]


def random_rotation(plan, rng):
    return affine_map(plan.out_shape, [1.5] * 3, rotate_deg=(rng.uniform(-20, 20), 0, 0))


def test_workers_that_are_not_persistent_draw_new_augmentations_every_epoch():
    """Each epoch's workers are new processes: seeded from PyTorch's per-epoch worker seed,
    they draw new augmentations (not the last epoch's again), reproducibly under
    torch.manual_seed."""
    spec = medproc.Spec(spacing=1.5, orientation="RAS", crop=(24, 28, 20))
    with ProxyServer(spec, device="cpu", batch_size=2, augment=random_rotation) as server:

        def epoch():
            loader = server.loader(
                CaseDataset(4, server.transform),
                batch_size=2,
                num_workers=2,
                persistent_workers=False,
            )
            return torch.cat([b["image"] for b in loader])

        torch.manual_seed(0)
        first, second = epoch(), epoch()
        torch.manual_seed(0)
        again = epoch()
    assert not torch.equal(first, second)
    assert torch.equal(first, again)


def test_clip_boxes_against_monai():
    """clip_boxes against MONAI's clip_boxes_to_image (ClipBoxToImaged's function): with voxel
    i covering [i - 0.5, i + 0.5], MONAI's 0..n frame is ours shifted by half a voxel; the two
    agree on every box at least one voxel wide after clipping, and ours keeps exactly the boxes
    that hold a voxel centre (computed here by enumerating the grid's centres)."""
    from monai.data.box_utils import clip_boxes_to_image

    from medproc.annotations.boxes import clip_boxes

    shape = (10, 12, 8)
    rng = np.random.default_rng(5)
    lo = rng.uniform(-6, 14, (400, 3))
    boxes = np.c_[lo, lo + rng.uniform(0.1, 6, (400, 3))].astype(np.float32)
    boxes[:4] = [[2, 2, 2, 2.6, 2.6, 2.6], [-3, 1, 1, -0.2, 3, 3], [-1, 1, 1, 0.4, 3, 3],
                 [8.2, 10.1, 6.8, 9.9, 11.8, 7.9]]  # fmt: skip
    kept, ours = clip_boxes(boxes, shape)
    centres = np.stack(np.meshgrid(*map(np.arange, shape), indexing="ij"), -1).reshape(-1, 3)
    holds = [bool(np.any(np.all((c >= b[:3]) & (c <= b[3:]), axis=1)))
             for b in boxes for c in [centres]]  # fmt: skip
    assert list(kept) == list(np.flatnonzero(holds))
    assert {0, 2, 3} <= set(kept.tolist()) and 1 not in kept  # ([-3, -0.2]: no centre)
    theirs, keep = clip_boxes_to_image(boxes + 0.5, shape, remove_empty=True)
    wide = np.all(ours[:, 3:] - ours[:, :3] >= 1, axis=1)
    by_index = dict(zip(np.flatnonzero(np.asarray(keep)).tolist(), np.asarray(theirs) - 0.5))
    assert wide.sum() > 20
    for n, b in zip(kept[wide], ours[wide]):
        np.testing.assert_allclose(by_index[int(n)], b, atol=1e-5)


def test_proxy_arguments_of_another_type_are_refused_naming_them():
    """with_label="yes" failed as int('yes'); seed="x", num_threads=0 and box_mode="foo" were
    accepted."""
    spec = medproc.Spec(spacing=2.0)
    for kw, said in (
        (dict(with_label="yes"), "with_label must be True or False, got 'yes'"),
        (dict(seed="x"), "seed must be a whole number, got 'x'"),
        (dict(num_threads=0), "num_threads must be a whole number from 1 to 1024 .*, got 0"),
    ):
        with pytest.raises(medproc.UsageError, match=said):
            ProxyServer(spec, device="cpu", **kw)
    with pytest.raises(ValueError, match="box_mode must be in"):
        ProxyTransform(spec, box_mode="foo")
    ProxyTransform(spec, seed=np.int64(3))  # (a numpy integer is a whole number)


def test_an_arena_larger_than_the_memory_is_refused_naming_it():
    """ProxyServer(arena_gb=1e6) failed at loader() with a bare ENOMEM."""
    spec = medproc.Spec(spacing=2.0, crop=(8, 8, 8))
    with ProxyServer(spec, device="cpu", arena_gb=1e6, resample_in="server") as s:
        with pytest.raises(ValueError, match="arena_gb must be > 0 and at most the host's memory"):
            s.loader(CaseDataset(2, s.transform), batch_size=1, num_workers=2)


class ValuedDataset(CaseDataset):
    """Sample i: a 20^3 volume of the value ``scale * (i + 1)`` and a box label."""

    def __init__(self, n, transform, scale):
        super().__init__(n, transform)
        self.scale = scale

    def __getitem__(self, i):
        img = medproc.Volume(np.full((20, 20, 20), self.scale * (i + 1), np.float32), np.eye(4))
        lab = np.zeros((20, 20, 20), np.uint8)
        lab[5:15, 5:15, 5:15] = 1
        return self.transform({"image": img, "label": medproc.Volume(lab, np.eye(4))})


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("persistent", [True, False])
def test_train_and_val_loaders_of_one_server_each_get_their_own_samples(persistent, where):
    """A train and a val loader made from one server (with workers, before either is
    iterated; then an inline one): each loader's workers wrote into the arena of the loader
    made last, and the train batches came out zeros, without an error; an inline loader made
    after one with workers failed with an AttributeError. Every batch now holds its own
    samples' values and labels, over two epochs of each."""
    spec = medproc.Spec(spacing=2.0, crop=(8, 8, 8))
    server = ProxyServer(spec, device="cpu", batch_size=2, with_label=True, resample_in=where)
    with server:
        kw = {"batch_size": 2, "num_workers": 2, "persistent_workers": persistent}
        train = server.loader(ValuedDataset(4, server.transform, 1.0), **kw)
        val = server.loader(ValuedDataset(4, server.transform, 100.0), **kw)
        inline = server.loader(ValuedDataset(2, server.transform, 7.0), batch_size=2)
        for loader, scale in ((train, 1.0), (val, 100.0), (inline, 7.0)) * 2:
            got = [b for b in loader]
            values = torch.cat([b["image"].mean(dim=(1, 2, 3, 4)) for b in got])
            n = len(values)
            np.testing.assert_allclose(values.numpy(), scale * np.arange(1, n + 1), rtol=1e-6)
            assert all(int(b["label"].sum()) == 2 * 125 for b in got)  # 5^3 voxels each


@pytest.mark.parametrize(
    ("device", "workers"), [("cpu", 2), pytest.param("gpu", 2, marks=pytest.mark.gpu)]
)
def test_the_proxy_example_runs_on_the_sample_data_with_lesions_on_their_labels(
    device, workers, capsys
):
    """examples/proxy_loader.py (the user guide's proxy, runnable): every batch has its fixed
    size, and every lesion inside the output lies on a voxel of its label map."""
    import os
    import re
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
    import proxy_loader

    assert proxy_loader.main(["--device", device, "--workers", str(workers)]) == 0
    lines = [s for s in capsys.readouterr().out.splitlines() if s.startswith("epoch")]
    assert len(lines) == 4  # 2 epochs of the 2 sample cases
    for line in lines:
        assert "batch (2, 1, 128, 128, 80) torch.float32, 2 lesion(s)" in line
        on = [int(x) for x in re.findall(r"\d+", line.split("inside:")[1])]
        assert len(on) == 2 and 0 not in on, line


class FailingDataset(ValuedDataset):
    def __getitem__(self, i):
        if i == 3:
            raise OSError("disk gone")
        return super().__getitem__(i)


@pytest.mark.parametrize("where", WHERE)
def test_a_failed_epoch_with_workers_leaves_no_workers_behind(where):
    """A dataset error in a worker reached the loop, as it should, but the failed loader's
    persistent workers lived on until the garbage collector took their iterator, at times in
    a later loader's forked worker, which then printed 'AssertionError: can only test a child
    process' tracebacks (a prober's script). They now end with the failed epoch; the next
    loader works."""
    import multiprocessing

    def children():  # (an earlier test's workers may end meanwhile: only new ones count)
        return {p.pid for p in multiprocessing.active_children()}

    import gc

    gc.collect()  # (an earlier test's loaders, held in cycles, let their workers go now)
    before = children()
    spec = medproc.Spec(spacing=2.0, crop=(8, 8, 8))
    server = ProxyServer(spec, device="cpu", batch_size=2, with_label=True, resample_in=where)
    with server:
        failing = server.loader(FailingDataset(6, server.transform, 1.0), 2, num_workers=2)
        with pytest.raises(OSError, match="disk gone"):
            list(failing)
        assert not children() - before  # (failing is still held)
        assert failing.arena is None or not any(failing.arena._size[:])  # pieces given back
        after = server.loader(ValuedDataset(4, server.transform, 1.0), 2, num_workers=2)
        assert sum(len(b["image"]) for b in after) == 4


@pytest.mark.parametrize("device", DEVICES)
def test_breaking_out_of_epochs_keeps_the_workers_and_the_arena_from_filling(device):
    """Batches prefetched for an epoch left with break are dropped by PyTorch with their arena
    pieces taken. Ending the workers at every break cost a validation loop a fork per pass
    (review); leaving the pieces taken filled the arena. Persistent workers are kept while at
    most half the arena is taken, then ended and the arena given back: the pieces taken stay
    bounded, and a whole epoch after the breaks is whole and in order."""
    spec = medproc.Spec(spacing=2.0, crop=(8, 8, 8))
    kw = {"batch_size": 2, "with_label": True, "resample_in": "server"}  # (the arena's case)
    with ProxyServer(spec, device=device, **kw) as server:
        loader = server.loader(ValuedDataset(12, server.transform, 1.0), 2, num_workers=2)
        sizes = loader.arena._size
        epoch = iter(loader)
        next(epoch)
        pids = [w.pid for w in loader.loader._iterator._workers]
        del epoch  # (left, as by break)
        assert [w.pid for w in loader.loader._iterator._workers] == pids  # kept
        for _ in range(8):
            epoch = iter(loader)
            next(epoch)
            del epoch
            # (half the entries, and one epoch's prefetch left taken by the last break)
            assert sum(1 for s in sizes[:] if s) <= len(sizes) // 2 + 12 * 2
        values = torch.cat([b["image"].mean(dim=(1, 2, 3, 4)).cpu() for b in loader])
        np.testing.assert_allclose(values.numpy(), np.arange(1, 13), rtol=1e-6)


@pytest.mark.parametrize("where", WHERE)
def test_two_epochs_at_once_of_a_loader_without_persistent_workers_are_each_whole(where):
    """Without persistent workers PyTorch allows two iterators at once: leaving the first
    ended the second's workers and emptied the arena under it (10 of 40 samples, no error; a
    review). Each epoch ends only its own workers."""
    spec = medproc.Spec(spacing=2.0, crop=(8, 8, 8))
    with ProxyServer(spec, device="cpu", batch_size=2, resample_in=where) as server:
        kw = {"num_workers": 2, "persistent_workers": False}
        loader = server.loader(ValuedDataset(12, server.transform, 1.0), 2, **kw)
        first, second = iter(loader), iter(loader)
        next(first)
        got = [next(second)]
        del first
        got += list(second)
        values = torch.cat([b["image"].mean(dim=(1, 2, 3, 4)) for b in got])
        np.testing.assert_allclose(values.numpy(), np.arange(1, 13), rtol=1e-6)


def test_a_float_label_is_refused_in_the_worker_naming_the_sample():
    """A label map of 1.5s was refused by the engine's thread, naming no sample (a prober's);
    the worker that has the sample refuses it, naming its image."""
    spec = medproc.Spec(spacing=2.0, crop=(8, 8, 8))
    img = medproc.Volume(np.zeros((20, 20, 20), np.float32), np.eye(4))
    img.meta["source"] = "case7.nii.gz"
    lab = medproc.Volume(np.full((20, 20, 20), 1.5, np.float32), np.eye(4))
    with ProxyServer(spec, device="cpu", batch_size=1, with_label=True) as server:
        with pytest.raises(medproc.errors.ReadError, match=r"the label of case7.nii.gz: .*1.5"):
            server.transform({"image": img, "label": lab})
