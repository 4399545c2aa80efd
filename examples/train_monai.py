"""Train MONAI's UNet on medproc batches, infer with sliding windows, invert, save aligned.

    python examples/train_monai.py --steps 40 --device cpu      # runs on sample_data

What it shows (and what tests/test_monai.py checks):
1. medproc's PatchLoader feeds MONAI training code unchanged: MetaTensor (B, 1, i, j, k)
   images and labels, a MONAI ``UNet``, ``DiceCELoss``; the loss falls.
2. ``sliding_window_inference`` on a volume preprocessed by a MONAI ``Compose`` that mixes
   medproc transforms (LoadVolumed, Resampled) with MONAI's own (ScaleIntensityRanged...).
3. ``Invertd`` maps the prediction back through the inverse plan; it is saved in the source
   image's geometry (same shape and affine as the original file).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import medproc  # noqa: E402
from medproc.monai import Invertd, LoadVolumed, PatchLoader, Resampled, to_volume  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = medproc.Spec(spacing=2.0, orientation="RAS",
                    intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)))


def datalist(root=os.path.join(ROOT, "sample_data", "nifti")):
    return [{"image": f, "label": os.path.join(root, "labels", os.path.basename(f))}
            for f in sorted(glob.glob(os.path.join(root, "images", "*.nii.gz")))]


def make_net():
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    return UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(8, 16, 32), strides=(2, 2),
                num_res_units=1)


def train(steps=40, device="cpu", cache_dir="/tmp/medproc_train_cache", patch=(32, 32, 32), lr=3e-3):
    from monai.losses import DiceCELoss

    dev = torch.device("cuda" if device == "gpu" else "cpu")
    loader = PatchLoader(datalist(), SPEC, patch, batch_size=4, num_samples=8, pos=3, neg=1,
                         flip_prob=0.5, intensity_scale=0.05, device=device, cache_dir=cache_dir)
    net = make_net().to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    losses = []
    while len(losses) < steps:
        for batch in loader:
            img = batch["image"].to(dev)
            lab = (batch["label"] > 0).long().to(dev)
            opt.zero_grad()
            loss = loss_fn(net(img), lab)
            loss.backward()
            opt.step()
            losses.append(float(loss))
            if len(losses) >= steps:
                break
    return net, losses


def infer_and_invert(net, case, out_path, device="cpu"):
    from monai.inferers import sliding_window_inference
    from monai.transforms import Compose, EnsureTyped, ScaleIntensityRanged

    pre = Compose([
        LoadVolumed(["image", "label"]),
        Resampled(["image", "label"], SPEC.replace(intensity=medproc.Intensity())),  # medproc
        ScaleIntensityRanged("image", -1000, 400, 0.0, 1.0, clip=True),              # MONAI
        EnsureTyped(["image", "label"]),                                              # MONAI
    ])
    d = pre(dict(case))
    dev = torch.device("cuda" if device == "gpu" else "cpu")
    net.eval()
    with torch.no_grad():
        logits = sliding_window_inference(d["image"][None].to(dev), (32, 32, 32), 4, net, overlap=0.25)
    pred = logits.argmax(1).to(torch.uint8).cpu()  # (1, i, j, k)
    d["pred"] = medproc.monai.transforms.MetaTensor(pred, affine=d["image"].affine)
    d = Invertd(["pred", "label"], plan_key="image_plan")(d)
    back = to_volume(d["pred"])
    medproc.save(back.with_array(back.array.astype(np.uint8)), out_path)
    return d, back


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--out", default="out/prediction.nii.gz")
    a = ap.parse_args(argv)
    net, losses = train(a.steps, a.device)
    print("loss: first 5 %.3f, last 5 %.3f" % (np.mean(losses[:5]), np.mean(losses[-5:])))
    infer_and_invert(net, datalist()[0], a.out, a.device)
    print("prediction saved in the source geometry:", a.out)


if __name__ == "__main__":
    main()
