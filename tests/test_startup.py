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


def test_outside_the_command_nothing_is_marked_and_afterwards_imports_work(monkeypatch):
    monkeypatch.delitem(sys.modules, "requests", raising=False)
    with without_unused_imports(command=True):
        with pytest.raises(ImportError):
            import requests  # noqa: F401
    assert "requests" not in sys.modules
    with without_unused_imports(command=False):
        pytest.importorskip("requests")
    assert is_command() is False  # pytest is not the medproc command
