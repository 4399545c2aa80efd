"""The proxy's voxels against SimpleITK on the same output grid (the independent reference of
tests/test_resample.py): linear within relative L2 <= 1e-3 in the interior, for plain
respacing (on the CPU the engine takes its separable resize there) and for a rotation
augmentation (warp), with and without DataLoader workers."""

import numpy as np
import pytest
import SimpleITK as sitk
from test_resample import _synthetic, interior, rel_l2
from world import sitk_array

from medproc import Intensity, Spec
from medproc.io.sitk_io import resample_filter, to_sitk
from medproc.plan import affine_map
from medproc.proxy import ProxyServer, ProxyTransform

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def rotate(plan, rng):  # deterministic: the test recomputes each sample's plan
    return affine_map(plan.out_shape, [1.5] * 3, rotate_deg=(0, 0, 12))


class Volumes:
    def __init__(self, vols, transform):
        self.vols, self.transform = vols, transform

    def __len__(self):
        return len(self.vols)

    def __getitem__(self, i):
        return self.transform({"image": self.vols[i], "index": i})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("augment", [None, rotate], ids=["respace", "rotate"])
def test_proxy_voxels_match_simpleitk(device, workers, augment):
    axial, oblique = _synthetic(False)[0], _synthetic(True)[0]
    vols = [axial, oblique, axial.with_array(axial.array[:, :, :30])]
    spec = Spec(spacing=1.5, orientation="RAS")
    with ProxyServer(spec, device=device, batch_size=3, augment=augment) as server:
        loader = server.loader(Volumes(vols, server.transform), batch_size=3, num_workers=workers)
        (batch,) = list(loader)
    for n, vol in enumerate(vols):
        plan = server.transform.plan({"image": vol})
        out = batch["image"][n].cpu().numpy()[0]  # (C, i, j, k) -> (i, j, k)
        assert out.shape == tuple(plan.out_shape)
        np.testing.assert_allclose(batch["affine"][n].numpy(), plan.out_affine, atol=1e-6)
        f = resample_filter(
            plan.out_affine, plan.out_shape, pixel=sitk.sitkFloat64, motion=plan.motion
        )
        ref = sitk_array(f.Execute(to_sitk(vol.with_array(vol.array.astype(np.float64)))))
        mask = interior(plan)
        assert mask.mean() > 0.2
        assert rel_l2(out.astype(np.float64), ref, mask) <= 1e-3, (n, rel_l2(out, ref, mask))


def test_where_to_resample_is_checked_when_the_server_is_made():
    spec = Spec(spacing=1.5)
    with pytest.raises(ValueError, match="resample_in must be auto, server or workers"):
        ProxyServer(spec, device="cpu", resample_in="gpu")
    with pytest.raises(ValueError, match="resample_in='workers' is DALI's CPU backend"):
        ProxyServer(spec, device="gpu", resample_in="workers")


MARK = None


def _mark(worker_id):  # a user's own worker_init_fn
    global MARK
    MARK = f"worker {worker_id}"


class Marked(Volumes):
    def __getitem__(self, i):
        return self.transform({"image": self.vols[i], "index": i, "mark": MARK})


@pytest.mark.parametrize("where", ["server", "workers"])
def test_cpu_loaders_with_workers_resample_where_asked(where):
    """'workers': the server's own pipeline is never used, 'server': every batch goes through
    it; either way the user's worker_init_fn runs in each worker, and the voxels (with the
    spec's intensity) are those of an inline loader."""
    vol = _synthetic(False)[0]
    spec = Spec(spacing=1.5, intensity=Intensity(clip=(-100, 100), scale=(0, 1)))
    with ProxyServer(spec, device="cpu", batch_size=2, resample_in=where) as server:
        inline = [b["image"] for b in server.loader(Volumes([vol], server.transform), 1)]
        used, real = [], server._engine.stream
        server._engine.stream = lambda *a, **k: used.append(1) or real(*a, **k)
        ds = Marked([vol] * 4, server.transform)
        batches = list(server.loader(ds, batch_size=2, num_workers=2, worker_init_fn=_mark))
    assert bool(used) == (where == "server")
    assert sorted(m for b in batches for m in b["mark"]) == ["worker 0"] * 2 + ["worker 1"] * 2
    for b in batches:
        assert b["image"].shape[0] == 2
        np.testing.assert_allclose(b["image"].numpy(), inline[0].expand_as(b["image"]), atol=1e-6)
    assert 0 <= float(inline[0].min()) and float(inline[0].max()) <= 1


def test_workers_that_resample_refuse_a_transform_that_is_not_the_server_s():
    """The workers' pipelines are given to server.transform as they start: samples through a
    ProxyTransform made apart would reach the main process unresampled."""
    vol = _synthetic(False)[0]
    spec = Spec(spacing=1.5)
    with ProxyServer(spec, device="cpu", batch_size=1) as server:
        loader = server.loader(Volumes([vol], ProxyTransform(spec)), batch_size=1, num_workers=1)
        with pytest.raises(TypeError, match="not this server's own"):
            list(loader)
