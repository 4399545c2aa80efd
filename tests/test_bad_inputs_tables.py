"""Bad tables and bad output folders: annotation files (CSV, JSON, DICOM SEG/RTSTRUCT), case
lists and ``-o`` folders that cannot be used give one clear error (file, line or item, what was
expected, what to do), exit status 2, no traceback, and nothing converted; a garbage
``manifest.csv`` is moved aside with a warning and the run goes on."""

import json
import os
import re

import nibabel as nib
import numpy as np
import pydicom
import pytest

import medproc
from medproc.annotations import read_json, read_luna_csv, read_rtstruct, read_seg
from medproc.cli import main

HEAD = "seriesuid,coordX,coordY,coordZ,diameter_mm\n"


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    arr = np.random.default_rng(0).integers(-1000, 1000, (10, 8, 6)).astype(np.int16)
    p = d / "case1.nii.gz"
    nib.save(nib.Nifti1Image(arr, np.diag([2.0, 2.0, 3.0, 1.0])), p)
    return str(p)


def _run(args, capsys):
    rc = main(args)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err + cap.out, cap.err
    return rc, cap.err


LESION_CSVS = {
    "utf16.csv": (
        "seriesuid,coordX,coordY,coordZ,diameter_mm\na,1,2,3,4\n".encode("utf-16"),
        "is UTF-16 text .*save it as UTF-8",  # (was "Latin-1 or binary?")
    ),
    "garbage.csv": (os.urandom(3000), "not UTF-8|NUL"),
    "latin1.csv": ((HEAD + "café,1,2,3,4\n").encode("latin-1"), r"line 2: is not UTF-8"),
    "nul.csv": ((HEAD + "a,1,2\x00,3,4\n").encode(), r"line 2: holds NUL bytes"),
    "huge_field.csv": (  # (on line 3: it said line 2, the line before)
        (HEAD + "A,1,2,3,4\n" + "a," + "9" * 300000 + ",2,3,4\n").encode(),
        r"line 3: .*field larger than field limit",
    ),
    "missing_cols.csv": (b"uid,x,y,z\nA,1,2,3\n", r"line 1: missing column\(s\)"),
    "not_numbers.csv": ((HEAD + "A,1,x,3,4\n").encode(), r"line 2: coordinates and diameter"),
    "empty_uid.csv": ((HEAD + ",1,2,3,4\n").encode(), r"line 2: empty seriesuid"),
    "nan.csv": ((HEAD + "A,nan,2,3,4\n").encode(), r"line 2: coordinates must be finite"),
    "unclosed_quote.csv": ((HEAD + 'A,"1,2,3,4\n').encode(), r"line \d+|coordinates"),
    # (the numbers are checked as arrays: the first bad line is still the one named)
    "nan_before_text.csv": (
        (HEAD + "A,1,2,3,4\nA,1,2,3,0\nB,1,2,3,4\nA,1,x,3,4\n").encode(),
        r"line 3: coordinates must be finite and the diameter > 0, got \[1.0, 2.0, 3.0\] / 0.0",
    ),
    "far_then_nan.csv": (
        (HEAD + "A,1,2,3,4\nA,1,2,1e6,4\nA,nan,2,3,4\n").encode(),
        r"line 3: coordinates \[1.0, 2.0, 1000000.0\] lie more than",
    ),
    "far_before_empty.csv": (
        (HEAD + "A,1,2,3,4\nA,1,2,1e6,4\n,1,2,3,4\n").encode(),
        r"line 3: coordinates \[1.0, 2.0, 1000000.0\] lie more than",
    ),
    "nan_then_extra_cells.csv": (  # (a prober's: the CSV error of line 5 was named)
        (HEAD + "s1,1,2,3,4\ns3,nan,1,1,1\ns3,2,2,2,2\ns2,0,0,0,5,7\n").encode(),
        r"line 3: coordinates must be finite",
    ),
    "far_then_huge_field.csv": (
        (HEAD + "s1,1,2,3,4\ns3,1,1,1,2500\ns3," + "9" * 300000 + ",2,3,4\n").encode(),
        r"line 3: size or diameter 2500.0 mm is over 2000 mm",
    ),
    "nan_on_the_empty_uid_line.csv": (
        (HEAD + "A,1,2,3,4\n,nan,2,3,4\n").encode(),
        r"line 3: coordinates must be finite",
    ),
}

JSONS = {
    "not_json.json": ("{cases: oops", r"line 1: not valid JSON"),
    "latin1.json": (b'{"cases": [{"image": "caf\xe9"}]}', "not UTF-8"),
    "list.json": ("[1, 2]", "top level is a JSON list"),
    "converted_label.json": (  # (convert's annotations.json: it named cases[0].labels[0])
        '{"image": "a", "lesions": [{"kind": "box", "center_world_ras": [1, 2, 3], '
        '"size_mm": [1, 2, 3], "label": "x"}]}',
        r"lesions\[0\].label: a label must be an integer",
    ),
    "boxes_3.json": (
        '{"cases": [{"image": "a", "boxes": 3}]}',
        r"cases\[0\].boxes: must be a list",
    ),
    "label_str.json": (
        '{"cases": [{"image": "a", "boxes": [[1,2,3,4,5,6]], "labels": ["a"]}]}',
        r"cases\[0\].labels\[0\]: a label must be an integer",
    ),
    "label_float.json": (
        '{"cases": [{"image": "a", "boxes": [[1,2,3,4,5,6]], "labels": [1.5]}]}',
        r"labels\[0\]: a label must be an integer, got 1.5",
    ),
    "label_bool.json": (
        '{"cases": [{"image": "a", "boxes": [[1,2,3,4,5,6]], "labels": [true]}]}',
        "a label must be an integer",
    ),
    "label_huge.json": (
        '{"cases": [{"image": "a", "boxes": [[1,2,3,4,5,6]], "labels": [1' + "0" * 40 + "]}]}",
        "a label must be an integer",
    ),
    "number_huge.json": ('{"cases": [{"image": "a", "points": [[1e999, 2, 3, 4]]}]}', "finite"),
    "int_huge.json": (
        '{"cases": [{"image": "a", "points": [[1' + "0" * 400 + ", 2, 3, 4]]}]}",
        "finite",
    ),
    "case_str.json": ('{"cases": ["a.nii.gz"]}', r"cases\[0\]: must be an object"),
    "no_image.json": ('{"cases": [{"boxes": []}]}', r"cases\[0\]: needs an 'image'"),
    "image_number.json": ('{"cases": [{"image": 7}]}', r"cases\[0\]: needs an 'image'"),
    "box_strings.json": (
        '{"cases": [{"image": "a", "boxes": [["1","2","3","4","5","6"]]}]}',
        r"cases\[0\].boxes\[0\]: expected 6 finite numbers",
    ),
    "point_short.json": (
        '{"cases": [{"image": "a", "points": [[1, 2, 3]]}]}',
        r"cases\[0\].points\[0\]: expected 4",
    ),
    "deep.json": ("[" * 100000 + "]" * 100000, "nested too deeply"),
    "twice.json": ('{"cases": [{"image": "a.nii.gz"}, {"image": "a.nii.gz"}]}', "listed again"),
    "system_number.json": ('{"coordinate_system": 5, "cases": []}', "coordinate_system: must be"),
    "cases_str.json": ('{"cases": "x"}', "cases: must be a list"),
    "training_str.json": ('{"training": [3]}', r"training\[0\]: must be an object"),
}


def test_luna_series_of_another_type_is_refused_not_an_empty_answer(sample_data):
    table = os.path.join(sample_data, "lesions.csv")
    for series in (3, ["case001"], None):
        if series is None:
            assert read_luna_csv(table, series)  # (None: every image's)
            continue
        with pytest.raises(medproc.UsageError, match="read_luna_csv: series must be"):
            read_luna_csv(table, series)


def _write(path, data):
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return str(path)


@pytest.mark.parametrize("name", sorted(LESION_CSVS) + sorted(JSONS))
def test_malformed_annotation_file_is_one_clear_error(name, image, tmp_path, capsys):
    data, pattern = {**LESION_CSVS, **JSONS}[name]
    p = _write(tmp_path / name, data)
    reader = read_json if name.endswith(".json") else read_luna_csv
    with pytest.raises(medproc.errors.ReadError, match=pattern) as ei:
        reader(p)
    assert str(ei.value).startswith(p + ": ")
    out = tmp_path / "out"
    args = ["convert", image, "-o", str(out), "--spacing", "3", "--annotations", p]
    rc, err = _run(args, capsys)
    assert rc == 2 and f"{p}: " in err and "error" in err
    assert not out.exists()  # refused before any work


def test_annotation_paths_that_are_not_tables(image, tmp_path, capsys, sample_data):
    dcm = os.path.join(sample_data, "dicom", "ct_axial", "IM00000.dcm")
    os.mkdir(tmp_path / "folder.csv")
    os.mkfifo(tmp_path / "pipe.csv")
    cases = {
        dcm: "is a DICOM file, not a lesion table",
        str(tmp_path / "missing.csv"): "no such file",
        str(tmp_path / "folder.csv"): "is a folder, not a regular file. Point it",
        str(tmp_path / "pipe.csv"): "FIFO (named pipe), not a regular file; medproc never reads",
    }
    for p, pattern in cases.items():
        rc, err = _run(
            ["convert", image, "-o", str(tmp_path / "o"), "--spacing", "3", "--annotations", p],
            capsys,
        )
        assert rc == 2 and p in err and pattern in err, err
        # (a prober's finding: a folder was said to be "not an image file", read from "pipes")
        assert ("pipes" in err) == p.endswith("pipe.csv") and "image file" not in err
    with pytest.raises(medproc.errors.ReadError, match="is a DICOM file, not a JSON"):
        read_json(dcm)


def test_truncated_or_incomplete_seg_and_rtstruct(tmp_path):
    from pydicom.data import get_testdata_file

    seg = get_testdata_file("liver.dcm")
    raw = open(seg, "rb").read()
    cut = _write(tmp_path / "seg_cut.dcm", raw[: len(raw) // 2])
    with pytest.raises(medproc.errors.ReadError, match="seg_cut.dcm"):
        read_seg(cut)
    ds = pydicom.dcmread(seg)
    del ds.PerFrameFunctionalGroupsSequence[1].SegmentIdentificationSequence
    ds.save_as(tmp_path / "seg_noid.dcm")
    with pytest.raises(medproc.errors.ReadError, match=r"seg_noid.dcm: frame 2: has no Segment"):
        read_seg(tmp_path / "seg_noid.dcm")
    ds = pydicom.dcmread(seg)
    del ds.PerFrameFunctionalGroupsSequence[0].PlanePositionSequence
    del ds.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence
    ds.save_as(tmp_path / "seg_nopos.dcm")
    with pytest.raises(medproc.errors.ReadError, match="seg_nopos.dcm: .*cannot be placed"):
        read_seg(tmp_path / "seg_nopos.dcm")
    vol = medproc.Volume(np.zeros((8, 8, 4), np.int16), np.eye(4))
    rt = pydicom.Dataset()
    rt.Modality = "RTSTRUCT"
    item = pydicom.Dataset()
    item.ContourSequence = [pydicom.Dataset()]
    rt.ROIContourSequence = [item]  # no ReferencedROINumber, no ContourData
    rt.file_meta = pydicom.dataset.FileMetaDataset()
    rt.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    rt.save_as(tmp_path / "rt.dcm", enforce_file_format=False)
    with pytest.raises(medproc.errors.ReadError, match="rt.dcm: is an incomplete or malformed"):
        read_rtstruct(tmp_path / "rt.dcm", vol)
    item.ReferencedROINumber = 1
    item.ContourSequence[0].ContourData = [0, 0, 1, 4, 0, 1, 4, 4, 1]
    rt.save_as(tmp_path / "rt.dcm", enforce_file_format=False)
    with pytest.warns(medproc.errors.MedprocWarning, match=r"contours of ROI \[1\], which Struc"):
        assert not read_rtstruct(tmp_path / "rt.dcm", vol).array.any()  # (no unnamed number)
    named = pydicom.Dataset()
    named.ROINumber, named.ROIName = 1, "gtv"
    rt.StructureSetROISequence = [named]
    item.ContourSequence[0].ContourData = ["1", "2"]  # not x, y, z triples
    rt.save_as(tmp_path / "rt.dcm", enforce_file_format=False)
    with pytest.raises(medproc.errors.ReadError, match=r"ROI 1 contour 1: malformed ContourData"):
        read_rtstruct(tmp_path / "rt.dcm", vol)
    item.ContourSequence[0].ContourData = [0, 0, 50, 4, 0, 50, 4, 4, 50]  # slice 50 of 4
    rt.save_as(tmp_path / "rt.dcm", enforce_file_format=False)
    with pytest.raises(medproc.errors.ReadError, match=r"all 1 of its contours lie outside"):
        read_rtstruct(tmp_path / "rt.dcm", vol)
    for f in (cut, tmp_path / "rt.dcm"):
        with pytest.raises(medproc.MedprocError):
            (read_seg if "seg" in str(f) else lambda p: read_rtstruct(p, vol))(f)
    on_slice = pydicom.Dataset()
    on_slice.ContourData = [0, 0, 1, 4, 0, 1, 4, 4, 1]  # on slice 1: drawn
    item.ContourSequence.append(on_slice)
    rt.save_as(tmp_path / "rt.dcm", enforce_file_format=False)
    with pytest.warns(medproc.errors.MedprocWarning, match=r"1 of 2 contours lie outside"):
        assert read_rtstruct(tmp_path / "rt.dcm", vol).array[:, :, 1].any()


CASE_LISTS = {  # name: (contents made from the good image's path, what the error says)
    "no_image_col.csv": (lambda i: "path,label\na.nii.gz,\n", r"line 1: missing column"),
    "empty_cell.csv": (lambda i: f"image,name\n{i},a\n,b\n", r"line 3: the 'image' cell is"),
    "latin1.csv": (lambda i: f"image,name\n{i},café\n".encode("latin-1"), "line 2: is not UTF-8"),
    "nul.csv": (lambda i: f"image\n{i}\x00\n", "line 2: holds NUL"),
    "huge.csv": (lambda i: f"image,name\n{i}," + "n" * 300000 + "\n", "field larger"),
    "binary.csv": (lambda i: os.urandom(2000), "not UTF-8|NUL|missing column"),
}


@pytest.mark.parametrize("name", sorted(CASE_LISTS))
def test_malformed_case_list(name, image, tmp_path, capsys):
    make, pattern = CASE_LISTS[name]
    p = _write(tmp_path / name, make(image))
    out = tmp_path / "out"
    rc, err = _run(["convert", p, "-o", str(out), "--spacing", "3"], capsys)
    assert rc == 2 and f"{p}: " in err and re.search(pattern, err), err
    assert not os.path.exists(out / "manifest.csv")


def test_case_list_names_cannot_escape_the_output_folder(image, tmp_path, capsys):
    rows = ["../../../escaped", "/etc/cron.d/x", "..", ".hidden", "a/../../b", "", "x\x01y"]
    text = "image,name\n" + "".join(f'{image},"{n}"\n' for n in rows)
    text += f"{tmp_path / 'missing.nii.gz'},m\n"
    p = _write(tmp_path / "list.csv", text)
    before = set(os.listdir(tmp_path))
    out = tmp_path / "deep" / "out"
    rc, err = _run(["convert", p, "-o", str(out), "--spacing", "3"], capsys)
    # the missing image is a failed row; the image is converted once, the rows that list it
    # again under another name fail, saying so (none is dropped unsaid)
    assert set(os.listdir(tmp_path)) == before | {"deep"} and os.listdir(tmp_path / "deep") == [
        "out"
    ]
    import csv

    m = list(csv.DictReader(open(out / "manifest.csv")))
    assert rc == 1 and [r["status"] for r in m].count("ok") == 1 and len(m) == 8
    for r in m:
        assert os.path.dirname(r["output"]) == str(out) and not r["case"].startswith(".")
    again = [r for r in m if "listed again" in r["error"]]
    assert len(again) == 6 and all("with another label or name" in r["error"] for r in again)
    missing = next(r for r in m if "missing.nii.gz" in r["error"])
    assert "missing.nii.gz: no such file or folder" in missing["error"]


def test_output_folder_that_is_a_file_or_busy(image, tmp_path, capsys):
    f = _write(tmp_path / "afile", "x")
    rc, err = _run(["convert", image, "-o", f, "--spacing", "3"], capsys)
    assert rc == 2 and f"{f}: exists and is not a folder" in err
    rc, err = _run(["convert", image, "-o", f"{f}/sub", "--spacing", "3"], capsys)
    assert rc == 2 and f"cannot be created: {f} is a file" in err  # (it said "not writable")
    from medproc.manifest import OutdirLock

    out = tmp_path / "busy"
    out.mkdir()
    lock = OutdirLock(str(out))
    try:
        # a second lock on the same folder from this process is granted by POSIX; another
        # process is refused, which a subprocess checks
        import subprocess
        import sys

        r = subprocess.run(
            [sys.executable, "-m", "medproc", "convert", image, "-o", str(out), "--spacing", "3"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and "another medproc convert" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    finally:
        lock.release()
    rc, err = _run(["convert", image, "-o", str(out), "--spacing", "3"], capsys)
    assert rc == 0


@pytest.mark.parametrize("dry", [False, True])
def test_a_qc_folder_that_is_a_file_is_refused_before_any_work(image, tmp_path, capsys, dry):
    """OUTDIR/qc a file: every case failed as 'a bug in medproc' (FileExistsError) and was
    recorded 'killed?', while --dry-run said all was fine (a prober's)."""
    out = tmp_path / "out"
    out.mkdir()
    _write(out / "qc", "x")
    args = ["convert", image, "-o", str(out), "--spacing", "3", "--qc"] + ["--dry-run"] * dry
    rc, err = _run(args, capsys)
    assert rc == 2 and f"{out / 'qc'}: exists and is not a folder: --qc writes" in err
    assert sorted(os.listdir(out)) == ["qc"]  # (nothing done)


def test_output_folder_not_writable(image, tmp_path):
    from badinputs import deny_prefix

    prefix = deny_prefix()
    if prefix is None:
        pytest.skip("running as root without user namespaces: every folder is writable")
    import subprocess
    import sys

    out = tmp_path / "ro"
    out.mkdir()
    os.chmod(out, 0o555)
    r = subprocess.run(
        [*prefix, sys.executable, "-m", "medproc", "convert", image, "-o", str(out / "sub")]
        + ["--spacing", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert f"{out / 'sub'}: cannot be written to" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "content",
    [os.urandom(4000), b"case,source\x00\n", b"case,world\n1,2\n", "caf\xe9".encode("latin-1")],
    ids=["binary", "nul", "partial-header", "latin1"],
)
def test_garbage_manifest_is_moved_aside_with_a_warning(content, image, tmp_path, capsys):
    """A damaged manifest (one with a manifest column, or no readable header) is moved aside;
    someone else's table is refused (tests/test_convert_hygiene.py)."""
    out = tmp_path / "out"
    out.mkdir()
    _write(out / "manifest.csv", content)
    rc, err = _run(["convert", image, "-o", str(out), "--spacing", "3"], capsys)
    assert rc == 0, err
    assert "warning" in err and "could not be parsed" in err and "moved aside" in err
    aside = [n for n in os.listdir(out) if n.startswith("manifest.csv.unreadable-")]
    assert len(aside) == 1 and open(out / aside[0], "rb").read() == content
    import csv

    (row,) = csv.DictReader(open(out / "manifest.csv"))
    assert row["status"] == "ok"


def test_labels_folder_that_does_not_exist(image, tmp_path, capsys):
    rc, err = _run(
        ["convert", image, "-o", str(tmp_path / "o"), "--spacing", "3", "--labels", "/nope"],
        capsys,
    )
    assert rc == 2 and "/nope: the labels folder (--labels) does not exist" in err


def test_errors_print_as_plain_text_and_verbose_shows_the_traceback(tmp_path, capsys):
    """An error whose text looks like rich markup prints as it is; -v adds the traceback."""
    os.mkdir(tmp_path / "x[")  # so the path holds a closing tag: .../x[/red]y.json
    p = _write(tmp_path / "x[" / "red]y.json", '{"cases": [{"image": "[bold]a", "boxes": 3}]}')
    assert "[/red]" in p
    img = tmp_path / "i[1].nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.int16), np.eye(4)), img)
    args = ["convert", str(img), "-o", str(tmp_path / "o"), "--spacing", "3", "--annotations", p]
    rc, err = _run(args, capsys)
    assert rc == 2 and f"{p}: cases[0].boxes: must be a list" in err
    assert main(["-v", *args]) == 2
    assert "Traceback" in capsys.readouterr().err
    doc = json.loads(open(p).read())
    assert doc["cases"][0]["boxes"] == 3  # the input is untouched


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"Cases": []}, "unknown key 'Cases': did you mean 'cases'?"),
        ({"lesions_by_case": []}, "holds neither a 'cases' list nor MONAI's"),
        ({"cases": [{"image": "a.nii", "box": [[0, 0, 0, 1, 1, 1]]}]}, "unknown key 'box'"),
        (
            {"cases": [{"image": "a.nii", "coordinate_system": "LPS"}]},
            "set once for the whole file",
        ),
        ({"training": [{"image": "a.nii", "boxes": [[0, 0, 0, 1, 1, 1]]}]}, "'boxes' is a key"),
        ({"cases": [], "training": []}, "holds both 'cases' and MONAI's"),
    ],
)
def test_a_lesion_json_with_misspelled_or_mixed_keys_is_refused(tmp_path, doc, message):
    """Each of these read as "no lesions" before: a typo must not silently empty a dataset's
    annotations."""
    p = tmp_path / "les.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(medproc.errors.ReadError, match=re.escape(message)) as e:
        read_json(p)
    assert str(p) in str(e.value)


def test_read_json_reads_what_medproc_writes(sample_data, tmp_path):
    """convert's <name>.annotations.json (world RAS centres) reads back onto the lesions it
    was made from, and MONAI datalists read: a 'label' path (a segmentation) means no box
    labels, a test entry may be a bare path."""
    out = tmp_path / "o"
    args = ["convert", os.path.join(sample_data, "dicom", "ct_axial"), "-o", str(out)]
    assert main(args + ["--annotations", os.path.join(sample_data, "lesions.csv"), "-q"]) == 0
    (ann,) = out.glob("*.annotations.json")
    (back,) = read_json(ann).values()
    uid = medproc.load(os.path.join(sample_data, "dicom", "ct_axial")).meta["series_uid"]
    ref = read_luna_csv(os.path.join(sample_data, "lesions.csv"), uid)
    assert len(back.centers) == len(ref.centers) == 2
    np.testing.assert_allclose(back.centers, ref.centers, atol=1e-3)  # (world, as written)
    np.testing.assert_allclose(back.sizes, ref.sizes, atol=1e-3)
    dl = tmp_path / "dl.json"
    dl.write_text(
        json.dumps(
            {"training": [{"image": "a.nii.gz", "label": "a_seg.nii.gz"}], "test": ["b.nii.gz"]}
        )
    )
    got = read_json(dl)
    assert set(got) == {"a", "b"} and all(len(v.centers) == 0 for v in got.values())


def test_control_characters_in_file_names_are_printed_escaped(tmp_path, capsys):
    """A file name holding a terminal escape sequence (or a newline) reaches the terminal
    escaped: it cannot clear the screen, retitle the window or split a row."""
    name = "x\x1b]0;PWNED\x07\x1b[2J\nrow.nii.gz"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(b"junk")
    assert main(["inspect", str(tmp_path / "in")]) == 1
    assert main(["convert", str(tmp_path / "in"), "-o", str(tmp_path / "o")]) == 1
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert "\x1b" not in text and "\x07" not in text
    assert "x\\x1b]0;PWNED\\x07\\x1b[2J\\nrow.nii.gz" in text
