"""The bundled sample data is what the generator makes, and its lesions sit where the CSV says."""

import csv
import os

import numpy as np

import medproc
from medproc.sample_data import make_bundled, make_dataset


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_bundled_lesions_at_label_centroids(sample_data):
    rows = [
        r
        for r in _rows(os.path.join(sample_data, "lesions.csv"))
        if r["seriesuid"].startswith("case")
    ]
    assert len(rows) == 4
    for name in ("case001", "case002"):
        lab = medproc.load(os.path.join(sample_data, "nifti", "labels", f"{name}.nii.gz"))
        mine = [r for r in rows if r["seriesuid"] == name]
        for n, r in enumerate(mine, 1):
            lps = np.array([float(r["coordX"]), float(r["coordY"]), float(r["coordZ"])])
            centroid = lab.voxel_to_world(np.argwhere(lab.array == n).mean(0))
            # a sphere's voxel centroid is within a fraction of a voxel of its centre
            assert np.abs(centroid - lps * [-1, -1, 1]).max() < 0.5 * lab.spacing.max()


def test_bundled_is_reproducible(tmp_path, sample_data):
    make_bundled(str(tmp_path))
    for rel in ("lesions.csv", "nifti/labels/case001.nii.gz"):
        a = open(os.path.join(sample_data, rel), "rb").read()
        b = open(os.path.join(tmp_path, rel), "rb").read()
        if rel.endswith(".gz"):
            np.testing.assert_array_equal(
                medproc.load(os.path.join(sample_data, rel)).array,
                medproc.load(os.path.join(tmp_path, rel)).array,
            )
        else:
            assert a == b


def test_generator_cases_and_lesion_hu(tmp_path):
    info = make_dataset(str(tmp_path), cases=2, size=64, slices=(20, 24), nifti=True)
    for case in info["cases"]:
        vol = medproc.load(os.path.join(tmp_path, "dicom", case["name"]))
        assert vol.shape == case["shape"] and vol.meta["series_uid"] == case["series_uid"]
        assert case["shape"][:2] == (64, 64) and 20 <= case["shape"][2] <= 24  # (i, j, k)
        for les in case["lesions"]:
            i, j, k = np.round(vol.world_to_voxel(np.array(les.center_lps) * [-1, -1, 1])).astype(
                int
            )
            assert abs(vol.array[i, j, k] - les.hu) < 60  # lesion HU plus noise, not lung
        # the NIfTI written from the same (i, j, k) volume holds the same voxels on the same grid
        nii = medproc.load(os.path.join(tmp_path, "nifti", f"{case['name']}.nii.gz"))
        np.testing.assert_array_equal(nii.array, vol.array)
        np.testing.assert_allclose(nii.affine, vol.affine, atol=1e-4)


def _hu_at(vol, ras):
    ijk = np.round(vol.world_to_voxel(np.asarray(ras, float))).astype(int)
    assert np.all(ijk >= 0) and np.all(ijk < vol.shape), (ras, "outside", vol)
    return float(vol.array[tuple(ijk)])


def test_bundled_phantom_is_asymmetric_so_a_flip_shows(sample_data):
    """Marker plate on the patient's LEFT (RAS x < 0) in the superior half, spine posterior,
    heart anterior-left, diaphragm inferior: in the DICOM (LPS) and NIfTI files alike."""
    for rel in ("dicom/ct_axial", "dicom/ct_oblique", "nifti/images/case001.nii.gz"):
        v = medproc.load(os.path.join(sample_data, rel))
        marker = v.voxel_to_world(np.argwhere(v.array > 1000))
        assert len(marker) > 50, rel
        assert marker[:, 0].max() < -135 and marker[:, 2].min() > -2, rel  # left, superior
        spine = v.voxel_to_world(np.argwhere((v.array > 500) & (v.array < 900)))
        assert np.median(spine[:, 1]) < -60, rel  # posterior
        # mirror points: lung on the right, heart on the left; lung above, liver below
        assert _hu_at(v, (45, 30, 5)) < -600 and _hu_at(v, (-45, 30, 5)) > -100, rel
        if rel != "dicom/ct_oblique":  # its slab does not reach down to the diaphragm there
            assert _hu_at(v, (70, 5, 20)) < -600 and _hu_at(v, (70, 5, -34)) > -100, rel


def test_bundled_lesions_lie_in_the_lungs(sample_data):
    from medproc.sample_data import in_lung

    rows = _rows(os.path.join(sample_data, "lesions.csv"))
    assert len(rows) == 8
    for r in rows:
        c = np.array([-float(r["coordX"]), -float(r["coordY"]), float(r["coordZ"])])  # RAS
        rad = float(r["diameter_mm"]) / 2
        pts = c + rad * np.vstack([np.zeros(3), np.eye(3), -np.eye(3)])
        assert in_lung(pts[:, 0], pts[:, 1], pts[:, 2]).all(), r
