#!/usr/bin/env bash
# `make image` / `make test-deploy`, step 1: a container engine, and the images no registry gives us here.
#
# With docker (an engine that answers `docker info`), nothing is done: the Dockerfile's public base image and
# the compose file's public images are pulled as on any machine. Otherwise podman, the way these machines run
# containers (docs/deployment.md, "Building without a registry"):
#   1. the Debian packages below, when missing;
#   2. /etc/containers/containers.conf: runc with no default ulimits (crun cannot set rlimits on these kernels)
#      and the netavark network backend (DNS between containers); written when absent or written by this script,
#      checked (never edited) when it is someone else's;
#   3. localhost/debian:bookworm-min, bootstrapped from Debian's mirror (no registry is reachable);
#   4. stand-ins built from deploy/standins/ on it, tagged as the images they stand in for:
#      python:3.11-slim-bookworm's (under a local name, passed to the build as BASE_IMAGE), and the compose
#      file's redis, prometheus, pushgateway and haproxy (the front proxy). Grafana has no Debian package: the stack
#      under test runs without it;
#   5. a check of what the compose file asks of podman: `--init`, a bridge network where a container reaches
#      another by its name, a port published on 127.0.0.1. It fails here, with podman's message, not minutes
#      later in a test waiting for a connection.
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

# Debian packages, installed without their recommends, so each one podman needs is named here:
#   podman, buildah, runc     the engine, the image builder, the OCI runtime (crun fails here, see containers.conf)
#   catatonit                 the init process of `init: true` (podman run --init); podman only recommends it
#   netavark, aardvark-dns    bridge networks with DNS, so `redis` resolves from the api. Without them podman
#                             falls back to CNI, whose networks have no DNS
#   iptables                  netavark's port publishing and masquerading (netavark 1.4 drives iptables)
#   debootstrap               the base image, from Debian's mirror
#   podman-compose            runs docker-compose.yml (Debian's 1.0.3)
PACKAGES=(podman buildah runc catatonit netavark aardvark-dns iptables debootstrap podman-compose)
need=()
for pkg in "${PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)" = installed ] || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  wait_lock=(-o DPkg::Lock::Timeout=600)  # another apt run (unattended upgrades, a second job) holds the lock
  $SUDO apt-get "${wait_lock[@]}" update -qq >/dev/null || true  # a stale list still installs from the mirror
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
fi

CONF=/etc/containers/containers.conf
BY="# written by crossprobe's scripts/container-setup.sh"
MARK="$BY (rewritten when it changes; delete this line to keep edits)"
WANT="$MARK
[containers]
default_ulimits = []
[engine]
runtime = \"runc\"
[network]
network_backend = \"netavark\""
ours() {  # the file is this script's: its first line says so, or it is what the previous version wrote (without
  # the network backend: podman then kept CNI where it found it installed)
  local previous=$'[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"'
  head -n1 "$CONF" | grep -qF "$BY" || [ "$(cat "$CONF")" = "$previous" ]
}
if [ ! -e "$CONF" ] || { [ "$(cat "$CONF")" != "$WANT" ] && ours; }; then
  echo "writing $CONF: runc, no default ulimits, netavark"
  $SUDO mkdir -p /etc/containers
  printf '%s\n' "$WANT" | $SUDO tee "$CONF.tmp" >/dev/null
  $SUDO mv "$CONF.tmp" "$CONF"
elif [ "$(cat "$CONF")" != "$WANT" ]; then
  got=$(podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.NetworkBackend}}')
  if [ "$got" != "runc netavark" ]; then
    echo "$CONF is not this script's and gives podman '$got' (runtime, network backend); add:" >&2
    printf '%s\n' "${WANT#*$'\n'}" >&2
    exit 1
  fi
  echo "$CONF is not this script's; podman runs runc with netavark as needed (default_ulimits = [] is assumed)"
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
build docker.io/library/haproxy:2.6 deploy/standins/haproxy.Containerfile
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'bookworm|prom|haproxy' || true

# 5. what the compose stack needs of podman, tried on the Python stand-in (a web server to publish and reach)
net=crossprobe-setup-check
srv=crossprobe-setup-check-server
port=${CHECK_PORT:-18765}
# (aardvark-dns, the network's DNS server, may print "failed to connect to syslog" as it exits: no syslog here)
cleanup() { podman rm -f -t 0 "$srv" >/dev/null 2>&1 || true; podman network rm -f "$net" >/dev/null 2>&1 || true; }
fail() { echo "podman check failed: $1" >&2; cleanup; exit 1; }
cleanup
podman network create "$net" >/dev/null || fail "podman network create $net"
podman run -d --init --name "$srv" --network "$net" -p "127.0.0.1:$port:8000" "$PYTHON_BASE" \
  python3 -m http.server 8000 >/dev/null \
  || fail "podman run --init -p 127.0.0.1:$port:8000 (the compose file's init: true and ports)"
# PROBE URL: a GET that answers within 10 s
PROBE='import sys, time, urllib.request
for _ in range(50):
    try:
        urllib.request.urlopen(sys.argv[1], timeout=2)
        sys.exit(0)
    except OSError as e:
        err = e
        time.sleep(0.2)
sys.exit(f"{sys.argv[1]}: {err}")'
podman run --rm --init --network "$net" "$PYTHON_BASE" python3 -c "$PROBE" "http://$srv:8000/" \
  || fail "a container did not reach another by its name (DNS on the network: netavark with aardvark-dns)"
python3 -c "$PROBE" "http://127.0.0.1:$port/" || fail "the published port 127.0.0.1:$port did not answer on the host"
cleanup
echo "podman check passed: --init, DNS between containers, a published port" \
  "($(podman info --format '{{.Host.OCIRuntime.Name}}, {{.Host.NetworkBackend}}'))"
