"""Label maps on grids where nearest-neighbour samples fall exactly on the boundaries between
input voxels: the shift is what the note says it is, and the note is given exactly there."""

import warnings

import numpy as np
import pytest

import medproc
from medproc import Spec
from medproc._ties import tie_axes
from medproc.errors import MedprocWarning


def _box_case():
    """A 3 x 3 x 2 mm label box (and an image of it), off the grid's centre."""
    lab = np.zeros((40, 36, 20), np.uint8)
    lab[11:17, 20:24, 5:9] = 1
    aff = np.diag([3.0, 3.0, 2.0, 1.0])
    aff[:3, 3] = [-60.0, -50.0, -20.0]
    return medproc.Volume(lab.astype(np.float32), aff), medproc.Volume(lab, aff)


def _centroid_mm(vol):
    idx = np.argwhere(np.asarray(vol.array) > 0).mean(0)
    return (vol.affine @ np.r_[idx, 1.0])[:3]


def _meta_vol(t):
    return medproc.Volume(t[0].numpy(), t.affine.numpy())


def _run(spec):
    img, lab = _box_case()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        _, out = medproc.resample(img, spec=spec, label=lab, device="cpu")
    notes = [str(w.message) for w in got if issubclass(w.category, MedprocWarning)]
    return _centroid_mm(out) - _centroid_mm(lab), out, notes


def test_halving_the_spacing_on_monais_grid_shifts_labels_by_what_the_note_says():
    spec = Spec(spacing=1.5, grid="monai")
    shift, _, notes = _run(spec)
    (note,) = [n for n in notes if "exactly on an output sample" in n]
    assert "along i by 0.75 mm, j by 0.75 mm." in note  # k: 2 -> 1.5 mm, a third of its boundaries
    # towards lower indices: -0.75 mm along i and j (axes along +x, +y), half an output voxel
    np.testing.assert_allclose(shift[:2], [-0.75, -0.75], atol=1e-9)


def test_no_note_and_no_shift_where_no_sample_ties():
    shift, _, notes = _run(Spec(spacing=2.4, grid="monai"))  # 3 -> 2.4 on MONAI's grid
    assert not [n for n in notes if "exactly on an output sample" in n]
    assert np.abs(shift).max() < 0.6  # nearest neighbour's own rounding, unbiased here


@pytest.mark.parametrize("grid", ["centred", "monai"])
def test_tie_axes_agrees_with_the_sample_positions_computed_independently(grid):
    """Boundaries hit, counted from the output and input affines in float64 (nibabel): the
    input voxel boundaries (half-integer indices) between the first and last sample, and those
    a sample falls on."""
    from nibabel.affines import apply_affine

    img, _ = _box_case()
    for sp in (1.5, 2.4, 2.0, 1.0, (1.5, 1.5, 2.0), 0.75, 0.7):
        plan = medproc.make_plan(img.shape, img.affine, Spec(spacing=sp, grid=grid))
        got = {o: hit for o, _, hit in tie_axes(plan)}
        for o in range(3):
            line = np.zeros((plan.out_shape[o], 3))
            line[:, o] = np.arange(plan.out_shape[o])
            src = apply_affine(np.linalg.inv(img.affine) @ plan.out_affine, line)
            x = src[:, np.argmax(np.ptp(src, axis=0))] if len(src) > 1 else src[:, 0]
            halves = np.arange(np.ceil(x.min() - 0.5), np.floor(x.max() - 0.5) + 1) + 0.5
            hit = np.mean([np.isclose(x, h, atol=1e-6).any() for h in halves])
            assert got.get(o, 0.0) == pytest.approx(hit if hit >= 0.1 else 0.0), (sp, o)


def test_resampled_warns_for_its_label_key_on_a_tying_grid():
    import torch
    from monai.data import MetaTensor

    from medproc.monai import Resampled

    img, lab = _box_case()
    d = {
        k: MetaTensor(torch.from_numpy(v.array[None]), affine=torch.from_numpy(v.affine))
        for k, v in (("image", img), ("label", lab))
    }
    t = Resampled(["image", "label"], spec=Spec(spacing=1.5, grid="monai"), device="cpu")
    with pytest.warns(MedprocWarning, match="exactly on an output sample"):
        out = t(d)
    shift = _centroid_mm(_meta_vol(out["label"])) - _centroid_mm(lab)
    np.testing.assert_allclose(shift[:2], [-0.75, -0.75], atol=1e-9)
