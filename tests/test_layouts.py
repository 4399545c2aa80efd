"""Training layouts from a finished conversion: nnU-Net v2 raw datasets (checked against the
schema nnU-Net documents and, where nnunetv2 is installed, its own verifier) and MONAI decathlon
datalists (read with MONAI's load_decathlon_datalist); labels from label maps, DICOM SEG and
RTSTRUCT put on the output grid."""

import json
import os
import re

import nibabel as nib
import numpy as np
import pydicom
import pytest
from dicom_seg import write_seg

import medproc
from medproc.annotations import read_rtstruct
from medproc.convert import convert
from medproc.layouts import (
    find_dicom_labels,
    label_on_grid,
    write_monai_datalist,
    write_nnunet,
)
from medproc.sample_data import Lesion, ct_phantom

# the bundled axial series' lesions (make_bundled), LPS mm, and its series UID
LESIONS_LPS = [((-62.0, -10.0, 5.0), 14.0), ((75.0, 15.0, -20.0), 10.0)]
AXIAL_UID = "1.2.826.0.1.3680043.8.498.2026.1.1"


@pytest.fixture(scope="module")
def converted(sample_data, tmp_path_factory):
    """The bundled data (2 DICOM series, 2 NIfTI cases with label maps) at 3 mm RAS."""
    out = str(tmp_path_factory.mktemp("conv") / "out")
    rows = convert(
        [os.path.join(sample_data, "dicom"), os.path.join(sample_data, "nifti", "images")],
        out,
        medproc.Spec(spacing=3.0, orientation="RAS"),
        labels_dir=os.path.join(sample_data, "nifti", "labels"),
    )
    assert [r["status"] for r in rows] == ["ok"] * 4
    return out, {r["series_uid"] or r["case"]: r for r in rows}


def _check_nnunet_schema(d):
    """dataset.json and folders as nnU-Net v2's dataset_format.md and verify_dataset_integrity
    require: keys and types, background 0 and consecutive labels, one _0000 image per case,
    numTraining = labelled cases, label grids = image grids, values only those declared."""
    doc = json.load(open(os.path.join(d, "dataset.json")))
    assert {"channel_names", "labels", "numTraining", "file_ending"} <= set(doc)
    assert doc["file_ending"] == ".nii.gz" and isinstance(doc["numTraining"], int)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in doc["channel_names"].items())
    assert list(doc["channel_names"]) == ["0"]
    labels = doc["labels"]
    assert labels["background"] == 0 and all(isinstance(v, int) for v in labels.values())
    assert sorted(labels.values()) == list(range(len(labels)))  # consecutive, as nnU-Net asserts
    images = sorted(os.listdir(os.path.join(d, "imagesTr")))
    assert all(re.fullmatch(r".+_0000\.nii\.gz", f) for f in images)
    ids = [f[: -len("_0000.nii.gz")] for f in images]
    assert sorted(os.listdir(os.path.join(d, "labelsTr"))) == [f"{i}.nii.gz" for i in ids]
    assert doc["numTraining"] == len(ids) > 0
    for i in ids:
        img = nib.load(os.path.join(d, "imagesTr", f"{i}_0000.nii.gz"))
        lab = nib.load(os.path.join(d, "labelsTr", f"{i}.nii.gz"))
        assert img.shape == lab.shape and np.allclose(img.affine, lab.affine, atol=1e-5)
        assert set(np.unique(np.asarray(lab.dataobj)).tolist()) <= set(labels.values())
    return doc, ids


def test_nnunet_from_label_maps(converted, tmp_path):
    out, rows = converted
    d = write_nnunet(out, tmp_path / "raw" / "Dataset501_Sample")
    doc, ids = _check_nnunet_schema(d)
    assert ids == ["case001", "case002"] and doc["numTraining"] == 2
    assert doc["labels"] == {"background": 0, "label_1": 1, "label_2": 2}
    assert doc["channel_names"] == {"0": "CT"}  # HU: nnU-Net's CT normalisation
    for case in ids:  # hard links to the outputs: no copy, same bytes
        assert os.path.samefile(
            os.path.join(d, "imagesTr", f"{case}_0000.nii.gz"), rows[case]["output"]
        )
        assert os.path.samefile(
            os.path.join(d, "labelsTr", f"{case}.nii.gz"), rows[case]["label_output"]
        )
    # the DICOM series have no label: inference images
    assert len(os.listdir(os.path.join(d, "imagesTs"))) == 2
    assert [f for f in os.listdir(tmp_path / "raw") if f.startswith(".")] == []  # no leftovers
    nnunet = pytest.importorskip("nnunetv2.experiment_planning.verify_dataset_integrity")
    nnunet.verify_dataset_integrity(d, num_processes=1)


def test_nnunet_refuses_bad_names_and_existing_folders_and_replaces_with_overwrite(
    converted, tmp_path
):
    out, _ = converted
    with pytest.raises(ValueError, match="Dataset501_Lungs"):
        write_nnunet(out, tmp_path / "lungs")
    d = write_nnunet(out, tmp_path / "Dataset002_A", link="copy")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_nnunet(out, d)
    open(os.path.join(d, "stale.txt"), "w").close()  # (a file the user added: kept, said)
    open(os.path.join(d, "imagesTr", "old_0000.nii.gz"), "w").close()  # (medproc's: replaced)
    with pytest.warns(medproc.MedprocWarning, match=r"kept 1 entry\(ies\).*\(stale.txt\)"):
        write_nnunet(out, d, overwrite=True, channel_name="zscore")
    assert os.path.exists(os.path.join(d, "stale.txt"))
    assert not os.path.exists(os.path.join(d, "imagesTr", "old_0000.nii.gz"))
    assert json.load(open(os.path.join(d, "dataset.json")))["channel_names"] == {"0": "zscore"}
    assert sorted(os.listdir(tmp_path)) == ["Dataset002_A"]
    with pytest.raises(FileExistsError, match=r"Dataset002_A has the dataset ID 002 of Dat"):
        write_nnunet(out, tmp_path / "Dataset002_B")  # (nnU-Net refuses two of one ID)
    os.rename(d, tmp_path / "Dataset002_A.bak")  # (nnU-Net takes any DatasetNNN* folder)
    with pytest.raises(FileExistsError, match=r"Dataset002_A.bak has the dataset ID 002"):
        write_nnunet(out, tmp_path / "Dataset002_C")
    os.rename(tmp_path / "Dataset002_A.bak", d)


def test_label_values_with_gaps_are_renumbered_consistently(converted, tmp_path):
    out, rows = converted
    gapped = {}
    for case, new in (("case001", (0, 2, 7)), ("case002", (0, 7, 9))):
        lab = medproc.load(rows[case]["label_output"])
        arr = np.asarray(lab.array)
        p = str(tmp_path / f"{case}.nii.gz")
        medproc.save(lab.with_array(np.choose(arr, new).astype(np.uint8)), p)
        gapped[case] = p
    d = write_nnunet(out, tmp_path / "Dataset003_Gaps", labels=gapped, label_names={7: "nodule"})
    doc, ids = _check_nnunet_schema(d)
    assert doc["labels"] == {"background": 0, "label_2": 1, "nodule": 2, "label_9": 3}
    for case, new in (("case001", (0, 2, 7)), ("case002", (0, 7, 9))):
        src = np.asarray(medproc.load(rows[case]["label_output"]).array)
        got = np.asarray(nib.load(os.path.join(d, "labelsTr", f"{case}.nii.gz")).dataobj)
        want = {2: 1, 7: 2, 9: 3}
        for v, n in enumerate(new[1:], 1):
            assert np.array_equal(got == want[n], src == v)


def _axial_label(sample_data):
    """The bundled axial series and its lesion label map on its own grid (the phantom's)."""
    v = medproc.load(os.path.join(sample_data, "dicom", "ct_axial"))
    _, lab = ct_phantom(v.shape, v.affine, [Lesion(c, d) for c, d in LESIONS_LPS])
    return v, lab


def _write_seg(path, image, lab, names):
    """A minimal multi-frame DICOM SEG (8-bit frames): one frame per segment and slice."""
    frames = [
        (k, n, lab[:, :, k] == n)
        for n in names
        for k in range(image.shape[2])
        if (lab[:, :, k] == n).any()
    ]
    write_seg(path, image.affine, image.shape, frames, names, ref=image.meta["series_uid"])


def _expected_on(out_path, lesion_numbers):
    """The phantom's lesion label computed analytically on an output grid."""
    img = nib.load(out_path)
    les = [Lesion(*LESIONS_LPS[n - 1]) for n in lesion_numbers]
    return ct_phantom(img.shape, img.affine, les)[1]


def _dice(a, b):
    return 2 * (a & b).sum() / max(1, a.sum() + b.sum())


def test_dicom_seg_labels_land_on_the_output_grid(converted, sample_data, tmp_path):
    out, rows = converted
    image, lab = _axial_label(sample_data)
    seg_dir = tmp_path / "dicom_tree" / "seg"
    seg_dir.mkdir(parents=True)
    _write_seg(str(seg_dir / "seg.dcm"), image, lab, {1: "nodule right", 2: "nodule left"})
    found = find_dicom_labels([str(tmp_path / "dicom_tree"), os.path.join(sample_data, "dicom")])
    assert found == {AXIAL_UID: str(seg_dir / "seg.dcm")}
    with pytest.raises(medproc.MedprocError, match="label_names"):  # named + bare values
        write_nnunet(out, tmp_path / "Dataset004_Seg", labels=found)
    case = rows[AXIAL_UID]["case"]
    d = write_nnunet([rows[AXIAL_UID]], tmp_path / "Dataset004_Seg", labels=found)  # rows too
    doc, ids = _check_nnunet_schema(d)
    assert doc["labels"] == {"background": 0, "nodule right": 1, "nodule left": 2}
    assert ids == [case]
    got = np.asarray(nib.load(os.path.join(d, "labelsTr", f"{case}.nii.gz")).dataobj)
    # exactly what converting the image with this label map on its grid gives (same plan)
    _, want = medproc.resample(image, spacing=3.0, orientation="RAS", label=image.with_array(lab))
    np.testing.assert_array_equal(got, want.array)
    assert {1, 2} <= set(np.unique(got).tolist())
    analytic = _expected_on(rows[AXIAL_UID]["output"], [1, 2])
    assert all(_dice(got == n, analytic == n) > 0.75 for n in (1, 2))  # on the lesions
    # a SEG of one lesion (contiguous frames: read_seg's own grid), named "nodule right" again
    one = np.where(lab == 1, 1, 0).astype(np.uint8)
    _write_seg(str(seg_dir / "seg.dcm"), image, one, {1: "nodule right"})
    d = write_nnunet([rows[AXIAL_UID]], d, labels=found, overwrite=True)
    doc, _ = _check_nnunet_schema(d)
    assert doc["labels"] == {"background": 0, "nodule right": 1}
    got = np.asarray(nib.load(os.path.join(d, "labelsTr", f"{case}.nii.gz")).dataobj)
    np.testing.assert_array_equal(got, want.array == 1)


def test_a_seg_off_its_series_or_with_an_undeclared_segment_is_refused(
    converted, sample_data, tmp_path
):
    """A SEG whose frames lie 5 m away from the series it names became an all-background
    label with a warning; a segment number the SEG does not declare became class 'label_7'.
    Both are errors naming the file (the layout leaves the case out); the second is read_seg's."""
    out, rows = converted
    image, lab = _axial_label(sample_data)
    found = {AXIAL_UID: str(tmp_path / "seg.dcm")}
    far = image.affine.copy()
    far[:3, 3] += 5000
    ks = [k for k in range(image.shape[2]) if (lab[:, :, k] == 1).any()]
    frames = [(k, 1, lab[:, :, k] == 1) for k in ks]
    write_seg(found[AXIAL_UID], far, image.shape, frames, {1: "gtv"}, ref=AXIAL_UID)
    with pytest.raises(medproc.MedprocError, match="every labelled voxel lies outside"):
        write_nnunet([rows[AXIAL_UID]], tmp_path / "Dataset011_Far", labels=found)
    frames = [(k, 7, lab[:, :, k] == 1) for k in ks]
    write_seg(found[AXIAL_UID], image.affine, image.shape, frames, {1: "gtv"}, ref=AXIAL_UID)
    with pytest.raises(medproc.ReadError, match=r"frame 1: references segment 7, which its"):
        write_nnunet([rows[AXIAL_UID]], tmp_path / "Dataset012_Undeclared", labels=found)


def test_rtstruct_labels_land_on_the_output_grid_by_roi_name(converted, sample_data, tmp_path):
    out, rows = converted
    image, lab = _axial_label(sample_data)
    ds = pydicom.Dataset()
    ds.Modality = "RTSTRUCT"
    roi = pydicom.Dataset()
    roi.ROINumber, roi.ROIName = 7, "GTV"
    ds.StructureSetROISequence = [roi]
    (cx, cy, cz), diam = LESIONS_LPS[0]
    rc, contours = pydicom.Dataset(), []
    rc.ReferencedROINumber = 7
    for k in range(image.shape[2]):
        z = image.voxel_to_world([0, 0, k])[2]
        if abs(z - cz) < diam / 2 - 0.5:
            r, t = np.sqrt((diam / 2) ** 2 - (z - cz) ** 2), np.linspace(0, 2 * np.pi, 90)
            c = pydicom.Dataset()
            c.ContourGeometricType = "CLOSED_PLANAR"
            c.ContourData = [
                f"{v:.3f}"
                for v in np.stack(
                    [cx + r * np.cos(t), cy + r * np.sin(t), np.full_like(t, z)], 1
                ).ravel()
            ]
            contours.append(c)
    rc.ContourSequence = contours
    ds.ROIContourSequence = [rc]
    fr, st, se = pydicom.Dataset(), pydicom.Dataset(), pydicom.Dataset()
    se.SeriesInstanceUID = AXIAL_UID
    st.RTReferencedSeriesSequence = [se]
    fr.RTReferencedStudySequence = [st]
    ds.ReferencedFrameOfReferenceSequence = [fr]
    ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds.save_as(tmp_path / "rt.dcm", enforce_file_format=False)
    found = find_dicom_labels(str(tmp_path))
    assert found == {AXIAL_UID: str(tmp_path / "rt.dcm")}
    d = write_nnunet([rows[AXIAL_UID]], tmp_path / "Dataset005_Rt", labels=found)
    doc, ids = _check_nnunet_schema(d)
    assert doc["labels"] == {"background": 0, "GTV": 1}  # ROI 7 renumbered, named
    got = np.asarray(nib.load(os.path.join(d, "labelsTr", f"{ids[0]}.nii.gz")).dataobj)
    on_image = read_rtstruct(tmp_path / "rt.dcm", image)  # the reader, on the source grid
    _, want = medproc.resample(image, spacing=3.0, orientation="RAS", label=on_image)
    np.testing.assert_array_equal(got, (want.array == 7).astype(np.uint8))  # ROI 7 -> class 1
    assert _dice(got == 1, _expected_on(rows[AXIAL_UID]["output"], [1]) == 1) > 0.75


def test_monai_datalist_reads_with_monai(converted, sample_data, tmp_path):
    from monai.data import load_decathlon_datalist, load_decathlon_properties

    out, rows = converted
    p = write_monai_datalist(out, os.path.join(out, "datalist.json"), validation=["case002"])
    train = load_decathlon_datalist(p)
    val = load_decathlon_datalist(p, data_list_key="validation")
    test = load_decathlon_datalist(p, is_segmentation=False, data_list_key="test")
    assert train == [{"image": rows["case001"]["output"], "label": rows["case001"]["label_output"]}]
    assert val == [{"image": rows["case002"]["output"], "label": rows["case002"]["label_output"]}]
    assert sorted(x["image"] for x in test) == sorted(
        r["output"] for k, r in rows.items() if k.startswith("1.")
    )
    for x in json.load(open(p))["training"]:  # relative paths: the folder can move
        assert not os.path.isabs(x["image"]) and not os.path.isabs(x["label"])
    keys = ["labels", "numTraining", "numValidation", "numTest", "name"]
    props = load_decathlon_properties(p, keys)  # each count is its list's length
    assert (props["numTraining"], props["numValidation"], props["numTest"]) == (1, 1, len(test))
    assert props["labels"]["0"] == "background"
    # every list is there, empty or not; a validation name that is no case is an error
    p0 = write_monai_datalist(out, os.path.join(out, "all.json"))
    assert load_decathlon_datalist(p0, data_list_key="validation") == []
    with pytest.raises(ValueError, match=r"case999: no such case \(cases: case001, case002, "):
        write_monai_datalist(out, os.path.join(out, "bad.json"), validation=["case999"])
    with pytest.raises(TypeError, match="not one string"):  # (a str is a list of letters)
        write_monai_datalist(out, os.path.join(out, "bad.json"), validation="case002")
    assert not os.path.exists(os.path.join(out, "bad.json"))
    # a validation case that failed to convert is left out, with a warning
    failed = [dict(r, status="failed") if k == "case002" else r for k, r in rows.items()]
    with pytest.warns(UserWarning, match="case002 did not convert"):
        p3 = write_monai_datalist(failed, os.path.join(out, "f.json"), validation=["case002"])
    assert load_decathlon_datalist(p3, data_list_key="validation") == []
    # labels from a SEG elsewhere are written beside the list, on the output grid; the label
    # maps' values are named like the SEG's segments, so the classes agree
    image, lab = _axial_label(sample_data)
    _write_seg(str(tmp_path / "seg.dcm"), image, lab, {1: "a", 2: "b"})
    p2 = write_monai_datalist(
        out,
        str(tmp_path / "list" / "d.json"),
        labels={AXIAL_UID: str(tmp_path / "seg.dcm")},
        label_names={1: "a", 2: "b"},
    )
    items = {os.path.basename(x["image"]): x for x in load_decathlon_datalist(p2)}
    seg_item = items[os.path.basename(rows[AXIAL_UID]["output"])]
    assert seg_item["label"].startswith(str(tmp_path / "list" / "labels"))
    assert nib.load(seg_item["label"]).shape == nib.load(seg_item["image"]).shape


def test_label_on_grid_is_exact_nearest_neighbour():
    rng = np.random.default_rng(0)
    lab = medproc.Volume(
        rng.integers(0, 4, (10, 12, 8)).astype(np.uint8), np.diag([2.0, 2.0, 3.0, 1.0])
    )
    same = label_on_grid(lab, lab.affine, lab.shape)
    np.testing.assert_array_equal(same.array, lab.array)
    flip = lab.affine @ np.array([[-1, 0, 0, 9], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])
    np.testing.assert_array_equal(label_on_grid(lab, flip, lab.shape).array, lab.array[::-1])
    fine = lab.affine @ np.diag([0.5, 0.5, 1.0, 1.0])  # half the spacing, same origin
    up = label_on_grid(lab, fine, (19, 23, 8)).array
    assert up.dtype == np.uint8 and np.array_equal(up[::2, ::2], lab.array)  # on the voxels
    shifted = lab.affine @ np.array([[1, 0, 0, 20.0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    assert not label_on_grid(lab, shifted, lab.shape).array.any()  # outside: 0


def test_a_dataset_folder_gets_the_usual_permissions(converted, tmp_path, monkeypatch):
    """Built in a temporary folder then renamed: it ends with 0777 less the umask (as
    os.makedirs would make it), not mkdtemp's owner-only 0700, which shut out the other users
    of a shared nnUNet_raw."""
    import medproc.io.atomic as atomic

    out, _ = converted
    monkeypatch.setattr(atomic, "_UMASK", 0o022)
    d = write_nnunet(out, tmp_path / "Dataset007_Perm", link="copy")
    assert os.stat(d).st_mode & 0o777 == 0o755
