"""MONAI's spleen-segmentation tutorial, shrunk to sample_data, with medproc swapped in.

    python examples/monai_train.py --backend medproc --epochs 40     # or --backend monai

The script is MONAI's (CacheDataset, DataLoader with workers, list_data_collate,
RandCropByPosNegLabeld, UNet, DiceLoss, sliding_window_inference, decollate_batch, Invertd,
AsDiscreted, SaveImaged). The backends differ in one block, :func:`load_and_resample`:
``LoadImaged`` -> ``Orientationd`` -> ``Spacingd`` (MONAI) or ``LoadVolumed`` -> ``Resampled``
with ``Spec(grid="monai")`` (medproc). Nothing else changes; tests/test_monai_training.py runs
both and checks that they train alike (the same losses) and that, given one network, both
validations write the same predictions, each case under its own name in its source geometry.
"""

from __future__ import annotations

import argparse
import glob
import os

import numpy as np
import torch
from monai.data import CacheDataset, DataLoader, decollate_batch
from monai.inferers import sliding_window_inference
from monai.losses import DiceLoss
from monai.metrics import DiceMetric
from monai.networks.layers import Norm
from monai.networks.nets import UNet
from monai.transforms import (
    AsDiscrete,
    AsDiscreted,
    Compose,
    EnsureTyped,
    Invertd,
    LoadImaged,
    Orientationd,
    RandCropByPosNegLabeld,
    RandFlipd,
    SaveImaged,
    ScaleIntensityRanged,
    Spacingd,
)
from monai.utils import set_determinism

import medproc
from medproc.monai import LoadVolumed, Resampled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("image", "label")
PIXDIM = (2.4, 2.4, 2.4)
PATCH = (32, 32, 16)
ROI = (128, 128, 48)  # validation window: the whole volume at once


def load_and_resample(backend: str) -> list:
    """The one block that differs between the backends."""
    if backend == "monai":
        return [
            LoadImaged(KEYS, ensure_channel_first=True),
            Orientationd(KEYS, axcodes="RAS"),
            Spacingd(KEYS, pixdim=PIXDIM, mode=("bilinear", "nearest")),
        ]
    if backend == "medproc":
        spec = medproc.Spec(spacing=PIXDIM, orientation="RAS", grid="monai")
        return [LoadVolumed(KEYS), Resampled(KEYS, spec, mode=("bilinear", "nearest"))]
    raise ValueError(f"backend must be 'monai' or 'medproc', got {backend!r}")


def datalist(root: str = os.path.join(ROOT, "sample_data", "nifti")) -> list[dict]:
    """MONAI's datalist: one dict of paths per case."""
    images = sorted(glob.glob(os.path.join(root, "images", "*.nii.gz")))
    return [
        {"image": p, "label": os.path.join(root, "labels", os.path.basename(p))} for p in images
    ]


def transforms(backend: str, train: bool) -> Compose:
    """The tutorial's transforms, with ``load_and_resample(backend)`` at the head."""
    t = load_and_resample(backend) + [
        ScaleIntensityRanged("image", a_min=-1000, a_max=400, b_min=0.0, b_max=1.0, clip=True),
        AsDiscreted("label", threshold=0.5),  # lesion (any label value) vs background
    ]
    if train:
        t += [
            RandCropByPosNegLabeld(
                KEYS, label_key="label", spatial_size=PATCH, pos=1, neg=1, num_samples=1
            ),
            RandFlipd(KEYS, prob=0.5, spatial_axis=0),
        ]
    return Compose(t + [EnsureTyped(KEYS)])


def train(backend: str = "medproc", epochs: int = 40) -> tuple[torch.nn.Module, list[float]]:
    """The tutorial's training loop; returns the network and the loss of every step."""
    set_determinism(seed=0)
    train_ds = CacheDataset(datalist(), transforms(backend, train=True), num_workers=2)
    train_loader = DataLoader(
        train_ds, batch_size=2, shuffle=True, num_workers=2, persistent_workers=True
    )
    model = UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1, norm=Norm.BATCH)
    loss_function = DiceLoss(to_onehot_y=True, softmax=True)
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    losses = []
    for _ in range(epochs):
        model.train()
        for batch in train_loader:
            optimizer.zero_grad()
            loss = loss_function(model(batch["image"]), batch["label"])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return model, losses


def validate(model, backend: str = "medproc", out_dir: str = "out/monai_train"):
    """The tutorial's validation: sliding windows, Dice on the resampled grid, predictions
    inverted to each source grid and saved there; returns the Dice and the saved paths."""
    val_transforms = transforms(backend, train=False)
    val_loader = DataLoader(CacheDataset(datalist(), val_transforms, num_workers=2))
    post_pred, post_label = AsDiscrete(argmax=True, to_onehot=2), AsDiscrete(to_onehot=2)
    post = Compose(
        [
            Invertd("pred", transform=val_transforms, orig_keys="image", nearest_interp=False),
            AsDiscreted("pred", argmax=True),
            SaveImaged("pred", output_dir=out_dir, output_postfix="seg", savepath_in_metadict=True),
        ]
    )
    dice, saved = DiceMetric(include_background=False), []
    model.eval()
    with torch.no_grad():
        for batch in val_loader:
            batch["pred"] = sliding_window_inference(batch["image"], ROI, 1, model)
            preds = [post_pred(p) for p in decollate_batch(batch["pred"])]
            dice(y_pred=preds, y=[post_label(lb) for lb in decollate_batch(batch["label"])])
            for case in decollate_batch(batch):
                saved.append(post(case)["pred"].meta["saved_to"])
    return float(dice.aggregate().item()), saved


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", default="medproc", choices=["medproc", "monai"])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--out", default="out/monai_train")
    a = ap.parse_args()
    net, losses = train(a.backend, a.epochs)
    print(f"loss: first {np.mean(losses[:3]):.3f}, last {np.mean(losses[-3:]):.3f}")
    dice, saved = validate(net, a.backend, a.out)
    print(f"validation Dice {dice:.3f}; predictions in the source geometry:", *saved)
