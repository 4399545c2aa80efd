"""NIfTI (nibabel test data) and NRRD (pyradiomics 3.0.1 data) against independent references."""

import glob
import os
import re

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk
from world import assert_same_world

import medproc
from medproc.sample_data import grid_affine


def test_nibabel_oblique_example4d():
    from nibabel.testing import data_path

    path = os.path.join(data_path, "example4d.nii.gz")
    img = nib.load(path)
    vol = medproc.load(path)
    data = np.asanyarray(img.dataobj)
    assert vol.array.shape == data.shape
    # the voxel nibabel calls (i, j, k) is ours at [i, j, k], at the same world position
    rng = np.random.default_rng(0)
    for _ in range(20):
        i, j, k = (rng.integers(0, n) for n in data.shape[:3])
        np.testing.assert_array_equal(vol.array[i, j, k], data[i, j, k])
        np.testing.assert_allclose(
            vol.voxel_to_world([i, j, k]),
            nib.affines.apply_affine(img.affine, [i, j, k]),
            atol=1e-9,
        )


def _nrrd_header_affine(path):
    """Parse the NRRD text header ourselves: index (x, y, z) -> world in the header's space."""
    hdr = {}
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("latin-1").strip()
            if not line:
                break
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                hdr[k.strip()] = v.strip().lstrip("=").strip()
    vecs = [
        list(map(float, t.split(","))) for t in re.findall(r"\(([^)]*)\)", hdr["space directions"])
    ]
    origin = list(map(float, re.findall(r"\(([^)]*)\)", hdr["space origin"])[0].split(",")))
    a = np.eye(4)
    a[:3, :3] = np.array(vecs).T
    a[:3, 3] = origin
    space = hdr["space"].lower()
    assert space in ("left-posterior-superior", "lps", "right-anterior-superior", "ras"), space
    if space in ("left-posterior-superior", "lps"):
        a = np.diag([-1, -1, 1, 1]) @ a
    sizes = tuple(int(s) for s in hdr["sizes"].split())
    return a, sizes


def test_pyradiomics_nrrd_geometry(pyradiomics_data):
    files = sorted(glob.glob(os.path.join(pyradiomics_data, "*.nrrd")))
    assert len(files) >= 10
    for f in files:
        vol = medproc.load(f)
        aff_xyz, sizes = _nrrd_header_affine(f)
        assert vol.shape == sizes, f
        np.testing.assert_allclose(vol.affine, aff_xyz, atol=1e-6, err_msg=f)


def test_pyradiomics_label_lines_up_with_image(pyradiomics_data):
    img = medproc.load(os.path.join(pyradiomics_data, "lung1_image.nrrd"))
    lab = medproc.load(os.path.join(pyradiomics_data, "lung1_label.nrrd"))
    centroid_world = lab.voxel_to_world(np.argwhere(lab.array > 0).mean(0))
    inside = np.round(img.world_to_voxel(centroid_world)).astype(int)
    assert np.all(inside >= 0) and np.all(inside < img.shape)
    # the tumour is soft tissue (CT), not air
    i, j, k = inside
    assert img.array[i, j, k] > -300


@pytest.mark.parametrize("ext", [".nii.gz", ".nii", ".nrrd", ".mha"])
def test_save_load_roundtrip(tmp_path, ext):
    c, s = np.cos(0.3), np.sin(0.3)
    aff = grid_affine((11, 9, 7), (0.9, 0.8, 2.5), (10, -20, 5), iop=(c, s, 0, -s, c, 0))
    arr = np.random.default_rng(0).integers(-1000, 1000, (11, 9, 7)).astype(np.int16)
    out = medproc.save(medproc.Volume(arr, aff), tmp_path / f"v{ext}")
    back = medproc.load(out)
    assert_same_world(back.array, back.affine, arr, aff, atol_mm=1e-4)
    # every format keeps the (i, j, k) axes as they are
    np.testing.assert_array_equal(back.array, arr)
    np.testing.assert_allclose(back.affine, aff, atol=1e-4)
    assert sorted(os.listdir(tmp_path)) == [f"v{ext}"]  # no temporary left behind


def test_sheared_affine_saves_as_nifti_sform_only(tmp_path):
    aff = grid_affine((6, 5, 4), (1.0, 1.0, 2.0), (0, 0, 0), tilt_deg=15)
    vol = medproc.Volume(np.zeros((6, 5, 4), np.int16), aff)
    back = medproc.load(medproc.save(vol, tmp_path / "t.nii.gz"))
    np.testing.assert_allclose(back.affine, aff, atol=1e-5)
    with pytest.raises(medproc.MedprocError, match="sheared"):
        medproc.save(vol, tmp_path / "t.nrrd")


def test_nan_nifti_is_refused_unless_asked(broken_dataset):
    with pytest.raises(medproc.ReadError, match=r"nan\.nii\.gz.*100 NaN/inf voxel.*nan='zero'"):
        medproc.load(broken_dataset["nan"])
    zero = medproc.load(broken_dataset["nan"], nan="zero")
    kept = medproc.load(broken_dataset["nan"], nan="keep")
    assert np.isfinite(zero.array).all() and np.isnan(kept.array).sum() == 100
    np.testing.assert_array_equal(
        zero.array[np.isfinite(kept.array)], kept.array[np.isfinite(kept.array)]
    )
    with pytest.raises(ValueError, match="nan must be one of"):
        medproc.load(broken_dataset["nan"], nan="drop")


def test_unreadable_and_missing_files(tmp_path):
    p = tmp_path / "bad.nii.gz"
    p.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(medproc.ReadError, match="bad.nii.gz.*cannot be read as NIfTI"):
        medproc.load(p)
    q = tmp_path / "bad.nrrd"
    q.write_text("NRRD0004\ntype: short\n")
    with pytest.raises(medproc.ReadError, match="bad.nrrd.*'sizes' field is missing"):
        medproc.load(q)
    q.write_text("NRRD0004\ntype: short\nsizes: 2 2 2\nencoding: bogus\n\n" + "x" * 16)
    with pytest.raises(medproc.ReadError, match="bad.nrrd.*SimpleITK cannot read"):
        medproc.load(q)
    with pytest.raises(medproc.ReadError, match="no such file"):
        medproc.load(tmp_path / "nope.nii.gz")
    with pytest.raises(ValueError, match="use a .nii.gz"):
        medproc.save(medproc.Volume(np.zeros((2, 2, 2)), np.eye(4)), tmp_path / "x.png")


def _nibabel_niftis():
    from nibabel.testing import data_path

    return sorted(glob.glob(os.path.join(data_path, "*.nii*")))


@pytest.mark.parametrize("path", _nibabel_niftis(), ids=os.path.basename)
def test_every_nibabel_nifti_against_simpleitk(path, quiet):
    """nibabel's test NIfTIs, read by medproc (through nibabel) and by SimpleITK (its own NIfTI
    library): same voxel values at the same world positions."""
    import SimpleITK as sitk

    from medproc.io.sitk_io import sitk_affine

    nimg = nib.load(path)
    if not hasattr(nimg, "get_sform"):
        with pytest.raises(medproc.ReadError, match="not a volume"):
            medproc.load(path)  # CIFTI: surfaces/connectivity, not a voxel grid
        return
    data = np.asanyarray(nimg.dataobj)
    if data.dtype.kind == "f" and not np.isfinite(data).all():
        with pytest.raises(medproc.ReadError, match="NaN"):
            medproc.load(path)  # NaN voxels are refused with the count, never passed on silently
        kept = medproc.load(path, nan="keep")  # ... unless asked for
        np.testing.assert_array_equal(kept.array, data)
        return
    vol = medproc.load(path)
    try:
        img = sitk.ReadImage(path)
    except RuntimeError:  # e.g. NIfTI-2: compare with nibabel's view instead
        np.testing.assert_array_equal(vol.array, data)
        np.testing.assert_allclose(vol.affine, nimg.affine)
        return
    ref = sitk.GetArrayFromImage(img)
    if img.GetDimension() != 3:
        pytest.skip(f"SimpleITK reads it as {img.GetDimension()}D")
    ref = ref.transpose(2, 1, 0) if ref.ndim == 3 else ref.transpose(2, 1, 0, 3)  # ITK (x, y, z)
    arr = vol.array if vol.array.ndim == 3 else vol.array[..., 0]
    if img.GetNumberOfComponentsPerPixel() > 1:
        ref = ref[..., 0]
    assert_same_world(
        arr.astype(np.float64),
        vol.affine,
        ref.astype(np.float64),
        sitk_affine(img),
        atol_mm=1e-3,
        rtol=1e-6,
    )
    assert arr.shape == ref.shape  # NIfTI's (i, j, k) is ITK's index (x, y, z): no permutation


def _sample_niftis():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_data")
    return sorted(glob.glob(os.path.join(root, "**", "*.nii*"), recursive=True))


def test_load_is_nibabel_for_every_sample_nifti_and_example4d():
    """One axis order: medproc's shape, array and affine are nibabel's, as they are (no axis
    reversal anywhere), for the bundled NIfTIs and nibabel's oblique 4D example."""
    from nibabel.testing import data_path

    sample = _sample_niftis()
    assert len(sample) >= 4, sample  # images and labels of case001, case002
    for path in sample + [os.path.join(data_path, "example4d.nii.gz")]:
        img = nib.load(path)
        vol = medproc.load(path)
        assert vol.array.shape == img.shape, path
        assert vol.shape == img.shape[:3], path
        np.testing.assert_array_equal(vol.array, np.asanyarray(img.dataobj), err_msg=path)
        np.testing.assert_array_equal(vol.affine, img.affine, err_msg=path)
        assert vol.orientation == "".join(nib.aff2axcodes(img.affine)), path


DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"]
DTYPES += ["float32", "float64"]


@pytest.mark.parametrize("ext", [".nii.gz", ".nrrd", ".mha"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_loads_and_resamples_on_the_cpu(tmp_path, ext, dtype):
    """Every voxel type NIfTI/NRRD/MHA hold is read as stored and resampled by the engine on the
    CPU without losing values (uint16 to 65535, int32 HU, 64-bit integers below 2^24; float64
    is accepted): the identity resample gives the stored values, in float32. As a label map the
    same values come back exactly, in the label's own dtype."""
    info = np.iinfo(dtype) if dtype[0] in "ui" else None
    rng = np.random.default_rng(0)
    if info is None:
        arr = (rng.standard_normal((9, 7, 5)) * 1000).astype(dtype)
    else:
        lo, hi = max(int(info.min), -(2**24)), min(int(info.max), 2**24)
        arr = rng.integers(lo, hi, (9, 7, 5), endpoint=True).astype(dtype)
        arr[0, 0, 0], arr[-1, -1, -1] = lo, hi  # the extremes of what must stay exact
    aff = grid_affine((9, 7, 5), (1.5, 1.2, 3.0), (0, 0, 0))
    vol = medproc.Volume(arr, aff)
    if ext == ".nii.gz":
        import nibabel as nib

        nib.save(nib.Nifti1Image(arr, aff, dtype=arr.dtype), tmp_path / f"v{ext}")
    else:
        medproc.save(vol, tmp_path / f"v{ext}")
    back = medproc.load(tmp_path / f"v{ext}")
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back.array, arr)
    out = medproc.resample(back, spacing=back.spacing, device="cpu")
    assert out.array.dtype == np.float32
    np.testing.assert_array_equal(out.array, arr.astype(np.float32))
    if info is not None:
        img, lab = medproc.resample(back, spacing=back.spacing, label=back, device="cpu")
        assert lab.array.dtype == arr.dtype
        np.testing.assert_array_equal(lab.array, arr)


def test_dipy_style_uint16_with_a_trailing_singleton_axis(tmp_path):
    """dipy's S0_10slices.nii.gz: uint16 with shape (x, y, z, 1), full-range values."""
    import nibabel as nib

    arr = np.random.default_rng(1).integers(0, 65535, (10, 8, 10, 1), endpoint=True)
    arr = arr.astype(np.uint16)
    nib.save(nib.Nifti1Image(arr, np.diag([2.0, 2.0, 2.0, 1.0])), tmp_path / "S0.nii.gz")
    vol = medproc.load(tmp_path / "S0.nii.gz")
    assert vol.array.shape == (10, 8, 10, 1) and vol.dtype == np.uint16
    out = medproc.resample(vol, spacing=2.0, device="cpu")
    np.testing.assert_array_equal(np.squeeze(out.array), arr[..., 0].astype(np.float32))
    half = medproc.resample(vol, spacing=4.0, device="cpu")
    assert half.shape == (5, 4, 5) and np.isfinite(half.array).all()


def test_a_5d_nifti_becomes_channels_in_file_order_saying_so(tmp_path):
    """(x, y, z, 1, c) is MONAI's/ITK's vector image: its components as channels, no note;
    (x, y, z, t, c) is flattened with the 4th dimension fastest (the file's order), noted."""
    import nibabel as nib

    rng = np.random.default_rng(5)
    vec = rng.random((4, 5, 6, 1, 3)).astype(np.float32)
    nib.save(nib.Nifti1Image(vec, np.eye(4)), tmp_path / "vec.nii.gz")
    v = medproc.load(tmp_path / "vec.nii.gz")
    np.testing.assert_array_equal(v.array, vec[:, :, :, 0, :])
    assert v.meta["warnings"] == []
    both = rng.random((4, 5, 6, 2, 3)).astype(np.float32)
    nib.save(nib.Nifti1Image(both, np.eye(4)), tmp_path / "both.nii.gz")
    v = medproc.load(tmp_path / "both.nii.gz")
    assert v.array.shape == (4, 5, 6, 6)
    for t in range(2):
        for c in range(3):
            np.testing.assert_array_equal(v.array[..., t + 2 * c], both[..., t, c])
    assert any("5-D image" in w and "6 channels" in w for w in v.meta["warnings"])


@pytest.mark.parametrize("kind", ["complex64", "complex128", "rgb24", "rgba32"])
def test_complex_and_rgb_niftis_are_refused_clearly(tmp_path, kind):
    import nibabel as nib

    if kind.startswith("complex"):
        arr = (np.ones((4, 4, 4)) + 1j).astype(kind)
        what = "complex voxels"
    else:
        names = ["R", "G", "B", "A"][: 3 if kind == "rgb24" else 4]
        arr = np.zeros((4, 4, 4), dtype=[(n, "u1") for n in names])
        what = "RGB colour" if kind == "rgb24" else "RGBA colour"
    nib.save(nib.Nifti1Image(arr, np.eye(4)), tmp_path / f"{kind}.nii.gz")
    with pytest.raises(medproc.ReadError, match=f"{kind}.nii.gz: stores {what}.*Save|Convert"):
        medproc.load(tmp_path / f"{kind}.nii.gz")


def test_save_refuses_what_it_cannot_write_naming_the_path(tmp_path):
    """float16 (which resample can make) has no NIfTI/ITK type, a folder is not a file name,
    igzip has levels 0-3, and a write the OS refuses names the user's path, not the temporary
    one beside it."""
    vol = medproc.Volume(np.zeros((4, 4, 4), np.float16), np.eye(4))
    for name in ("a.nii.gz", "a.nii", "a.nrrd", "a.mha"):
        with pytest.raises(medproc.errors.UsageError, match="no float16") as e:
            medproc.save(vol, tmp_path / name)
        assert str(tmp_path / name) in str(e.value)
    medproc.save(vol, tmp_path / "a.npy")  # the training cache keeps it
    ok = medproc.Volume(np.zeros((4, 4, 4), np.float32), np.eye(4))
    with pytest.raises(medproc.errors.UsageError, match="is a folder"):
        medproc.save(ok, tmp_path)
    with pytest.raises(medproc.errors.UsageError, match="compresslevel must be 0-3"):
        medproc.save(ok, tmp_path / "b.nii.gz", compresslevel=9)
    (tmp_path / "file").write_text("x")
    with pytest.raises(medproc.errors.OutputError, match="cannot be written") as e:
        medproc.save(ok, tmp_path / "file" / "c.nii.gz")
    assert str(tmp_path / "file" / "c.nii.gz") in str(e.value)
    assert not list(tmp_path.glob(".*part*"))


def test_load_takes_bytes_paths_and_names_wrong_arguments(sample_data):
    """load(b'...') raised a str/bytes TypeError from os.path; workers='a' an int() error."""
    p = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    assert medproc.load(os.fsencode(p)).shape == medproc.load(p).shape
    with pytest.raises(medproc.errors.UsageError, match="path must be a str or path-like"):
        medproc.load(5)
    with pytest.raises(medproc.errors.UsageError, match="workers must be a whole number"):
        medproc.load(os.path.join(sample_data, "dicom", "ct_axial"), workers="a")


@pytest.mark.parametrize(
    "geometry, says",
    [
        ("", "no 'space directions'"),
        ("space: left-posterior-superior\nspace directions: none (0,3,0) (0,0,4)\n", "axis 0 has"),
        ("space: left-posterior-superior\nspace directions: (2,0,0) (0,3,0) (0,0,4)\n", None),
        ("spacings: 2 3 4\n", None),
    ],
)
def test_a_nrrd_without_a_voxel_size_is_said_as_niftis_is(tmp_path, geometry, says):
    """SimpleITK reads a NRRD axis with no size as 1 mm without a word (a prober's files): the
    volume's warnings say so; the voxels and the sizes that are given are read as SimpleITK
    reads them."""
    data = np.arange(10 * 12 * 8, dtype=np.int16)
    path = tmp_path / "v.nrrd"
    head = f"NRRD0004\ntype: short\ndimension: 3\nsizes: 10 12 8\n{geometry}"
    path.write_bytes((head + "endian: little\nencoding: raw\n\n").encode() + data.tobytes())
    v = medproc.load(str(path))
    ref = sitk.ReadImage(str(path))
    np.testing.assert_array_equal(v.array, sitk.GetArrayFromImage(ref).transpose(2, 1, 0))
    np.testing.assert_allclose(v.spacing, ref.GetSpacing())
    warned = [w for w in v.meta["warnings"] if "voxel size is unknown" in w]
    assert (says in warned[0]) if says else not warned


def test_a_nrrd_space_direction_of_length_zero_is_named_not_called_non_finite(tmp_path):
    """SimpleITK reads a (0,0,0) space direction as a NaN direction: the error said the affine
    was not finite. It now names the axis and the vector; a collinear pair is still refused."""
    data = np.zeros(64, np.int16).tobytes()
    head = "NRRD0004\ntype: short\ndimension: 3\nsizes: 4 4 4\nspace: left-posterior-superior\n"
    for dirs, says in (
        ("(2,0,0) (0,0,0) (0,0,1)", r"v.nrrd: its 'space directions' give axis 1 the vector"),
        ("(1,0,0) (1,0,0) (0,0,1)", r"v.nrrd: the voxel axes .* are collinear"),
    ):
        path = tmp_path / "v.nrrd"
        tail = "encoding: raw\nendian: little\n\n"
        path.write_bytes(f"{head}space directions: {dirs}\n{tail}".encode() + data)
        with pytest.raises(medproc.errors.ReadError, match=says):
            medproc.load(str(path))


def test_a_qform_quaternion_that_is_no_rotation_is_said_and_the_sform_used(tmp_path):
    """quatern_b = 5 (b^2 + c^2 + d^2 > 1): with an sform, medproc.load raised nibabel's bare
    ValueError; now the sform is used and a warning says why. Without one: an error naming
    the quaternion."""
    import struct

    aff = np.diag([1.5, 2.0, 2.5, 1.0])
    aff[:3, 3] = (-10.0, 20.0, 5.0)
    img = nib.Nifti1Image(np.zeros((4, 5, 6), np.int16), aff)
    img.set_qform(aff, code=1)
    raw = bytearray(img.to_bytes())
    struct.pack_into("<3f", raw, 256, 5.0, 0.0, 0.0)  # quatern_b, c, d
    (tmp_path / "q.nii").write_bytes(raw)
    v = medproc.load(str(tmp_path / "q.nii"))
    np.testing.assert_array_equal(v.affine, aff)
    assert any("quaternion is not a rotation" in w for w in v.meta["warnings"])
    struct.pack_into("<h", raw, 254, 0)  # sform_code 0: the qform is the affine
    (tmp_path / "q0.nii").write_bytes(raw)
    with pytest.raises(medproc.ReadError, match="qform quaternion .* is not a rotation"):
        medproc.load(str(tmp_path / "q0.nii"))
