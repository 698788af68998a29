"""schemathesis against the service's own OpenAPI document (/openapi.json), on `crossprobe serve` over a real
tiny index (tests/service/conftest.py's `built`: 12 images, a real Redis), every check (`--checks all`), all
phases, at least 1,000 generated requests: no 5xx and no failed check allowed. `make test-fuzz` runs it (the
`fuzz` marker keeps it out of `make test`: a few minutes on 2 cores).

The numbers (requests generated, responses by status, 5xx, failed checks) are printed and written to
docs/research/results/fuzz.json with the command and the machine. CROSSPROBE_FUZZ_EXAMPLES (per operation and phase,
default 150) and CROSSPROBE_FUZZ_SEED (default 16) change the run. The server runs with the defaults a
deployment starts from: no keys (the search routes are open, /admin/* answers 403), no rate limit.

tests/service/fuzz_hooks.py holds the only adjustments (two rules JSON Schema cannot state; it says why).
A schemathesis.toml (written per run) gives schemathesis the index's real ids and name as dictionaries, drawn
for half of the values of item ids and index names: random strings alone are answered 404 almost always, and
the routes' own work (metadata, image resizing, explain maps, searches of a named index) would go unfuzzed.
Dictionaries respect the generation mode (an entry is used in a negative case only if it breaks the schema).
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.service import live

pytestmark = pytest.mark.fuzz

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "docs" / "research" / "results" / "fuzz.json"
MIN_CASES = 1000


def _machine() -> dict:
    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def _config(built) -> str:
    """schemathesis.toml: the served index's ids and name as dictionaries (see the module's docstring)."""
    ids = ", ".join(json.dumps(i) for i in built.ids)
    binding = '{ dictionary = "%s", probability = 0.5 }'
    return "\n".join([
        "[dictionaries.ids]", f"values = [{ids}]",
        "[dictionaries.indexes]", 'values = ["photos"]',
        "[parameters]",
        f'"path.item_id" = {binding % "ids"}',  # /v1/items/{item_id}[/image]
        f'"body.ids[*]" = {binding % "ids"}',  # /v1/explain, /metadata
        f'"body.index" = {binding % "indexes"}',  # /v1/search, /v1/explain
        f'"body.indice_name" = {binding % "indexes"}',  # /knn-service, /metadata
        f'"query.index" = {binding % "indexes"}',  # /v1/items/...
    ]) + "\n"


def _served(base: str) -> Counter:
    """The server's own count of its answers by status (MetricsMiddleware's crossprobe_requests_total)."""
    served = Counter()
    for m in re.finditer(r'^crossprobe_requests_total\{endpoint="([^"]*)",status="(\d+)"\} ([0-9.e+]+)$',
                         httpx.get(f"{base}/metrics").text, re.M):
        served[int(m.group(2))] += int(float(m.group(3)))
    return served


def test_schemathesis_finds_no_5xx_and_no_failed_check(built, svc_ckpt, artifacts, tmp_path_factory):
    exe = Path(sys.executable).with_name("schemathesis")
    if not exe.exists():
        pytest.fail("schemathesis is not installed: `make test-fuzz` installs the fuzz extra")
    import schemathesis

    examples = int(os.environ.get("CROSSPROBE_FUZZ_EXAMPLES", "150"))
    seed = int(os.environ.get("CROSSPROBE_FUZZ_SEED", "16"))
    tmp = tmp_path_factory.mktemp("fuzz")
    report, har, config = tmp / "report.json", tmp / "requests.har", tmp / "schemathesis.toml"
    config.write_text(_config(built))
    log = tmp / "server.log"
    with live.serve(built, svc_ckpt, artifacts, log) as base:
        before = _served(base)  # /readyz answered 503 while the server was loading: not the fuzzer's
        args = ["--config-file", str(config), "run", f"{base}/openapi.json", "--checks", "all",
                "--max-examples", str(examples),
                "--seed", str(seed), "--workers", "1", "--request-timeout", "60", "--no-color",
                "--report", "json,har", "--report-json-path", str(report), "--report-har-path", str(har)]
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.service.fuzz_hooks", "NO_COLOR": "1"}
        t0 = time.monotonic()
        run = subprocess.run([str(exe), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
        took = time.monotonic() - t0
        served = _served(base) - before
    (tmp / "schemathesis.out").write_text(run.stdout + run.stderr)
    print(run.stdout[-6000:], run.stderr[-3000:], sep="\n")
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(report.read_text())
    statuses = Counter(e["response"]["status"] for e in json.loads(har.read_text())["log"]["entries"])
    server_log = log.read_text(errors="replace")
    result = {
        "command": "make test-fuzz  (pytest -m fuzz tests/service/test_fuzz.py)",
        # as run, less the temporary report paths; the server's port is a free one
        "schemathesis": "SCHEMATHESIS_HOOKS=tests.service.fuzz_hooks schemathesis " + " ".join(
            ["http://127.0.0.1:<port>/openapi.json" if a.endswith("/openapi.json") else
             "schemathesis.toml" if a == str(config) else a for a in args[:-6]]),
        "config": "schemathesis.toml: the index's ids and name as dictionaries, probability 0.5 (_config)",
        "schemathesis_version": schemathesis.__version__,
        "hooks": "tests/service/fuzz_hooks.py: a strategy for format visible-text; filter_failure drops an ST202 "
                 "(valid data rejected) only when its 422 is for a blank query or shortlist < k",
        "server": "crossprobe serve (uvicorn, h11 with the slow-client deadlines) over a 12-image index in a real "
                  "Redis; default settings: no keys, no rate limit, admin off",
        "machine": _machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "seconds": round(took, 1),
        "max_examples": examples,
        "seed": seed,
        "operations": doc.get("operations"),
        "phases": doc.get("phases"),
        "test_cases": doc["test_cases"],
        "requests_sent": sum(statuses.values()),
        "responses_by_status": dict(sorted(statuses.items())),
        "server_5xx": sum(n for s, n in served.items() if s >= 500),
        "responses_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "failed_checks": doc["failures"],
        # failures fuzz_hooks.filter_failure dropped: ST202 for a blank query or shortlist < k, each a correct 422
        "filtered_by_hooks": doc.get("filtered"),
        "errors": doc["errors"],
        "warnings": doc.get("warnings"),
        "exit_code": run.returncode,
        "server_tracebacks": server_log.count("Traceback"),
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nschemathesis {result['schemathesis_version']}: {doc['test_cases']['generated']} test cases generated, "
          f"{result['requests_sent']} requests, {result['responses_5xx']} 5xx (server counted "
          f"{result['server_5xx']}), {len(doc['failures'])} failed checks, {len(doc['errors'])} errors, "
          f"{doc.get('filtered')} known-correct 422s filtered, in {took:.0f} s -> {RESULT.relative_to(ROOT)}")

    assert doc["test_cases"]["generated"] >= MIN_CASES, result["test_cases"]
    assert result["responses_5xx"] == 0 and result["server_5xx"] == 0, result["responses_by_status"]
    assert result["server_tracebacks"] == 0, server_log[-5000:]
    assert doc["failures"] == [], json.dumps(doc["failures"], indent=1) + run.stdout[-20000:]
    assert doc["errors"] == [], doc["errors"]
    assert run.returncode == 0, run.stdout[-5000:]
