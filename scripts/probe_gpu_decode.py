"""On a GPU machine: prove, per pixel encoding, which GPU decoder configuration is bit-exact.

    python scripts/probe_gpu_decode.py [EXTRA_DIR ...] [--out FILE]     (PROBE_JOBS=8 files at once)
    python scripts/probe_gpu_decode.py --from-log PROBE_LOG TABLE   (select again, no GPU)

Decodes every compressed DICOM file of pydicom and pydicom-data (MEDPROC_PYDICOM_DATA: a copy of
its folder) and of each EXTRA_DIR (e.g. the synthetic series of scripts/make_decode_data.py) on
the GPU with each configuration in medproc.pipeline.decode.CONFIGS, compares every frame with
pydicom's CPU decoders, and writes medproc/pipeline/gpu_decode_support.json: for each encoding
key, the first configuration (in ``preference()`` order) that was exact on *every* file of that kind; the others, with the best difference or the error, under
"unsupported".
"""

import glob
import json
import os
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def files(extra):
    from fetch_test_data import pydicom_test_files

    out = pydicom_test_files()
    for d in extra:
        out += sorted(glob.glob(os.path.join(d, "**", "*.dcm"), recursive=True))
    return out


#: syntaxes whose streams may be irreversibly coded: a file that happens to be exact (a reversible
#: stream under a lossy syntax) proves nothing for the next file, whose float rounding may differ
LOSSY = {
    "1.2.840.10008.1.2.4.50",
    "1.2.840.10008.1.2.4.51",
    "1.2.840.10008.1.2.4.81",
    "1.2.840.10008.1.2.4.91",
    "1.2.840.10008.1.2.4.203",
}


def apply_policy(doc: dict) -> dict:
    """Keep GPU entries only for lossless-only syntaxes (see LOSSY); moved entries say why."""
    for key in [k for k in doc["entries"] if k.split("|")[0] in LOSSY]:
        entry = doc["entries"].pop(key)
        doc["unsupported"][key] = {
            "policy": "lossy syntax: exact on these files, not provable for others",
            "exact_files": entry["files"],
            "config": entry["config"],
        }
    return doc


def preference() -> list[int]:
    """Configurations in the order the table prefers them: the ``precision`` fix first (it reads
    the precision each frame's stream declares, so it holds where BitsStored differs), then the
    rest in CONFIGS order."""
    import medproc.pipeline.decode as dec

    return sorted(range(len(dec.CONFIGS)), key=lambda c: (dec.CONFIGS[c]["fix"] != "precision", c))


def select(records: list[tuple[str, dict]]) -> tuple[dict, dict]:
    """Per encoding key, the first preferred configuration exact on *every* file of that key.

    ``records``: (file name, {"key", "configs": {index: max |difference| or "error: ..."}} or
    {"key", "reference": why pydicom could not decode it}).
    """
    import medproc.pipeline.decode as dec

    by_key: dict = {}
    for name, r in records:
        by_key.setdefault(r["key"], []).append((name, r))
    entries, unsupported = {}, {}
    for key, items in sorted(by_key.items()):
        ok = None
        if all("configs" in r for _, r in items):
            ok = next(
                (c for c in preference() if all(r["configs"].get(c) == 0 for _, r in items)), None
            )
        if ok is not None:
            entries[key] = {"config": dec.CONFIGS[ok], "files": [n for n, _ in items]}
        else:
            unsupported[key] = {n: (r.get("configs") or r.get("reference")) for n, r in items}
    return entries, unsupported


def from_log(log: str, table: str) -> None:
    """Select again from the per-file results a probe printed (``name key {index: result}``
    lines), keeping the table's GPU facts; files pydicom could not decode stay as they were."""
    import ast
    import re

    records = []
    for line in open(log):
        m = re.match(r"^(\S+) (\S+\|\S+\|\S+\|\S+\|\S+\|.*?) (\{.*\})$", line.strip())
        if m:
            records.append(
                (m.group(1), {"key": m.group(2), "configs": ast.literal_eval(m.group(3))})
            )
    doc = json.load(open(table))
    for key, files in doc.get("unsupported", {}).items():
        for name, v in files.items():
            if isinstance(v, str) and v.startswith("pydicom cannot decode"):
                records.append((name, {"key": key, "reference": v}))
    doc["entries"], doc["unsupported"] = select(records)
    doc["selected_from_log"] = os.path.basename(log)
    with open(table, "w") as f:
        json.dump(apply_policy(doc), f, indent=1, default=str)
    print(
        f"{len(doc['entries'])} encodings proven, {len(doc['unsupported'])} left to the CPU -> {table}"
    )


def _name(path: str) -> str:
    """A file's name in the table: enough of its path to tell the synthetic sets apart."""
    parts = os.path.normpath(path).split(os.sep)
    return "/".join(parts[-4:] if "decode" in "/".join(parts[-4:-2]) else parts[-1:])


def _reason(e: Exception) -> str:
    """The line of a DALI error that says what went wrong (not the trailing 'no longer valid')."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    useful = [
        x
        for x in lines
        if "no longer valid" not in x and not x.startswith(("File ", "Error in", "which was"))
    ]
    return "error: " + (useful or lines or ["?"])[-1][:200]


def probe_one(path: str, configs: list[int]) -> None:
    """Child process: try ``configs`` on ``path`` in order, stop at the first error."""
    import pydicom
    from pydicom.encaps import generate_frames

    import medproc.pipeline.decode as dec

    warnings.simplefilter("ignore")
    ds = pydicom.dcmread(path)
    nf = int(ds.get("NumberOfFrames") or 1)
    spp = int(ds.get("SamplesPerPixel") or 1)
    ref = ds.pixel_array
    ref = ref[None] if ref.ndim == (2 if spp == 1 else 3) else ref
    frames = list(generate_frames(ds.PixelData, number_of_frames=nf))
    out = {}
    groups: dict = {}  # one GPU decode per (output dtype, stream form); the fixes are applied after
    for c in configs:
        cfg = dec.CONFIGS[c]
        groups.setdefault((cfg.get("dtype"), cfg.get("stream")), []).append(c)
    bits, signed = int(ds.get("BitsStored") or 16), bool(int(ds.get("PixelRepresentation") or 0))
    for (dtype, stream), cs in groups.items():
        try:
            raw = dec.decode_frames_gpu(
                frames,
                {"dtype": dtype, "stream": stream, "fix": "none"},
                bits,
                signed,
                batch_size=8,
            )
        except Exception as e:  # noqa: BLE001
            out.update({c: _reason(e) for c in cs})
            print(json.dumps(out), flush=True)
            return
        sizes = [
            dec.stream_header(f) for f in frames
        ]  # of the original stream, as decode_frames_gpu
        for c in cs:
            worst = 0
            for g, r, siz in zip(raw, ref, sizes):
                try:
                    g = dec._fix(g, dec.CONFIGS[c]["fix"], bits, signed, siz).cpu().numpy()
                except ValueError as e:
                    worst = f"error: {e}"
                    break
                if g.shape != r.shape:
                    worst = f"shape {g.shape} vs {r.shape}"
                    break
                worst = max(worst, int(np.abs(g.astype(np.int64) - r.astype(np.int64)).max()))
            out[c] = worst
    print(json.dumps(out), flush=True)


def main(argv=None):
    import pydicom

    import medproc.pipeline.decode as dec

    warnings.simplefilter("ignore")
    argv = sys.argv[1:] if argv is None else argv
    out_path = os.path.join(os.path.dirname(dec.__file__), "gpu_decode_support.json")
    if "--out" in argv:
        i = argv.index("--out")
        out_path = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    jobs = []
    for path in files(argv):
        try:
            ds = pydicom.dcmread(path)
            ts = str(ds.file_meta.TransferSyntaxUID)
        except Exception:  # noqa: BLE001
            continue
        if (
            ts in dec.NATIVE
            or "PixelData" not in ds
            or not ds.file_meta.TransferSyntaxUID.is_compressed
        ):
            continue
        info = dec.encoding_info(ds)
        info["TransferSyntaxUID"] = ts
        try:
            _ = ds.pixel_array  # the reference must exist
        except Exception as e:  # noqa: BLE001
            jobs.append((path, dec.support_key(info), f"pydicom cannot decode: {e}"))
            continue
        jobs.append(
            (
                path,
                dec.support_key(info),
                [c for c, cfg in enumerate(dec.CONFIGS) if dec.config_applies(cfg, ts)],
            )
        )

    def run(job):
        path, key, todo = job
        if isinstance(todo, str):
            return path, {"key": key, "reference": todo}
        per = {}
        while todo:  # each file in fresh processes: a failed DALI decode leaves a process unusable
            r = subprocess.run(
                [sys.executable, __file__, "--one", path, ",".join(map(str, todo))],
                capture_output=True,
                text=True,
                timeout=600,
            )
            lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
            got = json.loads(lines[-1]) if lines else {}
            if not got:  # the child died before reporting: charge the first config and go on
                got = {
                    str(todo[0]): "error: "
                    + (r.stderr.strip().splitlines() or ["crashed"])[-1][:160]
                }
            per.update({int(k): v for k, v in got.items()})
            todo = [c for c in todo if c not in per]
        print(_name(path), key, per, flush=True)
        return path, {"key": key, "configs": per}

    from concurrent.futures import ThreadPoolExecutor

    # files in parallel (each child is a small CUDA context on the same GPU)
    with ThreadPoolExecutor(int(os.environ.get("PROBE_JOBS", "8"))) as ex:
        results = dict(ex.map(run, jobs))
    entries, unsupported = select([(_name(p), r) for p, r in results.items()])
    import nvidia.dali

    doc = apply_policy(
        {
            "note": "Written by scripts/probe_gpu_decode.py: GPU decoding is used only for these encodings, "
            "each bit-exact against pydicom on every listed file.",
            "measured": time.strftime("%Y-%m-%d"),
            "dali": nvidia.dali.__version__,
            "configs_tried": dec.CONFIGS,
            "entries": entries,
            "unsupported": unsupported,
        }
    )
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"{len(entries)} encodings proven, {len(unsupported)} left to the CPU -> {out_path}")


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--from-log":
        from_log(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 2 and sys.argv[1] == "--one":
        probe_one(sys.argv[2], [int(x) for x in sys.argv[3].split(",")])
    else:
        main()
