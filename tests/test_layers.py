"""The layers hold (docs/architecture.md, "Layers"): core -> storage -> (jobs | service | the torch part) -> the
command line, and what serves and indexes never imports torch or the torch part (crossprobe.models).

import-linter (the dev extra) checks the contract in .importlinter; these tests run it on the tree, show that it
catches a planted violation, and check by the import graph that only the command line imports the command line."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"core": "core", "models": "models", "storage": "storage", "indexer": "indexer", "service": "service", "cli": "cli"}  # crossprobe.<name> -> folder


def lint(root: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    return subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--config", str(ROOT / ".importlinter"),
                           "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def planted(tmp_path: Path, line: str) -> subprocess.CompletedProcess:
    """lint-imports over a copy of the packages (a namespace, as installed) with `line` added to service/hybrid.py."""
    pkg = tmp_path / "crossprobe"
    for name, folder in PACKAGES.items():
        shutil.copytree(ROOT / folder, pkg / name, ignore=shutil.ignore_patterns("__pycache__", "static", "checkpoints"))
    hybrid = pkg / "service" / "hybrid.py"
    hybrid.write_text(hybrid.read_text() + f"\n{line}  # planted\n")
    return lint(tmp_path, pythonpath=tmp_path)


def test_the_tree_keeps_its_layers():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_a_planted_import_of_the_jobs_from_the_service_breaks_the_contract(tmp_path):
    """A copy of the packages with one service module importing the batch jobs: the contract must fail, naming
    the import."""
    out = planted(tmp_path, "from crossprobe.indexer.jobs import sources")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BROKEN" in out.stdout
    assert "crossprobe.service.hybrid -> crossprobe.indexer.jobs.sources" in out.stdout


def test_a_planted_import_of_torch_in_the_service_breaks_the_torch_free_contract(tmp_path):
    """The same copy with `import torch` in a service module: the torch-free contract fails, naming the import."""
    out = planted(tmp_path, "import torch")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "never import torch or crossprobe.models BROKEN" in " ".join(out.stdout.split()), out.stdout
    assert "crossprobe.service.hybrid -> torch" in out.stdout
    print(out.stdout[out.stdout.index("Broken contracts"):])  # what a developer sees (make test -s shows it)


def test_only_the_command_line_imports_the_command_line():
    import grimp

    graph = grimp.build_graph("crossprobe.core", "crossprobe.models", "crossprobe.storage", "crossprobe.indexer", "crossprobe.service", "crossprobe.cli")
    cli = {"crossprobe.cli"} | graph.find_descendants("crossprobe.cli")
    importers = set().union(*(graph.find_modules_that_directly_import(m) for m in cli))
    assert importers <= cli, f"imports of the command line from below it: {sorted(importers - cli)}"
