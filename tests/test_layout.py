"""The layout that shows the architecture (io -> plan -> engine -> connectors -> cli), checked
on the source: module sizes, who imports DALI and MONAI, docstrings, lint, and the README."""

import ast
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "medproc")
MODULES = sorted(
    os.path.relpath(os.path.join(d, f), ROOT)
    for d, _, files in os.walk(PKG)
    for f in files
    if f.endswith(".py")
)


def _imports(path):
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    pkg = os.path.dirname(path).replace(os.sep, ".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            yield base


@pytest.mark.parametrize("path", MODULES)
def test_modules_are_small(path):
    n = sum(1 for _ in open(os.path.join(ROOT, path)))
    assert n <= 400, f"{path} has {n} lines (limit 400): split it"


def test_only_the_pipeline_imports_dali_and_only_medproc_monai_imports_monai():
    for path in MODULES:
        mods = set(_imports(path))
        if any(m.startswith("nvidia") for m in mods):
            assert path.startswith(os.path.join("medproc", "pipeline")), path
        if any(m == "monai" or m.startswith("monai.") for m in mods):
            assert path.startswith(os.path.join("medproc", "monai")), path


def test_the_pipeline_imports_nothing_from_io_or_the_connectors():
    allowed = ("medproc.pipeline", "medproc.plan", "medproc.spec", "medproc.geometry")
    allowed += ("medproc.errors", "medproc._float32")  # (leaves: they import no medproc module)
    for path in MODULES:
        if not path.startswith(os.path.join("medproc", "pipeline")):
            continue
        for m in _imports(path):
            if m.startswith("medproc"):
                assert m.startswith(allowed), f"{path} imports {m}"


PUBLIC = [
    "medproc",
    "medproc.volume",
    "medproc.spec",
    "medproc.plan",
    "medproc.geometry",
    "medproc.resample",
    "medproc.io",
    "medproc.io.writers",
    "medproc.io.decoders",
    "medproc.io.atomic",
    "medproc.pipeline",
    "medproc.pipeline.engine",
    "medproc.annotations",
    "medproc.convert",
    "medproc.cases",
    "medproc.proxy",
    "medproc.monai",
    "medproc.qc",
    "medproc.inspect",
    "medproc.sample_data",
]


@pytest.mark.parametrize("modname", PUBLIC)
def test_every_public_name_has_a_docstring(modname):
    mod = importlib.import_module(modname)
    assert inspect.getdoc(mod), f"{modname} has no module docstring"
    missing = []
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                fn = member.fget if isinstance(member, property) else member
                if attr.startswith("_") or not callable(fn):
                    continue
                if not (getattr(fn, "__doc__", "") or "").strip():
                    missing.append(f"{name}.{attr}")
    assert not missing, f"{modname}: no docstring on {missing}"


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is installed by the [test] extra")
def test_ruff_check_and_format_are_clean():
    paths = ["medproc", "tests", "bench", "scripts", "examples"]
    r = subprocess.run(["ruff", "check", *paths], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    r = subprocess.run(
        ["ruff", "format", "--check", *paths], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-3000:]


def test_readme_example_runs_as_written(tmp_path):
    text = open(os.path.join(ROOT, "README.md")).read()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Volume(shape=(112, 112, 40)" in r.stdout and "orientation=LPS" in r.stdout
