"""ruff (lint, and the format check) and mypy over the product packages, as pyproject.toml's
[tool.ruff] and [tool.mypy] configure them: part of `make test`, so a change that breaks one fails CI
(docs/development.md, "Style")."""
from __future__ import annotations

import os
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


PACKAGES = ("core", "models", "storage", "indexer", "service", "cli")  # pyproject's package-dir: crossprobe.<name>


def mypy(tmp_path: Path, packages: tuple[str, ...], root: Path = ROOT) -> subprocess.CompletedProcess:
    """mypy -p crossprobe.<package> ... over a tree of the installed names (crossprobe/<package> -> the folder)."""
    tree = tmp_path / "tree" / "crossprobe"
    tree.mkdir(parents=True)
    for package in packages:
        (tree / package).symlink_to(root / package)
    env = {**os.environ, "MYPYPATH": str(tree.parent)}
    args = [a for p in packages for a in ("-p", f"crossprobe.{p}")]
    return subprocess.run([str(Path(sys.executable).parent / "mypy"), "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)


def test_mypy_finds_nothing_in_the_product_packages(tmp_path):
    out = mypy(tmp_path, PACKAGES)
    assert out.returncode == 0 and "Success: no issues found" in out.stdout, out.stdout + out.stderr


def test_mypy_fails_on_a_planted_type_error(tmp_path):
    """The same run over a copy of the core with one wrong annotation: mypy must name it."""
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(ROOT / "core", copy / "core", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "core" / "planted.py").write_text("def f() -> int:\n    return 'x'\n")
    out = mypy(tmp_path, ("core",), root=copy)
    assert out.returncode == 1 and "planted.py:2: error: Incompatible return value" in out.stdout, out.stdout
