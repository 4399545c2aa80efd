"""Synthetic compressed CT series for the GPU decode probe, tests and benchmark.

    python scripts/make_decode_data.py OUT [--slices N] [--size N] [--series N]

Writes OUT/<syntax>[-signed]/sNN/: JPEG 2000 lossless (12-bit unsigned and 16-bit signed),
HTJ2K lossless (12-bit unsigned) and JPEG lossless process 14 SV1 (12-bit unsigned and 16-bit
signed).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import medproc  # noqa: E402
from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series  # noqa: E402

SYNTAXES = {
    "j2k": ("1.2.840.10008.1.2.4.90", False),
    "j2k-signed": ("1.2.840.10008.1.2.4.90", True),
    "htj2k": ("1.2.840.10008.1.2.4.201", False),
    "jpegll": ("1.2.840.10008.1.2.4.70", False),
    "jpegll-signed": ("1.2.840.10008.1.2.4.70", True),
}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--series", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=list(SYNTAXES))
    a = ap.parse_args(argv)
    for name in a.only:
        ts, signed = SYNTAXES[name]
        for s in range(a.series):
            shape = (a.size, a.size, a.slices)
            aff = grid_affine(shape, (0.7, 0.7, 1.25), (-180.0, -160.0, -50.0 + s))
            img, _ = ct_phantom(shape, aff, [], seed=s)
            write_dicom_series(
                os.path.join(a.out, name, f"s{s:02d}"),
                medproc.Volume(img, aff),
                f"1.2.826.0.1.3680043.8.498.77.{len(name)}.{s}",
                transfer_syntax=ts,
                signed=signed,
                seed=s,
            )
        print("wrote", name)


if __name__ == "__main__":
    main()
