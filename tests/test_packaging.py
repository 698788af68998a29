"""The card's layout installs as one distribution: models/, indexer/, service/ and the command line's cli/ become
crossprobe.core, crossprobe.models, crossprobe.indexer, crossprobe.service and crossprobe.cli (pyproject's package-dir), so a wheel
works away from the repository and the `crossprobe` command is one typer app."""
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("core", "models", "storage", "indexer", "service", "cli")


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed():
    # a new sub-package missing from `packages` would be left out of the wheel without an error
    found = {".".join(("crossprobe",) + p.parent.relative_to(ROOT).parts)
             for top in TOPS for p in (ROOT / top).rglob("__init__.py")}
    st = _setuptools()
    assert found == set(st["packages"])
    assert st["package-dir"] == {f"crossprobe.{t}": t for t in TOPS}


def test_wheel_installs_and_runs_away_from_the_repository(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    (whl,) = (tmp_path / "dist").glob("crossprobe-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names}  # no top-level `models` / `service` left in site-packages
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert tops == {"crossprobe", f"crossprobe-{version}.dist-info"}, tops
    for needed in ("crossprobe/models/checkpoints/default/model.safetensors", "crossprobe/models/data/imagenet_classes.tsv",
                   "crossprobe/cli/__init__.py", "crossprobe/core/inference/crossprobe.py", "crossprobe/indexer/jobs/kinds.py", "crossprobe/models/training/run.py"):
        assert needed in names, needed
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(whl)], check=True)
    # run from an empty folder with the installed copy first on the path: nothing may come from the checkout
    probe = ("import crossprobe.cli as c, crossprobe.models.checkpoint as k, crossprobe.models as m;"
             "print(c.__file__); print(k.DEFAULT_CHECKPOINT); print(m.DEFAULT_CHECKPOINT.exists() and k.DEFAULT_CHECKPOINT == m.DEFAULT_CHECKPOINT)")
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    cli_file, ckpt, same = run.stdout.split()
    assert cli_file.startswith(str(site)) and ckpt.startswith(str(site)) and same == "True"
    helptext = subprocess.run([sys.executable, "-m", "crossprobe.cli", "--help"], cwd=tmp_path, env=env,
                              capture_output=True, text=True)
    assert helptext.returncode == 0, helptext.stderr[-2000:]
    for command in ("train", "eval", "index", "serve", "demo-service", "export"):
        assert f" {command} " in helptext.stdout, command
