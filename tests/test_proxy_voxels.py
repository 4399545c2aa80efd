"""The proxy's voxels against SimpleITK on the same output grid (the independent reference of
tests/test_resample.py): linear within relative L2 <= 1e-3 in the interior, for plain
respacing (on the CPU the engine takes its separable resize there) and for a rotation
augmentation (warp), with and without DataLoader workers."""

import numpy as np
import pytest
import SimpleITK as sitk
import torch
from test_resample import _synthetic, interior, rel_l2
from world import sitk_array

from medproc import Intensity, Spec, UsageError
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


def test_workers_that_resample_take_copies_and_transforms_made_apart():
    """A dataset deep-copied (train -> val) or calling a ProxyTransform made apart is resampled
    in the workers like one calling server.transform; a sample made outside the workers (cached
    in the main process) is refused, saying what to do."""
    import copy

    vol = _synthetic(False)[0]
    spec = Spec(spacing=1.5)
    with ProxyServer(spec, device="cpu", batch_size=1) as server:
        own = Volumes([vol], server.transform)
        want = next(iter(server.loader(own, batch_size=1, num_workers=1)))["image"][0]
        for ds in (copy.deepcopy(own), Volumes([vol], ProxyTransform(spec))):
            (got,) = list(server.loader(ds, batch_size=1, num_workers=1))
            np.testing.assert_array_equal(got["image"][0].numpy(), want.numpy())
        cached = [server.transform({"image": vol})]  # (made here, in the main process)
        with pytest.raises(TypeError, match="reached it unresampled"):
            list(server.loader(cached, batch_size=1, num_workers=1))


class Labelled(torch.utils.data.Dataset):
    """Whole volumes of different sizes with a uint16 label map holding values above 255."""

    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return 4

    def __getitem__(self, i):
        vol = _synthetic(False, shape=(30 + i, 32, 20))[0]
        lab = np.zeros(vol.shape, np.uint16)
        lab[5:20, 5:20, 5:15] = 300 + i
        return self.transform({"image": vol, "label": vol.with_array(lab), "index": i})


@pytest.mark.parametrize(("where", "workers"), [("server", 0), ("server", 2), ("workers", 2)])
def test_every_cpu_way_gives_the_same_outputs_as_tensors_of_their_own(where, workers):
    """uint16 label maps failed inline and through the server (torch has no min of uint16);
    outputs of varying size came back from workers as shared-memory tensors, a file
    descriptor each (~1000 kept samples exhausted them) and a /dev/shm file (a 64 MB Docker
    /dev/shm hung the loop): they come through the loader's arena and are plain tensors."""
    spec = Spec(spacing=1.5)
    with ProxyServer(spec, device="cpu", batch_size=2, with_label=True, resample_in=where) as s:
        got = list(s.loader(Labelled(s.transform), batch_size=2, num_workers=workers))
        ref = list(s.loader(Labelled(s.transform), batch_size=2))  # inline
    for b, r in zip(got, ref):
        for key in ("image", "label"):
            for t, u in zip(b[key], r[key]):
                assert not t.is_shared()
                np.testing.assert_allclose(t.numpy(), u.numpy(), atol=1e-5)
        assert all(lb.dtype == torch.uint16 for lb in b["label"])
        assert [int(lb.numpy().max()) for lb in b["label"]] == [300 + int(i) for i in b["index"]]


class Endless(torch.utils.data.IterableDataset):
    def __init__(self, transform):
        self.transform = transform

    def __iter__(self):
        vol = _synthetic(False)[0]
        for i in range(6):
            if i == 3:
                raise OSError("disk gone")
            yield self.transform({"image": vol, "index": i})


@pytest.mark.parametrize("where", ["server", "workers"])
def test_an_iterable_dataset_s_error_reaches_the_loop_and_ends_the_workers(where):
    """Without a length, the epoch's clean-up raised TypeError (no len()) over the dataset's
    own error and left the workers running."""
    import gc
    import multiprocessing

    gc.collect()
    before = {p.pid for p in multiprocessing.active_children()}
    with ProxyServer(Spec(spacing=1.5), device="cpu", batch_size=1, resample_in=where) as s:
        loader = s.loader(Endless(s.transform), batch_size=1, num_workers=1)
        with pytest.raises(OSError, match="disk gone"):
            list(loader)
        assert not {p.pid for p in multiprocessing.active_children()} - before


@pytest.mark.parametrize("size", [0, 3, 2.0, "2"])  # (None: the server's, tests/test_proxy.py)
def test_a_loader_batch_size_the_server_cannot_take_is_refused_naming_it(size):
    with ProxyServer(Spec(spacing=1.5), device="cpu", batch_size=2) as server:
        with pytest.raises(
            UsageError, match=r"batch_size must be a whole number from 1 to .* 2, got"
        ):
            server.loader(Volumes([], server.transform), batch_size=size)


def test_loader_numbers_are_checked_numpy_integers_taken():
    """A prober's: np.int64(2) was refused as a batch size (ProxyServer takes it), and
    num_workers 1.5, "2" or None were bare TypeErrors from torch."""
    with ProxyServer(Spec(spacing=1.5), device="cpu", batch_size=2) as server:
        ds = Volumes([_synthetic(False)[0]] * 2, server.transform)
        for n in (1.5, "2", None, -1, True):
            with pytest.raises(UsageError, match="num_workers must be a whole number >= 0"):
                server.loader(ds, num_workers=n)
        got = [len(b["image"]) for b in server.loader(ds, batch_size=np.int64(2))]
        assert got == [2]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_batch_sampler_s_batches_are_checked_against_the_server(workers):
    vol = _synthetic(False)[0]
    with ProxyServer(Spec(spacing=1.5), device="cpu", batch_size=2) as server:
        ds = Volumes([vol] * 3, server.transform)
        ok = server.loader(ds, batch_sampler=[[0, 1], [2]], num_workers=workers)
        assert [len(b["image"]) for b in ok] == [2, 1] and len(ok) == 2
        big = torch.utils.data.BatchSampler(range(3), batch_size=3, drop_last=False)
        with pytest.raises(ValueError, match="batch_sampler's batch_size 3 is more than"):
            server.loader(ds, batch_sampler=big)
        with pytest.raises(ValueError, match="batch_size=2 and a batch_sampler"):
            server.loader(ds, 2, batch_sampler=[[0, 1]])
        drawn = server.loader(ds, batch_sampler=[[0], [0, 1, 2]], num_workers=workers)
        with pytest.raises(ValueError, match="drew a batch of 3 samples; the server takes 1 to 2"):
            list(drawn)


class Nested(torch.utils.data.Dataset):
    """A dataset whose samples also take a value from an inline proxy loader of another
    server, run in the workers of a loader that resamples there; ``keep_open``: the inner
    loop is left part-way, its iterator kept."""

    def __init__(self, vol, inner, transform, keep_open=False):
        self.vol, self.inner, self.transform, self.keep_open = vol, inner, transform, keep_open
        self.kept = []

    def __len__(self):
        return 2

    def __getitem__(self, i):
        loader = self.inner.loader(Volumes([self.vol] * 2, self.inner.transform), batch_size=1)
        if self.keep_open:
            it = iter(loader)
            b = next(it)
            self.kept.append(it)  # (never finished nor closed)
        else:
            b = list(loader)[0]
        out = self.transform({"image": self.vol})
        out["inner_mean"] = float(b["image"][0].mean())
        return out


@pytest.mark.parametrize("keep_open", [False, True])
def test_an_inline_loader_inside_a_worker_that_resamples_uses_its_own_server(keep_open):
    """The inline loader's transform took the worker's resampler and failed (AttributeError);
    an inner loop left open must not turn the worker's own resampling off (a reviewer's
    finding against a first fix, a process-wide counter)."""
    vol = _synthetic(False)[0]
    with ProxyServer(Spec(spacing=3.0), device="cpu", batch_size=1) as inner:
        (alone,) = list(inner.loader(Volumes([vol], inner.transform), batch_size=1))
        with ProxyServer(Spec(spacing=1.5), device="cpu", batch_size=2, resample_in="workers") as s:
            ds = Nested(vol, inner, s.transform, keep_open)
            (b,) = list(s.loader(ds, batch_size=2, num_workers=1))
            (plain,) = list(s.loader(Volumes([vol], s.transform), batch_size=1))
    want = float(alone["image"][0].mean())
    assert b["inner_mean"].tolist() == pytest.approx([want] * 2)
    for t in b["image"]:  # the outer samples resampled in the worker, as without the inner loop
        np.testing.assert_allclose(t.numpy(), plain["image"][0].numpy(), atol=1e-5)


class Kept(Volumes):
    """A dataset that keeps the transform's outputs and returns them again (a cache)."""

    def __init__(self, vols, transform):
        super().__init__(vols, transform)
        self.kept = {}

    def __getitem__(self, i):
        if i not in self.kept:
            self.kept[i] = super().__getitem__(i)
        return self.kept[i]


@pytest.mark.parametrize("where", ["server", "workers"])
def test_an_output_handed_over_twice_is_refused_not_read_from_another_sample(where):
    """A dataset returning a kept transform output again made the loop read whatever sample
    had its arena piece by then (wrong values, no error)."""
    vols = [_synthetic(False)[0].with_array(np.full((70, 80, 36), float(i), np.float32))
            for i in range(4)]  # fmt: skip
    with ProxyServer(Spec(spacing=1.5), device="cpu", batch_size=2, resample_in=where) as s:
        loader = s.loader(Kept(vols, s.transform), batch_size=2, num_workers=1)
        first = [float(b["image"][n].mean()) for b in loader for n in range(2)]
        assert first == [0.0, 1.0, 2.0, 3.0]
        with pytest.raises(RuntimeError, match="handed over twice"):
            list(loader)


class Redrawn(Volumes):
    """A dataset that draws each sample twice and keeps the second (the first is dropped)."""

    def __getitem__(self, i):
        super().__getitem__(i)
        return super().__getitem__(i)


@pytest.mark.parametrize("where", ["server", "workers"])
def test_pieces_of_outputs_dropped_in_the_workers_are_given_back_after_each_epoch(where):
    vol = _synthetic(False)[0]
    with ProxyServer(Spec(spacing=1.5), device="cpu", batch_size=2, resample_in=where) as s:
        loader = s.loader(Redrawn([vol] * 4, s.transform), batch_size=2, num_workers=2)
        for _ in range(3):
            assert sum(len(b["image"]) for b in loader) == 4
            assert not any(loader.arena._size[:])


def test_a_transform_made_apart_resamples_as_the_server_does_on_every_cpu_way():
    """Plans follow the transform's spec (spacing), voxels the server's (interp, dtype), with
    or without workers: num_workers must not change the results."""
    vol = _synthetic(False)[0]
    apart = ProxyTransform(Spec(spacing=3.0, interp="nearest", dtype="float16"))
    got = []
    for where, workers in (("server", 0), ("server", 2), ("workers", 2)):
        with ProxyServer(Spec(spacing=3.0), device="cpu", batch_size=1, resample_in=where) as s:
            (b,) = list(s.loader(Volumes([vol], apart), batch_size=1, num_workers=workers))
            got.append(b["image"][0])
    for t in got[1:]:
        assert t.dtype == got[0].dtype == torch.float32
        np.testing.assert_allclose(t.numpy(), got[0].numpy(), atol=1e-6)


@pytest.mark.parametrize(("where", "workers"), [("server", 0), ("server", 2), ("workers", 2)])
def test_a_value_the_engine_refuses_names_the_samples(where, workers):
    """int64 voxels beyond float32's exact range are refused by the engine: through the
    server's pipeline the error named no sample."""
    from medproc import MedprocError, Volume

    good = _synthetic(False)[0]
    big = Volume(np.full((20, 20, 20), 2**40, np.int64), np.eye(4), {"source": "case3.nii.gz"})
    vols = [good, big]
    with ProxyServer(Spec(spacing=1.5), device="cpu", batch_size=2, resample_in=where) as s:
        with pytest.raises(MedprocError, match="cannot be resampled exactly") as e:
            list(s.loader(Volumes(vols, s.transform), batch_size=2, num_workers=workers))
    said = str(e.value) + " ".join(getattr(e.value, "__notes__", []))
    assert "case3.nii.gz" in said
