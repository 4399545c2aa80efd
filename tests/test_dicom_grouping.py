"""Which files make one DICOM series (``medproc.io.dicom_group``), as ``medproc convert``,
``medproc inspect`` and ``medproc.load`` see it: a damaged copy fails only its own folder,
files without a SeriesInstanceUID are one series per folder, a slice of another size fails its
stack; and the output naming templates (``--name``) take plain fields only."""

import csv
import os
import re
import shutil

import numpy as np
import pydicom
import pytest
from badinputs import _edit as edit_file

import medproc
from medproc.cli import main
from medproc.inspect import inspect_paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AXIAL = os.path.join(ROOT, "sample_data", "dicom", "ct_axial")  # 40 slices of 112x112
OBLIQUE = os.path.join(ROOT, "sample_data", "dicom", "ct_oblique")


def _edit(folder, pick=None, **attrs):
    """Set (or delete, for None) ``attrs`` in the files of ``folder`` (those ``pick`` keeps)."""
    for n in sorted(os.listdir(folder)):
        if pick is None or pick(n):
            edit_file(os.path.join(folder, n), **attrs)


def _by_position(folder):
    """The file names of ``folder`` in slice order (the sample's names are shuffled)."""
    z = {
        n: float(pydicom.dcmread(os.path.join(folder, n)).ImagePositionPatient[2])
        for n in os.listdir(folder)
    }
    return sorted(z, key=z.get)


def _convert(tmp_path, inp, *extra):
    """Run ``medproc convert`` in-process: (exit status, manifest rows, their sources relative
    to ``inp``)."""
    out = tmp_path / "out"
    rc = main(["convert", str(inp), "-o", str(out), "--spacing", "3", "-j", "1", "-q", *extra])
    with open(out / "manifest.csv") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["source"] = os.path.relpath(r["source"], inp)
    return rc, rows


def _by_source(rows):
    by = {r["source"]: r for r in rows}
    assert len(by) == len(rows), rows
    return by


def _errors(entries):
    return {e.source: e.error for e in entries if e.error and e.kind != "skipped"}


# --- a damaged copy fails only its own folder ------------------------------------------------


def test_a_truncated_stray_copy_fails_itself_not_the_intact_exports(tmp_path, quiet):
    """A truncated copy of one slice beside two intact exports of its series (one re-exported
    with an edited file, so the folders are kept apart): the stray file is a failed row of its
    own, naming it; both exports convert whole, and inspect agrees."""
    inp = tmp_path / "in"
    shutil.copytree(AXIAL, inp / "exportA")
    shutil.copytree(AXIAL, inp / "exportB")
    _edit(inp / "exportB", lambda n: n == "IM00003.dcm", InstitutionName="another export")
    shutil.copytree(OBLIQUE, inp / "other")
    data = open(os.path.join(AXIAL, "IM00000.dcm"), "rb").read()
    (inp / "stray_copy.dcm").write_bytes(data[:-5000])
    rc, rows = _convert(tmp_path, inp)
    rows = _by_source(rows)
    assert rc == 1
    assert {k: r["status"] for k, r in rows.items()} == {
        "exportA": "ok",
        "exportB": "ok",
        "other": "ok",
        "stray_copy.dcm": "failed",
    }
    assert rows["exportA"]["in_shape"] == rows["exportB"]["in_shape"] == "112x112x40"
    err = rows["stray_copy.dcm"]["error"]
    assert "stray_copy.dcm: truncated file" in err and "exportA" not in err
    entries = inspect_paths(str(inp))
    assert list(_errors(entries)) == [str(inp / "stray_copy.dcm")]
    assert sum(e.kind == "dicom" and not e.error for e in entries) == 3
    assert medproc.load(inp / "exportA").shape == (112, 112, 40)


def test_a_stray_copy_with_a_damaged_header_fails_itself(tmp_path, quiet):
    """A copy of one slice (its SOPInstanceUID) whose header is damaged (Rows 0): a failed file
    of its own; the only export of the series, intact, converts."""
    inp = tmp_path / "in"
    shutil.copytree(AXIAL, inp / "exportA")
    shutil.copy(os.path.join(AXIAL, "IM00005.dcm"), inp / "stray_copy.dcm")
    ds = pydicom.dcmread(inp / "stray_copy.dcm")
    ds.Rows = 0
    ds.save_as(inp / "stray_copy.dcm")
    rc, rows = _convert(tmp_path, inp)
    rows = _by_source(rows)
    assert rc == 1
    assert {k: r["status"] for k, r in rows.items()} == {
        "exportA": "ok",
        "stray_copy.dcm": "failed",
    }
    assert "stray_copy.dcm: Rows x Columns is 0x112" in rows["stray_copy.dcm"]["error"]
    assert list(_errors(inspect_paths(str(inp)))) == [str(inp / "stray_copy.dcm")]


def test_a_series_every_file_of_which_fails_is_one_failed_case(tmp_path, quiet):
    """40 files all failing the same header check (RescaleSlope 0) were 40 failed rows and 40
    lines: now one, for the series' folder, naming a file, the reason and the count; inspect
    shows one error and lists none of its files as skipped."""
    inp = tmp_path / "in"
    shutil.copytree(AXIAL, inp / "bad")
    shutil.copytree(AXIAL, inp / "good")
    _edit(inp / "bad", RescaleSlope=0, SeriesInstanceUID="1.2.3.4")
    rc, rows = _convert(tmp_path, inp)
    rows = _by_source(rows)
    assert rc == 1 and {k: r["status"] for k, r in rows.items()} == {"bad": "failed", "good": "ok"}
    err = rows["bad"]["error"]
    assert "no usable file of series 1.2.3.4 (40 files)" in err and "RescaleSlope is 0" in err
    entries = inspect_paths(str(inp))
    assert list(_errors(entries)) == [str(inp / "bad")]
    assert not [e for e in entries if e.kind == "skipped" and "bad" in e.source]
    named = [str(inp / "bad" / n) for n in sorted(os.listdir(inp / "bad"))[:2]]
    entries = inspect_paths(named)  # files named one by one: each its own error
    assert sorted(_errors(entries)) == named
    assert all("RescaleSlope is 0" in e for e in _errors(entries).values())


def test_an_export_without_orientation_fails_itself_not_the_other(tmp_path, quiet):
    """A second export of the series whose files lost ImageOrientationPatient: that folder is
    a failed row naming its files; the intact export converts."""
    inp = tmp_path / "in"
    shutil.copytree(AXIAL, inp / "exportA")
    shutil.copytree(AXIAL, inp / "exportB_noiop")
    _edit(inp / "exportB_noiop", ImageOrientationPatient=None)
    rc, rows = _convert(tmp_path, inp)
    rows = _by_source(rows)
    assert rc == 1
    assert {k: r["status"] for k, r in rows.items()} == {
        "exportA": "ok",
        "exportB_noiop": "failed",
    }
    err = rows["exportB_noiop"]["error"]
    assert "exportB_noiop/IM0000" in err and "no ImageOrientationPatient" in err
    errors = _errors(inspect_paths(str(inp)))
    assert list(errors) == [str(inp / "exportB_noiop")]


# --- one series is never split silently ------------------------------------------------------


def test_files_without_series_uid_are_one_series_per_folder(tmp_path, quiet):
    """Files without SeriesInstanceUID are one series per folder and SeriesNumber (as dcm2niix
    groups them), not a 1-slice volume per file."""
    inp = tmp_path / "in"
    shutil.copytree(AXIAL, inp / "no_uid")
    _edit(inp / "no_uid", SeriesInstanceUID=None)
    shutil.copytree(AXIAL, inp / "two_numbers")
    _edit(inp / "two_numbers", SeriesInstanceUID=None)
    odd = set(_by_position(inp / "two_numbers")[1::2])  # every other slice: series 9
    _edit(inp / "two_numbers", lambda n: n in odd, SeriesNumber=9)
    vol = medproc.load(inp / "no_uid")
    ref = medproc.load(AXIAL)
    assert np.array_equal(np.asarray(vol.array), np.asarray(ref.array))
    np.testing.assert_allclose(vol.affine, ref.affine)
    rc, rows = _convert(tmp_path, inp)
    assert rc == 0
    shapes = sorted((r["source"], r["status"], r["in_shape"]) for r in rows)
    assert shapes == [
        ("no_uid", "ok", "112x112x40"),
        ("two_numbers", "ok", "112x112x20"),
        ("two_numbers", "ok", "112x112x20"),
    ]


def test_a_slice_of_another_size_fails_the_series_naming_it(tmp_path, quiet):
    """The last slice of a series with another Columns (its pixel data matching): not a
    39-slice volume and a 1-slice volume, but one failed series naming that file, in convert,
    inspect and load alike."""
    inp = tmp_path / "in"
    d = inp / "last_slice_narrow"
    shutil.copytree(AXIAL, d)
    files = _by_position(d)
    ds = pydicom.dcmread(d / files[-1])
    ds.PixelData = ds.pixel_array[:, :100].copy().tobytes()
    ds.Columns = 100
    ds.save_as(d / files[-1])
    why = f"{files[-1]}: its image is 112x100 (Rows x Columns), while the other 39 file(s)"
    with pytest.raises(medproc.ReadError, match=re.escape(why)):
        medproc.load(d)
    rc, rows = _convert(tmp_path, inp)
    rows = _by_source(rows)
    assert rc == 1
    assert {k: r["status"] for k, r in rows.items()} == {"last_slice_narrow": "failed"}
    assert why in rows["last_slice_narrow"]["error"]
    (entry,) = [e for e in inspect_paths(str(inp)) if e.kind == "dicom"]
    assert entry.error.startswith(why)


@pytest.mark.parametrize(
    "split",
    ["no_uid", "tilted", "localizer", "stack_localizer", "not_unit", "zero_iop", "skew", "nearly"],
)
def test_a_slice_split_off_into_a_gap_of_its_stack_fails_the_series_naming_it(
    tmp_path, quiet, split
):
    """A slice of the stack without SeriesInstanceUID, or turned 0.5 degrees in its plane, was
    a 1-slice volume converted "ok", while the stack failed for "missing slices", naming no
    file: now one failed series naming the file and why it was kept apart. The reason is the
    real one (a prober's finding: a LOCALIZER mark or non-unit orientation vectors were said
    to be "an orientation differing by 0.00 degrees", and an all-zero orientation left the
    stack failing for "missing slices ... find the missing files")."""
    inp = tmp_path / "in"
    d = inp / "split"
    shutil.copytree(AXIAL, d)
    name = _by_position(d)[7]
    ds = pydicom.dcmread(d / name)
    if split == "no_uid":
        del ds.SeriesInstanceUID
        why = "it has no SeriesInstanceUID"
    elif split == "tilted":
        a = np.radians(0.5)
        ds.ImageOrientationPatient = [np.cos(a), np.sin(a), 0.0, -np.sin(a), np.cos(a), 0.0]
        why = "its orientation differs from theirs by 0.50 degrees"
    elif split == "localizer":
        ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
        why = "it is marked LOCALIZER (ImageType)"
    elif split == "stack_localizer":  # (the other way round: every other file marked)
        _edit(d, pick=lambda n: n != name, ImageType=["ORIGINAL", "PRIMARY", "LOCALIZER"])
        why = "the stack's slices are marked LOCALIZER (ImageType)"
    elif split == "nearly":  # (apart by more than grouping's rounding, by no visible angle)
        ds.ImageOrientationPatient = [1.001, 0, 0, 0, 1, 0]
        why = "its ImageOrientationPatient [1.001, 0, 0, 0, 1, 0] differs from theirs [1, 0, 0"
    else:  # (what the reader refuses: placed by its position alone, and that is why)
        iop, what = {
            "not_unit": ([2, 0, 0, 0, 2, 0], " is not made of unit vectors"),
            "zero_iop": ([0] * 6, " is not made of unit vectors"),
            "skew": ([1, 0, 0, 1, 0, 0], "'s row and column are not perpendicular"),
        }[split]
        ds.ImageOrientationPatient = iop
        why = f"its ImageOrientationPatient{what}: {iop}"
    ds.save_as(d / name)
    said = f"{name}: it lies in a gap of the stack's slices"
    with pytest.raises(medproc.ReadError, match=re.escape(said) + ".*" + re.escape(why)):
        medproc.load(d)
    rc, rows = _convert(tmp_path, inp)
    assert rc == 1 and [r["status"] for r in rows] == ["failed"]
    assert said in rows[0]["error"] and why in rows[0]["error"]


def test_a_lone_slice_of_another_series_in_a_gap_is_its_own_and_the_gap_is_said(tmp_path, quiet):
    """Only a slice of the stack's own series (or of none) is taken for a split-off slice: a
    one-slice series of another UID in the gap stays a volume of its own, and the stack fails
    for its missing slice (a reviewer's finding: it was blamed on the other series' file)."""
    d = tmp_path / "in" / "gap"
    shutil.copytree(AXIAL, d)
    name = _by_position(d)[7]
    ds = pydicom.dcmread(d / name)
    ds.SeriesInstanceUID = ds.SeriesInstanceUID + ".9"
    ds.save_as(d / name)
    from medproc.io.dicom_scan import scan_dicom

    scan = scan_dicom(str(d))
    assert sorted(len(s.frames) for s in scan.series) == [1, 39]
    assert not any(s.problems for s in scan.series)
    with pytest.raises(medproc.errors.MedprocError, match="missing slices"):
        medproc.load(d, series="1.2.826.0.1.3680043.8.498.2026.1.1")


def test_a_stack_without_orientation_beside_a_lone_slice_is_grouped_as_before():
    """A reviewer's finding: a stack without ImageOrientationPatient (a secondary capture) in
    the folder of an oriented lone slice crashed the gap check (IndexError)."""
    from medproc.io.dicom_group import DicomSeries, _no_strays_in_gaps
    from medproc.io.dicom_header import Frame

    info = {"Rows": 8, "Columns": 8, "SamplesPerPixel": 1}
    flat = [Frame(f"/x/s{n}.dcm", None, np.array([0.0, 0.0, 2.0 * n]), None, (1.0, 1.0))
            for n in (0, 1, 5)]  # fmt: skip
    lone = Frame("/x/one.dcm", None, np.array([0.0, 0.0, 4.0]), np.eye(3)[:2].ravel(), (1, 1))
    groups = [DicomSeries("nouid:/x", flat, info), DicomSeries("nouid:/x", [lone], info)]
    keys = {id(g): ("nouid:/x", 8, 8, 1, False) for g in groups}
    assert _no_strays_in_gaps(groups, keys) == groups


def test_a_localizer_of_another_size_stays_a_part_of_its_own(tmp_path, quiet):
    """A localizer (ImageType LOCALIZER) in the series, in its orientation but of another size,
    is a volume of its own (``.part``), as before: not a slice of the stack."""
    d = tmp_path / "with_localizer"
    shutil.copytree(AXIAL, d)
    ds = pydicom.dcmread(d / "IM00000.dcm")
    ds.PixelData = ds.pixel_array[:64, :].copy().tobytes()
    ds.Rows = 64
    ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
    ds.SOPInstanceUID = ds.SOPInstanceUID + ".99"
    ds.save_as(d / "scout.dcm")
    from medproc.io.dicom_scan import scan_dicom

    scan = scan_dicom(str(d))
    assert sorted(len(s.frames) for s in scan.series) == [1, 40]
    assert not any(s.problems for s in scan.series)


def test_two_stacks_of_two_sizes_at_different_positions_stay_two_volumes(tmp_path, quiet):
    """The upper half of a series cropped to another size (a second acquisition of the series
    elsewhere along the normal): two volumes of their own (``.part``), as before and as dcm2niix
    converts them, not a failed series."""
    d = tmp_path / "two_sizes"
    shutil.copytree(AXIAL, d)
    for name in _by_position(d)[20:]:
        ds = pydicom.dcmread(d / name)
        ds.PixelData = ds.pixel_array[:, :100].copy().tobytes()
        ds.Columns = 100
        ds.save_as(d / name)
    from medproc.io.dicom_scan import scan_dicom

    scan = scan_dicom(str(d))
    assert sorted(len(s.frames) for s in scan.series) == [20, 20]
    assert not any(s.problems for s in scan.series)


# --- naming templates ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template, error",
    [
        ("", "is empty"),
        ("  ", "is empty"),
        ("{name.__class__}", "'{name.__class__}' is not a plain field"),
        ("{name[0]}", "'{name[0]}' is not a plain field"),
        ("{name!r}", "'{name!r}' is not a plain field"),
        ("{series_number:03d}", "'{series_number:03d}' is not a plain field"),
        ("{0}", "'{0}' is not a plain field"),
        ("{patient}", "uses unknown field 'patient'"),
    ],
)
def test_naming_templates_take_plain_fields_only(tmp_path, capsys, template, error):
    """``--name`` is text with plain ``{field}``s of the documented set: an empty template, or
    a field with attribute or index access, a conversion or a format spec, is a usage error
    (exit 2) before any work."""
    image = os.path.join(ROOT, "sample_data", "nifti", "images", "case001.nii.gz")
    out = tmp_path / "out"
    assert main(["convert", image, "-o", str(out), "--spacing", "3", "--name", template]) == 2
    err = capsys.readouterr().err
    assert "usage error" in err and error in err and "Traceback" not in err
    assert not out.exists()


def test_plain_naming_templates_still_work(tmp_path):
    image = os.path.join(ROOT, "sample_data", "nifti", "images", "case001.nii.gz")
    out = tmp_path / "out"
    rc = main(["convert", image, "-o", str(out), "--spacing", "3", "-q", "--name", "{{x}}-{name}"])
    assert rc == 0 and os.path.exists(out / "{x}-case001.nii.gz")


@pytest.mark.parametrize("uids", ["kept", "deleted"])
def test_inspect_lists_every_series_of_a_folder_holding_two(tmp_path, quiet, uids):
    """A prober's finding: ``medproc inspect`` on a folder holding two readable series (with
    their UIDs, or without: one volume per part of the folder) listed one, exit 0, while
    ``convert`` wrote both: the report's de-duplication keyed entries by folder alone."""
    d = tmp_path / "mix"
    d.mkdir()
    for prefix, src in (("x", AXIAL), ("y", OBLIQUE)):
        for n in os.listdir(src):
            shutil.copy(os.path.join(src, n), d / f"{prefix}{n}")
    if uids == "deleted":
        _edit(d, SeriesInstanceUID=None)
    found = [e for e in inspect_paths(str(d)) if e.kind == "dicom"]
    assert sorted(e.files for e in found) == [30, 40], [(e.series, e.files) for e in found]
    assert not any(e.error for e in found)
    assert len({e.series for e in found}) == 2
    rc, rows = _convert(tmp_path, tmp_path / "mix")
    assert rc == 0 and len(rows) == 2
