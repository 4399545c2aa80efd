"""How far medproc's nearest-neighbour label maps are from MONAI's Spacingd on the bundled
sample data (docs/coming-from-monai.md, "nearest ties"): run from the repository root,
``python scripts/nearest_ties.py``. Halving the spacing (3 -> 1.5 mm) puts every other sample
exactly half-way between two voxels, where DALI rounds up and torch to even."""

import numpy as np
from monai.transforms import Compose, LoadImaged, Orientationd, Spacingd

import medproc
from medproc.monai import LoadVolumed, Resampled


def main() -> None:
    for case in ("case001", "case002"):
        p = f"sample_data/nifti/labels/{case}.nii.gz"
        for sp in (1.5, 2.4):
            monai = Compose(
                [
                    LoadImaged("l", ensure_channel_first=True),
                    Orientationd("l", "RAS"),
                    Spacingd("l", pixdim=sp, mode="nearest"),
                ]
            )({"l": p})["l"]
            spec = medproc.Spec(spacing=sp, orientation="RAS", grid="monai")
            ours = Compose([LoadVolumed("l"), Resampled("l", spec, mode="nearest")])({"l": p})["l"]
            a, b = np.asarray(monai[0]), np.asarray(ours[0])
            fg = (a > 0) | (b > 0)
            print(
                f"{case} {sp} mm: foreground voxels agreeing {np.mean(a[fg] == b[fg]):.3f}, "
                f"all voxels {np.mean(a == b):.4f}"
            )


if __name__ == "__main__":
    main()
