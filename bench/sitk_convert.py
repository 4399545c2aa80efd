"""The SimpleITK side of bench/convert.py, as a user would write it: DICOM series -> 1.5 mm
(linear, SimpleITK's own grid rule) -> float32 .nii.gz. One implementation, run in process
(``convert_one``) and as a whole process:

    python bench/sitk_convert.py OUT_DIR JOBS [--ext=nii] [--itk-threads=N] SERIES_DIR [...]

with JOBS > 1 a pool of that many processes (SimpleITK at its best: one per core);
``--itk-threads=N`` caps ITK's threads in every process (ITK's default is every core in each
of them, which a pool of one process per core oversubscribes); ``--ext=nii``
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


def _set_threads(n: int) -> None:
    if n > 0:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(n)


if __name__ == "__main__":
    out, jobs, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    opts = {}
    while rest and rest[0].startswith("--"):
        k, v = rest.pop(0)[2:].split("=", 1)
        opts[k] = v
    ext, threads = opts.get("ext", "nii.gz"), int(opts.get("itk-threads", 0))
    _set_threads(threads)
    work = [(src, os.path.join(out, f"{n}.{ext}")) for n, src in enumerate(rest)]
    if jobs > 1 and len(work) > 1:
        pool = ProcessPoolExecutor(
            min(jobs, len(work)), initializer=_set_threads, initargs=(threads,)
        )
        with pool as ex:
            list(ex.map(_one, work))
    else:
        for w in work:
            _one(w)
