"""`make test-deploy`: the committed docker-compose.yml, run unchanged under podman-compose, checked against its
running containers, and measured (docs/research/results/deploy.json, docs/deployment.md).

It runs the README's Docker quick start: `make image` (done by the make target), `up -d`, the `indexer` job over
a folder of sample photos mounted as $IMAGES. The stack (tests/deploy/stack.py) is the two api replicas behind the
proxy, Redis, Prometheus and the Pushgateway; Grafana is left out of `up` (its image has no package here; its
dashboard's queries are run below against the stack's Prometheus). Redis, Prometheus, the Pushgateway and HAProxy
are stand-ins built from Debian's packages under the compose file's image names (scripts/container-setup.sh).
podman-compose 1.0 (Debian's) has no --profile: it runs a profile's service by its name (`run --rm indexer`), and
it ignores depends_on's health conditions (podman runs no health checks without systemd; `podman healthcheck run`
runs the image's check on demand below). Searches go through the proxy (127.0.0.1:8000) unless a check is about
one container: then it reads that replica on its own port. tests/deploy/test_replicas.py kills a replica under load.

The checks run in file order over one stack (module scope); each records what it saw in RESULT, which the last
test writes out. The same photos are indexed and served on the host (this venv, `crossprobe serve`) to compare
answers and latency in the same run. Every process and container started here is stopped here."""
from __future__ import annotations

import json
import os
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
from tests.deploy.stack import (API, PROJECT, PROM, REPLICAS, SERVICES, alive, compose, down, machine, name,
                                not_running,
                                proxy_servers, readyz, running_stack, search, serve_pids_code, sh, started_at, up,
                                version, wait)
from tests.deploy.test_dockerfile import instructions

pytestmark = pytest.mark.deploy

HOST_PORT = 8790
OUT = REPO / "docs" / "research" / "results" / "deploy.json"
RESULT: dict = {}
LOAD_S = 60
API1 = REPLICAS["api"]  # the replica `api` alone (its own port): what a check of that one container reads


def api_rss() -> float:
    """VmRSS of the api container's `crossprobe serve` process."""
    code = serve_pids_code + ("for pid in serve_pids():\n"
                              "    status = open(f'/proc/{pid}/status').read().splitlines()\n"
                              "    print(next(ln.split()[1] for ln in status if ln.startswith('VmRSS')))")
    out = sh(["podman", "exec", name("api"), "python", "-c", code]).stdout.split()
    assert out, "no crossprobe serve process in the api container"
    return max(float(x) for x in out) * 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from running_stack(tmp_path_factory, "deploy")


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
    """Through the proxy: with no replica ready (no index yet) it passes requests to a live one, so the client reads
    the service's own 503 not_ready, not HAProxy's page; each replica says the same on its own port."""
    r = wait("the api's /readyz", lambda: alive("api") and (x := readyz(API1)).status_code in (200, 503)
             and "no index" in x.text and x, 120)
    RESULT["api_ready_s"] = {"cold": round(time.monotonic() - stack["t0"], 2),
                             "cold_means": "`up -d` of the stack (no index yet) until /readyz answers 'no index "
                                           "served yet' with the models loaded"}
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    for base in (API, REPLICAS["api-2"]):
        x = wait(f"/readyz at {base}", lambda b=base: (x := readyz(b)).status_code == 503 and "no index" in x.text
                 and x, 120)
        assert x.json()["error"]["code"] == "not_ready", x.text
    # podman runs HEALTHCHECKs from systemd timers, absent here: run the image's own check on demand
    for replica in REPLICAS:
        assert sh(["podman", "healthcheck", "run", name(replica)], check=False).returncode == 0, replica
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
    RESULT["confinement"] = {"measured": "this run", "containers": confined}
    want_mb = {"redis": 2048, "api": 4096, "api-2": 4096, "proxy": 256, "prometheus": 1024, "pushgateway": 1024}
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
    served = wait("both replicas to serve the new index", lambda: all(version(b) for b in REPLICAS.values())
                  and {version(b) for b in REPLICAS.values()}, 60)
    RESULT["indexer_job"]["served_after_s"] = round(time.monotonic() - t, 2)
    assert len(served) == 1, served  # the same version on both
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

    def item(i: str) -> set[int]:  # its status on every replica
        return {httpx.get(f"{b}/v1/items/{i}", params={"index": "photos"}, timeout=5).status_code
                for b in REPLICAS.values()}

    wait("the watcher to start (its /metrics)", lambda: sh(["podman", "exec", name("watcher"), "python", "-c",
         "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9109/metrics', timeout=2)"],
         check=False, timeout=30).returncode == 0, 180, step=1)
    new = stack["gallery"] / "coffee-again.jpg"
    shutil.copyfile(stack["gallery"] / "coffee.jpg", new)
    new.chmod(0o644)
    t = time.monotonic()
    wait("the copied photo served by both replicas", lambda: item(new.name) == {200}, 60)
    added_s = time.monotonic() - t
    new.unlink()
    t = time.monotonic()
    wait("the deleted photo gone from both replicas", lambda: item(new.name) == {404}, 60)
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
        up = {f'{t["labels"]["job"]} {t["labels"]["instance"]}': t["health"] for t in active}
        return up if up and all(v == "up" for v in up.values()) else None

    up = wait("every target up", targets, 90, step=1)
    RESULT["prometheus_targets_up"] = up
    # every replica, by its service name (deploy/prometheus/prometheus.yml)
    assert set(up) == {"crossprobe-api api:8000", "crossprobe-api api-2:8000", "pushgateway pushgateway:9091",
                       "crossprobe-watch watcher:9109"}, up
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
    before = version(API1)
    p = compose("run", "--rm", "reindex", env=stack["env"], timeout=600)
    after = wait("the reindexed version served by both replicas",
                 lambda: (v := {version(b) for b in REPLICAS.values()}) != {before} and len(v) == 1 and v.pop(), 60)
    RESULT["reindex_job"] = {"exit": p.returncode, "version_before": before, "version_after": after}
    assert search("a cup of coffee", k=1).json()["results"][0]["id"].startswith("coffee.")


# ---- restarts, SIGTERM --------------------------------------------------------------------------------------
def test_a_restarted_api_keeps_serving_from_the_volumes(stack):
    want = search("a cup of coffee", k=3).json()["results"]
    t = time.monotonic()
    sh(["podman", "restart", "-t", "30", name("api")], timeout=120)
    wait("the restarted api ready", lambda: readyz(API1).status_code == 200, 60, step=0.1)
    RESULT["api_ready_s"]["warm"] = round(time.monotonic() - t, 2)
    RESULT["api_ready_s"]["warm_means"] = "`podman restart` of the api (index on the volumes) until /readyz is 200"
    # the container may come back on another address: the proxy looks its name up again and checks it back in
    wait("the proxy to route to the restarted api", lambda: proxy_servers()["api"]["status"] == "UP", 30, step=0.1)
    RESULT["api_ready_s"]["proxy_up_again"] = round(time.monotonic() - t, 2)
    got = search("a cup of coffee", k=3, base=API1).json()["results"]
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
    wait("the api back", lambda: readyz(API1).status_code == 200, 60)
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


# ---- backup and restore through the compose volumes (docs/operations.md, "Backups") ------------------------
def test_backup_while_the_watcher_runs_then_restore_into_an_emptied_index(stack):
    """`crossprobe index backup` in the image (the watcher following $IMAGES meanwhile), the index dropped from
    Redis and the volume, `index restore` of the archive: both replicas answer as before, ids and scores. The
    archive goes to the indexes volume (outside any index: `_backups` is no index name): podman-compose 1.0's `run`
    passes no `-v` on, and returns 0 whatever the command did, so each command's own line is checked."""
    queries = list(EXPECTED)[:6]
    before = {q: [(h["id"], h["score"]) for h in search(q, k=3).json()["results"]] for q in queries}
    archive = "/data/indexes/_backups/photos.tar"
    t = time.monotonic()
    p = compose("run", "--rm", "indexer", "crossprobe", "index", "backup", "--all", "--to", archive.rsplit("/", 1)[0],
                env=stack["env"], timeout=300, merged=True)  # --all: one <name>.tar per index, the folder made
    backup_s = time.monotonic() - t
    said = re.search(r"backed up photos/\S+: [^\r\n]*", p.stdout)
    assert said, p.stdout[-3000:]
    assert not not_running(["watcher"]), "the watcher ran through the backup"
    sh(["podman", "stop", "-t", "60", name("watcher")], timeout=120)  # else it builds the dropped index again
    p = compose("run", "--rm", "indexer", "crossprobe", "index", "drop", "photos", "--yes", env=stack["env"],
                timeout=300, merged=True)
    # no index left: 404 index_not_found, or 503 not_ready once the replica serves none at all
    gone = ("index_not_found", "not_ready")
    wait("the dropped index gone from both replicas",
         lambda: all(search("a cat", base=b).json().get("error", {}).get("code") in gone for b in REPLICAS.values()), 60)
    t = time.monotonic()
    p = compose("run", "--rm", "indexer", "crossprobe", "index", "restore", archive, env=stack["env"], timeout=300,
                merged=True)
    restore_s = time.monotonic() - t
    assert re.search(r"restored photos/\S+: [^\r\n]*now active", p.stdout), p.stdout[-3000:]
    wait("the restored index served by both replicas",
         lambda: all(search("a cat", base=b).status_code == 200 for b in REPLICAS.values()), 60)
    after = {b: {q: [(h["id"], h["score"]) for h in search(q, base=base, k=3).json()["results"]] for q in queries}
             for b, base in REPLICAS.items()}
    RESULT["backup_restore"] = {"backup_said": said.group(0), "backup_s": round(backup_s, 2),
                                "restore_s": round(restore_s, 2),
                                "means": "`podman-compose run --rm indexer crossprobe index backup|restore` wall "
                                         "time, container start included; the index dropped in between, the watcher "
                                         "running during the backup",
                                "same_answers": {b: a == before for b, a in after.items()}}
    assert all(a == before for a in after.values()), (before, after)


# ---- measured: memory, latency against the host, the image -------------------------------------------------
def test_measure_memory_and_latency_against_the_host(stack, host_service):
    queries = list(EXPECTED)
    for q in queries:  # warm both
        search(q, base=API1, k=10), search(q, base=host_service, k=10)
    idle = api_rss()

    def client(i):
        n, end = 0, time.monotonic() + LOAD_S
        with httpx.Client(timeout=10) as c:
            while time.monotonic() < end:
                assert c.post(f"{API1}/v1/search", json={"query": queries[(i + n) % len(queries)], "index": "photos",
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
                               "load": f"{LOAD_S} s, 4 concurrent clients, {sent} searches (k 10, the server's default reranker)",
                               "at": "the api replica's own port (no proxy)"}

    lat = {"container": [], "host": []}
    with httpx.Client(timeout=10) as c:
        for rep in range(20):  # alternated one by one, so both sides see the same machine load
            for q in queries:
                for side, base in (("container", API1), ("host", host_service)):
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
    RESULT.update({
        "image_bytes": image["Size"],
        "image_layers": [x for x in layers if x["bytes"] > 1_000_000],
        "image_fills": fills,
        "build_s": {"cold": latest.get("cold"), "cached": latest.get("after_code_change"),
                    "unchanged": latest.get("unchanged"),
                    "cached_means": "a rebuild after an edit of service/ (the dependency layers from the cache)",
                    "builds": builds[-6:]},
        "command": "make image && make test-deploy",
        "machine": machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    OUT.write_text(json.dumps(RESULT, indent=2) + "\n")
    assert RESULT["image_bytes"] <= 1e9
