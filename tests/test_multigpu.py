"""Data parallelism on two GPUs (nvidia-h200-x2, -m gpu): one process per GPU, each with a
PatchLoader over its own shard (cached on its own GPU), with the engine's default threads
(``LOCAL_WORLD_SIZE`` set as torchrun sets it). Two GPUs must give >= 1.9x one GPU's samples/s,
no case may be in two shards or come twice within an epoch, and DDP keeps the replicas equal."""

import os
import socket
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (nvidia-h200-x2)"),
]

PATCH = (96, 96, 96)
WINDOW_S = 6.0  # seconds each process counts samples for, all processes at once


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_case(args):
    out, seed = args
    from medproc.sample_data import make_dataset

    make_dataset(out, cases=1, size=256, slices=(100, 140), nifti=True, lesions=3, seed=seed)


@pytest.fixture(scope="module")
def cases16(tmp_path_factory):
    """16 synthetic CTs (256² x 100-140 slices) with lesion label maps, made in parallel."""
    import glob

    root = tmp_path_factory.mktemp("multigpu")
    dirs = [str(root / f"c{i:02d}") for i in range(16)]
    with ProcessPoolExecutor(min(16, os.cpu_count() or 1)) as ex:
        list(ex.map(_make_case, [(d, 200 + i) for i, d in enumerate(dirs)]))
    return [
        {
            "image": glob.glob(os.path.join(d, "nifti", "*.nii.gz"))[0],
            "label": glob.glob(os.path.join(d, "labels", "*.nii.gz"))[0],
        }
        for d in dirs
    ]


def _spec():
    import medproc

    return medproc.Spec(
        spacing=1.5, orientation="RAS", intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1))
    )


def _setup(rank: int, world: int, port: int, backend: str):
    """What torchrun does for a rank: its GPU, the process group, and LOCAL_WORLD_SIZE (from
    which the engine's default threads are this rank's share of the cores)."""
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        LOCAL_WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    return dist


def _throughput(rank, world, port, datalist, out):
    """Samples this rank's loader delivers in WINDOW_S seconds, all ranks at once (no model)."""
    from medproc.monai.loader import Augment, PatchLoader, PosNeg
    from medproc.pipeline.engine import default_threads

    dist = _setup(rank, world, port, "gloo")
    loader = PatchLoader(  # shard from torch.distributed: rank of world
        datalist,
        _spec(),
        PATCH,
        batch_size=4,
        sampling=PosNeg(pos=1, neg=1, num_samples=4),
        augment=Augment(flip_prob=0.5),
        device="gpu",
    )
    assert (loader.shard_id, loader.num_shards) == (rank, world)

    def batches():
        while True:
            yield from loader

    it = batches()
    for _ in range(10):  # warm-up: pipelines built, queue full
        next(it)
    torch.cuda.synchronize()
    dist.barrier()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < WINDOW_S:
        b = next(it)
        n += b["image"].shape[0]
    torch.cuda.synchronize()
    rate = n / (time.perf_counter() - t0)
    dist.barrier()
    np.savez(
        f"{out}/tp{world}_{rank}.npz",
        rate=rate,
        threads=default_threads(),
        device=str(b["image"].device),
        cases=[c["image"] for c in loader.cases],
    )
    dist.destroy_process_group()


def test_two_gpus_scale(tmp_path, cases16):
    """Two GPUs, one process each, sharded loaders: >= 1.9x one GPU's samples/s, with the
    default threads (cores / LOCAL_WORLD_SIZE each)."""
    for world in (1, 2):
        torch.multiprocessing.spawn(
            _throughput,
            args=(world, _port(), cases16, str(tmp_path)),
            nprocs=world,
            join=True,
        )
    one = np.load(tmp_path / "tp1_0.npz")
    two = [np.load(tmp_path / f"tp2_{r}.npz") for r in range(2)]
    cores = len(os.sched_getaffinity(0))
    assert int(one["threads"]) == min(cores, 16)
    assert all(int(x["threads"]) == max(1, min(cores // 2, 16)) for x in two)
    assert [str(x["device"]) for x in two] == ["cuda:0", "cuda:1"]
    shards = [set(x["cases"].tolist()) for x in two]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 16
    total = sum(float(x["rate"]) for x in two)
    print(f"1 GPU {float(one['rate']):.0f} samples/s, 2 GPUs {total:.0f} samples/s")
    assert total >= 1.9 * float(one["rate"]), (float(one["rate"]), [float(x["rate"]) for x in two])


def _train(rank, world, port, datalist, out):
    """DDP: a MONAI UNet trained for two epochs on each rank's shard."""
    from monai.losses import DiceCELoss
    from monai.networks.nets import UNet

    from medproc.monai.loader import Augment, PatchLoader, PosNeg

    dist = _setup(rank, world, port, "nccl")
    loader = PatchLoader(
        datalist,
        _spec(),
        (32, 32, 32),
        batch_size=4,
        sampling=PosNeg(pos=1, neg=1, num_samples=2),
        augment=Augment(flip_prob=0.5),
        device="gpu",
        shard_id=rank,
        num_shards=world,
    )
    torch.manual_seed(0)
    net = UNet(3, 1, 2, channels=(8, 16, 32), strides=(2, 2), num_res_units=1).cuda(rank)
    net = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    epochs, devices = [], set()
    for _ in range(2):
        cases = []
        for batch in loader:
            devices.update({str(batch["image"].device), str(batch["label"].device)})
            cases += [c["image"] for c in batch["case"]]
            opt.zero_grad()
            loss_fn(net(batch["image"]), (batch["label"] > 0).long()).backward()
            opt.step()
        epochs.append(cases)
    flat = torch.cat([p.detach().flatten() for p in net.parameters()]).cpu().numpy()
    np.savez(
        f"{out}/train{rank}.npz",
        params=flat,
        devices=sorted(devices),
        epochs=np.array(epochs, dtype=object),
        shard=[c["image"] for c in loader.cases],
        steps=len(loader),
    )
    dist.destroy_process_group()


def test_ddp_shards_disjoint_and_replicas_equal(tmp_path, cases16):
    """Each rank trains on its own shard on its own GPU; within every epoch no case comes on
    both ranks and each comes num_samples times on its rank; DDP keeps the weights equal."""
    dl = cases16[:7]  # uneven: shards of 4 and 3, both 3 volumes per epoch
    torch.multiprocessing.spawn(_train, args=(2, _port(), dl, str(tmp_path)), nprocs=2, join=True)
    r = [np.load(tmp_path / f"train{i}.npz", allow_pickle=True) for i in range(2)]
    assert list(r[0]["devices"]) == ["cuda:0"] and list(r[1]["devices"]) == ["cuda:1"]
    assert list(r[0]["shard"]) == [c["image"] for c in dl[0::2]]
    assert list(r[1]["shard"]) == [c["image"] for c in dl[1::2]]
    assert int(r[0]["steps"]) == int(r[1]["steps"])  # ranks in step
    for e in range(2):
        seen = [list(x["epochs"][e]) for x in r]
        assert len(seen[0]) == len(seen[1]) == 3 * 2
        assert not set(seen[0]) & set(seen[1])
        for s, x in zip(seen, r):
            assert set(s) <= set(x["shard"])
            assert all(s.count(c) == 2 for c in set(s))
    np.testing.assert_allclose(r[0]["params"], r[1]["params"], atol=1e-6)
