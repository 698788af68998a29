"""Deployment fixtures: the repo's deploy files and the real tools that read them (hadolint from the dev
extra; promtool, prometheus, prometheus-pushgateway and docker-compose from Debian: `make system`), plus the
service fixtures (a real Redis, a small checkpoint, a real index) for the live Prometheus test."""
from __future__ import annotations

import json
import re
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


# the compose file refuses to render without Grafana's admin password (no admin/admin): the tests pass this one
# what the compose file requires set: Grafana's admin password and Redis's (never used beyond the tests)
STACK_SECRETS = {"GRAFANA_ADMIN_PASSWORD": "a-test-password-never-used", "REDIS_PASSWORD": "a-test-redis-password-0123"}


def compose_config(env: dict[str, str], *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`docker-compose [extra] config` in the repo (validation and interpolation; no engine needed), with the
    variables `env` gives and none of the file's own from this process (a GRAFANA_ADMIN_PASSWORD exported here
    would hide a missing one)."""
    import os

    own = set(re.findall(r"\$\{(\w+)", (REPO / "docker-compose.yml").read_text()))
    p = run([tool("docker-compose"), "-f", str(REPO / "docker-compose.yml"), *extra, "config"], cwd=REPO,
            env={**{k: v for k, v in os.environ.items() if k not in own}, **env})
    return p, (yaml.safe_load(p.stdout) if p.returncode == 0 and p.stdout.strip() else None)


# ---- the PromQL of the dashboard and the alert rules, as test_prometheus_live.py and test_stack.py run it ------
WINDOW = "5m"  # Grafana's $__rate_interval here: longer than a whole test, so every rate sees all of it


def expressions() -> dict[str, str]:
    """Every PromQL expression of the dashboard (Grafana's interval variables replaced) and of rules.yml
    (alerts in their `bool` form: test_prometheus_live.py's docstring says why) -> where it comes from."""
    out: dict[str, str] = {}

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                expr = re.sub(r"\$__(rate_interval|interval|range)\b", WINDOW, t["expr"])
                assert "$" not in expr, f"an unresolved Grafana variable in {t['expr']}"
                out[expr] = f"dashboard panel {p['title']!r}"

    dash = json.loads(DASHBOARD.read_text())
    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        assert v.get("type") != "query", "template variables: add their queries here"
    for g in load_yaml(RULES)["groups"]:
        for rule in g["rules"]:
            if "record" in rule:
                out[rule["expr"].strip()] = f"recording rule {rule['record']}"
            else:
                expr, n = with_bool(rule["expr"].strip())
                assert n >= 1, f"alert {rule['alert']} has no top-level comparison to test"
                out[expr] = f"alert {rule['alert']}"
    return out


_CMP = re.compile(r"==|!=|>=|<=|>|<")


def with_bool(expr: str) -> tuple[str, int]:
    """Add PromQL's `bool` modifier to every comparison outside parentheses, brackets, braces and strings:
    `x > 0.01` filters (nothing while healthy), `x > bool 0.01` answers 0 or 1 for every series of x."""
    out, depth, quote, found, i = [], 0, None, 0, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(expr[i:i + 2] if c == "\\" else c)
            i += 2 if c == "\\" else 1
            if c == quote:
                quote = None
            continue
        if c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and (m := _CMP.match(expr, i)):
            out.append(m.group(0))
            i += len(m.group(0))
            if not re.match(r"\s*bool\b", expr[i:]):
                out.append(" bool")
            found += 1
            continue
        out.append(c)
        i += 1
    return "".join(out), found
