"""benchmarks/ is a package run from the repository root (`python -m benchmarks.service_bench`): every module
imports as `benchmarks.<name>`, siblings import each other absolutely, and nothing under benchmarks/, research/,
scripts/ or tests/ edits the module search path to reach a script."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(f"benchmarks.{p.stem}" for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_imports_as_a_package_module(name):
    assert importlib.import_module(name).__file__.startswith(str(ROOT / "benchmarks"))


def test_nothing_edits_sys_path():
    needle = "sys" + ".path"  # not spelled out, so that this file does not find itself
    found = [str(p.relative_to(ROOT)) for top in ("benchmarks", "research", "scripts", "tests")
             for p in (ROOT / top).rglob("*.py") if needle in p.read_text()]
    assert found == []


def test_a_benchmark_runs_as_a_module_from_the_repository_root():
    out = subprocess.run([sys.executable, "-m", "benchmarks.ann_sweep", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "--index" in out.stdout, out.stderr[-2000:]
