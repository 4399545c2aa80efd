"""Where a benchmark result came from, written into every result file: the git commit (and
whether the tree differed from it), a hash of the code that ran (``medproc/`` and ``bench/``
sources: on the GPU node the copy of ``.git`` can be older than the tree it runs, and this hash
names the tree whatever git says), the arguments, the machine's cores and the date."""

from __future__ import annotations

import datetime
import glob
import hashlib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_sha1(root: str = ROOT) -> str:
    """sha1 over the paths and bytes of ``medproc/**/*.py`` and ``bench/*.py`` (12 hex digits);
    the same at a commit here as on any copy of that tree."""
    h = hashlib.sha1()
    files = glob.glob(os.path.join(root, "medproc", "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(root, "bench", "*.py"))
    for p in sorted(os.path.relpath(f, root) for f in files):
        h.update(p.encode())
        with open(os.path.join(root, p), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


def provenance(argv=None, root: str = ROOT) -> dict:
    def git(*args):
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "source_sha1": source_sha1(root),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "cpus": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


if __name__ == "__main__":  # the hash of this tree, to match a result file's source_sha1
    print(source_sha1())
