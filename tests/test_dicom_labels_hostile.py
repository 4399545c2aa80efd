"""Hostile DICOM SEG / RTSTRUCT labels (medproc.annotations.dicom_labels) and what the training
layouts make of them (medproc._layout_labels): a SEG that leaves out slices lands on its own
slices, overlapping ROIs are said, inner contours are holes, ROI numbers are identifiers,
empty labels and labels of no case are never used silently. Expected voxels are computed from
the geometry the test writes, not from the reader."""

import json
import os
import re
import warnings

import nibabel as nib
import numpy as np
import pydicom
import pytest
from dicom_seg import write_seg as seg_file
from pydicom.dataset import Dataset, FileMetaDataset

import medproc
from medproc.annotations import read_rtstruct, read_seg
from medproc.convert import convert
from medproc.errors import GeometryError, MedprocError, MedprocWarning, ReadError
from medproc.layouts import find_dicom_labels, write_monai_datalist, write_nnunet

SHAPE = (48, 48, 30)
AFFINE = np.array([[1.0, 0, 0, -24], [0, 1.0, 0, -24], [0, 0, 2.5, -37.5], [0, 0, 0, 1]])
UID = "1.2.826.0.1.3680043.8.498.77.1"
_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """One NIfTI image converted on its own grid: (manifest rows, image Volume, tmp folder)."""
    d = tmp_path_factory.mktemp("hostile")
    os.makedirs(d / "images")
    arr = np.random.default_rng(0).integers(-1000, 400, SHAPE).astype(np.int16)
    nib.save(nib.Nifti1Image(arr, AFFINE), str(d / "images" / "ct.nii.gz"))
    rows = convert([str(d / "images")], str(d / "out"), medproc.Spec(), workers=1)
    assert [r["status"] for r in rows] == ["ok"]
    out = nib.load(rows[0]["output"])
    assert out.shape == SHAPE and np.allclose(out.affine, AFFINE)  # (labels need no resampling)
    return rows, medproc.load(str(d / "images" / "ct.nii.gz")), d


def _square(lo=20, hi=30):
    m = np.zeros(SHAPE[:2], bool)
    m[lo:hi, lo:hi] = True
    return m


def write_seg(path, frames, names, *, thickness=2.5, n_frames=None, ref=UID):
    """A SEG on the image's grid: frames = [(slice k (may be fractional), segment, mask (i, j))]."""
    return seg_file(path, AFFINE, SHAPE, frames, names, ref=ref, thickness=thickness,
                    n_frames=n_frames)  # fmt: skip


def write_rt(path, rois, contours, ref=UID):
    """rois = [(ROI number, name)] in file order; contours = [(ROI number, k, [(i, j), ...])]."""
    ds = Dataset()
    ds.Modality = "RTSTRUCT"
    ds.StructureSetROISequence = []
    for n, name in rois:
        r = Dataset()
        r.ROINumber, r.ROIName = n, name
        ds.StructureSetROISequence.append(r)
    ds.ROIContourSequence = []
    for n, _ in rois:
        rc = Dataset()
        rc.ReferencedROINumber = n
        rc.ContourSequence = []
        for m, k, poly in contours:
            if m == n:
                c = Dataset()
                c.ContourGeometricType = "CLOSED_PLANAR"
                lps = [(_LPS @ AFFINE @ [i, j, k, 1])[:3] for i, j in poly]
                c.ContourData = [f"{v:.4f}" for p in lps for v in p]
                rc.ContourSequence.append(c)
        ds.ROIContourSequence.append(rc)
    fr, st, se = Dataset(), Dataset(), Dataset()
    se.SeriesInstanceUID = ref
    st.RTReferencedSeriesSequence = [se]
    fr.RTReferencedStudySequence = [st]
    ds.ReferencedFrameOfReferenceSequence = [fr]
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.481.3"
    ds.SOPInstanceUID = ds.SeriesInstanceUID = pydicom.uid.generate_uid()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.save_as(path, enforce_file_format=True)
    return str(path)


def sq(lo, hi):
    """A square contour through half-voxel corners: exactly the voxel centres lo..hi-1."""
    return [(lo - 0.5, lo - 0.5), (hi - 0.5, lo - 0.5), (hi - 0.5, hi - 0.5), (lo - 0.5, hi - 0.5)]


def nnunet(case, tmp_path, label, name="Dataset301_Hostile"):
    rows, _, _ = case
    d = write_nnunet(rows, tmp_path / name, labels={rows[0]["case"]: label})
    doc = json.load(open(os.path.join(d, "dataset.json")))
    lab = np.asarray(nib.load(os.path.join(d, "labelsTr", rows[0]["case"] + ".nii.gz")).dataobj)
    return doc, lab


# 1 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("thickness", [2.5, None])
def test_a_seg_that_leaves_out_slices_lands_on_its_slices_in_nnunet(case, tmp_path, thickness):
    """Frames at slices 10 and 20 only, no SpacingBetweenSlices: the label is on slices 10 and
    20 of the output (it was read on a 2-slice grid 25 mm apart and smeared over 5..24)."""
    seg = write_seg(tmp_path / "seg.dcm", [(10, 1, _square()), (20, 1, _square(5, 9))], {1: "t"})
    doc, lab = nnunet(case, tmp_path, seg)
    assert doc["labels"] == {"background": 0, "t": 1}
    assert np.flatnonzero(lab.sum((0, 1))).tolist() == [10, 20]
    np.testing.assert_array_equal(lab[:, :, 10], _square())
    np.testing.assert_array_equal(lab[:, :, 20], _square(5, 9))
    if thickness is not None:  # on its own, the gap is seen from its SliceThickness: refused
        with pytest.raises(GeometryError, match=r"seg.dcm: .*leaves out slices.*image="):
            read_seg(seg)


def test_a_seg_off_the_image_grid_with_gaps_is_refused_not_smeared(case, tmp_path):
    """Frames half a slice off the image's slices (so not placeable voxel for voxel), 25 mm
    apart, declaring neither spacing nor thickness: refused naming the file."""
    frames = [(10.5, 1, _square()), (20.5, 1, _square())]
    seg = write_seg(tmp_path / "off.dcm", frames, {1: "t"}, thickness=None)
    with pytest.raises(GeometryError, match=r"off.dcm: its frames lie 25 mm apart.*2.5 mm"):
        nnunet(case, tmp_path, seg)
    assert not os.path.exists(tmp_path / "Dataset301_Hostile")
    # frames off the grid but contiguous still come in through the SEG's own grid
    seg = write_seg(
        tmp_path / "off2.dcm", [(k + 0.5, 1, _square()) for k in range(10, 14)], {1: "t"}
    )
    _, lab = nnunet(case, tmp_path, seg, "Dataset302_Off")
    assert lab.sum() > 0 and set(np.flatnonzero(lab.sum((0, 1)))) <= set(range(10, 15))


# 2 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", [1, -1])
def test_overlapping_rois_are_said_and_the_higher_roi_number_wins(tmp_path, case, order):
    """GTV (ROI 1, 10x10 voxels) inside Lung (ROI 2) on slice 10, alone on slice 12: the
    100 voxels on slice 10 are Lung's whatever the order the file lists them in, and said."""
    _, image, _ = case
    rois = [(1, "GTV"), (2, "Lung")][::order]
    contours = [(1, 10, sq(20, 30)), (2, 10, sq(5, 44)), (1, 12, sq(20, 30))]
    p = write_rt(tmp_path / "rt.dcm", rois, contours)
    with pytest.warns(MedprocWarning) as got:
        lab = read_rtstruct(p, image).array
    text = " ".join(str(w.message) for w in got)
    assert "rt.dcm" in text and "'Lung' (ROI 2) overwrites 100 voxel(s) of 'GTV' (ROI 1)" in text
    assert "MISSING" not in text
    assert (lab[:, :, 10] == 2).sum() == 39 * 39 and (lab[:, :, 12] == 1).sum() == 100
    # GTV only inside Lung: it vanishes, and the warning says so plainly
    p = write_rt(tmp_path / "rt2.dcm", rois, contours[:2])
    with pytest.warns(MedprocWarning, match=r"'GTV' \(ROI 1\) is MISSING .* all its 100 voxel"):
        lab = read_rtstruct(p, image).array
    assert set(np.unique(lab).tolist()) == {0, 2}


# 3 ------------------------------------------------------------------------------------------
def test_an_inner_contour_is_a_hole(tmp_path, case):
    _, image, _ = case
    p = write_rt(tmp_path / "ring.dcm", [(1, "Ring")], [(1, 10, sq(10, 40)), (1, 10, sq(20, 30))])
    lab = read_rtstruct(p, image).array
    assert int((lab[:, :, 10] == 1).sum()) == 30 * 30 - 10 * 10
    assert lab[24, 24, 10] == 0 and lab[12, 12, 10] == 1
    t = np.linspace(0, 2 * np.pi, 120, endpoint=False)
    outer = [(24 + 18 * np.cos(a), 24 + 18 * np.sin(a)) for a in t]
    inner = [(24 + 7 * np.cos(a), 24 + 7 * np.sin(a)) for a in t[::-1]]
    p = write_rt(tmp_path / "ring2.dcm", [(3, "Ring")], [(3, 12, inner), (3, 12, outer)])
    lab = read_rtstruct(p, image).array
    area = np.pi * (18**2 - 7**2)
    assert abs(int((lab == 3).sum()) - area) < 0.03 * area
    assert lab[24, 24, 12] == 0 and lab[24 + 12, 24, 12] == 3


def test_contours_nest_overlap_or_repeat_without_losing_voxels(tmp_path, case):
    """By nesting, not XOR: an island inside a hole is drawn; a contour given twice is drawn
    once (XOR cancelled it: 0 voxels); two contours that overlap without one holding the other
    are taken together (XOR lost their intersection); the last two are said."""
    _, image, _ = case
    nested = [(1, 10, sq(5, 45)), (1, 10, sq(10, 40)), (1, 10, sq(20, 30))]
    lab = read_rtstruct(write_rt(tmp_path / "n.dcm", [(1, "A")], nested), image).array[:, :, 10]
    assert int(lab.sum()) == 40 * 40 - 30 * 30 + 10 * 10 and lab[25, 25] and not lab[15, 15]
    with pytest.warns(
        MedprocWarning, match=r"ROI 1 \('A'\), slice\(s\) \[10\]: 1 contour\(s\) given twice"
    ):
        p = write_rt(tmp_path / "d.dcm", [(1, "A")], [(1, 10, sq(20, 30)), (1, 10, sq(20, 30))])
        assert int(read_rtstruct(p, image).array.sum()) == 100
    with pytest.warns(MedprocWarning, match=r"1 pair\(s\) of contours overlap, taken together"):
        p = write_rt(tmp_path / "o.dcm", [(1, "A")], [(1, 10, sq(10, 20)), (1, 10, sq(15, 25))])
        assert int(read_rtstruct(p, image).array.sum()) == 100 + 100 - 25


def test_a_hole_poking_a_rim_past_the_outer_contour_is_still_a_hole():
    """A notch drawn on the outer contour's edge, its coordinates a thousandth of a voxel past
    it (as exported with 4 decimals), rasterises one column outside the outer's mask (a
    re-probe got the notch filled: 1620 voxels instead of 1200). A rim of at most a tenth of
    the inner contour, next to the outer one, still makes it a hole; a contour reaching
    further out is an overlap, taken together."""
    from medproc.annotations._overlap import combine_contours

    outer = np.zeros((48, 48), bool)
    outer[5:40, 5:40] = True
    notch = np.zeros_like(outer)
    notch[25:41, 15:31] = True  # (column 40: past the outer's last, 39)
    got, said = combine_contours([outer, notch])
    assert not said and int(got.sum()) == 35 * 35 - 15 * 16 and not got[40].any()
    wide = np.zeros_like(outer)
    wide[25:46, 15:31] = True  # (6 columns past: not a hole)
    got, said = combine_contours([outer, wide])
    assert "overlap, taken together" in said and int(got.sum()) == int((outer | wide).sum())
    # nearly the same outline twice (each inside the other by that rim): taken together, not
    # two holes (a late re-probe got an empty slice)
    again = np.zeros_like(outer)
    again[5:41, 5:40] = True
    got, said = combine_contours([outer, again])
    assert "overlap, taken together" in said and int(got.sum()) == int((outer | again).sum())


def test_overlapping_segments_are_said_like_overlapping_rois(tmp_path, case):
    """SEG and RTSTRUCT share one overlap rule and its warning: a segment wholly under a higher
    one is said MISSING (it vanished silently before)."""
    _, image, _ = case
    frames = [(10, 1, _square(20, 30)), (10, 2, _square(15, 35))]
    p = write_seg(tmp_path / "s.dcm", frames, {1: "Tumour", 2: "Liver"})
    with pytest.warns(MedprocWarning, match=r"'Liver' \(segment 2\) overwrites 100 voxel\(s\) "
                      r"of 'Tumour' \(segment 1\).*'Tumour' \(segment 1\) is MISSING"):  # fmt: skip
        lab = read_seg(p, image=image).array
    assert int((lab == 2).sum()) == 400 and not (lab == 1).any()


# 4 ------------------------------------------------------------------------------------------
def test_roi_numbers_are_identifiers_not_overflows(tmp_path, case):
    _, image, _ = case
    big = write_rt(tmp_path / "big.dcm", [(70000, "GTV")], [(70000, 10, sq(20, 30))])
    lab = read_rtstruct(big, image).array  # the ROI number as value, in a type that holds it
    assert lab.dtype == np.uint32 and int((lab == 70000).sum()) == 100
    rois = [(70000, "GTV"), (-1, "Lung"), (0, "Cord")]
    contours = [(70000, 10, sq(20, 30)), (-1, 12, sq(5, 15)), (0, 14, sq(30, 40))]
    p = write_rt(tmp_path / "ids.dcm", rois, contours)
    with pytest.raises(ReadError, match=r"ids.dcm: ROI number\(s\) \[-1, 0\].*renumber=True"):
        read_rtstruct(p, image)
    vol = read_rtstruct(p, image, renumber=True)  # 1..N in ascending ROI number order
    assert vol.meta["rois"] == {1: "Lung", 2: "Cord", 3: "GTV"}
    doc, lab = nnunet(case, tmp_path, p)  # the layout renumbers: any ROI number works
    assert doc["labels"] == {"background": 0, "Lung": 1, "Cord": 2, "GTV": 3}
    for value, (k, lo, hi) in {1: (12, 5, 15), 2: (14, 30, 40), 3: (10, 20, 30)}.items():
        want = np.zeros(SHAPE, bool)
        want[lo:hi, lo:hi, k] = True
        np.testing.assert_array_equal(lab == value, want)


def test_more_classes_than_a_layout_holds_is_an_error_naming_the_label(tmp_path, case):
    arr = (np.arange(np.prod(SHAPE)).reshape(SHAPE) % 70000).astype(np.int32)
    p = str(tmp_path / "many.nii.gz")
    nib.save(nib.Nifti1Image(arr, AFFINE), p)
    n = len(np.unique(arr)) - 1  # (0 is background)
    assert n > 65535
    with pytest.raises(MedprocError, match=rf"many.nii.gz: .*{n} distinct values.* 65535"):
        nnunet(case, tmp_path, p)


# 5 ------------------------------------------------------------------------------------------
def _outside(p):
    return write_seg(p, [(k, 1, _square()) for k in (60, 70, 90)], {1: "t"})


def _seg_zero(p):
    return write_seg(p, [(k, 0, _square()) for k in range(10, 15)], {0: "t"})


def _seg_empty(p):
    return write_seg(p, [(k, 1, np.zeros(SHAPE[:2], bool)) for k in range(10, 15)], {1: "t"})


def _rt_empty(p):
    return write_rt(p, [(1, "GTV")], [])


def _edited(**attrs):
    """A SEG of 5 frames with ``attrs`` set in it (None: deleted); ``per_frame``: a frame item
    more than NumberOfFrames says."""
    extra = attrs.pop("per_frame", False)

    def make(p):
        from badinputs import _edit

        write_seg(p, [(k, 1, _square()) for k in range(10, 15)], {1: "t", 2: "u"})
        _edit(p, **attrs, **({"NumberOfFrames": 4} if extra else {}))
        return str(p)

    return make


def _seg_dup_numbers(p):
    write_seg(p, [(k, 1, _square()) for k in range(10, 15)], {1: "liver", 2: "tumor"})
    ds = pydicom.dcmread(p)
    ds.SegmentSequence[1].SegmentNumber = 1  # (the last name was taken, unsaid)
    ds.save_as(p)
    return str(p)


def _seg_unlisted(p):
    return write_seg(p, [(k, 3, _square()) for k in range(10, 15)], {1: "t", 2: "u"})


def _truncated(keep):
    """The SEG of 5 frames cut after ``keep`` bytes (12.8 kB in all; a fraction: of it)."""

    def make(p):
        write_seg(p, [(k, 1, _square()) for k in range(10, 15)], {1: "t"})
        data = open(p, "rb").read()
        open(p, "wb").write(data[: int(len(data) * keep if keep < 1 else keep)])
        return str(p)

    return make


# (a reviewer's and a prober's findings: each was read as something else, exit 0)
@pytest.mark.parametrize(
    "make, says",
    [
        (_edited(SegmentationType="FRACTIONAL", SegmentationFractionalType="PROBABILITY",
                 MaximumFractionalValue=255), "is a FRACTIONAL SEG (PROBABILITY"),
        (_edited(SegmentSequence=[]), "its SegmentSequence lists no segment"),
        (_edited(per_frame=True), "lists 5 per-frame items but NumberOfFrames is 4"),
        (_seg_dup_numbers, "lists segment number 1 twice ('liver', 'tumor')"),
        # (a prober's: frames of a segment no item names became the unnamed class "label_3";
        # a SEG cut before its frame items was "not a DICOM SEG (Modality 'SEG' ...)")
        (_seg_unlisted, "frame 1: references segment 3, which its SegmentSequence does not "
                        "list (it lists [1, 2])"),
        (_truncated(600), "a DICOM element declares a length that runs 2 bytes past the end "
                          "of the file: the file is truncated"),
        (_truncated(1000), "runs 280 bytes past the end of the file: the file is truncated"),
        (_edited(PixelData=None), "is a DICOM SEG without PixelData: the file is truncated or "
                                  "incomplete"),
        (_edited(PerFrameFunctionalGroupsSequence=None), "is a DICOM SEG without "
                                                         "PerFrameFunctionalGroupsSequence"),
        (_truncated(200), "is not a DICOM SEG (it holds neither a Modality nor a SOP Class "
                           "UID: truncated?)"),
        (_truncated(0.9), "its pixel data cannot be decoded"),
    ],
)  # fmt: skip
def test_a_seg_that_cannot_be_read_as_binary_segments_is_refused_naming_it(make, says, tmp_path):
    from medproc.annotations import read_seg

    p = make(tmp_path / "ann.dcm")
    with pytest.raises(MedprocError, match="ann.dcm: ") as e:
        read_seg(p)
    assert says in str(e.value)


def test_an_annotation_of_another_series_is_said_and_an_image_path_is_refused(tmp_path, case):
    """A SEG or RTSTRUCT naming another series than the DICOM image it is read onto was placed
    without a word; ``image="folder"`` was blamed on the file ("incomplete or malformed
    RTSTRUCT (AttributeError ...)")."""
    _, image, _ = case
    seg = write_seg(tmp_path / "seg.dcm", [(k, 1, _square()) for k in range(10, 15)], {1: "t"})
    rt = write_rt(tmp_path / "rt.dcm", [(1, "GTV")], [(1, 12, sq(20, 30))])
    for name, read in (("read_seg", read_seg), ("read_rtstruct", read_rtstruct)):
        path = seg if name == "read_seg" else rt
        with pytest.raises(medproc.UsageError, match=f"^{name}: image must be a medproc.Volume"):
            read(path, image=str(tmp_path))
        for uid, warns in ((UID, False), ("1.2.3.4", True), ("nouid:abc", False), ("", False)):
            img = image.with_array(image.array, series_uid=uid)
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                lab = read(path, image=img)
            hits = [w for w in said if "annotates series" in str(w.message)]
            assert len(hits) == warns, (name, uid, [str(w.message) for w in said])
            if warns:
                assert f"it annotates series {UID}, not the series of" in str(hits[0].message)
                assert "(1.2.3.4)" in str(hits[0].message)
                assert hits[0].filename == __file__  # (said at the call: a review's)
            assert lab.array[20:30, 20:30, 12].all()  # (placed all the same)
    for roi in (["GTV"], b"GTV", True, 1.5):  # (a damaged file, ROI 1, an empty label)
        with pytest.raises(medproc.UsageError, match="^read_rtstruct: roi must be an ROI's"):
            read_rtstruct(rt, image, roi=roi)
    with pytest.raises(medproc.UsageError, match="^seg_on_image: image must be"):
        from medproc.annotations.dicom_labels import seg_on_image

        seg_on_image(seg, None)


@pytest.mark.parametrize(
    "group, attr, value, says",
    [
        ("PlaneOrientationSequence", "ImageOrientationPatient", [0] * 6, "not made of unit"),
        ("PlaneOrientationSequence", "ImageOrientationPatient", [1, 0, 0, 1, 0, 0],
         "not perpendicular"),
        ("PixelMeasuresSequence", "PixelSpacing", [1e-9, 1e-9], "PixelSpacing .* is outside"),
    ],
)  # fmt: skip
def test_seg_frames_no_grid_can_place_are_refused_with_an_image_too(
    tmp_path, case, group, attr, value, says
):
    """A prober's: on an image's grid, a SEG with an all-zero orientation put its 5 frames of
    100 pixels on 5 voxels, unsaid; on its own grid it was refused."""
    _, image, _ = case
    p = write_seg(tmp_path / "seg.dcm", [(k, 1, _square()) for k in range(10, 15)], {1: "t"})
    ds = pydicom.dcmread(p)
    setattr(getattr(ds.SharedFunctionalGroupsSequence[0], group)[0], attr, value)
    ds.save_as(p)
    for image_given in (image, None):
        with pytest.raises(GeometryError, match=f"seg.dcm: frame 1: .*{says}.*cannot be placed"):
            read_seg(p, image=image_given)


def test_a_truncated_rtstruct_is_an_error_never_a_label_missing_an_roi(tmp_path, case):
    """A prober's: cut short, an RTSTRUCT raised a bare OSError or struct.error, or (cut at an
    ROI's boundary) came back with that ROI empty, unsaid. Each cut is now a ReadError naming
    the file, or (cut in what follows the contours) the whole label."""
    _, image, _ = case
    full = write_rt(
        tmp_path / "rt.dcm", [(1, "a"), (2, "b")], [(1, 12, sq(10, 20)), (2, 14, sq(25, 45))]
    )
    whole = read_rtstruct(full, image).array
    assert (whole == 1).sum() == 100 and (whole == 2).sum() == 400
    data = open(full, "rb").read()
    cut = str(tmp_path / "cut.dcm")
    outcomes = set()
    for n in range(132, len(data), 3):
        open(cut, "wb").write(data[:n])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lab = read_rtstruct(cut, image).array
        except MedprocError as e:
            assert str(e).startswith(cut + ": "), str(e)
            outcomes.add(type(e).__name__)
        else:
            np.testing.assert_array_equal(lab, whole, err_msg=f"cut at {n} of {len(data)}")
            outcomes.add("whole")
    assert "ReadError" in outcomes


def test_references_of_another_vr_name_no_series_not_a_crash():
    """A second prober's: a ReferencedSeriesSequence written as a UI value (or an RTSTRUCT's
    RTReferencedStudySequence) ended convert --layout with AttributeError; a multi-valued UID
    was read as the text of a list."""
    from pydicom.multival import MultiValue

    from medproc.annotations.dicom_labels import referenced_series

    ds = Dataset()
    ds.add_new(0x00081115, "UI", "1.2.3")  # (ReferencedSeriesSequence, as a UID)
    fr = Dataset()
    fr.add_new(0x30060012, "UI", "1.2.4")  # (RTReferencedStudySequence, as a UID)
    ds.ReferencedFrameOfReferenceSequence = [fr]
    assert referenced_series(ds) == []
    item = Dataset()
    item.SeriesInstanceUID = MultiValue(str, ["1.2.5", "1.2.6"])
    ds = Dataset()
    ds.ReferencedSeriesSequence = [item, Dataset()]
    assert referenced_series(ds) == []
    ds.ReferencedSeriesSequence[1].SeriesInstanceUID = "1.2.7"
    assert referenced_series(ds) == ["1.2.7"]


def test_an_roi_name_is_matched_exactly_first(tmp_path, case):
    """A second prober's: with ROIs 'GTV' (1) and 'gtv' (2), roi='gtv' took ROI 1."""
    _, image, _ = case
    rt = write_rt(
        tmp_path / "rt.dcm", [(1, "GTV"), (2, "gtv")], [(1, 12, sq(10, 20)), (2, 14, sq(25, 45))]
    )
    assert set(np.unique(read_rtstruct(rt, image, roi="gtv").array)) == {0, 2}
    assert set(np.unique(read_rtstruct(rt, image, roi="GTV").array)) == {0, 1}
    with pytest.raises(medproc.UsageError, match=r"ROI name 'Gtv' matches ROIs \[1, 2\]"):
        read_rtstruct(rt, image, roi="Gtv")


def test_a_reference_without_its_series_uid_is_said_not_a_crash(tmp_path):
    """A prober's: a SEG whose ReferencedSeriesSequence item lacks its SeriesInstanceUID (or an
    RTSTRUCT's RTReferencedSeriesSequence item) ended convert --layout with AttributeError."""
    p = write_seg(tmp_path / "seg.dcm", [(k, 1, _square()) for k in range(10, 15)], {1: "t"})
    ds = pydicom.dcmread(p)
    del ds.ReferencedSeriesSequence[0].SeriesInstanceUID
    ds.save_as(p)
    rt = write_rt(tmp_path / "rt.dcm", [(1, "GTV")], [(1, 12, sq(20, 30))])
    ds = pydicom.dcmread(rt)
    ref = ds.ReferencedFrameOfReferenceSequence[0].RTReferencedStudySequence[0]
    del ref.RTReferencedSeriesSequence[0].SeriesInstanceUID
    ds.save_as(rt)
    with pytest.warns(MedprocWarning, match="references no series") as said:
        assert find_dicom_labels(str(tmp_path)) == {}
    assert {os.path.basename(str(w.message).split(":")[0]) for w in said} >= {"seg.dcm", "rt.dcm"}


def test_a_seg_or_rtstruct_that_references_no_series_is_said(tmp_path):
    p = write_seg(tmp_path / "seg.dcm", [(k, 1, _square()) for k in range(10, 15)], {1: "t"})
    ds = pydicom.dcmread(p)
    del ds.ReferencedSeriesSequence
    ds.save_as(p)
    with pytest.warns(MedprocWarning, match=r"seg.dcm: a DICOM SEG that references no series"):
        assert find_dicom_labels(str(tmp_path)) == {}


def test_a_contour_far_beyond_the_image_or_without_area(tmp_path, case):
    """A contour around the whole image at 1e30 voxels overflowed int64 (said as "invalid value
    encountered in cast", then as lying outside); three collinear points labelled the voxels
    along their line (a prober's findings)."""
    from medproc.annotations import read_rtstruct

    img = case[1]
    big = [(-1e30, -1e30), (1e30, -1e30), (1e30, 1e30), (-1e30, 1e30)]
    p = write_rt(tmp_path / "big.dcm", [(1, "body")], [(1, 10, big)])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        lab = read_rtstruct(p, img)
    assert int((np.asarray(lab.array)[:, :, 10] == 1).sum()) == SHAPE[0] * SHAPE[1]
    assert not any("invalid value" in str(w.message) for w in said)
    p = write_rt(tmp_path / "line.dcm", [(1, "x")], [(1, 10, [(5, 5), (10, 10), (20, 20)])])
    with pytest.raises(MedprocError, match="line.dcm: ROI 1 contour 1: .*encloses no area"):
        read_rtstruct(p, img)


@pytest.mark.parametrize(
    "make, says",
    [
        (_outside, "all 3 of its frames that hold segment pixels lie outside the image"),
        (_seg_zero, "frame 1: references segment number 0"),
        (_seg_empty, "labels no voxel of"),
        (_rt_empty, "labels no voxel of"),
    ],
)
def test_an_empty_dicom_label_is_an_error_naming_the_file(tmp_path, case, make, says):
    p = make(tmp_path / "ann.dcm")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with pytest.raises(MedprocError, match="ann.dcm: ") as e:
            nnunet(case, tmp_path, p)
    assert says in str(e.value)
    assert not os.path.exists(tmp_path / "Dataset301_Hostile")


def test_empty_annotations_read_alone_warn(tmp_path, case):
    _, image, _ = case
    with pytest.warns(MedprocWarning, match="ann.dcm: its 5 frame.* hold no segmented pixel"):
        assert not read_seg(_seg_empty(tmp_path / "ann.dcm"), image=image).array.any()
    with pytest.warns(MedprocWarning, match="rt.dcm: no closed planar contour labels a voxel"):
        assert not read_rtstruct(_rt_empty(tmp_path / "rt.dcm"), image).array.any()
    with pytest.raises(ReadError, match="ann2.dcm: all 3 of its frames .* outside the image"):
        read_seg(_outside(tmp_path / "ann2.dcm"), image=image)
    p = write_rt(tmp_path / "zero.dcm", [(0, "GTV")], [(0, 10, sq(20, 30))])
    _, lab = nnunet(case, tmp_path, p)  # ROI 0 is an identifier: labelled, not background
    assert int((lab[:, :, 10] == 1).sum()) == 100


# 6 ------------------------------------------------------------------------------------------
def test_a_label_of_no_case_and_two_labels_of_one_series_are_said(tmp_path, case):
    rows, _, _ = case
    os.makedirs(tmp_path / "t")
    a = write_seg(tmp_path / "t" / "a.dcm", [(10, 1, _square())], {1: "t"})
    b = write_seg(tmp_path / "t" / "b.dcm", [(12, 1, _square())], {1: "u"})
    with pytest.warns(MedprocWarning, match=r"a.dcm and .*b.dcm all annotate series " + UID):
        assert find_dicom_labels(str(tmp_path / "t")) == {UID: a}
    with pytest.warns(MedprocWarning, match=r"a.dcm and .*b.dcm all annotate series " + UID):
        assert find_dicom_labels([b, a]) == {UID: a}  # (files as convert's scan lists them:
    # path order too; the CLI used the one found first, the library the first by name)
    with pytest.raises(MedprocError, match=r"not-there: no such file or folder"):
        find_dicom_labels([str(tmp_path / "t"), str(tmp_path / "not-there")])  # (was {}, unsaid)
    stray = write_seg(tmp_path / "s.dcm", [(10, 1, _square())], {1: "t"}, ref="1.2.3.4.5")
    labels = find_dicom_labels(stray)
    assert labels == {"1.2.3.4.5": stray}
    with pytest.warns(MedprocWarning, match=r"s.dcm: annotates series 1.2.3.4.5, which is none"):
        with pytest.raises(MedprocError, match=r"no case has a label: .*s.dcm: annotates series"):
            write_monai_datalist(rows, tmp_path / "dl.json", labels=labels)
    labels[rows[0]["case"]] = b  # another label for the case: the stray one is said, left out
    with pytest.warns(MedprocWarning, match=r"s.dcm: annotates series 1.2.3.4.5, which is none"):
        write_monai_datalist(rows, tmp_path / "dl.json", labels=labels)
    assert len(json.load(open(tmp_path / "dl.json"))["training"]) == 1


# 7 ------------------------------------------------------------------------------------------
def test_an_unreadable_seg_among_the_inputs_is_named_with_its_problem(tmp_path):
    from medproc._layout_labels import unreadable_dicom_labels

    os.makedirs(tmp_path / "in")
    arr = np.zeros(SHAPE, np.int16)
    nib.save(nib.Nifti1Image(arr, AFFINE), str(tmp_path / "in" / "ct.nii.gz"))
    write_seg(tmp_path / "in" / "seg.dcm", [], {1: "t"})  # no frames: NumberOfFrames 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = convert([str(tmp_path / "in")], str(tmp_path / "out"), medproc.Spec(), workers=1)
    said = unreadable_dicom_labels(rows)
    assert len(said) == 1 and said[0].startswith(str(tmp_path / "in" / "seg.dcm"))
    assert "NumberOfFrames is 0" in said[0]


# 8 ------------------------------------------------------------------------------------------
def test_label_values_beyond_float32_name_the_label_file(tmp_path, case):
    arr = np.zeros(SHAPE, np.uint32)
    arr[20:30, 20:30, 10] = 2**24 + 1
    shifted = AFFINE.copy()
    shifted[0, 3] += 0.5  # (another grid: the label is resampled onto the output's)
    p = str(tmp_path / "huge.nii.gz")
    nib.save(nib.Nifti1Image(arr, shifted), p)
    with pytest.raises(MedprocError, match=r"huge.nii.gz: label values 0..16777217") as e:
        nnunet(case, tmp_path, p)
    assert e.value.path == p


def test_class_names_match_without_case_and_spaces_and_bad_names_leave_the_case_out(case, tmp_path):
    """'GTV' in one case and 'gtv ' in another are one class (they were two, silently); an ROI
    named 'background' or one without a name leaves its case out, naming the file (the whole
    layout failed, without naming it)."""
    rows, _, _ = case
    two = [rows[0], {**rows[0], "case": "twin"}]
    a = write_rt(tmp_path / "a.dcm", [(1, "GTV")], [(1, 10, sq(20, 30))])
    b = write_rt(tmp_path / "b.dcm", [(3, "gtv ")], [(3, 12, sq(20, 30))])
    d = write_nnunet(two, tmp_path / "Dataset302_Names", labels={"ct": a, "twin": b})
    assert json.load(open(os.path.join(d, "dataset.json")))["labels"] == {
        "background": 0,
        "GTV": 1,
    }
    for bad, says in (((1, "Background"), "named 'background'"), ((1, " "), r"\[1\] have no")):
        p = write_rt(tmp_path / "bad.dcm", [bad], [(1, 10, sq(20, 30))])
        failed = []
        labels = {"ct": p, "twin": a}
        write_nnunet(two, tmp_path / "Dataset303_Bad", labels=labels, failed=failed, overwrite=True)
        assert len(failed) == 1 and failed[0].startswith("case ct: ") and "bad.dcm" in failed[0]
        assert re.search(says, failed[0]), failed[0]


def test_read_seg_with_an_image_says_when_frames_are_off_its_slices(case, tmp_path):
    """Frames half a slice off the image's slices: read_seg(image=) places each on the nearest
    voxel (10 and 11 landed on 10 and 12) and now says so; on the image's own slices, nothing
    is said."""
    _, image, _ = case
    p = write_seg(tmp_path / "off.dcm", [(10.5, 1, _square()), (11.5, 1, _square())], {1: "t"})
    with pytest.warns(MedprocWarning, match=r"off.dcm: its pixels lie up to 0.50 voxel off"):
        read_seg(p, image=image)
    p = write_seg(tmp_path / "on.dcm", [(10, 1, _square()), (11, 1, _square())], {1: "t"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lab = read_seg(p, image=image).array
    assert np.flatnonzero(lab.sum((0, 1))).tolist() == [10, 11]


def test_a_contour_running_past_the_image_edge_is_cut_and_said(tmp_path, case):
    """A contour partly off the image was clipped without a word (a prober's): its voxels on
    the image are labelled exactly, and a warning says it was cut."""
    _, image, _ = case
    p = write_rt(tmp_path / "edge.dcm", [(1, "GTV")], [(1, 10, sq(-10, 10))])
    with pytest.warns(MedprocWarning, match=r"edge.dcm: ROI 1 \('GTV'\): contour\(s\) run past"):
        lab = read_rtstruct(p, image).array
    assert int((lab[:, :, 10] == 1).sum()) == 100 and int(lab.sum()) == 100  # voxels 0..9
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a contour inside: no word)
        read_rtstruct(write_rt(tmp_path / "in.dcm", [(1, "GTV")], [(1, 10, sq(0, 10))]), image)
