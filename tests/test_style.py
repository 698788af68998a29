"""ruff (lint, and the format check) over the product packages, as pyproject.toml's [tool.ruff] configures it: part
of `make test`, so a change that breaks either fails CI (docs/development.md, "Style")."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_finds_nothing():
    out = subprocess.run([str(RUFF), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_product_packages_are_ruff_formatted():
    out = subprocess.run([str(RUFF), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_planted_unused_import_fails_the_check(tmp_path):
    """The check reads the project's configuration and fails on a violation (it is not a no-op)."""
    planted = tmp_path / "core" / "planted.py"
    planted.parent.mkdir()
    planted.write_text("import os\n")
    out = subprocess.run([str(RUFF), "check", "--config", str(ROOT / "pyproject.toml"), str(planted)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "F401" in out.stdout, out.stdout
