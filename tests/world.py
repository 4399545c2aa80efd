"""Compare volumes by the world position of their voxels, not by array layout.

medproc indexes voxels (i, j, k) (NIfTI's order) and its affines map (i, j, k) to RAS mm. An
array and the affine it is compared with must use the same index order: SimpleITK's
``GetArrayFromImage`` is (z, y, x) while its index -> world map (``sitk_affine``) takes
(x, y, z), so compare :func:`sitk_array` (the (x, y, z) = (i, j, k) view) with it.
"""

import numpy as np
from nibabel.affines import apply_affine


def sitk_array(img):
    """``sitk.GetArrayFromImage(img)`` indexed (x, y, z[, C]) = (i, j, k[, C]) (a view)."""
    import SimpleITK as sitk

    a = sitk.GetArrayFromImage(img)
    return a.transpose(2, 1, 0, *range(3, a.ndim))


def corners(shape):
    s = np.array(shape[:3]) - 1
    return np.array([[i, j, k] for i in (0, s[0]) for j in (0, s[1]) for k in (0, s[2])], float)


def assert_same_world(arr_a, aff_a, arr_b, aff_b, atol_mm=1e-3, values=True, rtol=0.0):
    """The two grids cover the same voxel centres (within atol_mm) and, with ``values``, hold
    the same value at each. Each array is indexed as its affine says (affine @ [i, j, k, 1] is
    the world position of ``arr[i, j, k]``); the two may differ by axis permutation and flips."""
    m = np.linalg.inv(aff_b) @ aff_a  # index a -> index b
    p = np.round(m[:3, :3])
    assert np.all(np.abs(p).sum(0) == 1) and np.all(np.abs(p).sum(1) == 1), (
        f"not a permutation:\n{m}"
    )
    pa = apply_affine(aff_a, corners(arr_a.shape))
    pb = apply_affine(aff_b, apply_affine(m, corners(arr_a.shape)))
    assert np.abs(pa - pb).max() < 1e-9
    # the a-grid's corners land on integer b indices inside b, and the world positions agree
    idx_b = apply_affine(m, corners(arr_a.shape))
    off = np.abs(idx_b - np.round(idx_b)).max()
    assert off * np.abs(aff_b[:3, :3]).max() < atol_mm, f"grids offset by {off} voxel"
    # a's grid spans b's array exactly along each of b's axes (an array transposed against its
    # affine fails here even with values=False)
    extent = np.round(idx_b.max(0) - idx_b.min(0))
    assert np.array_equal(extent, np.array(arr_b.shape[:3]) - 1), (extent + 1, arr_b.shape)
    assert np.all(np.round(idx_b.min(0)) == 0), f"a's grid starts at b index {idx_b.min(0)}"
    world_err = np.abs(
        apply_affine(aff_a, corners(arr_a.shape)) - apply_affine(aff_b, np.round(idx_b))
    ).max()
    assert world_err < atol_mm, f"world positions differ by {world_err} mm"
    if values:
        # reorder a into b's layout
        src_axis = [int(np.nonzero(p[j])[0][0]) for j in range(3)]
        sign = [int(p[j, src_axis[j]]) for j in range(3)]
        t = np.transpose(arr_a, src_axis + list(range(3, arr_a.ndim)))
        for j in range(3):
            if sign[j] < 0:
                t = np.flip(t, j)
        assert t.shape == arr_b.shape, (t.shape, arr_b.shape)
        if rtol:
            np.testing.assert_allclose(t, arr_b, rtol=rtol)
        else:
            np.testing.assert_array_equal(t, arr_b)
