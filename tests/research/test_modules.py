"""research/ is a package of topics run from the repository root (`python -m research.temde.sweep`): every script
imports as `research.<topic>.<name>` (importing runs nothing), and each topic has a README."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPICS = sorted(p.parent for p in (ROOT / "research").glob("*/__init__.py"))
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for t in TOPICS for p in t.glob("*.py")
                 if p.stem != "__init__")


def test_the_topics_are_there():
    assert {t.name for t in TOPICS} == {"bridge", "region_labels", "temde", "rerank", "calibration", "text_search",
                                        "explain", "misses"}
    assert all((t / "README.md").exists() for t in TOPICS)


@pytest.mark.parametrize("name", MODULES)
def test_every_script_imports_as_a_package_module(name):
    assert importlib.import_module(name).__file__.startswith(str(ROOT / "research"))


def test_a_script_runs_as_a_module_from_the_repository_root():
    out = subprocess.run([sys.executable, "-m", "research.temde.sweep", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "python -m research.temde.sweep" in out.stdout and "--adopt" in out.stdout, \
        out.stderr[-2000:]
