import os

import numpy as np
import pytest

import medproc
from medproc.geometry import axcodes, is_orthogonal, lps_to_ras, spacing_of


def test_volume_copies_affine_to_float64():
    aff = np.diag([1, 2, 3, 1]).astype(np.int32)
    v = medproc.Volume(np.zeros((2, 3, 4)), aff, {"a": 1})
    assert v.affine.dtype == np.float64
    aff[0, 0] = 9
    assert v.affine[0, 0] == 1
    assert v.spacing.tolist() == [1, 2, 3]
    assert v.shape == (2, 3, 4) and v.channels == 1


@pytest.mark.parametrize(
    "array, affine, match",
    [
        (np.zeros((2, 3)), np.eye(4), "must be 3D"),
        (np.zeros((2, 3, 4)), np.eye(3), "4x4"),
        (np.zeros((2, 3, 4)), np.diag([1, 1, 0, 1]), "singular"),
        (np.zeros((2, 3, 4)), np.full((4, 4), np.nan), "NaN"),
        (np.zeros((2, 3, 4), dtype=object), np.eye(4), "boolean, integer or float"),
    ],
)
def test_volume_refuses_bad_input(array, affine, match):
    with pytest.raises(ValueError, match=match):
        medproc.Volume(array, affine)


def test_world_voxel_roundtrip():
    rng = np.random.default_rng(0)
    a = np.eye(4)
    a[:3, :3] = np.linalg.qr(rng.normal(size=(3, 3)))[0] * [1.5, 0.7, 2.0]
    a[:3, 3] = [10, -20, 30]
    v = medproc.Volume(np.zeros((5, 6, 7), np.int16), a)
    idx = rng.uniform(0, 5, (10, 3))
    np.testing.assert_allclose(v.world_to_voxel(v.voxel_to_world(idx)), idx, atol=1e-12)
    np.testing.assert_allclose(v.spacing, [1.5, 0.7, 2.0])


def test_points_of_the_wrong_shape_are_refused_saying_so():
    v = medproc.Volume(np.zeros((2, 2, 2)), np.eye(4))
    with pytest.raises(ValueError, match=r"world_to_voxel: .*got shape \(2,\)"):
        v.world_to_voxel([1, 2])
    with pytest.raises(ValueError, match=r"voxel_to_world: .*got shape \(2, 4\)"):
        v.voxel_to_world(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="numbers of shape"):
        v.world_to_voxel("abc")


def test_indexing_is_refused_with_advice():
    v = medproc.Volume(np.zeros((2, 2, 2)), np.eye(4))
    with pytest.raises(TypeError, match="vol.array"):
        v[0]


def test_geometry_helpers():
    assert axcodes(lps_to_ras(np.eye(4))) == "LPS"
    assert spacing_of(np.diag([2, 3, 4, 1])).tolist() == [2, 3, 4]
    shear = np.eye(4)
    shear[0, 2] = 0.3
    assert is_orthogonal(np.eye(4)) and not is_orthogonal(shear)


def test_axes_are_ijk():
    """shape, spacing and orientation name axes (i, j, k), NIfTI's order; the affine maps
    (i, j, k) to RAS mm."""
    v = medproc.Volume(np.zeros((4, 5, 6), np.int16), np.diag([3.0, 2.0, 1.0, 1.0]))
    assert v.shape == (4, 5, 6)
    assert v.spacing.tolist() == [3.0, 2.0, 1.0]
    assert v.orientation == "RAS"
    assert v.voxel_to_world([1, 1, 1]).tolist() == [3.0, 2.0, 1.0]
    # a DICOM axial grid: i along a row -> Left, j down a column -> Posterior, k -> Superior
    assert (
        medproc.Volume(np.zeros((4, 5, 6)), lps_to_ras(np.diag([0.7, 0.8, 2.5, 1.0]))).orientation
        == "LPS"
    )


def _resample_input(name):
    from medproc.sample_data import ct_phantom, grid_affine

    if name == "synthetic":
        # not square in-plane, three different spacings: an i/j mix-up cannot hide
        aff = grid_affine((40, 48, 16), (0.9, 1.1, 2.5), (-20.0, -25.0, 30.0))
        return medproc.Volume(ct_phantom((40, 48, 16), aff, [])[0], aff)
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_data")
    return medproc.load(os.path.join(root, "dicom", name))


@pytest.mark.parametrize("name", ["ct_axial", "ct_oblique", "synthetic"])
def test_resample_to_own_spacing_is_identity(name):
    """Resampling an anisotropic volume (ct_axial: 2.9 x 2.9 x 2.5 mm) to its own spacing, given
    in (i, j, k) order as Volume.spacing is, changes nothing: same grid, same voxels."""
    v = _resample_input(name)
    assert len(set(np.round(v.spacing, 6))) > 1  # anisotropic
    if name == "ct_axial":
        np.testing.assert_allclose(v.spacing, [2.9, 2.9, 2.5], atol=1e-6)
    out = medproc.resample(v, spacing=v.spacing)
    assert out.shape == v.shape
    np.testing.assert_allclose(out.affine, v.affine, rtol=0, atol=1e-9)
    assert out.orientation == v.orientation
    ref = v.array.astype(np.float32)
    np.testing.assert_allclose(
        out.array, ref, rtol=0, atol=4 * np.finfo(np.float32).eps * float(np.abs(ref).max())
    )
