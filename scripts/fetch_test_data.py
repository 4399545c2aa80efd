"""Fetch real test volumes nobody on the team wrote: pyradiomics 3.0.1's data/ (NRRD CT/MR
with tumour label maps) from its PyPI source package. Idempotent; prints the folder.

    python scripts/fetch_test_data.py [DEST]   (default: .data/)
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tarfile
import tempfile


def fetch(dest: str = ".data") -> str:
    out = os.path.join(dest, "pyradiomics")
    if len(glob.glob(os.path.join(out, "*.nrrd"))) >= 6 or os.environ.get("MEDPROC_OFFLINE"):
        return out  # MEDPROC_OFFLINE: use what is there (machines without a package index)
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--no-build-isolation",
                "pyradiomics==3.0.1",
                "-d",
                tmp,
            ],
            check=True,
        )
        (sdist,) = glob.glob(os.path.join(tmp, "pyradiomics-3.0.1.tar.gz"))
        with tarfile.open(sdist) as tf:
            for m in tf.getmembers():
                if (
                    m.isfile()
                    and m.name.startswith("pyradiomics-3.0.1/data/")
                    and m.name.endswith(".nrrd")
                ):
                    m.name = os.path.basename(m.name)
                    tf.extract(m, out, filter="data")
    return out


def pydicom_test_files() -> list[str]:
    """Every .dcm file shipped by pydicom and pydicom-data (MEDPROC_PYDICOM_DATA names a copy of
    pydicom-data's folder on machines where the package cannot be installed: the GPU machine)."""
    import pydicom
    from pydicom.data import get_testdata_file

    base = os.path.join(os.path.dirname(pydicom.__file__), "data", "test_files")
    files = sorted(glob.glob(os.path.join(base, "*.dcm")))
    store = os.environ.get("MEDPROC_PYDICOM_DATA")
    if not store:
        ext = get_testdata_file("693_J2KR.dcm")  # pydicom-data's store (exact name: no download)
        store = os.path.dirname(ext) if ext else None
    if store:
        files += sorted(glob.glob(os.path.join(store, "*.dcm")))
    return files


if __name__ == "__main__":
    print(fetch(*sys.argv[1:]))
