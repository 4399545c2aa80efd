"""The engine's contract: one pipeline per thread, fork-safe, running ahead, in order, errors
surfaced; and every connector's results equal to a serial run."""

import threading

import numpy as np
import pytest
import torch

import medproc
from medproc import Spec, make_plan
from medproc.pipeline import Engine, ForkError, Graph, Job, slabs
from medproc.pipeline import cache as cache_mod
from medproc.sample_data import ct_phantom, grid_affine


def _cases(n=6, seed=0):
    """Small CT phantoms of different sizes and spacings, each with a label map."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n):
        shape = (int(rng.integers(28, 40)), int(rng.integers(28, 40)), int(rng.integers(10, 16)))
        sp = (float(rng.uniform(2.5, 3.5)), float(rng.uniform(2.5, 3.5)), float(rng.uniform(3, 5)))
        aff = grid_affine(shape, sp, (-50.0, -50.0, -30.0))
        img, lab = ct_phantom(shape, aff, [], seed=c)
        lab = (img > 0).astype(np.uint8)
        out.append(
            (
                medproc.Volume(img, aff, {"source": f"case{c}"}),
                medproc.Volume(lab, aff, {"source": f"case{c}"}),
            )
        )
    return out


def _in_threads(work, n):
    """``work(i)`` for i in range(n), each in its own thread at once; results by i."""
    got, errors = {}, []

    def run(i):
        try:
            got[i] = work(i)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return got


SPEC = Spec(spacing=2.0, orientation="RAS", intensity=medproc.Intensity(clip=(-1000, 400)))


def test_threads_never_share_a_pipeline_and_results_match_serial():
    cases = _cases(8)
    serial = medproc.resample_batch(
        [c[0] for c in cases], SPEC, labels=[c[1] for c in cases], batch_size=1
    )

    def work(i):
        out = []
        for _ in range(3):
            img, lab = medproc.resample(cases[i][0], spec=SPEC, label=cases[i][1])
            out.append((img.array, lab.array))
        return out

    got = _in_threads(work, len(cases))
    for i, (ref_img, ref_lab) in enumerate(serial):
        for img, lab in got[i]:
            np.testing.assert_array_equal(img, ref_img.array)
            np.testing.assert_array_equal(lab, ref_lab.array)
    # each thread built its own pipelines; those of finished threads are dropped on next use
    assert len({k[0] for k in cache_mod._CACHE}) >= 1
    medproc.resample(cases[0][0], spec=SPEC)
    alive = {t.ident for t in threading.enumerate()}
    assert {k[0] for k in cache_mod._CACHE} <= alive


def test_monai_cache_dataset_with_worker_threads_gives_each_case_its_own_image():
    monai = pytest.importorskip("monai")
    from medproc.monai import Resampled, to_metatensor

    cases = _cases(12, seed=1)
    data = [
        {"image": to_metatensor(img), "label": to_metatensor(lab), "n": n}
        for n, (img, lab) in enumerate(cases)
    ]
    t = Resampled(["image", "label"], SPEC)
    serial = [t(dict(d)) for d in data]
    ds = monai.data.CacheDataset(data, transform=t, num_workers=4, progress=False)
    for n in range(len(data)):
        item = ds[n]
        assert item["n"] == n
        np.testing.assert_array_equal(np.asarray(item["image"]), np.asarray(serial[n]["image"]))
        np.testing.assert_array_equal(np.asarray(item["label"]), np.asarray(serial[n]["label"]))
        np.testing.assert_allclose(
            np.asarray(item["image"].affine), np.asarray(serial[n]["image"].affine)
        )


class _Cases(torch.utils.data.Dataset):
    def __init__(self, cases, spec):
        self.cases, self.spec = cases, spec

    def __len__(self):
        return len(self.cases)

    def __getitem__(self, i):
        img, lab = self.cases[i]
        out, out_lab = medproc.resample(img, spec=self.spec, label=lab)
        return {
            "image": torch.from_numpy(np.ascontiguousarray(out.array)),
            "label": torch.from_numpy(np.ascontiguousarray(out_lab.array)),
            "i": i,
        }


def test_train_validate_train_with_forked_workers_after_dali_ran_in_the_parent():
    """The usual loop: DataLoader workers (forked) resample, then validation resamples in the
    main process, then the next epoch forks new workers. Used to hang at epoch 1."""
    spec = SPEC.replace(crop=(24, 24, 16))
    cases = _cases(4, seed=2)
    ref = [_Cases(cases, spec)[i] for i in range(len(cases))]  # DALI has run in this process
    loader = torch.utils.data.DataLoader(
        _Cases(cases, spec),
        batch_size=2,
        num_workers=2,
        timeout=120,
        multiprocessing_context="fork",
    )
    for _epoch in range(2):
        for batch in loader:  # train
            for b, i in enumerate(batch["i"].tolist()):
                np.testing.assert_array_equal(batch["image"][b].numpy(), ref[i]["image"].numpy())
                np.testing.assert_array_equal(batch["label"][b].numpy(), ref[i]["label"].numpy())
        val = medproc.resample(cases[0][0], spec=spec)  # validate in the main process
        np.testing.assert_array_equal(val.array, ref[0]["image"].numpy())


def test_stream_runs_ahead_in_order_and_surfaces_errors():
    cases = _cases(5, seed=3)
    eng = Engine("cpu", batch_size=2)
    graph = Graph.from_spec(SPEC, labels=1)
    plans = [make_plan(v.shape, v.affine, SPEC) for v, _ in cases]
    pulled = []

    def items():
        for n, ((img, lab), p) in enumerate(zip(cases, plans)):
            pulled.append(n)
            yield [Job(img.array, p, (lab.array,))], graph, n

    out = []
    it = eng.stream(items(), as_torch=False, ahead=2)
    res, n = next(it)
    # the producer went on preparing while we held the first result
    for _ in range(100):
        if len(pulled) >= 3:
            break
        threading.Event().wait(0.05)
    assert len(pulled) >= 3
    out.append((n, res))
    out += [(n, res) for res, n in it]
    assert [n for n, _ in out] == list(range(5))
    for n, res in out:
        ref = eng.run([Job(cases[n][0].array, plans[n], (cases[n][1].array,))], graph)
        np.testing.assert_array_equal(res[0][0], ref[0][0])

    def bad():
        yield [Job(cases[0][0].array, plans[1], (cases[0][1].array,))], graph, 0  # wrong plan

    with pytest.raises(ValueError, match="does not match its plan"):
        list(eng.stream(bad(), as_torch=False))


def test_labels_keep_their_dtype_and_unusual_dtypes_are_resampled_exactly():
    img, lab = _cases(1, seed=4)[0]
    plan = make_plan(img.shape, img.affine, Spec(spacing=img.spacing))  # identity grid
    eng = Engine("cpu", batch_size=1)
    for dt in ("uint16", "int32", "int64", "bool"):
        lb = lab.array.astype(dt)
        (res,) = eng.run([Job(img.array.astype("float64"), plan, (lb,))], Graph(labels=1))
        assert res[1].dtype == (np.uint8 if dt == "bool" else np.dtype(dt))
        np.testing.assert_array_equal(res[1], lb)
        np.testing.assert_array_equal(res[0], img.array.astype(np.float32))


def test_gpu_pipeline_in_a_child_forked_after_cuda_fails_at_once(monkeypatch):
    monkeypatch.setitem(cache_mod._STATE, "cuda_parent", True)  # as after a fork from CUDA
    with pytest.raises(ForkError, match="multiprocessing_context='spawn'"):
        cache_mod.cached_pipeline(("test",), lambda: object(), device="gpu")


@pytest.mark.gpu
def test_gpu_stream_and_threads_match_serial():
    cases = _cases(6, seed=5)
    cpu = medproc.resample_batch([c[0] for c in cases], SPEC, labels=[c[1] for c in cases])

    def work(i):
        img, lab = medproc.resample(
            cases[i][0].to("gpu"), spec=SPEC, label=cases[i][1].to("gpu"), device="gpu"
        )
        return img.array.cpu().numpy(), lab.array.cpu().numpy()

    got = _in_threads(work, len(cases))
    for i, (img, lab) in enumerate(cpu):
        np.testing.assert_allclose(got[i][0], img.array, atol=0.5)  # GPU vs CPU interpolation
        assert (got[i][1] == lab.array).mean() > 0.995


@pytest.mark.gpu
def test_gpu_stream_does_not_wait_for_the_consumers_queued_kernels():
    """A training loop queues a step's kernels on its stream and then asks for data: the
    engine's batches must not wait behind those kernels (they did when the background thread
    worked on the default stream)."""
    import time

    cases = _cases(4, seed=7)
    eng = Engine("gpu", batch_size=2)
    graph = Graph.from_spec(SPEC, labels=1)
    plans = [make_plan(v.shape, v.affine, SPEC) for v, _ in cases]

    def items():
        while True:
            for (img, lab), p in zip(cases, plans):
                yield [Job(img.to("gpu").array, p, (lab.to("gpu").array,))], graph, None

    it = eng.stream(items(), as_torch=True, ahead=2)
    next(it)  # pipelines built
    torch.cuda.synchronize()
    busy = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    busy[0].record()
    torch.cuda._sleep(int(3e9))  # ~1-2 s of one kernel on the consumer's (default) stream
    busy[1].record()
    t = time.perf_counter()
    for _ in range(6):  # more than `ahead`: made while the kernel runs
        next(it)
    waited = time.perf_counter() - t
    torch.cuda.synchronize()
    sleep_s = busy[0].elapsed_time(busy[1]) / 1000
    it.close()
    assert sleep_s > 0.5, sleep_s
    assert waited < 0.5 * sleep_s, (waited, sleep_s)


@pytest.mark.gpu
def test_gpu_forked_worker_after_cuda_in_parent_gets_a_clear_error():
    from medproc.monai import Resampled, to_metatensor

    cases = _cases(2, seed=6)
    medproc.resample(cases[0][0], spec=SPEC, device="gpu")  # CUDA initialised here

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            t = Resampled(["image"], SPEC, device="gpu")
            return t({"image": to_metatensor(cases[i][0])})["image"].cpu()

    loader = torch.utils.data.DataLoader(
        DS(), num_workers=1, timeout=60, multiprocessing_context="fork"
    )
    with pytest.raises(Exception, match="forked after CUDA"):
        list(loader)


def test_a_consumer_that_stops_early_leaks_no_outputs_into_the_next_run():
    cases = _cases(4, seed=7)
    graph = Graph.from_spec(SPEC, labels=1)
    jobs = [Job(v.array, make_plan(v.shape, v.affine, SPEC), (lb.array,)) for v, lb in cases]
    expected = Engine("cpu", batch_size=1, num_threads=1).run(jobs, graph)  # another pipeline
    eng = Engine("cpu", batch_size=1, num_threads=2)
    it = eng.map(jobs, graph)
    next(it)  # batch 1 is already scheduled when batch 0 is handed out
    it.close()
    for n, (img, lab) in enumerate(eng.run(jobs[::-1], graph)[::-1]):
        np.testing.assert_array_equal(img, expected[n][0])
        np.testing.assert_array_equal(lab, expected[n][1])


def test_labels_never_get_values_they_do_not_hold_when_the_grid_leaves_the_input():
    """DALI's nearest-neighbour resize reads past its input where the sampled region leaves it;
    such plans must take the warp graph (found on an oblique phantom cropped beyond its field of
    view, where labels came back holding 85, 124, 170, 253)."""
    from test_annotations import oblique_case

    img, lab, _ = oblique_case()
    zeros = img.with_array(np.zeros(img.shape, np.uint8))
    spec = Spec(spacing=1.5, orientation="RAS", crop=(48, 56, 40))
    plan = make_plan(img.shape, img.affine, spec)
    assert plan.axis_aligned  # the case the separable graph would take
    # (here the region leaves the input by 12 voxels: the labels are warped, the image resized)
    assert Graph.from_spec(spec, labels=1).mode_for([plan], "cpu") == "mixed"
    full = make_plan(img.shape, img.affine, Spec(spacing=1.5, orientation="RAS")).out_shape
    near = Spec(spacing=1.5, orientation="RAS", crop=tuple(n + 4 for n in full))  # (2 out)
    plan_near = make_plan(img.shape, img.affine, near)
    assert Graph.from_spec(near, labels=1).mode_for([plan_near], "cpu") == "mixed"
    alone = medproc.resample(img, spec=spec)
    for _ in range(10):
        with_lab, out = medproc.resample(img, spec=spec, label=zeros)
        assert not out.array.any()
        np.testing.assert_array_equal(with_lab.array, alone.array)
        _, out = medproc.resample(img, spec=spec, label=lab)
        assert set(np.unique(out.array)) <= {0, 1, 2}


def _tie_case():
    """4 mm labels to 1.5 mm on a centred grid: many samples fall exactly half-way."""
    rng = np.random.default_rng(0)
    lab = np.asfortranarray(rng.integers(0, 5, (40, 36, 30)).astype(np.uint8))
    aff = np.diag([4.0, 4.0, 4.0, 1.0])
    aff[:3, 3] = [-80, -70, -60]
    return medproc.Volume(lab, aff)


def _half_up_reference(vol, out):
    """Nearest neighbour with ties rounded half up, in float64 from the plan's own grid."""
    from nibabel.affines import apply_affine

    idx = apply_affine(
        np.linalg.inv(vol.affine) @ out.affine, np.indices(out.shape).reshape(3, -1).T
    )
    near = np.floor(idx + 0.5 + 1e-9).astype(int)
    near = np.clip(near, 0, np.array(vol.shape) - 1)
    ties = (np.abs(idx % 1 - 0.5) < 1e-9).any(1).mean()
    return vol.array[tuple(near.T)].reshape(out.shape), ties


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("mode", ["auto", "warp"])
def test_nearest_neighbour_ties_are_broken_half_up_on_every_device(device, mode):
    vol = _tie_case()
    plan = make_plan(vol.shape, vol.affine, Spec(spacing=1.5))
    eng = Engine(device, batch_size=1)
    img = vol.array.astype(np.float32)
    ((lab_out, lab_as_label),) = eng.run(
        [Job(img, plan, (vol.array,))], Graph(interp="nearest", labels=1, mode=mode)
    )
    out = vol.with_array(np.asarray(lab_as_label), plan.out_affine)
    ref, ties = _half_up_reference(vol, out)
    assert ties > 0.1  # the case really is full of ties
    np.testing.assert_array_equal(np.asarray(lab_as_label), ref)
    np.testing.assert_array_equal(np.asarray(lab_out), ref.astype(np.float32))


def test_default_threads_share_the_cores_between_local_ranks(monkeypatch):
    from medproc.pipeline.engine import default_threads

    monkeypatch.delenv("MEDPROC_DALI_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_threads() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_threads() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_threads() == 4
    assert Engine("cpu").num_threads == 4
    monkeypatch.setenv("MEDPROC_DALI_THREADS", "3")
    assert default_threads() == 3
    # (a review's: 100000 was taken as it was, "abc" was int()'s bare ValueError)
    for bad in ("100000", "abc", "-2", "2.5", "4_0", "1e3"):
        monkeypatch.setenv("MEDPROC_DALI_THREADS", bad)
        with pytest.raises(medproc.UsageError, match=f"MEDPROC_DALI_THREADS='{bad}': num_thr"):
            Engine("cpu")
    for zero in ("0", "00", ""):  # (0 or empty: the cores' share)
        monkeypatch.setenv("MEDPROC_DALI_THREADS", zero)
        assert default_threads() == 4
    for bad in (0, 1025, 2.0, True, "2"):
        with pytest.raises(medproc.UsageError, match="num_threads must be a whole number from 1"):
            Engine("cpu", num_threads=bad)
    assert Engine("cpu", num_threads=np.int64(2)).num_threads == 2


def _threads_in_worker(_):
    from medproc.pipeline.engine import default_threads

    return default_threads()


def test_default_threads_in_dataloader_workers_are_their_share_of_the_cores(monkeypatch):
    """A volume alone in a batch runs on every DALI thread (slabs): 4 DataLoader workers on
    8 cores take 2 each, not 8 each."""
    from torch.utils.data import DataLoader

    monkeypatch.delenv("MEDPROC_DALI_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    got = list(DataLoader(range(4), num_workers=4, collate_fn=_threads_in_worker))
    assert got == [2, 2, 2, 2]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert list(DataLoader(range(2), num_workers=2, collate_fn=_threads_in_worker)) == [2, 2]


def test_stacked_hands_back_a_batch_tensor_only_when_the_rows_are_exactly_its_rows():
    from medproc.pipeline.runner import stacked

    batch = torch.empty(4, 2, 3)
    batch.copy_(torch.arange(24.0).reshape(4, 2, 3))
    rows = list(batch.unbind(0))
    assert stacked(rows) is batch  # no copy
    reshaped = [r.view(3, 2) for r in rows]
    retyped = [r.view(torch.int32) for r in rows]
    for other in (rows[::-1], rows[:2], [rows[0], rows[0], rows[2], rows[3]], reshaped, retyped):
        got = stacked(other)
        assert got is not batch and torch.equal(got, torch.stack(other))
    loose = [torch.ones(2, 3), torch.zeros(2, 3)]
    assert torch.equal(stacked(loose), torch.stack(loose))


def test_a_column_of_back_to_back_rows_is_fed_as_one_batch():
    """The engine feeds DALI a column in one piece when its samples are the rows of one block
    (PatchLoader's gathered boxes, staged host boxes), else sample by sample."""
    import torch

    from medproc.monai._columns import gathered as _gathered
    from medproc.pipeline.runner import _dense, _stage_offsets

    block = torch.arange(4 * 5 * 6 * 7, dtype=torch.int16).reshape(4, 5, 6, 7)
    rows = list(block.unbind(0))
    dense = _dense(rows)
    assert dense.shape == (4, 5, 6, 7) and dense.data_ptr() == block.data_ptr()
    assert torch.equal(dense, block)
    assert _dense(rows[1:]).data_ptr() == rows[1].data_ptr()  # a block's tail is one too
    # rows out of order, of separate memory, or of other shapes stay a list
    for col in ([rows[1], rows[0]], [r.clone() for r in rows], [rows[0], rows[1][:, :3]]):
        assert isinstance(_dense(col), list)

    # host boxes staged as the engine stages them (images, then labels), every one on a
    # 256-byte boundary: boxes of a multiple of 256 bytes (as 96^3 int16 and uint8 ones) make
    # each column one batch; others stay sample by sample
    def staged(imgs, labs):
        offsets, total = _stage_offsets(imgs + labs)
        assert all(at % 256 == 0 for at in offsets)
        block = torch.zeros(total, dtype=torch.uint8)
        views = []
        for a, at in zip(imgs + labs, offsets):
            v = block[at : at + a.nbytes].view(getattr(torch, a.dtype.name)).view(a.shape)
            v.copy_(torch.from_numpy(a))
            views.append(v)
        return views[: len(imgs)], views[len(imgs) :]

    imgs = [np.full((8, 4, 8, 1), n, np.int16) for n in range(3)]  # 512 bytes
    labs = [np.full((8, 4, 8, 1), n, np.uint8) for n in range(3)]  # 256 bytes
    for col, src in zip(staged(imgs, labs), (imgs, labs)):
        dense = _dense(col)
        assert isinstance(dense, torch.Tensor) and dense.shape == (3, 8, 4, 8, 1)
        assert torch.equal(dense, torch.from_numpy(np.stack(src)))
    odd = [np.full((5, 6, 7, 1), n, np.int16) for n in range(3)]  # 420 bytes
    col, _ = staged(odd, [])
    assert isinstance(_dense(col), list) and all(
        torch.equal(c, torch.from_numpy(o)) for c, o in zip(col, odd)
    )

    # boxes of cached (k, j, i) volumes: copied into one batch, rows seen as (i, j, k)
    vols = [torch.randn(9, 8, 7) for _ in range(3)]
    boxes = [v[1:5, 2:6, 0:3] for v in vols]
    got = _gathered(boxes)
    assert isinstance(_dense([g.permute(2, 1, 0) for g in got]), torch.Tensor)
    for g, b in zip(got, boxes):
        assert torch.equal(g, b.permute(2, 1, 0))
    uneven = _gathered([vols[0][1:5], vols[1][1:4]])  # other shapes: one by one
    assert [tuple(g.shape) for g in uneven] == [(7, 8, 4), (7, 8, 3)]
    host = [np.zeros((2, 2, 2))]
    assert _gathered(host) is host


def test_volumes_read_in_place_by_the_cpu_backend_live_until_their_batch_is_collected():
    """DALI's CPU backend reads the fed volumes in place (``no_copy``): outputs of C-ordered
    volumes (copied by the runner, referenced nowhere else) streamed ahead, with garbage
    allocated between batches, equal the serial run's. (DALI 2.4 keeps a reference of its own
    as well; the runner's hold, DALI's documented contract, is tested below.)"""
    rng = np.random.default_rng(7)
    eng = Engine("cpu", batch_size=2)
    graph = Graph.from_spec(SPEC, labels=1)
    cases = []
    for c in range(6):
        shape = (72, 64, 40 + c)
        aff = grid_affine(shape, (1.5, 1.5, 2.5), (-50.0, -50.0, -30.0))
        img = rng.normal(0, 300, shape).astype(np.float32)
        lab = (img > 200).astype(np.uint8)
        cases.append((img, lab, make_plan(shape, aff, SPEC)))
    junk = []

    def items():
        for n in range(0, 6, 2):
            jobs = [
                Job(np.ascontiguousarray(img), p, (np.ascontiguousarray(lab),))  # C order
                for img, lab, p in cases[n : n + 2]
            ]
            yield jobs, graph, n
            junk.append([np.full((72, 64, 46), 7e5, np.float32) for _ in range(8)])

    got = {n: res for res, n in eng.stream(items(), as_torch=False, ahead=2)}
    for n, (img, lab, p) in enumerate(cases):
        ref = eng.run([Job(np.asfortranarray(img), p, (np.asfortranarray(lab),))], graph)[0]
        out = got[n - n % 2][n % 2]
        np.testing.assert_array_equal(out[0], ref[0])
        np.testing.assert_array_equal(out[1], ref[1])


def test_the_runner_holds_each_batchs_fed_volumes_until_its_outputs_are_collected():
    eng = Engine("cpu", batch_size=2)
    graph = Graph.from_spec(SPEC, labels=1)
    img, lab = _cases(1, seed=9)[0]
    c_img = np.ascontiguousarray(img.array)  # C order: the runner feeds a DHWC copy
    plan = make_plan(img.shape, img.affine, SPEC)
    batch = eng._prepare([Job(c_img, plan, (np.ascontiguousarray(lab.array),))], graph, None)
    batch.start()
    runner = batch.runner
    assert runner.pending == len(runner._held) == 1
    fed = runner._held[0]
    assert any(
        a.shape == c_img.shape[::-1] + (1,) and np.array_equal(a[..., 0], c_img.T) for a in fed
    )
    assert not any(np.shares_memory(a, c_img) for a in fed)  # the copy, held here alone
    runner.collect(batch.n, False)
    assert runner.pending == len(runner._held) == 0


@pytest.mark.parametrize(
    "shape, crop, slab_bounds",
    [
        ((40, 40, 40), (120,) * 3, None),  # (one sample: too small to cut)
        ((40, 40, 40), (150,) * 3, (0, 150)),  # (3 slabs, 2 of them wholly outside)
        ((40, 40, 40), (300,) * 3, (0, 300)),  # (7 slabs, 6 wholly outside)
        ((40, 40, 100), (160, 160, 200), (0, 100, 200)),  # (two slabs, each touching it)
    ],
)
@pytest.mark.parametrize("interp", ["linear", "nearest"])
def test_padding_far_beyond_the_input_repeats_the_border_without_crashing(
    interp, shape, crop, slab_bounds
):
    """A prober's finding: 40^3 voxels centre-cropped to 150^3 (the border repeated) killed the
    process in DALI's CPU resize (SIGSEGV), through resample, PatchLoader and the proxy alike:
    the volume ran as slabs, and a slab lying wholly beyond the input crashed DALI's resize.
    For the resize graph such a slab joins its neighbour; the warp graph (nearest past the
    input) keeps every slab. The result is scipy's border-repeating interpolation."""
    from scipy.ndimage import map_coordinates

    from medproc.pipeline.graphs import misses_input

    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    v = medproc.Volume(a, np.diag([0.8, 0.8, 1.25, 1.0]))
    spec = Spec(crop=crop, interp=interp)
    plan = make_plan(v.shape, v.affine, spec)
    _, parts = slabs.split([Job(a, plan)], Graph.from_spec(spec))
    count = slabs.slab_count(plan.out_shape)
    if slab_bounds is None or interp == "nearest":  # (nearest past the input: warp, uncut)
        assert (parts is None and count == 1) or parts[0][1] == count
    else:
        assert parts is None and len(slab_bounds) == 2 or parts[0][2] == slab_bounds
        for k0, k1 in zip(slab_bounds[:-1], slab_bounds[1:]):
            assert not misses_input(plan.output_slab(k0, k1))
    out = medproc.resample(v, spec=spec, device="cpu")
    x = np.asarray(out.array)
    assert x.shape == crop
    to_in = np.linalg.inv(v.affine) @ out.affine
    idx = np.indices(x.shape).reshape(3, -1)
    src = (to_in @ np.vstack([idx, np.ones(idx.shape[1])]))[:3]
    ref = map_coordinates(a, src, order=1 if interp == "linear" else 0, mode="nearest")
    np.testing.assert_allclose(x.reshape(-1), ref, atol=1e-3 * float(a.max()))


@pytest.mark.parametrize(
    "spec, pad",
    [
        (Spec(crop=(150, 150, 150), interp="cubic"), 90),
        (Spec(spacing=(1.6, 1.6, 2.5), crop=(160, 160, 160), antialias=True), 140),
    ],
    ids=["cubic", "antialias"],
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_cubic_and_antialiased_padding_far_beyond_the_input_is_the_border_repeated(
    spec, pad, device
):
    """Cubic and antialiased resampling exist only in DALI's resize, which crashed the process
    on these grids (cut into slabs on the CPU: they reach 55 and 140 input voxels past a 40^3
    volume). The result is the same grid resampled from the input padded with its border
    (np.pad "edge") far enough that nothing lies outside it: what repeating the border means."""
    from medproc.pipeline.graphs import _outside

    rng = np.random.default_rng(3)
    a = rng.random((40, 40, 40)).astype(np.float32) + np.arange(40, dtype=np.float32)
    aff = np.diag([0.8, 0.8, 1.25, 1.0])
    assert slabs.slab_count(make_plan(a.shape, aff, spec).out_shape) > 1
    out = medproc.resample(medproc.Volume(a, aff), spec=spec, device=device)
    shift = np.eye(4)
    shift[:3, 3] = -pad
    padded = medproc.Volume(np.pad(a, pad, mode="edge"), aff @ shift)
    ref = medproc.resample(padded, spec=spec, device=device)
    assert ref.shape == out.shape and np.allclose(ref.affine, out.affine)
    plan = make_plan(padded.shape, padded.affine, spec)
    assert _outside(plan) == 0  # (nothing outside the padded input)
    got, want = (np.asarray(torch.as_tensor(x.array).cpu()) for x in (out, ref))
    np.testing.assert_allclose(got, want, atol=1e-4 if device == "cpu" else 1e-3)


def test_a_sample_wholly_outside_its_input_takes_warp_or_is_refused():
    """The whole-sample rule (a translated patch, say): the warp graph repeats the border;
    cubic, antialiasing and a forced resize, which only DALI's resize does and where it
    crashed the process (mode='resize' still did, a review's), are refused saying so."""
    from dataclasses import replace

    a = np.random.default_rng(0).random((20, 24, 28)).astype(np.float32)
    plan = make_plan(a.shape, np.eye(4), Spec())
    shifted = plan.matrix.copy()
    shifted[0, 3] += 1000  # (every sample 1000 voxels past the last i)
    far = replace(plan, matrix=shifted)
    assert Graph().mode_for([far], "cpu") == "warp"
    for g in (Graph(interp="cubic"), Graph(antialias=True), Graph(mode="resize")):
        with pytest.raises(medproc.UsageError, match="lies wholly outside its input"):
            g.mode_for([far], "cpu")
    ((out,),) = Engine("cpu", batch_size=1).run([Job(a, far)], Graph())
    np.testing.assert_allclose(out, np.broadcast_to(a[-1], a.shape), atol=1e-5)


def test_warped_slabs_are_not_joined():
    """Slabs join only for DALI's resize: with a fill value (warp) a volume padded far past
    itself keeps all its slabs, and its threads (a review's: 0.31 -> 0.50 s otherwise)."""
    spec = Spec(crop=(300,) * 3, fill=0.0)
    a = np.zeros((40, 40, 40), np.float32)
    plan = make_plan(a.shape, np.eye(4), spec)
    _, parts = slabs.split([Job(a, plan)], Graph.from_spec(spec))
    assert parts[0][1] == slabs.slab_count(plan.out_shape) == 7
