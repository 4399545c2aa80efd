"""Lesion annotations: readers (clear errors for malformed files), geometry through resampling,
crop, flip and rotation, SEG and RTSTRUCT, and convert --annotations."""

import json
import os
import warnings

import nibabel as nib
import numpy as np
import pydicom
import pytest

import medproc
from medproc import Spec, make_plan
from medproc.annotations import Lesions, read_json, read_luna_csv, read_rtstruct, read_seg
from medproc.cli import main
from medproc.plan import affine_map, flip_map
from medproc.sample_data import Lesion, ct_phantom, grid_affine

OBLIQUE = (0.9659258, 0.0, -0.258819, 0.1830127, 0.7071068, 0.6830127)


def oblique_case(shape=(50, 60, 30), spacing=(1.2, 1.0, 2.0), n=2):
    """An oblique, anisotropic CT with spherical lesions at known world positions; voxels
    (i, j, k) = 50 columns of 1.2 mm, 60 rows of 1.0 mm, 30 slices of 2 mm."""
    aff = grid_affine(shape, spacing, (0.0, 0.0, 0.0), iop=OBLIQUE)
    centre = medproc.Volume(np.zeros(shape), aff).voxel_to_world((np.array(shape) - 1) / 2)
    target = np.array([70.0, 5.0, 0.0])  # RAS: the phantom's left lung, so lesions sit in air
    aff[:3, 3] += target - centre
    centre = target
    les = [
        Lesion(tuple((centre + [dx, dy, 0]) * [-1, -1, 1]), 20.0, 80.0)
        for dx, dy in [(-10, -12), (8, 14)][:n]
    ]
    img, lab = ct_phantom(shape, aff, les)
    lesions = Lesions(
        [np.array(x.center_lps) * [-1, -1, 1] for x in les], [[x.diameter_mm] * 3 for x in les]
    )
    return medproc.Volume(img, aff), medproc.Volume(lab, aff), lesions


def sphere_mask(out_affine, out_shape, motion, lesions, n):
    """Ground truth: voxels of the output grid whose (un-moved) world point is in lesion n."""
    idx = np.indices(out_shape).reshape(3, -1).T.astype(float)
    world = nib.affines.apply_affine(np.linalg.inv(motion) @ out_affine, idx)
    r = lesions.diameters[n] / 2
    return (((world - lesions.centers[n]) ** 2).sum(1) <= r * r).reshape(out_shape)


def dice(a, b):
    return 2 * (a & b).sum() / (a.sum() + b.sum())


AUGMENTS = {
    "resample": lambda shape: np.eye(4),
    "flip": lambda shape: flip_map(shape, [0, 2]),  # axes i and k
    "rotate": lambda shape: affine_map(shape, [1.5] * 3, rotate_deg=(-20, 12, 0)),
    "flip+rotate+scale": lambda shape: (
        flip_map(shape, [1])
        @ affine_map(shape, [1.5] * 3, rotate_deg=(5, 0, 15), scale=(1.0, 0.95, 1.1))
    ),
}


@pytest.mark.parametrize("aug", list(AUGMENTS))
def test_lesions_stay_on_their_lesions(aug):
    img, lab, lesions = oblique_case()
    plan = make_plan(img.shape, img.affine, Spec(spacing=1.5, orientation="RAS", crop=(48, 56, 40)))
    plan = plan.augmented(AUGMENTS[aug](plan.out_shape))
    from medproc.pipeline import Engine, Graph, Job

    ((out_img, out_lab),) = Engine("cpu", batch_size=1).run(
        [Job(img.array, plan, (lab.array,))], Graph(labels=1, interp="linear")
    )
    assert out_img.shape == out_lab.shape == plan.out_shape == (48, 56, 40)
    placed = plan.lesions_on_grid(lesions)
    for n, p in enumerate(placed):
        assert p["inside"]
        centroid = np.argwhere(out_lab == n + 1).mean(0)  # (i, j, k)
        assert np.abs(np.array(p["center_voxel"]) - centroid).max() <= 0.5, (p, centroid)
        # the mask overlaps the lesion as the resampled image shows it (lesion 80 HU in lung at
        # -820 HU: half-way threshold, near the lesion) with Dice >= 0.95 ...
        near = sphere_mask(
            plan.out_affine,
            plan.out_shape,
            plan.motion,
            Lesions(lesions.centers, lesions.sizes + 8.0),
            n,
        )
        in_image = (out_img > -370) & near
        assert dice(out_lab == n + 1, in_image) >= 0.95
        # ... and the true sphere within the source's voxel size (2 mm slices)
        truth = sphere_mask(plan.out_affine, plan.out_shape, plan.motion, lesions, n)
        assert dice(out_lab == n + 1, truth) >= 0.9
        # the lesion is bright tissue in the resampled image too
        i, j, k = np.round(p["center_voxel"]).astype(int)
        assert out_img[i, j, k] > 0


def _grids(sample_data):
    """(affine, shape, lesions) on oblique, anisotropic, cropped and augmented grids."""
    img, _, lesions = oblique_case()
    yield img.affine, img.shape, lesions
    plan = make_plan(img.shape, img.affine, Spec(spacing=1.5, orientation="RAS", crop=(48, 56, 40)))
    for aug in AUGMENTS.values():
        p = plan.augmented(aug(plan.out_shape))
        moved = lesions.transformed(p.motion)
        yield p.out_affine, p.out_shape, moved
    table = read_luna_csv(os.path.join(sample_data, "lesions.csv"))
    for series in ("ct_axial", "ct_oblique"):
        v = medproc.load(os.path.join(sample_data, "dicom", series))
        les = table[v.meta["series_uid"]]
        yield v.affine, v.shape, les
        p = make_plan(v.shape, v.affine, Spec(spacing=(1.0, 1.5, 3.0), orientation="PIR"))
        yield p.out_affine, p.out_shape, les


def test_center_voxel_maps_to_center_world(sample_data):
    """affine @ [*center_voxel, 1] == center_world_ras (within 1e-3 mm) for every lesion."""
    n = 0
    for affine, shape, lesions in _grids(sample_data):
        for les in lesions.on_grid(affine, shape):
            world = affine @ np.array([*les["center_voxel"], 1.0])
            np.testing.assert_allclose(world[:3], les["center_world_ras"], atol=1e-3)
            n += 1
    assert n >= 2 * (1 + len(AUGMENTS) + 4)
    # the order is (i, j, k): the bundled axial series, LPS (-62, -10, 5) on a grid of
    # 2.9 x 2.9 x 2.5 mm from LPS (-161, -141, -50), i -> L, j -> P, k -> S
    v = medproc.load(os.path.join(sample_data, "dicom", "ct_axial"))
    les = read_luna_csv(os.path.join(sample_data, "lesions.csv"))[v.meta["series_uid"]]
    first = les.on_grid(v.affine, v.shape)[0]
    np.testing.assert_allclose(first["center_voxel"], [99 / 2.9, 131 / 2.9, 55 / 2.5], atol=1e-3)
    i, j, k = np.round(first["center_voxel"]).astype(int)
    assert v.array[i, j, k] > 0  # bright lesion (70 HU) in the lung


def test_lesion_leaving_a_crop_is_flagged_not_dropped():
    img, lab, lesions = oblique_case()
    plan = make_plan(img.shape, img.affine, Spec(spacing=1.5, orientation="RAS", crop=(8, 8, 8)))
    placed = plan.lesions_on_grid(lesions)
    assert len(placed) == 2 and not any(p["inside"] for p in placed)


def test_boxes_transform_as_boxes():
    les = Lesions([[0, 0, 0]], [[10, 20, 30]], kinds=["box"])
    rot = np.eye(4)
    rot[:2, :2] = [[0, -1], [1, 0]]  # 90 degrees about S
    moved = les.transformed(rot)
    np.testing.assert_allclose(moved.sizes[0], [20, 10, 30])


def test_luna_csv_is_lps_and_errors_name_the_line(tmp_path, sample_data):
    table = read_luna_csv(os.path.join(sample_data, "lesions.csv"))
    les = table["1.2.826.0.1.3680043.8.498.2026.1.1"]
    np.testing.assert_allclose(les.centers[0], [62.0, 10.0, 5.0])  # LPS (-62, -10, 5) -> RAS
    head = "seriesuid,coordX,coordY,coordZ,diameter_mm"
    for text, says in (
        (f"{head}\nA,1,2,3,4\nB,1,x,3,4\n", r"line 3: coordinates and diameter must be numbers"),
        ("uid,x,y,z\n", r"line 1: missing column"),
        (f"{head}\nA,1,2,3,-4\n", r"line 2: .*diameter > 0"),
        # a cell more than the header (an unquoted comma): refused, not dropped
        (f"{head}\nA,1,2,3,4,99\nB,1,2,3,4,\n", r"line 2: more cells than the header"),
        # a column twice: the csv module would keep the last one silently
        (f"{head},coordX\nA,1,2,3,4,99\n", r"line 1: the column\(s\) \['coordX'\] appear"),
    ):
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(medproc.ReadError, match="bad.csv: " + says):
            read_luna_csv(bad)


def test_json_boxes_and_points(tmp_path):
    doc = {
        "coordinate_system": "LPS",
        "box_mode": "xyzxyz",
        "cases": [
            {
                "image": "case7.nii.gz",
                "boxes": [[-10, -20, 0, 10, 20, 6]],
                "labels": [2],
                "points": [[1, 2, 3, 8]],
            }
        ],
    }
    p = tmp_path / "l.json"
    p.write_text(json.dumps(doc))
    les = read_json(p, image="/data/case7.nii.gz")
    assert les.kinds == ["box", "point"] and les.labels.tolist() == [2, 0]
    np.testing.assert_allclose(les.centers, [[0, 0, 3], [-1, -2, 3]])
    np.testing.assert_allclose(les.sizes[0], [20, 40, 6])
    # MONAI's detection datalist layout (world, cccwhd)
    p.write_text(
        json.dumps({"training": [{"image": "a.nii.gz", "box": [[1, 2, 3, 4, 5, 6]], "label": [1]}]})
    )
    np.testing.assert_allclose(read_json(p)["a"].sizes, [[4, 5, 6]])
    p.write_text('{"cases": [{"image": "a", "boxes": [[1, 2, 3]]}]}')
    with pytest.raises(medproc.ReadError, match=r"cases\[0\].boxes\[0\]: expected 6"):
        read_json(p)
    # a key twice: json would keep the last silently (here the second boxes)
    p.write_text('{"cases": [{"image": "a", "boxes": [[0, 0, 0, 1, 1, 1]], "boxes": []}]}')
    with pytest.raises(medproc.ReadError, match=r"l.json: the key 'boxes' appears twice"):
        read_json(p)
    p.write_text('{"cases": [\n{"image": "a",,}]}')
    with pytest.raises(medproc.ReadError, match=r"l.json: line 2: not valid JSON"):
        read_json(p)


def test_dicom_seg_lines_up(quiet):
    from pydicom.data import get_testdata_file

    path = get_testdata_file("liver.dcm")
    seg = read_seg(path)
    vol = medproc.load(path)  # the same frames through the image reader
    np.testing.assert_allclose(seg.affine, vol.affine, atol=1e-6)
    assert seg.meta["segments"] == {1: "Liver"}
    np.testing.assert_array_equal(seg.array, vol.array * 1)
    ds = pydicom.dcmread(path)
    assert int(seg.array.sum()) == int(ds.pixel_array.sum())
    # (i, j, k): slice k of the label is a frame (rows, columns) transposed, each frame once
    frames = ds.pixel_array
    assert seg.shape == (int(ds.Columns), int(ds.Rows), frames.shape[0])
    found = [
        [f for f in range(frames.shape[0]) if np.array_equal(seg.array[:, :, k], frames[f].T)]
        for k in range(seg.shape[2])
    ]
    assert sorted(sum(found, [])) == list(range(frames.shape[0])), found
    assert not np.array_equal(frames[0], frames[0].T)  # so the transpose is seen


def rtstruct_case(tmp_path):
    """A phantom with an off-centre lesion and an RTSTRUCT file (ROI "GTV", number 3) of its
    contours: ``(path, image Volume, phantom label array)``. (i, j, k) = 64 columns, 56 rows,
    24 slices of 2 mm; the lesion off-centre in-plane, so a contour rasterised with i and j
    swapped would miss it."""
    shape, sp = (64, 56, 24), (1.0, 1.0, 2.0)
    aff = grid_affine(shape, sp, (-32.0, -28.0, -24.0))
    cx, cy = 9.0, -6.0  # LPS mm
    les = Lesion((cx, cy, 0.0), 24.0, 80.0)
    img, lab = ct_phantom(shape, aff, [les])
    vol = medproc.Volume(img, aff)
    ds = pydicom.Dataset()
    ds.Modality = "RTSTRUCT"
    roi = pydicom.Dataset()
    roi.ROINumber, roi.ROIName = 3, "GTV"
    ds.StructureSetROISequence = [roi]
    rc = pydicom.Dataset()
    rc.ReferencedROINumber = 3
    contours = []
    for k in range(shape[2]):
        z = vol.voxel_to_world([0, 0, k])[2]
        if abs(z) >= 12:
            continue
        r = np.sqrt(144 - z * z)
        t = np.linspace(0, 2 * np.pi, 72, endpoint=False)
        pts = np.stack([cx + r * np.cos(t), cy + r * np.sin(t), np.full_like(t, z)], 1)  # LPS
        c = pydicom.Dataset()
        c.ContourGeometricType = "CLOSED_PLANAR"
        c.NumberOfContourPoints = len(pts)
        c.ContourData = [f"{v:.3f}" for v in pts.ravel()]
        contours.append(c)
    rc.ContourSequence = contours
    ds.ROIContourSequence = [rc]
    ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    p = tmp_path / "rt.dcm"
    ds.save_as(p, enforce_file_format=False)
    return p, vol, lab


def test_rtstruct_contours_rasterise_onto_the_lesion(tmp_path):
    p, vol, lab = rtstruct_case(tmp_path)
    mask = read_rtstruct(p, vol, roi="gtv")
    assert mask.shape == vol.shape and set(np.unique(mask.array)) == {0, 3}
    assert dice(mask.array > 0, lab > 0) >= 0.9
    with pytest.raises(medproc.MedprocError, match="no ROI named 'liver'.*GTV"):
        read_rtstruct(p, vol, roi="liver")


def test_convert_writes_annotations_next_to_outputs(sample_data, tmp_path):
    out = tmp_path / "o"
    assert (
        main(
            [
                "convert",
                os.path.join(sample_data, "dicom"),
                os.path.join(sample_data, "nifti", "images"),
                "-o",
                str(out),
                "--spacing",
                "1.5",
                "--orientation",
                "RAS",
                "--annotations",
                os.path.join(sample_data, "lesions.csv"),
                "-j",
                "1",
            ]
        )
        == 0
    )
    for name in ("case001", "case002"):
        doc = json.load(open(out / f"{name}.annotations.json"))
        assert len(doc["lesions"]) == 2
        label = medproc.load(os.path.join(sample_data, "nifti", "labels", f"{name}.nii.gz"))
        img = nib.load(str(out / f"{name}.nii.gz"))
        for n, les in enumerate(doc["lesions"], 1):
            i, j, k = np.round(les["center_voxel"]).astype(int)  # index into nibabel's array
            world = nib.affines.apply_affine(img.affine, [i, j, k])
            src = np.round(label.world_to_voxel(world)).astype(int)
            assert label.array[tuple(src)] == n  # the centre voxel is on the labelled lesion
            assert np.asarray(img.dataobj)[i, j, k] > 0  # and bright in the output image
    doc = json.load(open(out / "series-fbcae63ddf02.annotations.json"))
    assert len(doc["lesions"]) == 2 and all(x["inside"] for x in doc["lesions"])


def test_a_seg_that_leaves_out_slices_is_placed_on_its_image(tmp_path, quiet):
    """A SEG whose frames leave out slices (here its last frame moved 2 slices on, as if the
    two empty ones between were not written) has no evenly spaced grid of its own: read_seg
    says to give the image, and with it each frame lands on its own slice of that image."""
    from pydicom.data import get_testdata_file

    path = get_testdata_file("liver.dcm")
    whole = read_seg(path)  # 3 frames, 1 mm apart along k
    ds = pydicom.dcmread(path)
    frames = ds.pixel_array
    pos = ds.PerFrameFunctionalGroupsSequence[2].PlanePositionSequence[0]
    pos.ImagePositionPatient = [float(x) for x in pos.ImagePositionPatient[:2]] + [
        float(pos.ImagePositionPatient[2]) + 2.0
    ]
    gap = str(tmp_path / "gap.dcm")
    ds.save_as(gap)
    with pytest.raises(medproc.errors.GeometryError, match=r"gap.dcm: .*read_seg\(path, image="):
        read_seg(gap)
    image = medproc.Volume(np.zeros(whole.shape[:2] + (6,), np.int16), whole.affine)
    placed = read_seg(gap, image=image)
    np.testing.assert_array_equal(placed.affine, image.affine)
    assert placed.meta["segments"] == {1: "Liver"} and placed.shape == image.shape
    order = [  # which frame each slice of the whole SEG is
        next(f for f in range(3) if np.array_equal(whole.array[:, :, k], frames[f].T))
        for k in range(3)
    ]
    for k, f in enumerate(order):  # frames 0 and 1 where they were, frame 2 two slices on
        at = k + 2 if f == 2 else k
        np.testing.assert_array_equal(placed.array[:, :, at], frames[f].T)
    assert int(placed.array.sum()) == int(frames.sum())
    # its middle frame left out: two frames 2 mm apart look even, but the SEG declares 1 mm
    from pydicom.pixels import pack_bits

    ds = pydicom.dcmread(path)
    del ds.PerFrameFunctionalGroupsSequence[1]
    ds.NumberOfFrames, ds.PixelData = 2, pack_bits(frames[[0, 2]])
    ds.save_as(str(tmp_path / "gap2.dcm"))
    with pytest.raises(medproc.errors.GeometryError, match=r"declares SpacingBetweenSlices 1 mm"):
        read_seg(tmp_path / "gap2.dcm")


_HEAD = "seriesuid,coordX,coordY,coordZ,diameter_mm\n"


@pytest.mark.parametrize(
    "doc, says",
    [
        ({"cases": [{"image": "a.nii.gz", "boxes": 0}]}, "boxes: must be a list, got int 0"),
        ({"cases": [{"image": "a.nii.gz", "boxes": False}]}, "boxes: must be a list, got bool"),
        ({"cases": [{"image": "a.nii.gz", "points": ""}]}, "points: must be a list, got str"),
        ({"cases": [{"image": "a.nii.gz", "boxes": {}}]}, "boxes: must be a list, got dict"),
        (
            {"cases": [{"image": "a.nii.gz", "boxes": [[0, 0, 0, 5, 5, 5]], "labels": 0}]},
            "labels: must be a list",
        ),
        ({"training": [{"image": "a.nii.gz", "box": [0, 0, 0, 5, 5, 5]}]}, "box must be a list"),
        # a MONAI datalist's errors name its own keys ('box', 'label'), not medproc's
        ({"training": [{"image": "a.nii.gz", "box": 0}]}, "training[0].box: must be a list"),
        (
            {"validation": [{"image": "a.nii.gz", "box": [[0, 0, 0, 5, 5, 5]], "label": [0, 1]}]},
            "1 boxes but 2 labels ('box', 'label')",
        ),
        (
            {"training": [{"image": "a.nii.gz", "box": [[0, 0, 0, 5, 5, 5]], "label": [1.5]}]},
            "training[0].label[0]: a label must be an integer",
        ),
        ({"training": [{"image": "a.nii.gz", "box": [[0, 0, 0, 5, 5]]}]}, "training[0].box[0]:"),
        ({"cases": [{"image": "a.nii.gz", "points": [[0, 0, 0, 1e200]]}]}, "not a lesion"),
        ({"cases": [{"image": "a.nii.gz", "points": [[1e9, 0, 0, 5]]}]}, "not a position"),
        ({"cases": [{"image": "a.nii.gz", "boxes": [[0, 0, 0, 1, 1, 3e3]]}]}, "not a lesion"),
    ],
)
def test_json_values_of_the_wrong_type_or_size_are_errors_not_no_lesions(tmp_path, doc, says):
    p = tmp_path / "ann.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(medproc.MedprocError, match="ann.json") as e:
        read_json(str(p))
    assert says in str(e.value)


@pytest.mark.parametrize(
    "row, says",
    [
        ("a,1_000,0,0,5\n", "must be numbers"),
        ('"a,0,0,0,10\n', "fewer fields than the header"),
        ("a,0,0,0,1e300\n", "not a lesion"),
        ("a,0,2e5,0,5\n", "not a position"),
    ],
)
def test_luna_rows_that_are_no_lesion_are_errors_naming_the_line(tmp_path, row, says):
    p = tmp_path / "les.csv"
    p.write_text(_HEAD + row)
    with pytest.raises(medproc.MedprocError, match="les.csv") as e:
        read_luna_csv(str(p))
    assert says in str(e.value) and "line 2" in str(e.value)


def test_null_and_absent_lesion_lists_are_no_lesions(tmp_path):
    p = tmp_path / "ann.json"
    p.write_text(json.dumps({"cases": [{"image": "a.nii.gz", "boxes": None}, {"image": "b.nii"}]}))
    got = read_json(str(p))
    assert len(got["a"]) == 0 and len(got["b"]) == 0


def test_a_monai_datalist_without_a_coordinate_system_says_how_its_boxes_are_read(tmp_path):
    """MONAI's LUNA16 datalists hold LPS boxes and do not say so: read as RAS (MONAI's default)
    every box would land with x and y negated, on background. So medproc says how it reads
    them, and 'coordinate_system' at the top level settles it."""
    item = {"image": "a.nii.gz", "box": [[10.0, -20.0, 30.0, 4, 4, 4]], "label": [1]}
    p = tmp_path / "dl.json"
    p.write_text(json.dumps({"training": [item]}))
    with pytest.warns(medproc.MedprocWarning, match="dl.json: .*without 'coordinate_system'.*LPS"):
        ras = read_json(str(p))["a"]
    np.testing.assert_allclose(ras.centers, [[10.0, -20.0, 30.0]])
    for system, centre in (("LPS", [-10.0, 20.0, 30.0]), ("RAS", [10.0, -20.0, 30.0])):
        p.write_text(json.dumps({"coordinate_system": system, "training": [item]}))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said: no warning
            np.testing.assert_allclose(read_json(str(p))["a"].centers, [centre])
    p.write_text(json.dumps({"training": [{"image": "a.nii.gz", "label": "a_seg.nii.gz"}]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a segmentation datalist: no boxes, nothing to say
        read_json(str(p))


@pytest.mark.parametrize(
    "key, said",
    [
        ("coordinate_sytem", "did you mean 'coordinate_system'?"),
        ("boxmode", "did you mean 'box_mode'?"),
        ("units", "read as millimetres"),
    ],
)
def test_a_mistyped_top_level_key_is_an_error_not_the_defaults(tmp_path, key, said):
    """{"coordinate_sytem": "LPS", ...} was read as RAS cccwhd without a word: the boxes
    landed elsewhere. A near miss of a known key, or a unit, is an error naming it."""
    import re

    p = tmp_path / "l.json"
    doc = {key: "LPS", "cases": [{"image": "c.nii.gz", "boxes": [[-10, -10, -10, 10, 10, 10]]}]}
    p.write_text(json.dumps(doc))
    with pytest.raises(medproc.errors.ReadError, match=re.escape(said)):
        read_json(p)
    doc.pop(key)
    p.write_text(json.dumps({**doc, "name": "x", "description": "y"}))  # other keys: read
    assert len(read_json(p)) == 1


@pytest.mark.parametrize(
    "kw, said",
    [
        (dict(kinds=["point"]), "2 centres but 1 kinds"),
        (dict(kinds=["blob", "box"]), "kinds must be 'point' or 'box', got 'blob'"),
        (dict(labels=[1]), "2 centres but 1 labels"),
        (dict(sizes=[[1, 1, 1], [-5, 1, 1]]), r"sizes\[1\] is negative"),
        (dict(centers=[[0, 0, 0], [np.nan, 0, 0]]), r"centers\[1\] is not finite"),
    ],
)
def test_lesions_refuse_what_would_place_them_wrong(kw, said):
    """Lesions took kinds shorter than its centres (IndexError later), negative sizes (an
    inverted voxel box) and NaN centres (NaN boxes downstream)."""
    args = dict(centers=np.zeros((2, 3)), sizes=np.ones((2, 3))) | kw
    with pytest.raises(ValueError, match=said):
        Lesions(**args)


@pytest.mark.parametrize(
    "key",
    ["case001.nii.gz", "/data/luna/case001.nii.gz", "D:\\data\\case001.nii.gz", "sub/case001.mhd"],
)
def test_an_image_named_by_file_name_or_path_gets_its_lesions(tmp_path, sample_data, key):
    """A LUNA-style CSV keyed by a file name or path (POSIX or Windows), or a JSON whose image
    is a Windows path: LoadVolumed found no lesions and said nothing, so the case trained as a
    negative (a prober's files). Keys are read as the file's stem, as a JSON's were; the
    lesions equal those of the stem-keyed table, in LoadVolumed too; a UID stays as it is."""
    from medproc.monai import LoadVolumed

    rows = "-62.0,-10.0,5.0,14.0\n75.0,15.0,-20.0,10.0\n"
    head = "seriesuid,coordX,coordY,coordZ,diameter_mm\n"
    ref, named = tmp_path / "ref.csv", tmp_path / "named.csv"
    ref.write_text(head + "".join(f"case001,{r}\n" for r in rows.splitlines()))
    named.write_text(head + "".join(f'"{key}",{r}\n' for r in rows.splitlines()))
    want = read_luna_csv(str(ref))["case001"]
    got = read_luna_csv(str(named))
    assert list(got) == ["case001"]
    np.testing.assert_allclose(got["case001"].centers, want.centers)
    np.testing.assert_allclose(read_luna_csv(str(named), series=key).centers, want.centers)
    doc = {"coordinate_system": "LPS", "cases": [{"image": key, "points": [[1, 2, 3, 4]]}]}
    (tmp_path / "named.json").write_text(json.dumps(doc))
    assert list(read_json(str(tmp_path / "named.json"))) == ["case001"]
    image = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    d = LoadVolumed(["image"], lesion_key="les")({"image": image, "les": str(named)})
    np.testing.assert_allclose(d["les"].centers, want.centers)
    uid = "1.2.826.0.1.3680043.8.498.2026.1.1"
    (tmp_path / "uid.csv").write_text(head + f"{uid},{rows.splitlines()[0]}\n")
    assert list(read_luna_csv(str(tmp_path / "uid.csv"))) == [uid]
    two = tmp_path / "two.csv"  # two images of one stem: refused, not merged into one
    two.write_text(head + f"site1/case001.nii.gz,{rows.splitlines()[0]}\n"
                   f"site2/case001.nii.gz,{rows.splitlines()[1]}\n")  # fmt: skip
    with pytest.raises(medproc.errors.ReadError, match=r"line 3: 'site2.*line 2.*'case001'"):
        read_luna_csv(str(two))


def test_a_repeated_luna_row_is_read_once_with_a_warning(tmp_path):
    """A row given twice (same image, centre and diameter) was two lesions: two boxes on one
    nodule in detection training, said nowhere. It is read once; the warning names both lines.
    A second lesion of the same image, or the same centre with another diameter, stays."""
    p = tmp_path / "les.csv"
    p.write_text(_HEAD + "a,1,2,3,5\na,7,8,9,5\na,1,2,3,5\na,1,2,3,6\nb,1,2,3,5\n")
    with pytest.warns(medproc.MedprocWarning, match=r"les.csv: line 4 repeats line 2 .*1 rep"):
        got = read_luna_csv(str(p))
    assert len(got["a"]) == 3 and len(got["b"]) == 1
    np.testing.assert_allclose(got["a"].centers, [[-1, -2, 3], [-7, -8, 9], [-1, -2, 3]])
    np.testing.assert_allclose(got["a"].sizes[:, 0], [5, 5, 6])


def test_lesions_outside_their_image_are_named_and_an_lps_ras_mixup_is_said(tmp_path):
    """Lesions of a table in LPS read as RAS (or of another image) lie off the image: convert
    wrote them as "inside": false on the output only when the output grid missed them, and
    LoadVolumed said nothing, so a detection model trained on boxes beside the body. The
    input image is checked now: the warning names the lesion and, when negating x and y puts
    every lesion inside, the likely LPS/RAS mix-up. A correct table says nothing."""
    from medproc.monai import LoadVolumed

    aff = np.diag([2.0, 2.0, 2.0, 1.0])  # RAS x, y, z in [0, 78] mm: off the origin
    img = tmp_path / "scan.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((40, 40, 20), np.int16), aff), str(img))
    head = "seriesuid,coordX,coordY,coordZ,diameter_mm\n"
    right, mixed, away = (tmp_path / f"{n}.csv" for n in ("right", "mixed", "away"))
    right.write_text(head + "scan,-30,-50,10,6\nscan,-70,-4,30,5\n")  # LPS of RAS (30,50),(70,4)
    mixed.write_text(head + "scan,30,50,10,6\nscan,70,4,30,5\n")  # RAS given as LPS
    away.write_text(head + "scan,-30,-50,10,6\nscan,-30,-50,300,5\n")  # 300 mm: past the top
    load = LoadVolumed(["image"], lesion_key="les")
    with warnings.catch_warnings():
        warnings.simplefilter("error", medproc.MedprocWarning)
        d = load({"image": str(img), "les": str(right)})
    assert len(d["les"]) == 2
    with pytest.warns(medproc.MedprocWarning, match=r"mixed.csv on .*scan.nii.gz: 2 of 2 lesion"
                      r"\(s\) lie outside the image \(first: mixed.csv:2 at RAS \(-30, -50, 10\)"
                      r".*x and y negated all lie inside; are LPS"):  # fmt: skip
        load({"image": str(img), "les": str(mixed)})
    with pytest.warns(medproc.MedprocWarning, match=r"away.csv:3 at RAS \(30, 50, 300\) mm\): do "):
        load({"image": str(img), "les": str(away)})
    out = tmp_path / "o"
    args = ["convert", str(img), "-o", str(out), "--spacing", "4", "-q"]
    assert main(args + ["--annotations", str(mixed)]) == 0
    (row,) = _rows(out / "manifest.csv")
    assert "2 of 2 lesion(s) lie outside the image" in row["warnings"]
    assert "negated" in row["warnings"]
    assert main(["convert", str(img), "-o", str(tmp_path / "o2"), "--spacing", "4", "-q",
                 "--annotations", str(right)]) == 0  # fmt: skip
    (row,) = _rows(tmp_path / "o2" / "manifest.csv")
    assert "outside" not in row["warnings"]


def _rows(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))
