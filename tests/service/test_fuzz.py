"""schemathesis against the service's own OpenAPI document (/openapi.json), on `crossprobe serve` over a real
tiny index (tests/service/conftest.py's `built`: 12 images, a real Redis), every check (`--checks all`), all
phases, at least 1,000 generated requests: no 5xx and no failed check allowed. `make test-fuzz` runs it (the
`fuzz` marker keeps it out of `make test`: a few minutes on 2 cores).

Every run draws a fresh seed (a fuzz test pinned to one seed proves only that seed) unless CROSSPROBE_FUZZ_SEED
gives one, and prints it first with the command that replays the run. CROSSPROBE_FUZZ_EXAMPLES (per operation
and phase, default 150) sets the size. The numbers (seed, requests generated, responses by status, 5xx, failed
checks, server tracebacks) are printed and appended, passed or failed, to the "runs" of
docs/research/results/fuzz.json with the date, the machine and the replay command (docs/research/reliability.md,
"API fuzzing"). The server runs with the defaults a deployment starts from: no keys (the search routes are open,
/admin/* answers 403), no rate limit. `make test` runs none of it (the `fuzz` marker), only the cheap checks of
the seed and the record below.

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
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.service import live

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "docs" / "research" / "results" / "fuzz.json"
MIN_CASES = 1000
# what every run in RESULT shares; each run's own numbers go to its "runs" entry
ABOUT = {
    "about": "make test-fuzz runs, one entry per run, appended (passed or failed): schemathesis against the "
             "service's own OpenAPI document; seed drawn per run unless CROSSPROBE_FUZZ_SEED gives it; replay a "
             "run with its 'replay' command",
    "config": "schemathesis.toml: the index's ids and name as dictionaries, probability 0.5 (_config)",
    "hooks": "tests/service/fuzz_hooks.py: a strategy for format visible-text; filter_failure drops an ST202 "
             "(valid data rejected) only when its 422 is a documented rule the request breaks: a blank query "
             "(body or /v1/search/image's query parameter), shortlist < k, the other x-constraints",
    "server": "crossprobe serve (uvicorn, h11 with the slow-client deadlines) over a 12-image index in a real "
              "Redis; default settings: no keys, no rate limit, admin off",
}


def fuzz_seed() -> tuple[int, str]:
    """CROSSPROBE_FUZZ_SEED, else a fresh seed from the OS (-> seed, "given" | "drawn")."""
    given = os.environ.get("CROSSPROBE_FUZZ_SEED", "").strip()
    if given:
        return int(given), "given"
    return random.SystemRandom().randrange(1, 2**31), "drawn"


def record_run(run: dict, path: Path = RESULT) -> dict:
    """Append one run to the results file's "runs" (created if missing); -> the whole document."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc = {**ABOUT, "runs": [*doc.get("runs", []), run]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return doc


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


def test_the_seed_is_drawn_per_run_unless_given(monkeypatch):
    monkeypatch.delenv("CROSSPROBE_FUZZ_SEED", raising=False)
    drawn = {fuzz_seed() for _ in range(5)}
    assert len(drawn) == 5 and {how for _, how in drawn} == {"drawn"}, drawn
    monkeypatch.setenv("CROSSPROBE_FUZZ_SEED", "20261125")
    assert fuzz_seed() == (20261125, "given")


def test_each_run_is_appended_to_the_record(tmp_path):
    path = tmp_path / "fuzz.json"
    record_run({"seed": 1}, path)
    doc = record_run({"seed": 2}, path)
    assert [r["seed"] for r in doc["runs"]] == [1, 2] and json.loads(path.read_text()) == doc
    assert set(ABOUT) <= set(doc)


@pytest.mark.fuzz
def test_schemathesis_finds_no_5xx_and_no_failed_check(built, svc_ckpt, artifacts, tmp_path_factory):
    exe = Path(sys.executable).with_name("schemathesis")
    if not exe.exists():
        pytest.fail("schemathesis is not installed: `make test-fuzz` installs the fuzz extra")
    import schemathesis

    examples = int(os.environ.get("CROSSPROBE_FUZZ_EXAMPLES", "150"))
    seed, seed_source = fuzz_seed()
    replay = f"CROSSPROBE_FUZZ_SEED={seed} CROSSPROBE_FUZZ_EXAMPLES={examples} make test-fuzz"
    print(f"\nfuzz: seed {seed} ({seed_source}), {examples} examples per operation and phase; replay: {replay}",
          flush=True)
    tmp = tmp_path_factory.mktemp("fuzz")
    report, har, config = tmp / "report.json", tmp / "requests.har", tmp / "schemathesis.toml"
    config.write_text(_config(built))
    log = tmp / "server.log"
    # the test checkpoint with relevance curves (same weights, same fingerprint): min_relevance is served, not 422
    ckpt = tmp / "ck"
    shutil.copytree(svc_ckpt, ckpt)
    (ckpt / "calibration.json").write_text(json.dumps({"curves": {m: {"x": [-30.0, 30.0], "y": [0.0, 1.0], "shift": 1.0}
                                                                  for m in ("none", "cp", "temde")}, "meta": {}}))
    with live.serve(built, ckpt, artifacts, log) as base:
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
    kept = ROOT / "artifacts" / "fuzz" / f"seed-{seed}"  # the whole output, for a failure's details (not in git)
    kept.mkdir(parents=True, exist_ok=True)
    for f in (tmp / "schemathesis.out", report, log):
        if f.exists():
            shutil.copy(f, kept / f.name)
    print(run.stdout[-6000:], run.stderr[-3000:], sep="\n")
    assert report.exists(), f"seed {seed}; replay: {replay}\n" + run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(report.read_text())
    statuses = Counter(e["response"]["status"] for e in json.loads(har.read_text())["log"]["entries"])
    server_log = log.read_text(errors="replace")
    result = {
        "seed": seed,
        "seed_source": seed_source,  # drawn for this run, or given by CROSSPROBE_FUZZ_SEED
        "max_examples": examples,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": _machine(),
        "command": "make test-fuzz  (pytest -m fuzz tests/service/test_fuzz.py)",
        "replay": replay,
        "output": f"{kept.relative_to(ROOT)}/ (schemathesis.out, report.json, server.log; not in git)",
        # as run, less the temporary report paths; the server's port is a free one
        "schemathesis": "SCHEMATHESIS_HOOKS=tests.service.fuzz_hooks schemathesis " + " ".join(
            ["http://127.0.0.1:<port>/openapi.json" if a.endswith("/openapi.json") else
             "schemathesis.toml" if a == str(config) else a for a in args[:-6]]),
        "schemathesis_version": schemathesis.__version__,
        "seconds": round(took, 1),
        "cases": doc["test_cases"]["generated"],
        "server_5xx": sum(n for s, n in served.items() if s >= 500),
        "responses_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "failed_checks": len(doc["failures"]),
        "server_tracebacks": server_log.count("Traceback"),
        "errors": len(doc["errors"]),
        "exit_code": run.returncode,
        "test_cases": doc["test_cases"],
        "operations": doc.get("operations"),
        "phases": {name: p.get("status") for name, p in (doc.get("phases") or {}).items()},
        "requests_sent": sum(statuses.values()),
        "responses_by_status": dict(sorted(statuses.items())),
        # failures fuzz_hooks.filter_failure dropped: ST202 for a documented rule the request breaks (ABOUT)
        "filtered_by_hooks": doc.get("filtered"),
        "failures": doc["failures"],
        "error_details": doc["errors"],
        "warnings": {k: v for k, v in (doc.get("warnings") or {}).items() if v},
    }
    result["passed"] = (result["cases"] >= MIN_CASES and result["responses_5xx"] == result["server_5xx"] == 0
                        and result["failed_checks"] == result["server_tracebacks"] == result["errors"] == 0
                        and run.returncode == 0)
    record_run(result)
    print(f"\nschemathesis {result['schemathesis_version']}, seed {seed}: {result['cases']} test cases generated, "
          f"{result['requests_sent']} requests, {result['responses_5xx']} 5xx (server counted "
          f"{result['server_5xx']}), {result['failed_checks']} failed checks, {result['errors']} errors, "
          f"{result['server_tracebacks']} server tracebacks, {doc.get('filtered')} known-correct 422s filtered, "
          f"in {took:.0f} s -> {RESULT.relative_to(ROOT)}; replay: {replay}")

    where = f"seed {seed}; replay: {replay}\n"
    assert result["cases"] >= MIN_CASES, where + json.dumps(result["test_cases"])
    assert result["responses_5xx"] == 0 and result["server_5xx"] == 0, where + str(result["responses_by_status"])
    assert result["server_tracebacks"] == 0, where + server_log[-5000:]
    assert doc["failures"] == [], where + json.dumps(doc["failures"], indent=1) + run.stdout[-20000:]
    assert doc["errors"] == [], where + json.dumps(doc["errors"])
    assert run.returncode == 0, where + run.stdout[-5000:]
