"""The proxy on the bundled sample data: DataLoader workers read images, label maps and lesions
in Python; one DALI pipeline in this process resamples every batch (GPU, or DALI's CPU backend).

    python examples/proxy_loader.py --device cpu --workers 2      # or --device gpu

What a dataset gives ``server.transform``: a dict with ``"image"`` (a medproc Volume), and
optionally ``"label"`` (a Volume on the image's grid) and ``"lesions"`` (a
``medproc.annotations.Lesions``, here from the sample's LUNA-style CSV); any other keys pass
through to the batch. Each batch holds ``image``/``label`` tensors ``(B, C, i, j, k)``, the
output ``affine`` per sample, and ``lesions`` on the output grid (with MONAI detection boxes).
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
from medproc.annotations import read_luna_csv  # noqa: E402
from medproc.plan import affine_map  # noqa: E402
from medproc.proxy import ProxyServer  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_data")


class Cases(torch.utils.data.Dataset):
    """The sample's NIfTI cases: image, label map and lesions, read in the worker."""

    def __init__(self, transform):
        self.images = sorted(glob.glob(os.path.join(ROOT, "nifti", "images", "*.nii.gz")))
        self.lesions = read_luna_csv(os.path.join(ROOT, "lesions.csv"))  # {stem: Lesions}
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, n):
        path = self.images[n]
        name = os.path.basename(path)[: -len(".nii.gz")]
        sample = {
            "image": medproc.load(path),
            "label": medproc.load(os.path.join(ROOT, "nifti", "labels", os.path.basename(path))),
            "lesions": self.lesions.get(name, medproc.annotations.Lesions.empty()),
            "case": name,
        }
        return self.transform(sample)  # plans and ships the voxels: the server resamples


def augment(plan, rng):
    """A random rotation about k and a scale, as an index map on the output grid (the lesions
    move with the voxels)."""
    return affine_map(
        plan.out_shape,
        [1.5] * 3,
        rotate_deg=(0, 0, rng.uniform(-15, 15)),
        scale=[rng.uniform(0.9, 1.1)] * 3,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="cpu, gpu or auto (default)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args(argv)
    spec = medproc.Spec(
        spacing=1.5,
        orientation="RAS",
        crop=(128, 128, 80),  # a fixed output size: batches are stacked tensors
        intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)),
    )
    with ProxyServer(
        spec, device=args.device, batch_size=2, with_label=True, augment=augment, seed=0
    ) as server:
        loader = server.loader(Cases(server.transform), batch_size=2, num_workers=args.workers)
        for epoch in range(args.epochs):
            for batch in loader:
                image, label = batch["image"], batch["label"]
                for case, lesions, lab in zip(batch["case"], batch["lesions"], label):
                    on = [
                        int(lab[0][tuple(np.round(les["center_voxel"]).astype(int))])
                        for les in lesions
                        if les["inside"]
                    ]
                    print(
                        f"epoch {epoch} {case}: batch {tuple(image.shape)} {image.dtype}, "
                        f"{len(lesions)} lesion(s), the label at those inside: {on}"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
