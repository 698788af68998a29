#!/usr/bin/env bash
# The real components the tests run against, from Debian's packages (make test installs them when missing):
#   prometheus (+ promtool)      dashboards' and alert rules' PromQL checked against a live service
#   prometheus-pushgateway       the batch jobs' (reindex, index) metrics
#   docker-compose               `docker-compose config` validates docker-compose.yml (no engine needed)
#   caddy                        the HTTPS proxy of deploy/caddy/Caddyfile, run in front of a live service
#   chromium                     the web page's browser test (make test-e2e; Playwright drives it)
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-pushgateway >/dev/null 2>&1 || need+=(prometheus-pushgateway)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v caddy >/dev/null 2>&1 || need+=(caddy)
if [ "${WITH_BROWSER:-0}" = 1 ]; then command -v chromium >/dev/null 2>&1 || need+=(chromium); fi
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "missing Debian packages: ${need[*]} (install them as root)" >&2; exit 1; }
  SUDO=sudo
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null || true  # a stale list still installs from the configured mirror
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's packages start their daemons on install where an init system runs; the tests start their own
for svc in prometheus prometheus-pushgateway prometheus-node-exporter caddy; do
  $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
done
