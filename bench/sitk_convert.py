"""The SimpleITK side of bench/convert.py, as a user would write it: DICOM series -> 1.5 mm
(linear, SimpleITK's own grid rule) -> float32 .nii.gz. One implementation, run in process
(``convert_one``) and as a whole process:

    python bench/sitk_convert.py OUT_DIR JOBS [--ext=nii] [--itk-threads=N|auto] SERIES_DIR [...]

with JOBS > 1 a pool of that many processes (SimpleITK at its best: one per core);
``--itk-threads`` sets ITK's threads in every process (ITK's default is every core in each
of them, which a pool of one process per core oversubscribes; ``auto``: the cores shared out
over the processes that run, so fewer series than cores still use them all); ``--ext=nii``
writes uncompressed NIfTI (ITK's NIfTI writer gzips at zlib's default level whatever
``compressionLevel`` says, so the compressed outputs of the two tools are not the same work).
"""

import os
import sys
from concurrent.futures import ProcessPoolExecutor

import SimpleITK as sitk


def convert_one(src: str, out: str) -> None:
    """One series folder ``src`` to ``out`` (.nii.gz)."""
    r = sitk.ImageSeriesReader()
    r.SetFileNames(r.GetGDCMSeriesFileNames(src))
    img = r.Execute()
    size = [max(1, int(round(k * s / 1.5))) for k, s in zip(img.GetSize(), img.GetSpacing())]
    f = sitk.ResampleImageFilter()
    f.SetOutputOrigin(img.GetOrigin())
    f.SetOutputDirection(img.GetDirection())
    f.SetOutputSpacing((1.5, 1.5, 1.5))
    f.SetSize(size)
    f.SetInterpolator(sitk.sitkLinear)
    f.SetOutputPixelType(sitk.sitkFloat32)
    sitk.WriteImage(f.Execute(img), out)


def _one(args) -> None:
    convert_one(*args)


def set_threads(n: int) -> None:
    """ITK's threads in this process (0: ITK's default)."""
    if n > 0:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(n)


if __name__ == "__main__":
    out, jobs, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    opts = {}
    while rest and rest[0].startswith("--"):
        k, _, v = rest.pop(0)[2:].partition("=")
        if k not in ("ext", "itk-threads") or not v:
            sys.exit(
                f"sitk_convert.py: unknown option or no value: --{k}={v} (--ext=, --itk-threads=)"
            )
        opts[k] = v
    ext = opts.get("ext", "nii.gz")
    procs = max(1, min(jobs, len(rest)))
    given = opts.get("itk-threads", "0")
    threads = max(1, (os.cpu_count() or 1) // procs) if given == "auto" else int(given)
    set_threads(threads)
    work = [(src, os.path.join(out, f"{n}.{ext}")) for n, src in enumerate(rest)]
    if jobs > 1 and len(work) > 1:
        pool = ProcessPoolExecutor(
            min(jobs, len(work)), initializer=set_threads, initargs=(threads,)
        )
        with pool as ex:
            list(ex.map(_one, work))
    else:
        for w in work:
            _one(w)
