#!/usr/bin/env bash
# The open_clip export environment (issue 47): a virtualenv of its own, because open-clip-torch needs torchvision and
# no CPU torchvision exists for our torch 2.13.0 CPU wheel (torchvision 0.28.0 links libtorch_cuda.so and does not
# import). Here torch 2.14.1 + torchvision 0.29.1 (PyPI's CUDA builds, which run on CPU) serve open_clip, the reference
# Hugging Face / SentencePiece tokenizers, ONNX export and clip-benchmark; the main .venv keeps torch 2.13.0 CPU.
#
#   scripts/openclip-env.sh [VENV]      (default artifacts/openclip-venv; `make openclip-env`)
#
# Idempotent: a stamp file that records this script's hash skips a finished install. crossprobe itself is installed
# editable with --no-deps (its pyproject pins torch==2.13.0, which would fight 2.14.1), and its other runtime
# dependencies are installed from pyproject's list without torch, so `import crossprobe.models...` works there.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${1:-artifacts/openclip-venv}"
PY="${PY:-python3.11}"
# torch and torchvision pinned together: an unpinned torchvision would pick its own torch.
TORCH_PINS=("torch==2.14.1" "torchvision==0.29.1")
# the references (multilingual-clip: M-CLIP's own text tower, as Immich exports it) and the tools that run against them
# (clip-benchmark: issue 47's "the field's own evaluator"; it imports requests without declaring it)
REFERENCE_PKGS=("open-clip-torch==3.3.0" "clip-benchmark==1.6.2" "multilingual-clip==1.0.10" "transformers" "tokenizers"
                "sentencepiece" "onnx" "onnxruntime" "safetensors" "requests" "pytest>=8")
STAMP="$VENV/.openclip-env-$(sha256sum "$0" pyproject.toml | sha256sum | cut -c1-16)"

if [[ -f "$STAMP" ]]; then
  echo "openclip-env: $VENV is up to date"
  exit 0
fi
command -v "$PY" >/dev/null || { echo "openclip-env: need $PY (set PY=python3.x)" >&2; exit 1; }

start=$(date +%s)
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "${TORCH_PINS[@]}"
# every later install keeps these two: a constraints file, beside the machine's own (pip.conf's constraint= stays)
PINS="$VENV/torch-pins.txt"
printf '%s\n' "${TORCH_PINS[@]}" > "$PINS"
"${PIP[@]}" -c "$PINS" "${REFERENCE_PKGS[@]}"
# crossprobe's runtime dependencies, less torch (read from pyproject.toml, so the list lives in one place)
# (through a file, not mapfile: macOS's bash 3.2 has none)
"$VENV/bin/python" - > "$VENV/crossprobe-deps.txt" <<'EOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower() != "torch"))
EOF
"${PIP[@]}" -c "$PINS" -r "$VENV/crossprobe-deps.txt"
"${PIP[@]}" --no-deps -e .

"$VENV/bin/python" - <<'EOF'
import torch, torchvision, open_clip, transformers, sentencepiece, onnxruntime, clip_benchmark, multilingual_clip  # noqa: F401
import crossprobe.models.export  # noqa: F401
assert torch.__version__.startswith("2.14.1"), torch.__version__
print(f"openclip-env: torch {torch.__version__}, torchvision {torchvision.__version__},"
      f" open_clip {open_clip.__version__}, transformers {transformers.__version__}")
EOF
rm -f "$VENV"/.openclip-env-*
touch "$STAMP"
echo "openclip-env: $VENV ready in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
