import json
import os

import numpy as np
import pytest

from medproc.cli import main


def test_inspect_sample_data(sample_data, capsys):
    import os

    assert main(["inspect", sample_data, "--width", "300"]) == 0
    out = capsys.readouterr().out
    assert "6 row(s): 6 readable volume(s), 0 in error" in out
    # sizes and spacings in (i, j, k) = (columns, rows, slices) order, as nibabel shows them
    assert "CT chest axial" in out and "112x112x40" in out and "2.9 x 2.9 x 2.5" in out
    # each series by its folder, and its UID
    assert os.path.join(sample_data, "dicom", "ct_axial") in out
    assert "1.2.826.0.1.3680043.8.498.2026.1.1" in out
    # stray files are accounted for: listed as skipped, with the reason
    assert "1 path(s) skipped" in out
    assert f"{os.path.join(sample_data, 'lesions.csv')}: not a DICOM or image file" in out
    assert main(["inspect", sample_data, "--width", "300", "-q"]) == 0
    assert "lesions.csv" not in capsys.readouterr().out  # -q: the table and errors only


def test_inspect_reports_what_load_gives(sample_data, capsys):
    """inspect (headers only) reports the shape, spacing and orientation that medproc.load and
    nibabel give: one axis order, (i, j, k)."""
    import os

    import nibabel as nib

    import medproc

    assert main(["inspect", sample_data, "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in entries].count("skipped") == 1  # lesions.csv
    entries = [e for e in entries if e["kind"] != "skipped"]
    assert len(entries) == 6
    for e in entries:
        vol = medproc.load(e["source"], series=e["series"] or None)
        assert tuple(e["shape"]) == vol.shape, e
        np.testing.assert_allclose(e["spacing"], vol.spacing, atol=1e-4)
        assert e["orientation"] == vol.orientation == "LPS"
        if e["kind"] == "nifti":
            img = nib.load(e["source"])
            assert tuple(e["shape"]) == img.shape[:3]
            np.testing.assert_allclose(e["spacing"], img.header.get_zooms()[:3], atol=1e-4)
            assert e["orientation"] == "".join(nib.aff2axcodes(img.affine))
    axial = next(e for e in entries if os.path.basename(e["source"]) == "ct_axial")
    assert axial["shape"] == [112, 112, 40] and axial["spacing"] == [2.9, 2.9, 2.5]


def test_inspect_reports_broken_inputs(broken_dataset, capsys):
    import os

    root = os.path.dirname(broken_dataset["nan"])
    assert main(["inspect", root, "--json"]) == 1  # series or files in error: status 1
    entries = json.loads(capsys.readouterr().out)
    errors = {os.path.basename(e["source"]): e["error"] for e in entries if e["error"]}
    assert "missing slices" in errors["missing_slice"]
    assert "share a slice position" in errors["duplicate_slice"]
    assert "not a DICOM file" in errors["not_dicom.dcm"]
    assert (
        errors["truncated"] == "IM00002.dcm: truncated file: its pixel data ends 3000 bytes early"
    )
    ok = [e for e in entries if e["kind"] == "dicom" and not e["error"]]
    assert ok == []  # every broken series is reported, from headers and file sizes only


def test_inspect_shows_warnings(tmp_path, capsys):

    import medproc
    from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series

    # (i, j, k) = 16 columns, 16 rows of 1 mm, 6 slices of 2 mm
    aff = grid_affine((16, 16, 6), (1.0, 1.0, 2.0), (0, 0, 0), tilt_deg=20)
    img, _ = ct_phantom((16, 16, 6), aff, [])
    write_dicom_series(str(tmp_path / "tilt"), medproc.Volume(img, aff), "1.2.3.4", gantry_tilt=20)
    assert main(["inspect", str(tmp_path), "--width", "250"]) == 0
    out = capsys.readouterr().out
    assert "1 warning(s)" in out and "gantry tilt of 20.000 degrees" in out
    assert "16x16x6" in out
    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "empty"), "--width", "300"]) == 1
    out = capsys.readouterr().out  # the empty folder is the one row, in error
    assert "1 row(s): 0 readable volume(s), 1 in error" in out and "holds no file at all" in out


def test_inspect_exits_1_when_anything_is_in_error_and_lists_it(sample_data, tmp_path, capsys):
    import shutil

    shutil.copytree(f"{sample_data}/dicom/ct_axial", tmp_path / "good")
    bad = tmp_path / "bad.nii.gz"
    bad.write_bytes(b"not a nifti")
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["inspect", str(tmp_path / "good")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path), "--width", "300"]) == 1
    out = capsys.readouterr().out
    assert "2 row(s): 1 readable volume(s), 1 in error" in out and f"{bad}:" in out
    assert f"{tmp_path / 'notes.txt'}: not a DICOM or image file" in out


def test_a_path_that_does_not_exist_is_a_usage_error(sample_data, tmp_path, capsys):
    """A mistyped path stops inspect (exit 2, naming it), as it stops convert."""
    assert main(["inspect", sample_data, str(tmp_path / "nope")]) == 2
    assert "nope: no such file or folder" in capsys.readouterr().err


def test_piped_the_table_is_as_wide_as_its_rows(sample_data, capsys, monkeypatch):
    """Not a terminal (capsys) and no COLUMNS: rows are not folded to rich's 80 columns
    (which cut folders into slivers)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["inspect", sample_data]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) > 120
    folder = os.path.join(sample_data, "dicom", "ct_axial")
    assert any(folder in line for line in lines)  # whole, on one line


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_a_reader_that_went_away_gives_141(sample_data, extra):
    """``medproc inspect ... | head``: the documented 141, for the table (rich's console would
    exit 1 itself) and for JSON."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "medproc", "inspect", sample_data, *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # no reader from the start: the first write meets a closed pipe
    _, err = p.communicate(timeout=120)
    assert p.returncode == 141, err.decode()[-2000:]


@pytest.mark.parametrize(
    "args, message",
    [
        (["inspect", "sample_data", "--width", "-5"], "--width: must be >= 40"),
        (["inspect", "sample_data", "--max-skipped", "-1"], "--max-skipped: must be >= 0"),
        (["trace", "sample_data", "--png", "t.jpg"], "the picture is a PNG"),
    ],
)
def test_out_of_range_options_are_usage_errors(args, message, capsys):
    """--width -5 printed nothing at all, --max-skipped -1 a wrong count, and --png x.jpg a PNG
    under a JPEG name."""
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_series_split_over_two_named_folders_is_one_volume(sample_data, tmp_path, capsys):
    """Half the slices in A, half in B, both named (relative paths): one series, no folder
    reported empty; convert's manifest names the folder holding both."""
    import csv
    import shutil

    files = sorted(os.listdir(os.path.join(sample_data, "dicom", "ct_axial")))
    for n, f in enumerate(files):
        d = tmp_path / ("A" if n < len(files) // 2 else "B")
        d.mkdir(exist_ok=True)
        shutil.copy(os.path.join(sample_data, "dicom", "ct_axial", f), d / f)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["inspect", "A", "B", "--json"]) == 0
        (entry,) = json.loads(capsys.readouterr().out)
        assert entry["kind"] == "dicom" and entry["files"] == len(files)
        assert entry["folders"] == ["A", "B"]
        assert main(["convert", "A", "B", "-o", "out", "--spacing", "4", "-q"]) == 0
        (row,) = csv.DictReader(open("out/manifest.csv"))
        assert row["source"] == str(tmp_path) and row["status"] == "ok"
    finally:
        os.chdir(here)


def test_hidden_files_named_like_images_are_said_not_dropped(sample_data, tmp_path, capsys):
    """``.x.nii.gz`` (macOS's ``._case.nii.gz``...) is not read, and says so; a .DS_Store and
    medproc's own temporaries pass unsaid."""
    import shutil

    shutil.copy(f"{sample_data}/nifti/images/case001.nii.gz", tmp_path / "case001.nii.gz")
    shutil.copy(f"{sample_data}/nifti/images/case001.nii.gz", tmp_path / "._case001.nii.gz")
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    (tmp_path / ".case002.nii.gz.abcdefgh.part.nii.gz").write_bytes(b"")
    assert main(["inspect", str(tmp_path), "--width", "300"]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path / '._case001.nii.gz'}: a hidden file" in out and "1 path(s) skipped" in out
    assert ".DS_Store" not in out and ".part" not in out
