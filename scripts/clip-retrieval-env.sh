#!/usr/bin/env bash
# clip-retrieval 2.45.0 in a virtualenv of its own, for the side-by-side benchmark (benchmarks/peer_clip_retrieval.py,
# issue 54): its pins (numpy<2, open-clip-torch<3, sentence-transformers<3, pyarrow<16) cannot share crossprobe's
# environment. torch and torchvision as in scripts/openclip-env.sh (PyPI's builds, which run on CPU: no CPU
# torchvision exists beside our torch 2.13.0 CPU wheel).
#
#   scripts/clip-retrieval-env.sh [VENV]      (default artifacts/clipret-venv; `make clip-retrieval-env`)
#
# Idempotent: a stamp file records this script's hash.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${1:-artifacts/clipret-venv}"
PY="${PY:-python3.11}"
# setuptools<81: clip-anytorch (clip-retrieval imports it) still imports pkg_resources, which 81 removed
PINS=("torch==2.14.1" "torchvision==0.29.1" "clip-retrieval==2.45.0" "setuptools<81")
STAMP="$VENV/.clipret-env-$(sha256sum "$0" | cut -c1-16)"
if [[ -f "$STAMP" ]]; then
  echo "clip-retrieval-env: $VENV is up to date"
  exit 0
fi
command -v "$PY" >/dev/null || { echo "clip-retrieval-env: need $PY (set PY=python3.x)" >&2; exit 1; }
start=$(date +%s)
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
printf '%s\n' "${PINS[@]}" > "$VENV/pins.txt"
"${PIP[@]}" -c "$VENV/pins.txt" "${PINS[@]}"
"$VENV/bin/python" -c "import clip_retrieval, torch, open_clip, faiss; print('clip-retrieval-env: torch', torch.__version__, 'open_clip', open_clip.__version__)"
rm -f "$VENV"/.clipret-env-*
touch "$STAMP"
echo "clip-retrieval-env: $VENV ready in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
