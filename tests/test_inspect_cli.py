import json

from medproc.cli import main


def test_inspect_sample_data(sample_data, capsys):
    assert main(["inspect", sample_data, "--width", "250"]) == 0
    out = capsys.readouterr().out
    assert "6 volume(s) found" in out
    assert "CT chest axial" in out and "40x112x112" in out and "2.5 x 2.9 x 2.9" in out
    assert "lesions.csv" not in out  # stray files are ignored quietly


def test_inspect_reports_broken_inputs(broken_dataset, capsys):
    import os

    root = os.path.dirname(broken_dataset["nan"])
    assert main(["inspect", root, "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    errors = {os.path.basename(e["source"]): e["error"] for e in entries if e["error"]}
    assert "missing slices" in errors["missing_slice"]
    assert "share a slice position" in errors["duplicate_slice"]
    assert "not a DICOM file" in errors["not_dicom.dcm"]
    assert "truncated file(s), e.g. IM00002.dcm: its pixel data ends 3000 bytes early" in errors["truncated"]
    ok = [e for e in entries if e["kind"] == "dicom" and not e["error"]]
    assert ok == []  # every broken series is reported, from headers and file sizes only


def test_inspect_shows_warnings(tmp_path, capsys):

    import medproc
    from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series

    aff = grid_affine((6, 16, 16), (2.0, 1.0, 1.0), (0, 0, 0), tilt_deg=20)
    img, _ = ct_phantom((6, 16, 16), aff, [])
    write_dicom_series(str(tmp_path / "tilt"), medproc.Volume(img, aff), "1.2.3.4", gantry_tilt=20)
    assert main(["inspect", str(tmp_path), "--width", "250"]) == 0
    out = capsys.readouterr().out
    assert "1 warning(s)" in out and "gantry tilt of 20.000 degrees" in out
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(tmp_path / "empty")]) == 1
