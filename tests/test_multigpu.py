"""Data-parallel training on two GPUs: each rank's PatchLoader reads its own shard on its own
GPU, and DDP (NCCL) keeps the MONAI UNet in sync. Runs where two GPUs exist (-m gpu)."""

import os
import socket

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu


def _rank(rank, world, port, cache, out):
    import sys

    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    )
    import torch.distributed as dist
    import train_monai
    from monai.losses import DiceCELoss

    from medproc.monai import PatchLoader

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    dl = train_monai.datalist() * 2  # 4 cases, 2 per rank
    loader = PatchLoader(
        dl,
        train_monai.SPEC,
        (32, 32, 32),
        batch_size=2,
        num_samples=2,
        device="gpu",
        device_id=rank,
        shard_id=rank,
        num_shards=world,
        cache_dir=f"{cache}/r{rank}",
    )
    net = torch.nn.parallel.DistributedDataParallel(
        train_monai.make_net().cuda(rank), device_ids=[rank]
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    devices, cases, shapes = set(), [], set()
    for batch in loader:
        devices.add(str(batch["image"].device))
        devices.add(str(batch["label"].device))
        cases += [c["image"] for c in batch["case"]]
        # (B, C, i, j, k) patches, one (i, j, k) -> RAS affine per sample
        shapes.add(
            (
                tuple(batch["image"].shape[1:]),
                tuple(batch["label"].shape[1:]),
                tuple(batch["image"].affine.shape[1:]),
            )
        )
        opt.zero_grad()
        loss_fn(net(batch["image"]), (batch["label"] > 0).long()).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in net.parameters()]).cpu().numpy()
    np.savez(
        f"{out}/rank{rank}.npz",
        params=flat,
        devices=sorted(devices),
        cases=cases,
        shard=[c["image"] for c in loader.cases],
        shapes=repr(sorted(shapes)),
        datalist=[c["image"] for c in dl],
    )
    dist.destroy_process_group()


def test_two_gpu_sharded_training(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (nvidia-h200-x2)")
    import sys

    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(
        _rank, args=(2, port, str(tmp_path), str(tmp_path)), nprocs=2, join=True
    )
    r = [np.load(tmp_path / f"rank{i}.npz") for i in range(2)]
    assert list(r[0]["devices"]) == ["cuda:0"] and list(r[1]["devices"]) == ["cuda:1"]
    for x in r:
        assert str(x["shapes"]) == repr([((1, 32, 32, 32), (1, 32, 32, 32), (4, 4))])
    # disjoint shards (case i goes to rank i % 2), covering the datalist
    assert len(r[0]["shard"]) == len(r[1]["shard"]) == 2
    dl = list(r[0]["datalist"])
    assert list(r[0]["shard"]) == dl[0::2] and list(r[1]["shard"]) == dl[1::2]
    assert set(r[0]["shard"]).isdisjoint(r[1]["shard"])  # datalist * 2: each image on one rank
    for x in r:  # each rank trained on its own shard only, every case of it
        assert set(x["cases"]) == set(x["shard"])
    # DDP kept the replicas identical after training on different data
    np.testing.assert_allclose(r[0]["params"], r[1]["params"], atol=1e-6)
