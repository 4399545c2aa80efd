"""PatchLoader's cache (medproc/monai/_patch_cache.py): the sampling indices computed on the
GPU equal the host ones, sparse background, mixed dtypes in a batch, and the GPU cache (on the
H200: -m gpu) giving the same batches as the host cache."""

import numpy as np
import pytest
import torch

import medproc
import medproc.monai._cache_entry as ce
import medproc.monai._patch_cache as pc
from medproc.monai.loader import Augment, PatchLoader, PosNeg


def _vol(shape=(17, 13, 11), seed=0):
    rng = np.random.default_rng(seed)
    lab = np.asfortranarray((rng.random(shape) < 0.3).astype(np.uint8) * 2)
    img = np.asfortranarray(rng.integers(-1000, 400, shape).astype(np.int16))
    return img, lab


@pytest.mark.parametrize("threshold", [None, 0.5])
def test_gpu_indices_equal_host_indices(monkeypatch, threshold):
    """The torch route (the one the GPU takes, run here on CPU tensors) gives the numpy
    route's foreground indices, background bitmap and count."""
    monkeypatch.setattr(ce, "_FORCE_TORCH_PACK", True)
    img, lab = _vol()
    inten = (-1000.0, 400.0, 1 / 1400, 1000 / 1400)
    want = ce._indices_np(lab, img, inten, threshold)
    kji = [torch.from_numpy(np.ascontiguousarray(a.transpose(2, 1, 0))) for a in (lab, img)]
    got = ce._indices(kji[0], kji[1], inten, threshold)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[3] == want[3]
    bg = (lab == 0) & (True if threshold is None else (img + 1000) / 1400 > threshold)
    assert want[3] == int(bg.sum())
    np.testing.assert_array_equal(
        np.unpackbits(want[1], bitorder="little")[: bg.size], bg.ravel(order="F")
    )


def test_sparse_background_is_an_index_list(tmp_path):
    """Background under 1/64 of the volume is stored as its indices; every negative centre is
    one of those voxels, and each of them comes up."""
    shape = (16, 16, 16)
    lab = np.ones(shape, np.uint8)
    spots = [(0, 0, 0), (15, 3, 7), (8, 8, 8), (2, 14, 15)]
    for s in spots:
        lab[s] = 0
    img = np.zeros(shape, np.int16)
    medproc.save(medproc.Volume(img, np.eye(4)), tmp_path / "i.nii.gz")
    medproc.save(medproc.Volume(lab, np.eye(4)), tmp_path / "l.nii.gz")
    case = {"image": str(tmp_path / "i.nii.gz"), "label": str(tmp_path / "l.nii.gz")}
    loader = PatchLoader(
        [case], medproc.Spec(), (1, 1, 1), batch_size=100, sampling=PosNeg(0, 1, num_samples=200)
    )
    e = loader.entries[0]
    assert e.bg_bits is None and e.n_bg == len(spots) and e.bg_index.size == len(spots)
    seen = [
        tuple(np.round(a[:3, 3]).astype(int)) for b in loader for a in b["image"].affine.numpy()
    ]
    assert set(seen) == set(spots)


def test_mixed_dtypes_in_a_batch(tmp_path):
    """An int16 CT and a float32 MR in one loader: a batch mixes their caches (int16 and
    float32), and each patch holds its own volume's values."""
    rng = np.random.default_rng(1)
    lab = np.zeros((20, 20, 20), np.uint8)
    lab[5:15, 5:15, 5:15] = 1
    ct = rng.integers(-1000, 400, lab.shape).astype(np.int16)
    mr = rng.random(lab.shape).astype(np.float32) * 3.5
    cases = []
    for name, arr in (("ct", ct), ("mr", mr)):
        medproc.save(medproc.Volume(arr, np.eye(4)), tmp_path / f"{name}.nii.gz")
        medproc.save(medproc.Volume(lab, np.eye(4)), tmp_path / f"{name}_l.nii.gz")
        cases.append(
            {"image": str(tmp_path / f"{name}.nii.gz"), "label": str(tmp_path / f"{name}_l.nii.gz")}
        )
    loader = PatchLoader(
        cases, medproc.Spec(), (6, 6, 6), batch_size=4, sampling=PosNeg(num_samples=2)
    )
    assert {str(e.host_image().dtype) for e in loader.entries} == {"int16", "float32"}
    for b in loader:
        for s, case in enumerate(b["case"]):
            src = ct if "ct" in case["image"] else mr
            o = np.round(b["image"].affine[s].numpy()[:3, 3]).astype(int)
            box = tuple(slice(a, a + 6) for a in o)
            np.testing.assert_allclose(b["image"][s, 0].numpy(), src[box], rtol=1e-6)


# --- on the GPU (H200) ----------------------------------------------------------------------
def _dl():
    from test_patch_loader import datalist

    return datalist()


SPEC = medproc.Spec(
    spacing=1.5, orientation="RAS", intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1))
)
KW = dict(
    batch_size=4,
    sampling=PosNeg(pos=1, neg=1, num_samples=8),
    augment=Augment(flip_prob=0.5, affine_prob=0.5, range_z=0.3, intensity_factors=0.1),
    device="gpu",
)


@pytest.mark.gpu
def test_gpu_cache_equals_host_cache(monkeypatch):
    """The same seed gives the same patches whether the volumes live on the GPU (boxes sliced
    there) or on the host (boxes staged and copied per batch), or some of each (cache='auto'
    over its budget); batches are CUDA MetaTensors. (cache='host' builds on the CPU, whose
    resampling differs within a HU: here the host loader holds the GPU build's volumes.)"""
    a = PatchLoader(_dl(), SPEC, (32, 32, 24), cache="gpu", **KW)
    b = PatchLoader(_dl(), SPEC, (32, 32, 24), cache="host", **KW)
    assert all(e.on_gpu for e in a.entries) and not any(e.on_gpu for e in b.entries)
    for ea, eb in zip(a.entries, b.entries):  # built on the CPU: the same within a HU
        assert np.abs(ea.host_image().astype(int) - eb.host_image()).max() <= 1
    b.entries = [e.on_host() for e in a.entries]
    first = a.entries[0].nbytes
    monkeypatch.setattr(pc, "GPU_CACHE_FRACTION", 0.0)  # "auto": nothing fits...
    monkeypatch.setattr(pc, "gpu_budget", lambda where, dev: first)  # ...but one volume
    c = PatchLoader(_dl(), SPEC, (32, 32, 24), cache="auto", **KW)
    assert sorted(e.on_gpu for e in c.entries) == [False, True]
    for ba, bb, bc in zip(a, b, c):
        assert ba["image"].device.type == "cuda" and ba["label"].device.type == "cuda"
        assert [x["image"] for x in ba["case"]] == [x["image"] for x in bb["case"]]
        torch.testing.assert_close(ba["image"], bb["image"], atol=1e-5, rtol=0)
        torch.testing.assert_close(ba["image"], bc["image"], atol=1e-5, rtol=0)
        assert torch.equal(ba["label"], bb["label"]) and torch.equal(ba["label"], bc["label"])


@pytest.mark.gpu
def test_gpu_cache_build_equals_cpu_build():
    """Resampled on the GPU (device='gpu', warp) or on the CPU (resize): the same cached
    volumes (labels but for ties, images within one HU: the backends agree to 1e-4 of the
    range before the int16 rounding)."""
    g = PatchLoader(_dl(), SPEC, (16, 16, 16), cache="gpu", **{**KW, "device": "gpu"})
    c = PatchLoader(_dl(), SPEC, (16, 16, 16))
    for eg, ec in zip(g.entries, c.entries):
        assert eg.shape == ec.shape
        assert np.mean(eg.host_label() == ec.host_label()) > 0.999
        assert np.abs(eg.host_image().astype(int) - ec.host_image()).max() <= 1
        assert abs(eg.fg.size - ec.fg.size) <= 0.01 * ec.fg.size


def test_device_route_on_cpu_tensors_equals_host_route():
    """The GPU route's code (build through ``Builder.finish``: tensors resampled, clipped and
    indexed in torch, kept as (k, j, i) tensors; boxes sliced from them per batch), run on CPU
    tensors: the same cache and the same batches as the host route, for the same seed."""
    from test_patch_loader import datalist

    dl = datalist()
    spec = SPEC.replace(crop_foreground=-1000 + 1e-3)
    kw = dict(
        batch_size=3,
        sampling=PosNeg(pos=1, neg=1, num_samples=6, image_threshold=0.2),
        augment=Augment(flip_prob=0.5, affine_prob=0.5, range_z=0.3, intensity_factors=0.1),
    )
    host = PatchLoader(dl, spec, (24, 20, 16), **kw)
    dev = PatchLoader(dl, spec, (24, 20, 16), **kw)
    b = pc.Builder(
        spec,
        device="cpu",
        device_id=0,
        where="host",
        cache_dir=None,
        image_threshold=0.2,
        workers=2,
    )
    b.torch_route = True
    dev.entries = b.build(dev.cases)
    for eh, ed in zip(host.entries, dev.entries):
        assert ed.on_device and not ed.on_gpu and not eh.on_device
        assert ed.image.is_contiguous() and ed.image.shape == eh.shape[::-1]
        np.testing.assert_array_equal(ed.host_image(), eh.host_image())
        np.testing.assert_array_equal(ed.host_label(), eh.host_label())
        np.testing.assert_array_equal(ed.fg, eh.fg)
        np.testing.assert_array_equal(ed.bg_bits, eh.bg_bits)
        assert ed.host_image().min() >= -1000 and ed.host_image().max() <= 400  # clipped
    for _ in range(2):
        for bh, bd in zip(host, dev):
            torch.testing.assert_close(bh["image"], bd["image"], atol=1e-6, rtol=0)
            assert torch.equal(bh["label"].as_tensor(), bd["label"].as_tensor())
            torch.testing.assert_close(bh["image"].affine, bd["image"].affine)


def test_a_fifo_in_the_cache_folder_is_rebuilt_over_not_waited_on(tmp_path):
    """A FIFO named like an entry's file blocked PatchLoader in open() for ever (a prober's
    finding); it is damage like any other: the entry is built again."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import os, numpy as np, nibabel as nib, medproc
        from medproc.monai.loader import PatchLoader
        W = {str(tmp_path)!r}
        a = np.random.default_rng(0).integers(-1000, 400, (9, 7, 5)).astype(np.int16)
        lab = np.zeros((9, 7, 5), np.uint8); lab[3:5, 2:4, 1:3] = 1
        nib.save(nib.Nifti1Image(a, np.eye(4)), W + '/img.nii.gz')
        nib.save(nib.Nifti1Image(lab, np.eye(4)), W + '/lab.nii.gz')
        dl = [{{'image': W + '/img.nii.gz', 'label': W + '/lab.nii.gz'}}]
        def make():
            return PatchLoader(dl, medproc.Spec(), 4, batch_size=1, device='cpu',
                               num_threads=1, cache_dir=W + '/cache')
        make().close()
        for end in ('_image.npy', '.json'):
            name = [n for n in os.listdir(W + '/cache') if n.endswith(end)][0]
            os.unlink(W + '/cache/' + name); os.mkfifo(W + '/cache/' + name)
            loader = make()
            assert next(iter(loader))['image'].shape[-3:] == (4, 4, 4)
            loader.close()
        print('ok')
        """
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(medproc.__file__))}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=env)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
