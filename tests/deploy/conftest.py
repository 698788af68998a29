"""Deployment fixtures: the repo's deploy files and the real tools that read them (hadolint from the dev
extra; promtool, prometheus, prometheus-pushgateway and docker-compose from Debian: `make system`), plus the
service fixtures (a real Redis, a small checkpoint, a real index) for the live Prometheus test."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.service.conftest import artifacts, built, models_dir, redis_server, redis_url, svc_ckpt  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "crossprobe-latency.json"


def tool(name: str) -> str:
    """Path of a tool the deploy tests run (the venv's bin first: hadolint). Missing, the test fails naming
    the fix rather than skipping: `make test` installs them, and a skip would hide an unchecked deploy file."""
    venv = Path(sys.executable).parent / name
    found = str(venv) if venv.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: `make system` (scripts/system-deps.sh) installs it "
                    "(hadolint: the dev extra, `make venv`)")
    return found


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def compose_config(env: dict[str, str], *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`docker-compose [extra] config` in the repo (validation and interpolation; no engine needed)."""
    import os

    p = run([tool("docker-compose"), "-f", str(REPO / "docker-compose.yml"), *extra, "config"], cwd=REPO,
            env={**os.environ, **env})
    return p, (yaml.safe_load(p.stdout) if p.returncode == 0 and p.stdout.strip() else None)
