"""CPU time per file of the DICOM header scan (``medproc.io.dicom_records.scan_file``), in one
process: what every ``medproc convert`` / ``medproc inspect`` spends per file before any voxel
is read. Compare two checkouts by running it with each on ``PYTHONPATH``::

    python -m medproc.sample_data /tmp/many --cases 32 --size 96 --slices 150 250
    PYTHONPATH=OLD python bench/scan_headers.py '/tmp/many/dicom/*/*'
    PYTHONPATH=NEW python bench/scan_headers.py '/tmp/many/dicom/*/*'
"""

import argparse
import glob
import statistics
import time

from medproc.io.dicom_records import scan_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pattern", help="a glob of DICOM files (quote it)")
    ap.add_argument("--files", type=int, default=2000, help="files scanned per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    files = sorted(glob.glob(a.pattern))[: a.files]
    if not files:
        raise SystemExit(f"no files match {a.pattern!r}")
    for f in files[:100]:  # imports and the file cache
        scan_file(f)
    ms = []
    for _ in range(a.repeats):
        t = time.process_time()
        for f in files:
            scan_file(f)
        ms.append((time.process_time() - t) / len(files) * 1e3)
    print(
        f"{len(files)} files: {min(ms):.3f} ms per file (min of {a.repeats}), "
        f"median {statistics.median(ms):.3f}"
    )


if __name__ == "__main__":
    main()
