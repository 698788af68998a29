"""benchmarks/ is a package run from the repository root (`python -m benchmarks.service_bench`): every module
imports as `benchmarks.<name>`, siblings import each other absolutely, and nothing under benchmarks/, research/,
scripts/ or tests/ edits the module search path to reach a script. Their shared set-up is benchmarks/harness.py,
so their imports form no circle."""
import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "benchmarks").rglob("*.py")
                 if p.stem != "__init__")


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


def imports(root: Path, package: str) -> dict[str, set[str]]:
    """Every module of `package` under root -> the modules of that package it imports (at any depth of the file:
    a function-level import closes a circle as surely as a top-level one)."""
    graph = {}
    for p in (root / package).rglob("*.py"):
        name = ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m.split(".")[0] == package}
    return {n: {m for m in deps if m in graph and m != n} for n, deps in graph.items()}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of the graph (depth-first search), [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = 2
        path.pop()
        return []

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return []


def test_the_benchmarks_import_no_circle():
    graph = imports(ROOT, "benchmarks")
    assert "benchmarks.harness" in graph and graph["benchmarks.service_bench"]
    assert cycle(graph) == [], " -> ".join(cycle(graph))


def test_the_walk_finds_a_planted_circle(tmp_path):
    pkg = tmp_path / "benchmarks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from benchmarks.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from benchmarks import c\n")
    (pkg / "c.py").write_text("import benchmarks.a\n")
    assert cycle(imports(tmp_path, "benchmarks")) == ["benchmarks.a", "benchmarks.b", "benchmarks.c", "benchmarks.a"]
