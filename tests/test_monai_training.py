"""A MONAI training script (examples/monai_train.py, MONAI's spleen tutorial in small) run as
MONAI wrote it and with medproc's LoadVolumed + Resampled swapped in for LoadImaged ...
Spacingd, nothing else changed: both train alike and save the same predictions, each case under
its own name, in its source geometry."""

import os
import sys

import nibabel as nib
import numpy as np

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)
import monai_train  # noqa: E402


def test_the_backends_differ_only_in_loading_and_resampling():
    for train in (True, False):
        rest = {
            b: [
                type(t).__name__
                for t in monai_train.transforms(b, train).transforms[
                    len(monai_train.load_and_resample(b)) :
                ]
            ]
            for b in ("monai", "medproc")
        }
        assert rest["monai"] == rest["medproc"] and "ScaleIntensityRanged" in rest["monai"]


def test_the_script_trains_alike_and_saves_in_the_source_geometry(tmp_path):
    runs = {b: monai_train.train(b, epochs=4) for b in ("monai", "medproc")}
    (net, ours), (_, ref) = runs["medproc"], runs["monai"]
    # the same batches (the same crops of the same voxels, to 1e-5): the same losses
    assert len(ours) == len(ref) == 4
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    assert ours[-1] < ours[0] - 0.05
    # one network, both validations: the same predictions, files and geometry
    _, saved = monai_train.validate(net, "medproc", str(tmp_path / "medproc"))
    _, saved_ref = monai_train.validate(net, "monai", str(tmp_path / "monai"))
    names = [os.path.relpath(p, tmp_path / "medproc") for p in saved]
    assert names == [os.path.relpath(p, tmp_path / "monai") for p in saved_ref]
    assert names == [f"case00{n}/case00{n}_seg.nii.gz" for n in (1, 2)]  # one file per case
    for case, mine, theirs in zip(monai_train.datalist(), saved, saved_ref):
        source, written = nib.load(case["image"]), nib.load(mine)
        assert written.shape == source.shape
        np.testing.assert_allclose(written.affine, source.affine, atol=1e-5)
        same = np.asarray(written.dataobj) == np.asarray(nib.load(theirs).dataobj)
        assert same.mean() >= 0.999  # argmax ties may flip on 1e-6 differences
