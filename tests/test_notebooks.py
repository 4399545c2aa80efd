"""Every notebook runs top to bottom on sample_data on a CPU-only machine (nbclient)."""

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_there_are_four_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}},
    ).execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors


def test_api_reference_is_current():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "make_api_docs.py"), "--check"]
    )
    assert r.returncode == 0, "docs/api.md is stale: run python scripts/make_api_docs.py"
