"""Build docs/api.md from the docstrings of medproc's public API.

python scripts/make_api_docs.py          # writes docs/api.md
python scripts/make_api_docs.py --check  # exits 1 if docs/api.md is out of date
"""

import importlib
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODULES = [
    "medproc",
    "medproc.spec",
    "medproc.plan",
    "medproc.geometry",
    "medproc.io",
    "medproc.io.decoders",
    "medproc.annotations",
    "medproc.pipeline",
    "medproc.pipeline.decode",
    "medproc.proxy",
    "medproc.convert",
    "medproc.cases",
    "medproc.monai",
    "medproc.qc",
    "medproc.layouts",
    "medproc.sample_data",
    "medproc.inspect",
]


def render() -> str:
    out = [
        "# API reference",
        "",
        "Generated from the docstrings by `python scripts/make_api_docs.py`.",
        "",
    ]
    seen = set()
    for modname in MODULES:
        mod = importlib.import_module(modname)
        out += [f"## `{modname}`", "", inspect.cleandoc(mod.__doc__ or "").split("\n\n")[0], ""]
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if (
                obj is None
                or id(obj) in seen
                or not (inspect.isclass(obj) or inspect.isfunction(obj))
            ):
                continue
            seen.add(id(obj))
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                sig = "(...)"
            kind = "class" if inspect.isclass(obj) else "def"
            out += [
                f"### `{kind} {modname}.{name}{sig}`",
                "",
                inspect.cleandoc(obj.__doc__ or "(no docstring)"),
                "",
            ]
            if inspect.isclass(obj):
                for mname, m in sorted(vars(obj).items()):
                    if mname.startswith("_") or not (
                        inspect.isfunction(m) or isinstance(m, property)
                    ):
                        continue
                    doc = inspect.cleandoc((m.fget if isinstance(m, property) else m).__doc__ or "")
                    if doc:
                        out += [f"- `{name}.{mname}`: {doc.splitlines()[0]}"]
                out += [""]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    text = render()
    path = os.path.join(ROOT, "docs", "api.md")
    if "--check" in sys.argv:
        sys.exit(0 if os.path.exists(path) and open(path).read() == text else 1)
    open(path, "w").write(text)
    print("wrote", path)
