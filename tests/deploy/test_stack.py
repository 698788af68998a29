"""`make test-deploy`: the committed docker-compose.yml, run unchanged under podman-compose, checked against its
running containers, and measured (docs/research/results/deploy.json, docs/deployment.md).

It runs the README's Docker quick start: `make image` (done by the make target), `up -d`, the `indexer` job over
a folder of sample photos mounted as $IMAGES. Grafana is left out of `up` (its image has no package here; its
dashboard's queries are run below against the stack's Prometheus). Redis, Prometheus and the Pushgateway are
stand-ins built from Debian's packages under the compose file's image names (scripts/container-setup.sh).
podman-compose 1.0 (Debian's) has no --profile: it runs a profile's service by its name (`run --rm indexer`), and
it ignores depends_on's health conditions (podman runs no health checks without systemd; `podman healthcheck run`
runs the image's check on demand below).

The checks run in file order over one stack (module scope); each records what it saw in RESULT, which the last
test writes out. The same photos are indexed and served on the host (this venv, `crossprobe serve`) to compare
answers and latency in the same run. Every process and container started here is stopped here."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from crossprobe.models.demo import EXPECTED
from tests.deploy.conftest import STACK_SECRETS, REPO, expressions
from tests.deploy.test_dockerfile import instructions

pytestmark = pytest.mark.deploy

PROJECT = "cpdeploy"
SERVICES = ["redis", "api", "prometheus", "pushgateway"]  # grafana: no image reachable here
API = "http://127.0.0.1:8000"
PROM = "http://127.0.0.1:9090"
HOST_PORT = 8790
OUT = REPO / "docs" / "research" / "results" / "deploy.json"
RESULT: dict = {}
LOAD_S = 60


def name(service: str, project: str = PROJECT) -> str:
    return f"{project}_{service}_1"  # podman-compose 1.0's container names


def sh(cmd: list[str], timeout: float = 600, check: bool = True, env: dict | None = None,
       merged: bool = False) -> subprocess.CompletedProcess:
    """merged: stderr into stdout in the order written (p.stderr is then "")."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if merged else {"capture_output": True}
    p = subprocess.run(cmd, text=True, timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})}, **streams)
    p.stderr = p.stderr or ""
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def compose(*args: str, env: dict, project: str = PROJECT, files: tuple[Path, ...] = (),
            **kw) -> subprocess.CompletedProcess:
    fs = [a for f in (REPO / "docker-compose.yml", *files) for a in ("-f", str(f))]
    # unbuffered: podman-compose's echo of each podman command stays before that command's own output
    return sh(["podman-compose", "-p", project, *fs, *args], env={**env, "PYTHONUNBUFFERED": "1"}, **kw)


def down(env: dict, project: str = PROJECT, files: tuple[Path, ...] = ()) -> None:
    """`down -v`, and the project's network, which podman-compose 1.0 leaves behind."""
    compose("down", "-v", env=env, project=project, files=files, check=False, timeout=300)
    sh(["podman", "network", "rm", "-f", f"{project}_default"], check=False, timeout=60)


def not_running(services: list[str], project: str = PROJECT) -> dict[str, str]:
    """service -> what podman says of its container when it does not exist or does not run: its state, exit code,
    the runtime's error and its last log lines."""
    bad = {}
    for s in services:
        p = sh(["podman", "inspect", "--format", "{{.State.Status}}\t{{.State.ExitCode}}\t{{.State.Error}}",
                name(s, project)], check=False, timeout=30)
        if p.returncode != 0:
            bad[s] = "no container"
            continue
        status, code, error = (p.stdout.strip().split("\t") + ["", ""])[:3]
        if status != "running":
            logs = sh(["podman", "logs", "--tail", "10", name(s, project)], check=False, timeout=30)
            bad[s] = (status + (f", exit code {code}" if status == "exited" else "") + (f", {error}" if error else "")
                      + "".join(f"\n      log: {ln}" for ln in (logs.stdout + logs.stderr).strip().splitlines()))
    return bad


def podman_errors(compose_output: str, project: str) -> dict[str, list[str]]:
    """service -> the Error lines podman printed under podman-compose's `podman run` / `podman start` of its
    container (podman-compose 1.0 echoes each command, then podman's own output)."""
    said: dict[str, list[str]] = {}
    current = ""
    for line in compose_output.splitlines():
        if m := re.match(rf"podman (?:run --name=|start ){re.escape(project)}_(.+?)_1\b", line):
            current = m.group(1)
        elif line.startswith("Error") and "no such volume" not in line:  # podman-compose probes, then makes volumes
            said.setdefault(current, []).append(line)
    return said


def up(*services: str, env: dict, project: str = PROJECT, files: tuple[Path, ...] = ()) -> None:
    """`up -d`, then each container checked at once: it exists and runs. podman-compose 1.0 returns 0 when a
    `podman run` failed (no catatonit for --init, a network podman cannot make, a command not found), and every
    check after it would wait for a connection that is refused: fail here instead, quoting podman."""
    p = compose("up", "-d", *services, env=env, project=project, files=files, timeout=300, merged=True)
    bad = not_running(list(services), project)
    if bad:
        said = podman_errors(p.stdout, project)
        pytest.fail(f"containers that did not start after `podman-compose up -d` (which returned {p.returncode}):\n"
                    + "\n".join(f"  {s}: {state}" + "".join(f"\n    podman: {ln}" for ln in said.get(s, []))
                                for s, state in bad.items()), pytrace=False)


def alive(*services: str) -> bool:
    """For wait(): a container that stopped fails the wait at once, with podman's account of it."""
    bad = not_running(list(services))
    assert not bad, "\n".join(f"{s}: {state}" for s, state in bad.items())
    return True


def wait(what: str, check, timeout_s: float, step: float = 0.2):
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        try:
            if (v := check()):
                return v
        except (httpx.HTTPError, OSError) as e:
            last = e
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last error: {last})")


def readyz(base: str = API) -> httpx.Response:
    return httpx.get(f"{base}/readyz", timeout=2)


def search(q: str, base: str = API, **kw) -> httpx.Response:
    return httpx.post(f"{base}/v1/search", json={"query": q, "index": "photos", **kw}, timeout=10)


def api_rss() -> float:
    """VmRSS of the api container's `crossprobe serve` process (its PID 1, the compose file's init, has the same
    command line after `--` and a few hundred kB: the largest is the server)."""
    code = ("import pathlib\n"
            "for p in pathlib.Path('/proc').glob('[0-9]*'):\n"
            "    try: cmd = (p / 'cmdline').read_bytes().split(b'\\0')\n"
            "    except OSError: continue\n"
            "    if any(c.endswith(b'crossprobe') for c in cmd) and b'serve' in cmd:\n"
            "        print(next(ln.split()[1] for ln in (p / 'status').read_text().splitlines() if ln.startswith('VmRSS')))")
    out = sh(["podman", "exec", name("api"), "python", "-c", code]).stdout.split()
    assert out, "no crossprobe serve process in the api container"
    return max(float(x) for x in out) * 1024


def started_at(service: str) -> str:
    return sh(["podman", "inspect", "-f", "{{.State.StartedAt}}", name(service)]).stdout.strip()


def resolves_redis() -> None:
    """The api finds `redis` by name on the compose network: podman's CNI fallback (netavark or aardvark-dns
    missing) makes networks without DNS, where the api would run and wait for a Redis it cannot name."""
    p = sh(["podman", "exec", name("api"), "python", "-c", "import socket; socket.getaddrinfo('redis', 6379)"],
           check=False, timeout=30)
    if p.returncode != 0:
        backend = sh(["podman", "info", "--format", "{{.Host.NetworkBackend}}"], check=False).stdout.strip()
        pytest.fail(f"`redis` does not resolve in the api container (podman's network backend: {backend}; "
                    f"netavark with aardvark-dns gives DNS, scripts/container-setup.sh sets them up):\n"
                    f"{p.stderr.strip()[-1500:]}", pytrace=False)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if shutil.which("podman-compose") is None or shutil.which("podman") is None:
        pytest.fail("podman and podman-compose are missing: `make test-deploy` installs them (scripts/container-setup.sh)")
    if sh(["podman", "image", "exists", "crossprobe:cpu"], check=False).returncode != 0:
        pytest.fail("no image crossprobe:cpu: `make image` builds it (`make test-deploy` runs it first)")
    from crossprobe.models.demo import write_sample_gallery

    root = tmp_path_factory.mktemp("deploy")
    gallery = write_sample_gallery(root / "gallery")
    for p in [root, gallery, *gallery.iterdir()]:  # readable by the containers' uid 10001
        p.chmod(0o755 if p.is_dir() else 0o644)
    env = {"IMAGES": str(gallery), **STACK_SECRETS}  # the file wants it, though Grafana is left out here
    down(env)
    t0 = time.monotonic()
    started = list(SERVICES)
    try:
        up(*SERVICES, env=env)
        resolves_redis()
        yield {"env": env, "gallery": gallery, "root": root, "t0": t0, "started": started}
    finally:
        for s in started:
            logs = sh(["podman", "logs", name(s)], check=False, timeout=30)
            (root / f"{s}.log").write_text(logs.stdout + logs.stderr)
        down(env)


@pytest.fixture(scope="module")
def host_service(stack):
    """The same photos indexed and served on the host (this venv, embedded Redis): the comparison's other side."""
    root = stack["root"] / "host"
    env = {**os.environ, "CROSSPROBE_INDEX_ROOT": str(root / "indexes"), "CROSSPROBE_PORT": str(HOST_PORT),
           "CROSSPROBE_INDEX_PROGRESS": "false"}
    env.pop("REDIS_URL", None)  # the embedded Redis
    crossprobe = str(Path(sys.executable).parent / "crossprobe")
    subprocess.run([crossprobe, "index", "build", "--name", "photos", "--images", str(stack["gallery"])], env=env,
                   check=True, capture_output=True, timeout=600)
    proc = subprocess.Popen([crossprobe, "serve"], env=env, stdout=open(root / "serve.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait("the host service", lambda: readyz(f"http://127.0.0.1:{HOST_PORT}").status_code == 200, 120)
        yield f"http://127.0.0.1:{HOST_PORT}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---- a container that cannot start fails `up` at once ------------------------------------------------------
def test_a_container_that_cannot_start_fails_up_at_once_quoting_podman(tmp_path):
    """A planted failure, in a project of its own: an override file gives redis an entrypoint that does not exist.
    `podman run` fails (as it does without catatonit for --init, or without a network backend that works) and
    podman-compose still returns 0; `up` must fail within seconds, with podman's own message."""
    override = tmp_path / "broken.yml"
    override.write_text('services:\n  redis:\n    entrypoint: ["/no/such/entrypoint"]\n')
    project, env = f"{PROJECT}broken", {"IMAGES": str(tmp_path), **STACK_SECRETS}
    t = time.monotonic()
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            up("redis", env=env, project=project, files=(override,))
        took = time.monotonic() - t
    finally:
        down(env, project, (override,))
    message = str(failed.value)
    RESULT["failed_start"] = {"planted": "an override file: redis's entrypoint /no/such/entrypoint",
                              "failed_after_s": round(took, 2), "message": message}
    assert message.count("\n  redis: ") == 1 and "podman: Error: " in message and "/no/such/entrypoint" in message, message
    assert took < 60, took


# ---- the stack comes up ----------------------------------------------------------------------------------
def test_api_becomes_healthy_and_says_no_index(stack):
    r = wait("the api's /readyz", lambda: alive("api") and (x := readyz()).status_code in (200, 503)
             and "no index" in x.text and x, 120)
    RESULT["api_ready_s"] = {"cold": round(time.monotonic() - stack["t0"], 2),
                             "cold_means": "`up -d` of the stack (no index yet) until /readyz answers 'no index "
                                           "served yet' with the models loaded"}
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    # podman runs HEALTHCHECKs from systemd timers, absent here: run the image's own check on demand
    assert sh(["podman", "healthcheck", "run", name("api")], check=False).returncode == 0
    up = {s: sh(["podman", "inspect", "-f", "{{.State.Status}}", name(s)]).stdout.strip() for s in SERVICES}
    RESULT["services_up"] = {s: v == "running" for s, v in up.items()}
    RESULT["services_left_out"] = {"grafana": "no package or registry reachable here; its dashboard's queries "
                                              "run against this stack's Prometheus below"}
    assert all(RESULT["services_up"].values()), up


def test_api_runs_as_10001_and_writes_only_its_volumes(stack):
    assert sh(["podman", "exec", name("api"), "id", "-u"]).stdout.strip() == "10001"
    writable = {}
    for path in ("/data/indexes", "/tmp", "/", "/opt/venv", "/opt/crossprobe/graphs", "/home/crossprobe", "/etc"):
        p = sh(["podman", "exec", name("api"), "python", "-c",
                f"import os; f = os.path.join({path!r}, '.w'); open(f, 'w').close(); os.remove(f)"], check=False)
        writable[path] = p.returncode == 0
    RESULT["api_writable_paths"] = writable
    assert writable == {"/data/indexes": True, "/tmp": True, "/": False, "/opt/venv": False,
                        "/opt/crossprobe/graphs": False, "/home/crossprobe": False, "/etc": False}


def test_every_container_is_confined_and_redis_asks_for_its_password(stack):
    """Issue 55, item 7, on the running containers: no capabilities (Redis: the few its entrypoint needs), no new
    privileges, memory and process limits; Redis refuses a client without the password, answers one with it."""
    confined = {}
    for s in SERVICES:
        hc = json.loads(sh(["podman", "inspect", name(s)]).stdout)[0]["HostConfig"]
        confined[s] = {"cap_drop": hc.get("CapDrop"), "cap_add": hc.get("CapAdd"),
                       "no_new_privileges": any("no-new-privileges" in o for o in hc.get("SecurityOpt") or []),
                       "memory": hc.get("Memory"), "pids_limit": hc.get("PidsLimit")}
    RESULT["confinement"] = confined
    want_mb = {"redis": 2048, "api": 4096, "prometheus": 1024, "pushgateway": 1024}
    for s, c in confined.items():
        assert c["no_new_privileges"] and c["memory"] == want_mb[s] * 2**20, (s, c)
        # podman-compose 1.0 passes no pids_limit (docker-compose does): podman's own default of 2048 applies
        assert 0 < c["pids_limit"] <= 2048, (s, c)
        dropped = {x.upper().removeprefix("CAP_") for x in c["cap_drop"] or []}
        assert "ALL" in dropped or len(dropped) >= 10, (s, c)
    bare = sh(["podman", "exec", "-e", "REDISCLI_AUTH=", name("redis"), "redis-cli", "ping"], check=False)
    assert "NOAUTH" in bare.stdout + bare.stderr, bare
    assert sh(["podman", "exec", name("redis"), "redis-cli", "ping"]).stdout.strip() == "PONG"


# ---- the batch job indexes, the api serves it without a restart --------------------------------------------
def test_indexer_job_indexes_the_mounted_photos_and_the_api_serves_them(stack):
    before = started_at("api")
    p = compose("run", "--rm", "indexer", env=stack["env"], timeout=600)
    out = p.stdout + p.stderr
    m = re.search(r"(\d+) items active", out)
    assert m, out[-3000:]
    skipped = re.search(r"(\d+) skipped", out)
    RESULT["indexer_job"] = {"items": int(m.group(1)), "failed": int(skipped.group(1)) if skipped else 0,
                             "photos": len(list(stack["gallery"].iterdir()))}
    assert RESULT["indexer_job"]["items"] == RESULT["indexer_job"]["photos"]
    t = time.monotonic()
    wait("the api to serve the new index", lambda: readyz().status_code == 200, 60)
    RESULT["indexer_job"]["served_after_s"] = round(time.monotonic() - t, 2)
    assert started_at("api") == before  # no restart


def test_search_finds_the_expected_photos_as_the_host_does(stack, host_service):
    got, host, same = 0, 0, 0
    for q, want in EXPECTED.items():
        c = search(q, k=3, mode="vector")  # the model's count, as make demo's (the photos are named by subject)
        h = search(q, base=host_service, k=3, mode="vector")
        assert c.status_code == 200 and h.status_code == 200, c.text
        top_c, top_h = c.json()["results"][0]["id"], h.json()["results"][0]["id"]
        got += top_c.startswith(want + ".")
        host += top_h.startswith(want + ".")
        same += top_c == top_h
    RESULT["search_expected_first"] = {"n": got, "of": len(EXPECTED), "host": host,
                                       "same_first_as_host": same,
                                       "queries": "crossprobe.models.demo.EXPECTED (make demo's 16)"}
    assert same == len(EXPECTED) and got == host  # the container answers as the host does


def test_words_search_in_the_container(stack):
    """The indexer container writes each version's keyword index, and the api serves it: a file name by keyword
    alone, and hybrid as the default mode."""
    k = search("coffee", k=3, mode="keyword")
    h = search("a cup of coffee", k=3)
    assert k.status_code == 200 and h.status_code == 200, (k.text, h.text)
    assert [x["id"] for x in k.json()["results"]] == ["coffee.jpg"]
    assert h.json()["mode"] == "hybrid" and h.json()["results"][0]["id"] == "coffee.jpg"
    RESULT["keyword_search"] = {"keyword_first": k.json()["results"][0]["id"], "hybrid_mode": h.json()["mode"],
                                "keyword_stage_ms": h.json()["timings_ms"].get("keyword")}


def test_page_and_thumbnail_load(stack):
    page = httpx.get(f"{API}/", timeout=5)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    hit = search("a cup of coffee", k=1).json()["results"][0]
    img = httpx.get(f"{API}/v1/items/{hit['id']}/image", params={"index": "photos", "size": 128}, timeout=10)
    assert img.status_code == 200 and img.headers["content-type"].startswith("image/"), img.text[:300]
    RESULT["page_and_thumbnail"] = {"page": page.status_code, "thumbnail": img.status_code,
                                    "thumbnail_type": img.headers["content-type"]}


# ---- the watcher (profile watch) -------------------------------------------------------------------------
def test_watcher_follows_the_mounted_folder(stack):
    """`up -d watcher` (podman-compose 1.0 starts a profile's service by its name): a photo copied into $IMAGES on
    the host is served by the api within seconds, with nothing restarted, and gone once deleted."""
    before = started_at("api")
    stack["started"].append("watcher")
    up("watcher", env=stack["env"])

    def item(i: str) -> int:
        return httpx.get(f"{API}/v1/items/{i}", params={"index": "photos"}, timeout=5).status_code

    wait("the watcher to start (its /metrics)", lambda: sh(["podman", "exec", name("watcher"), "python", "-c",
         "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9109/metrics', timeout=2)"],
         check=False, timeout=30).returncode == 0, 180, step=1)
    new = stack["gallery"] / "coffee-again.jpg"
    shutil.copyfile(stack["gallery"] / "coffee.jpg", new)
    new.chmod(0o644)
    t = time.monotonic()
    wait("the copied photo served", lambda: item(new.name) == 200, 60)
    added_s = time.monotonic() - t
    new.unlink()
    t = time.monotonic()
    wait("the deleted photo gone", lambda: item(new.name) == 404, 60)
    RESULT["watcher"] = {"added_served_after_s": round(added_s, 2), "deleted_gone_after_s": round(time.monotonic() - t, 2),
                         "api_restarted": started_at("api") != before}
    assert not RESULT["watcher"]["api_restarted"]
    assert search("a cup of coffee", k=1).json()["results"][0]["id"] == "coffee.jpg"


# ---- Prometheus in its container --------------------------------------------------------------------------
def test_prometheus_scrapes_the_api_and_pushgateway_and_the_queries_return_data(stack):
    for q in ("a cat", "a dog", "a rocket"):
        for mode in ("cp", "temde", "none"):
            search(q, k=4, rerank=mode)
    search("a", k=0)

    def targets():
        active = httpx.get(f"{PROM}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        up = {t["labels"]["job"]: t["health"] for t in active}
        return up if up and all(v == "up" for v in up.values()) else None

    up = wait("every target up", targets, 90, step=1)
    RESULT["prometheus_targets_up"] = up
    assert set(up) == {"crossprobe-api", "pushgateway", "crossprobe-watch"}
    time.sleep(16)  # one more scrape (15 s interval) after the traffic above
    search("a cat", k=4)
    time.sleep(16)
    exprs = expressions()
    empty = []
    for expr, where in exprs.items():
        res = httpx.get(f"{PROM}/api/v1/query", params={"query": expr}, timeout=10).json()
        if res["status"] != "success" or not res["data"]["result"]:
            empty.append(where)
    RESULT["prometheus_queries"] = {"total": len(exprs), "with_data": len(exprs) - len(empty), "empty": empty}
    # the rules load and evaluate in the container's Prometheus
    rules = httpx.get(f"{PROM}/api/v1/rules", timeout=5).json()["data"]["groups"]
    health = [r["health"] for g in rules for r in g["rules"]]
    RESULT["prometheus_rules"] = {"rules": len(health), "ok": health.count("ok")}
    assert health and all(h == "ok" for h in health)
    assert len(empty) <= len(exprs) // 4, empty  # rates over a short window: see docs/deployment.md


# ---- the reindex job --------------------------------------------------------------------------------------
def test_reindex_job_runs(stack):
    before = readyz().json()["indexes"]["photos"]
    p = compose("run", "--rm", "reindex", env=stack["env"], timeout=600)
    after = wait("the reindexed version served", lambda: (v := readyz().json()["indexes"]["photos"]) != before and v,
                 60)
    RESULT["reindex_job"] = {"exit": p.returncode, "version_before": before, "version_after": after}
    assert search("a cup of coffee", k=1).json()["results"][0]["id"].startswith("coffee.")


# ---- restarts, SIGTERM --------------------------------------------------------------------------------------
def test_a_restarted_api_keeps_serving_from_the_volumes(stack):
    want = search("a cup of coffee", k=3).json()["results"]
    t = time.monotonic()
    sh(["podman", "restart", "-t", "30", name("api")], timeout=120)
    wait("the restarted api ready", lambda: readyz().status_code == 200, 60, step=0.1)
    RESULT["api_ready_s"]["warm"] = round(time.monotonic() - t, 2)
    RESULT["api_ready_s"]["warm_means"] = "`podman restart` of the api (index on the volumes) until /readyz is 200"
    got = search("a cup of coffee", k=3).json()["results"]
    RESULT["restart_keeps_serving"] = [h["id"] for h in got] == [h["id"] for h in want]
    assert RESULT["restart_keeps_serving"]


def test_sigterm_ends_the_api_cleanly_within_the_grace_period(stack):
    t = time.monotonic()
    sh(["podman", "stop", "-t", "30", name("api")], timeout=120)
    stop_s = time.monotonic() - t
    code = int(sh(["podman", "inspect", "-f", "{{.State.ExitCode}}", name("api")]).stdout.strip())
    logs = sh(["podman", "logs", "--tail", "20", name("api")]).stderr + sh(["podman", "logs", "--tail", "20", name("api")]).stdout
    RESULT["sigterm_clean"] = {"stop_s": round(stop_s, 2), "grace_s": 30, "exit_code": code,
                               "shutdown_logged": "Application shutdown complete" in logs}
    sh(["podman", "start", name("api")], timeout=60)
    wait("the api back", lambda: readyz().status_code == 200, 60)
    # `crossprobe serve` shuts down gracefully, then ends by the signal it got (service/server.py): 143 = 128 + SIGTERM;
    # 137 would be podman's SIGKILL at the end of the grace period
    assert stop_s < 30 and code == 143 and "Application shutdown complete" in logs, logs


# ---- Redis stopped and started --------------------------------------------------------------------------
def test_a_stopped_redis_degrades_and_recovers_with_no_data_lost(stack):
    items = lambda: {i["name"]: i["count"] for i in httpx.get(f"{API}/v1/indexes", timeout=5).json()["indexes"]}  # noqa: E731
    count = items()["photos"]
    hit = search("a cup of coffee", k=1).json()["results"][0]
    meta = httpx.get(f"{API}/v1/items/{hit['id']}", params={"index": "photos"}, timeout=5).json()
    sh(["podman", "stop", "-t", "10", name("redis")], timeout=60)
    try:
        r = wait("a degraded answer", lambda: (x := search("a cup of coffee", k=3)).status_code == 200
                 and x.json()["degraded"] and x, 30)
        degraded = {"status": r.status_code, "degraded_reason": r.json().get("degraded_reason"),
                    "first": r.json()["results"][0]["id"], "readyz": readyz().json().get("status")}
    finally:
        sh(["podman", "start", name("redis")], timeout=60)
    RESULT["degraded_on_redis_stop"] = degraded
    t = time.monotonic()
    wait("answers no longer degraded", lambda: not search("a cup of coffee", k=3).json()["degraded"], 60, step=0.5)
    after = httpx.get(f"{API}/v1/items/{hit['id']}", params={"index": "photos"}, timeout=5).json()
    RESULT["recovered"] = {"after_s": round(time.monotonic() - t, 2), "items_before": count, "items_after": items()["photos"],
                           "metadata_same": after == meta}
    assert degraded["degraded_reason"] and after == meta and items()["photos"] == count


# ---- measured: memory, latency against the host, the image -------------------------------------------------
def test_measure_memory_and_latency_against_the_host(stack, host_service):
    queries = list(EXPECTED)
    for q in queries:  # warm both
        search(q, k=10), search(q, base=host_service, k=10)
    idle = api_rss()

    def client(i):
        n, end = 0, time.monotonic() + LOAD_S
        with httpx.Client(timeout=10) as c:
            while time.monotonic() < end:
                assert c.post(f"{API}/v1/search", json={"query": queries[(i + n) % len(queries)], "index": "photos",
                                                         "k": 10}).status_code in (200, 429)
                n += 1
        return n

    peak = idle
    with ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(client, i) for i in range(4)]
        while not all(f.done() for f in futs):
            peak = max(peak, api_rss())
            time.sleep(1)
        sent = sum(f.result() for f in futs)
    RESULT["api_rss_bytes"] = {"idle": int(idle), "load_peak": int(peak),
                               "load": f"{LOAD_S} s, 4 concurrent clients, {sent} searches (k 10, the server's default reranker)"}

    lat = {"container": [], "host": []}
    with httpx.Client(timeout=10) as c:
        for rep in range(20):  # alternated one by one, so both sides see the same machine load
            for q in queries:
                for side, base in (("container", API), ("host", host_service)):
                    t = time.perf_counter()
                    assert c.post(f"{base}/v1/search", json={"query": q, "index": "photos", "k": 10}).status_code == 200
                    lat[side].append((time.perf_counter() - t) * 1000)

    def pct(xs, p):
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))], 2)

    RESULT["search_latency_ms"] = {side: {"p50": pct(v, 50), "p99": pct(v, 99), "n": len(v)} for side, v in lat.items()}
    RESULT["container_vs_host_p50_ratio"] = round(statistics.median(lat["container"]) / statistics.median(lat["host"]), 3)
    RESULT["container_vs_host_p99_ratio"] = round(pct(lat["container"], 99) / pct(lat["host"], 99), 3)


def test_write_results(stack):
    image = json.loads(sh(["podman", "image", "inspect", "crossprobe:cpu"]).stdout)[0]
    history = json.loads(sh(["podman", "history", "--format", "json", "crossprobe:cpu"]).stdout)
    layers = sorted(({"bytes": h.get("size", 0), "created_by": (h.get("CreatedBy") or h.get("createdBy") or "")[-160:]}
                     for h in history), key=lambda x: -x["bytes"])
    du = sh(["podman", "run", "--rm", "--entrypoint", "sh", "crossprobe:cpu", "-c",
             "du -sk /opt/venv/lib/python3.11/site-packages/* /opt/crossprobe/graphs | sort -rn | head -12"]).stdout
    fills = [{"kib": int(k), "path": p} for k, p in (ln.split("\t", 1) for ln in du.strip().splitlines())]
    builds = [json.loads(ln) for ln in (REPO / "artifacts" / "deploy" / "builds.jsonl").read_text().splitlines()] \
        if (REPO / "artifacts" / "deploy" / "builds.jsonl").exists() else []
    froms = sum(1 for w, _ in instructions() if w == "FROM")  # podman counts each FROM as a step, never cached

    def kind(b: dict) -> str:  # what the layer cache held for this build (scripts/build-image.sh counts steps)
        if "steps" not in b:
            return "unknown"
        rebuilt = b["steps"] - b["cached_steps"] - froms
        return "cold" if b["cached_steps"] == 0 else "unchanged" if rebuilt <= 0 else "after_code_change"

    latest = {}
    for b in builds:
        latest[kind(b)] = b["build_s"]
    # podman-compose 1.0 also prints podman's version and its own exit code: its line names podman-compose(r)
    versions = {t: next(ln for ln in sh([t, "--version"], check=False).stdout.splitlines()
                        if ln.startswith(("podman-compose", f"{t} version"))).split()[2]
                for t in ("podman", "podman-compose", "buildah")}
    RESULT.update({
        "image_bytes": image["Size"],
        "image_layers": [x for x in layers if x["bytes"] > 1_000_000],
        "image_fills": fills,
        "build_s": {"cold": latest.get("cold"), "cached": latest.get("after_code_change"),
                    "unchanged": latest.get("unchanged"),
                    "cached_means": "a rebuild after an edit of service/ (the dependency layers from the cache)",
                    "builds": builds[-6:]},
        "command": "make image && make test-deploy",
        "machine": {"cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                 if ln.startswith("model name")), platform.processor()),
                    "cores": os.cpu_count(), "kernel": platform.release(), **versions,
                    # other jobs on the machine move every timing above: their load, over the last 1, 5, 15 minutes
                    "load_average_at_end": [round(x, 1) for x in os.getloadavg()]},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    OUT.write_text(json.dumps(RESULT, indent=2) + "\n")
    assert RESULT["image_bytes"] <= 1e9
