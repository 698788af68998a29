#!/usr/bin/env bash
# `make image`: the CPU image from the committed Dockerfile, tagged $IMAGE (default crossprobe:cpu, the compose
# file's name). docker when an engine answers; podman otherwise, after scripts/container-setup.sh. With podman,
# only what this machine cannot reach is substituted, by the Dockerfile's own build arguments:
#   BASE_IMAGE        the local stand-in for python:3.11-slim-bookworm (no registry here); set BASE_IMAGE to pull
#                     the public one where a registry is reachable
#   TORCH_FIND_LINKS  the folder PIP_FIND_LINKS names, when set: torch's CPU wheel is there, not on PyPI
# and, outside the Dockerfile, the host's CA bundle is mounted into each RUN (PyPI is reached through it here).
# NO_CACHE=1 builds from scratch. Each build's wall time, with how many of its steps came from the layer cache, is
# appended to artifacts/deploy/builds.jsonl (tests/deploy/test_stack.py reports them).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-crossprobe:cpu}
extra=()
[ "${NO_CACHE:-0}" = 1 ] && extra+=(--no-cache)
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  engine=(docker build -t "$IMAGE" "${extra[@]}")
else
  engine=(podman build --network host --format docker -t "$IMAGE" "${extra[@]}"
          --build-arg "BASE_IMAGE=${BASE_IMAGE:-localhost/crossprobe-python:3.11-bookworm}")
  CA=/etc/ssl/certs/ca-certificates.crt
  [ -f "$CA" ] && engine+=(-v "$CA:$CA:ro")
  if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "${PIP_FIND_LINKS}" ]; then
    engine+=(-v "$PIP_FIND_LINKS:/wheels:ro" --build-arg TORCH_FIND_LINKS=/wheels
             --build-arg TORCH_INDEX_URL=https://pypi.org/simple)
  fi
fi
echo "${engine[*]} ."
mkdir -p artifacts/deploy
log=artifacts/deploy/last-build.log
start=$(date +%s%N)
"${engine[@]}" . 2>&1 | tee "$log"
end=$(date +%s%N)
ms=$(( (end - start) / 1000000 ))
# podman: "STEP i/n" per step and "--> Using cache" per cached one; BuildKit: "#n [stage i/n]" and "CACHED"
steps=$(grep -cE '^\[[0-9]+/[0-9]+\] STEP|^#[0-9]+ \[' "$log" || true)
cached=$(grep -cE '^--> Using cache|CACHED' "$log" || true)
printf '{"image": "%s", "build_s": %d.%03d, "no_cache": %s, "steps": %d, "cached_steps": %d, "engine": "%s", "date": "%s", "host": "%s"}\n' \
  "$IMAGE" $((ms / 1000)) $((ms % 1000)) "$([ "${NO_CACHE:-0}" = 1 ] && echo true || echo false)" "$steps" "$cached" "${engine[0]}" \
  "$(date -u +%FT%TZ)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >> artifacts/deploy/builds.jsonl
