"""The ``medproc`` command line's conventions: help with every default and the exit codes,
``python -m medproc``, ``-q``, arguments checked before any work (exit 2, nothing written),
``--dry-run`` (lists the cases and their outputs, writes nothing). In-process unless the
process itself is what is tested."""

import json
import os
import re
import subprocess
import sys

import pytest

from medproc._cli_parser import HelpFormatter
from medproc.cli import build_parser, main


def _subparser(name):
    p = build_parser()
    sub = next(a for a in p._actions if a.dest == "command")
    return p, sub.choices[name]


@pytest.mark.parametrize("command", ["convert", "inspect", "trace"])
def test_help_shows_every_default_and_the_exit_codes(command, capsys):
    _, parser = _subparser(command)
    fmt = HelpFormatter("medproc")
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or action.required:
            continue
        text = fmt._get_help_string(action) or ""
        assert action.help, f"{action.option_strings} has no help"
        assert "default" in text, f"{action.option_strings}: no default shown in {text!r}"
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    # every command's table has the codes of docs/cli.md's table, each once
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "cli.md")).read()
    codes = re.findall(r"^\| (\d+) \|", doc, flags=re.M)
    assert codes == ["0", "1", "2", "130", "141", "143"], codes
    codes = codes if command == "convert" else codes[:-1]  # (143: convert's SIGTERM)
    table = out[out.index("exit status:") :]
    assert [c for c in re.findall(r"^  (\d+) ", table, flags=re.M)] == codes, table
    with pytest.raises(SystemExit):  # medproc --help: every code (143 named, a newcomer's)
        main(["--help"])
    top = capsys.readouterr().out
    assert re.findall(r"^  (\d+) ", top[top.index("exit status") :], flags=re.M) == (
        ["0", "1", "2", "130", "141", "143"]
    )
    if command == "convert":
        assert "130" in out and "(default: auto)" in out and "(default: linear)" in out
        assert "(default: none)" in out and "{folder}" not in out and "folder:" in out


def test_python_dash_m_medproc_and_its_exit_status(tmp_path):
    """The program exits with main's status (``run`` leaves at once after flushing)."""
    r = subprocess.run([sys.executable, "-m", "medproc", "--version"], capture_output=True)
    assert r.returncode == 0 and r.stdout.decode().startswith("medproc ")
    missing = str(tmp_path / "nope")
    args = ["convert", missing, "-o", str(tmp_path / "o"), "--spacing", "2"]
    r = subprocess.run([sys.executable, "-m", "medproc", *args], capture_output=True)
    err = r.stderr.decode()
    assert r.returncode == 2 and f"{missing}: no such file or folder" in err, err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def _bad_usage_cases(tmp_path, image):
    (tmp_path / "a_file").write_text("x")
    base = ["convert", image, "--spacing", "2"]
    return {
        "missing input": (
            ["convert", image, str(tmp_path / "missing_dir"), "--spacing", "2"],
            "missing_dir: no such file or folder",
        ),
        "zero spacing": (["convert", image, "--spacing", "0"], "spacing must be > 0"),
        "bad orientation": (base + ["--orientation", "XYZ"], "orientation must be three codes"),
        "unknown name field": (base + ["--name", "{patient}"], "unknown field 'patient'"),
        "nnunet without dataset": (base + ["--layout", "nnunet"], "needs --dataset"),
        "nnunet bad name": (
            base + ["--layout", "nnunet", "--dataset", str(tmp_path / "lungs")],
            "must look like 'Dataset501_Lungs'",
        ),
        "nnunet npy": (
            base
            + ["--layout", "nnunet", "--dataset", str(tmp_path / "Dataset001_A")]
            + ["--format", "npy"],
            "needs .nii.gz",
        ),  # fmt: skip
        "validation without layout": (base + ["--validation", "c1"], "goes with --layout monai"),
        "dataset without layout": (base + ["--dataset", "d"], "goes with --layout nnunet|monai"),
        "labels folder missing": (base + ["--labels", str(tmp_path / "nolabels")], "labels"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing input",
        "zero spacing",
        "bad orientation",
        "unknown name field",
        "nnunet without dataset",
        "nnunet bad name",
        "nnunet npy",
        "validation without layout",
        "dataset without layout",
        "labels folder missing",
    ],
)
def test_bad_arguments_stop_before_any_work(case, sample_data, tmp_path, capsys):
    image = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    args, message = _bad_usage_cases(tmp_path, image)[case]
    out = tmp_path / "out"
    assert main(args + ["-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not out.exists()  # nothing was written, not even the output folder


def test_a_validation_name_that_is_no_case_stops_before_any_conversion(
    sample_data, tmp_path, capsys
):
    images = os.path.join(sample_data, "nifti", "images")
    out = tmp_path / "out"
    args = ["convert", images, "-o", str(out), "--spacing", "3", "--layout", "monai"]
    assert main(args + ["--validation", "case002", "case999"]) == 2
    err = capsys.readouterr().err
    assert "--validation: validation case(s) case999: no such case (cases: case001, case002)" in err
    assert not out.exists()  # nothing converted: the folder this run made is gone again
    # a case an earlier run put in the folder may be named: the datalist holds it
    labels = ["--labels", os.path.join(sample_data, "nifti", "labels"), "--spacing", "3"]
    one = ["convert", os.path.join(images, "case001.nii.gz"), "-o", str(out), *labels]
    assert main(one + ["-q"]) == 0
    two = ["convert", os.path.join(images, "case002.nii.gz"), "-o", str(out), *labels]
    assert main(two + ["--layout", "monai", "--validation", "case001", "-q"]) == 0
    doc = json.load(open(out / "datalist.json"))
    assert [x["image"] for x in doc["validation"]] == ["case001.nii.gz"]
    assert [x["image"] for x in doc["training"]] == ["case002.nii.gz"]


def test_workers_and_output_folder_checked_before_any_work(sample_data, tmp_path, capsys):
    image = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    with pytest.raises(SystemExit) as e:  # argparse: -j takes a number >= 1 or auto
        main(["convert", image, "-o", str(tmp_path / "o"), "-j", "0"])
    assert e.value.code == 2 and "expected a whole number >= 1 or 'auto'" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["convert", image, "-o", str(tmp_path / "file"), "--spacing", "2"]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_gpu_device_without_a_gpu_is_a_usage_error(sample_data, tmp_path, capsys):
    from medproc.pipeline import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible here")
    image = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    out = tmp_path / "o"
    assert main(["convert", image, "-o", str(out), "--spacing", "2", "--device", "gpu"]) == 2
    assert "DALI sees no NVIDIA GPU" in capsys.readouterr().err and not out.exists()


def test_dry_run_lists_the_cases_and_their_outputs_and_writes_nothing(
    sample_data, tmp_path, capsys
):
    out = tmp_path / "out"
    args = [
        "convert",
        os.path.join(sample_data, "dicom"),
        os.path.join(sample_data, "nifti", "images"),
    ]
    args += ["--labels", os.path.join(sample_data, "nifti", "labels"), "-o", str(out)]
    args += ["--spacing", "3", "--qc", "--annotations", os.path.join(sample_data, "lesions.csv")]
    assert main(args + ["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    for name in ("case001", "case002"):
        for f in (f"{name}.nii.gz", f"{name}.json", f"{name}_label.nii.gz",
                  f"{name}.annotations.json", os.path.join("qc", f"{name}.png")):  # fmt: skip
            assert str(out / f) in text, f
    assert text.count("convert ") == 4 and "4 to convert, 0 already done" in text
    assert "nothing written (--dry-run)" in text
    assert main(args) == 0
    capsys.readouterr()
    manifest = out / "manifest.csv"
    before = (manifest.stat().st_mtime_ns, sorted(os.listdir(out)))
    assert main(args + ["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert text.count("skip (done)") == 4 and "0 to convert, 4 already done" in text
    assert (manifest.stat().st_mtime_ns, sorted(os.listdir(out))) == before


def test_quiet_prints_only_errors(sample_data, tmp_path, capsys):
    image = os.path.join(sample_data, "nifti", "images", "case001.nii.gz")
    assert main(["convert", image, "-o", str(tmp_path / "o"), "--spacing", "3", "-q"]) == 0
    cap = capsys.readouterr()
    assert cap.err == "" and cap.out == ""
    bad = tmp_path / "bad.nii.gz"
    bad.write_bytes(b"not a nifti")
    assert main(["convert", str(bad), "-o", str(tmp_path / "o2"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "bad.nii.gz" in err and "converted" not in err


def test_the_program_converts_exactly_as_the_library(sample_data, tmp_path):
    """``python -m medproc`` (lean DALI import, ``os._exit`` after flushing) writes the same
    outputs and manifest as ``main`` in-process, which leaves DALI's introspection alone."""
    import csv

    import numpy as np

    import medproc
    from medproc.cli import _LeanDali

    dicom = os.path.join(sample_data, "dicom", "ct_oblique")
    args = [dicom, "--spacing", "3", "--orientation", "RAS", "-j", "1"]
    r = subprocess.run(
        [sys.executable, "-m", "medproc", "convert", *args, "-o", str(tmp_path / "p")],
        capture_output=True,
    )
    assert r.returncode == 0 and b"1 converted" in r.stderr, r.stderr
    assert main(["convert", *args, "-o", str(tmp_path / "m")]) == 0
    assert not any(isinstance(f, _LeanDali) for f in sys.meta_path)
    rows = []
    for d in ("p", "m"):
        with open(tmp_path / d / "manifest.csv", newline="") as f:
            (row,) = csv.DictReader(f)
        rows.append(row)
    a, b = (medproc.load(row["output"]) for row in rows)
    np.testing.assert_array_equal(a.array, b.array)
    np.testing.assert_array_equal(a.affine, b.affine)
    keys = ("status", "in_shape", "out_shape", "out_spacing", "options", "series_uid")
    assert [rows[0][k] for k in keys] == [rows[1][k] for k in keys]


def test_an_unknown_option_and_v_with_q_get_the_command_s_usage(sample_data, capsys):
    for args, message in (
        (
            ["convert", sample_data, "-o", "/nonexistent/o", "--bogus"],
            "unrecognized arguments: --bogus",
        ),
        (["-v", "inspect", sample_data, "-q"], "-q/--quiet: not allowed with argument -v"),
    ):
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err
        assert f"usage: medproc {args[0] if args[0] != '-v' else args[1]}" in err
