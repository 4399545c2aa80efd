"""Label maps on grids where nearest-neighbour samples fall exactly on the boundaries between
input voxels: the shift is what the note says it is, and the note is given exactly there."""

import warnings

import numpy as np
import pytest

import medproc
from medproc import Spec
from medproc._ties import tie_axes
from medproc.errors import MedprocWarning


def _box_case(shape=(40, 36, 20), spacing=(3.0, 3.0, 2.0)):
    """A label box (and an image of it), off the grid's centre."""
    lab = np.zeros(shape, np.uint8)
    lab[11:17, 20:24, 5:9] = 1
    aff = np.diag([*spacing, 1.0])
    aff[:3, 3] = [-60.0, -50.0, -20.0]
    return medproc.Volume(lab.astype(np.float32), aff), medproc.Volume(lab, aff)


def _centroid_mm(vol):
    idx = np.argwhere(np.asarray(vol.array) > 0).mean(0)
    return (vol.affine @ np.r_[idx, 1.0])[:3]


def _meta_vol(t):
    return medproc.Volume(t[0].numpy(), t.affine.numpy())


def _run(spec, **case):
    img, lab = _box_case(**case)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        _, out = medproc.resample(img, spec=spec, label=lab, device="cpu")
    notes = [str(w.message) for w in got if issubclass(w.category, MedprocWarning)]
    return _centroid_mm(out) - _centroid_mm(lab), out, notes


_NOTE = "exactly half-way between input voxels"


@pytest.mark.parametrize("orientation", [None, "LPS"])
def test_halving_the_spacing_on_monais_grid_shifts_labels_by_what_the_note_says(orientation):
    """3 -> 1.5 mm on MONAI's grid: every input voxel boundary falls on a sample. RAS input:
    lower indices are towards L and P, whatever the output's orientation."""
    shift, _, notes = _run(Spec(spacing=1.5, grid="monai", orientation=orientation))
    (note,) = [n for n in notes if _NOTE in n]
    assert "all, by 0.75 mm on average, towards L; all, by 0.75 mm on average, towards P;" in note
    assert "those at 2" in note and "by 0.75 mm towards I" in note  # k: 2 -> 1.5 mm, partly
    np.testing.assert_allclose(shift[:2], [-0.75, -0.75], atol=1e-9)  # towards L, P (RAS -x, -y)


def test_halving_the_resolution_of_even_axes_on_the_default_grid_is_said_too():
    """1 x 1 x 2 -> 2 x 2 x 4 mm on the centred grid, even sizes: every sample ties. Each
    boundary moves by 0 or a whole input voxel towards the lower indices, by its parity: the
    box at four successive offsets (both parities on every axis) moves by half an input voxel
    on average."""
    spec = Spec(spacing=(2.0, 2.0, 4.0))
    shifts = []
    for d in range(4):
        lab = np.zeros((64, 64, 32), np.uint8)
        lab[11 + d : 17 + d, 20 + d : 25 + d, 5 + d : 12 + d] = 1
        aff = np.diag([1.0, 1.0, 2.0, 1.0])
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            img, lb = medproc.Volume(lab.astype(np.float32), aff), medproc.Volume(lab, aff)
            _, out = medproc.resample(img, spec=spec, label=lb, device="cpu")
        shifts.append(_centroid_mm(out) - _centroid_mm(lb))
    (note,) = {str(w.message) for w in got if _NOTE in str(w.message)}
    for code, mm in (("L", 0.5), ("P", 0.5), ("I", 1)):
        assert f"all, by {mm:g} mm on average, towards {code}" in note
    np.testing.assert_allclose(np.mean(shifts, 0), [-0.5, -0.5, -1.0], atol=1e-9)


def test_no_note_and_no_shift_where_no_sample_ties():
    shift, _, notes = _run(Spec(spacing=2.4, grid="monai"))  # 3 -> 2.4 on MONAI's grid
    assert not [n for n in notes if _NOTE in n]
    assert np.abs(shift).max() < 0.6  # nearest neighbour's own rounding


@pytest.mark.parametrize("grid", ["centred", "monai"])
def test_tie_axes_agrees_with_the_sample_positions_computed_independently(grid):
    """Samples on half-way points and input voxel boundaries hit, from the output and input
    affines in float64 (nibabel)."""
    from nibabel.affines import apply_affine

    img, _ = _box_case()
    for sp in (1.5, 2.4, 2.0, 1.0, (1.5, 1.5, 2.0), 0.75, 0.7, 6.0):
        plan = medproc.make_plan(img.shape, img.affine, Spec(spacing=sp, grid=grid))
        got = {t["axis"]: t for t in tie_axes(plan)}
        for o in range(3):
            line = np.zeros((plan.out_shape[o], 3))
            line[:, o] = np.arange(plan.out_shape[o])
            src = apply_affine(np.linalg.inv(img.affine) @ plan.out_affine, line)
            x = src[:, o]  # axis-aligned, no permutation here
            on = np.isclose(x - np.floor(x), 0.5, atol=1e-6)
            halves = np.arange(np.ceil(x.min() - 0.5), np.floor(x.max() - 0.5) + 1) + 0.5
            hit = np.mean([np.isclose(x, h, atol=1e-6).any() for h in halves]) if len(halves) else 0
            if not on.any():
                assert o not in got, (sp, o)
                continue
            assert got[o]["samples"] == pytest.approx(on.mean()), (sp, o)
            assert got[o]["bounds"] == pytest.approx(hit), (sp, o)


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
    with pytest.warns(MedprocWarning, match=_NOTE):
        out = t(d)
    shift = _centroid_mm(_meta_vol(out["label"])) - _centroid_mm(lab)
    np.testing.assert_allclose(shift[:2], [-0.75, -0.75], atol=1e-9)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_convert_prints_a_note_shared_by_many_cases_once_and_records_it_for_each(
    tmp_path, capfd, jobs
):
    import csv
    import json

    import nibabel as nib

    from medproc.cli import main

    (tmp_path / "img").mkdir()
    (tmp_path / "lab").mkdir()
    img, lab = _box_case()
    for n in range(4):
        nib.save(nib.Nifti1Image(img.array, img.affine), tmp_path / "img" / f"c{n}.nii.gz")
        nib.save(nib.Nifti1Image(lab.array, lab.affine), tmp_path / "lab" / f"c{n}.nii.gz")
    out = tmp_path / "out"
    args = ["convert", str(tmp_path / "img"), "--labels", str(tmp_path / "lab"), "-o", str(out)]
    assert main([*args, "--spacing", "1.5", "--grid", "monai", "-j", jobs]) == 0
    err = capfd.readouterr().err
    assert err.count(_NOTE) == 1, err  # said for its first case only (any worker)
    assert "3 more case note(s) identical to one above not printed" in err
    rows = list(csv.DictReader(open(out / "manifest.csv")))
    assert len(rows) == 4 and all(_NOTE in r["warnings"] for r in rows)  # recorded for each
    for n in range(4):
        assert any(_NOTE in w for w in json.loads((out / f"c{n}.json").read_text())["warnings"])
    # a case-specific note is still printed for every case: each file clips differently
    out2 = tmp_path / "out2"
    for n in range(4):
        nib.save(
            nib.Nifti1Image(img.array * (300 * (n + 1)), img.affine),
            tmp_path / "img" / f"c{n}.nii.gz",
        )
    again = ["convert", str(tmp_path / "img"), "-o", str(out2), "--spacing", "3", "--dtype", "int8"]
    assert main([*again, "-j", jobs]) == 0
    err = capfd.readouterr().err
    assert err.count("int8") >= 4 and "not printed" not in err, err
