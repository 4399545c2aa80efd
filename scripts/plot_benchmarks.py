"""Bar charts of docs/results/*.json for docs/benchmarks.md (docs/images/bench_*.png).

python scripts/plot_benchmarks.py
"""

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOTS = [
    (
        "resample_h200.json",
        "volumes_per_s",
        "Resample 8 CT volumes to 1.5 mm, H200 (volumes/s)",
        "bench_resample.png",
    ),
    (
        "convert_cpu2core.json",
        "volumes_per_s",
        "DICOM -> 1.5 mm -> .nii.gz, 2-core CPU (volumes/s)",
        "bench_convert_cpu.png",
    ),
    (
        "convert_h200x2.json",
        "volumes_per_s",
        "DICOM -> 1.5 mm -> .nii.gz, H200 node, 16 workers (volumes/s)",
        "bench_convert_h200.png",
    ),
    (
        "loader_h200.json",
        "samples_per_s",
        "96^3 training patches, H200 (samples/s)",
        "bench_loader.png",
    ),
]


def main():
    for src, key, title, out in PLOTS:
        m = json.load(open(os.path.join(ROOT, "docs", "results", src)))["methods"]
        names = list(m)
        vals = [m[n][key] for n in names]
        fig, ax = plt.subplots(figsize=(8, 0.6 + 0.42 * len(names)))
        ax.barh(
            names,
            vals,
            color=["tab:green" if n.startswith("medproc") else "tab:gray" for n in names],
        )
        for y, v in enumerate(vals):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.set_xlim(0, max(vals) * 1.18)
        fig.tight_layout()
        fig.savefig(os.path.join(ROOT, "docs", "images", out), dpi=80)
        plt.close(fig)
        print("wrote docs/images/" + out)


if __name__ == "__main__":
    main()
