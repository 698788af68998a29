#!/usr/bin/env bash
# `make image` / `make test-deploy`, step 1: a container engine, and the images no registry gives us here.
#
# With docker (an engine that answers `docker info`), nothing is done: the Dockerfile's public base image and
# the compose file's public images are pulled as on any machine. Otherwise podman, the way these machines run
# containers (docs/deployment.md, "Building without a registry"):
#   1. Debian's podman, buildah, runc, debootstrap and podman-compose, when missing;
#   2. runc with no default ulimits, where no containers.conf exists (crun cannot set rlimits on these kernels);
#   3. localhost/debian:bookworm-min, bootstrapped from Debian's mirror (no registry is reachable);
#   4. stand-ins built from deploy/standins/ on it, tagged as the images they stand in for:
#      python:3.11-slim-bookworm's (under a local name, passed to the build as BASE_IMAGE), and the compose
#      file's redis, prometheus and pushgateway. Grafana has no Debian package: the stack under test runs without it.
# Each image is built once; FORCE=1 rebuilds them.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BASE=${PYTHON_BASE:-localhost/crossprobe-python:3.11-bookworm}

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "docker engine found: the public images are used"
  exit 0
fi

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
need=()
for tool in podman buildah runc debootstrap podman-compose; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [ ! -e /etc/containers/containers.conf ]; then
  echo "writing /etc/containers/containers.conf: runc, no default ulimits"
  $SUDO mkdir -p /etc/containers
  printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' | $SUDO tee /etc/containers/containers.conf >/dev/null
fi

have() { [ "${FORCE:-0}" != 1 ] && podman image exists "$1"; }

if ! have localhost/debian:bookworm-min; then
  root=$(mktemp -d)
  echo "debootstrap bookworm (minbase) into $root"
  $SUDO debootstrap --variant=minbase bookworm "$root" >/dev/null
  $SUDO tar -C "$root" -c . | podman import - localhost/debian:bookworm-min >/dev/null
  $SUDO rm -rf "$root"
fi

build() {  # build TAG CONTAINERFILE
  if ! have "$1"; then
    echo "building stand-in $1"
    podman build -q --network host --format docker -t "$1" -f "$2" deploy/standins >/dev/null
  fi
}
build "$PYTHON_BASE" deploy/standins/python.Containerfile
# the compose file's image names, as podman normalises them (docker.io/library/...)
build docker.io/library/redis:7.2-bookworm deploy/standins/redis.Containerfile
build docker.io/prom/prometheus:v2.53.0 deploy/standins/prometheus.Containerfile
build docker.io/prom/pushgateway:v1.9.0 deploy/standins/pushgateway.Containerfile
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'bookworm|prom' || true
