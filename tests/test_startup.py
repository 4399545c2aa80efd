"""The medproc command's own process does not import pydicom's `requests` (start-up time);
a library user's process, and later imports in the command's, are left alone."""

import subprocess
import sys

import pytest

from medproc._startup import is_command, without_unused_imports


def _loaded(*args: str) -> set:
    """The modules a Python process started with ``args`` imported (``-X importtime``)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, check=True
    )
    return {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}


def test_the_command_does_not_import_requests_but_the_library_does():
    pytest.importorskip("requests")  # pydicom imports it where it is installed
    command = _loaded("-m", "medproc", "--version")
    library = _loaded("-c", "import medproc")
    assert "pydicom" in command and "nibabel" in command  # the readers are loaded
    assert "requests.exceptions" not in command and "urllib3" not in command
    assert "requests.exceptions" in library  # a library user's process: unchanged


def test_marked_modules_are_absent_inside_and_import_normally_after(tmp_path, monkeypatch):
    (tmp_path / "medproc_unused_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("medproc_unused_probe",)
    with without_unused_imports(command=True, names=names):
        with pytest.raises(ImportError):
            import medproc_unused_probe  # noqa: F401
    assert "medproc_unused_probe" not in sys.modules
    with without_unused_imports(command=False, names=names):  # not the command: untouched
        import medproc_unused_probe

        assert medproc_unused_probe.VALUE == 1
    assert is_command() is False  # pytest is not the medproc command


def test_a_ctrl_c_while_the_command_imports_ends_it_without_a_traceback(tmp_path):
    """A Ctrl-C in the command's first ~0.2 s (its imports) printed an import traceback; it
    now ends the command with status 130 and one line (later, the command's own handling).
    The signal is sent from when medproc's first modules are imported (``-X importtime``
    says when; before that the interpreter itself is starting)."""
    import os
    import signal
    import time

    src = os.path.join(os.path.dirname(os.path.dirname(__file__)), "sample_data", "dicom")
    for n, delay in enumerate((0.02, 0.05, 0.1, 0.2)):
        out = str(tmp_path / str(n))
        p = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "medproc", "convert", src, "-o", out, "-q"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in p.stderr:  # (import times, one line per module as it is imported)
            if line.rstrip().endswith("medproc.errors"):
                break
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        err = p.stderr.read()
        p.wait(timeout=120)
        assert "Traceback" not in err, (delay, err[-2000:])
        assert p.returncode in (0, 130), (delay, p.returncode, err[-2000:])
        assert p.returncode == 0 or "interrupted" in err


def test_a_library_user_s_ctrl_c_handler_is_python_s_own():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import signal, medproc; "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "True"


def test_a_command_started_with_ctrl_c_ignored_keeps_ignoring_it(tmp_path):
    """A background job of a script starts with SIGINT ignored: the early handler replaced
    that, and the command then stopped on a Ctrl-C meant for the script (a review)."""
    import os
    import signal
    import time

    src = os.path.join(os.path.dirname(os.path.dirname(__file__)), "sample_data", "dicom")
    p = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "medproc", "convert", src, "-o",
         str(tmp_path / "out"), "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    for line in p.stderr:
        if line.rstrip().endswith("medproc.errors"):
            break
    for _ in range(3):  # (while importing, and after)
        time.sleep(0.1)
        p.send_signal(signal.SIGINT)
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err[-2000:]
    assert "interrupted" not in err
