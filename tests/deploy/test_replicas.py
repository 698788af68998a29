"""`make test-deploy`, the replicas: docker-compose.yml's two api replicas behind its proxy (HAProxy,
deploy/haproxy/haproxy.cfg), run under podman-compose on a stack of this module's own (tests/deploy/stack.py), one
replica killed under load (docs/research/results/replicas.json, docs/deployment.md "Replicas behind the proxy").

The kill run: 4 client threads search through the proxy (POST /v1/search at 127.0.0.1:8000) while api-2's
`crossprobe serve` process gets SIGKILL, as the kernel's OOM killer would send it. Its container then exits and
podman's restart policy (the compose file's `restart: unless-stopped`) starts it again; `podman kill` would not
do: podman counts it as a stop asked for, and restarts nothing. Every request the clients sent must be answered 200
(a 429 counts as failed too: the clients stay below the queue, so one would be the proxy piling a dead replica's
requests onto the other). A fifth client searches the surviving replica on its own port, past the proxy: the
control, which tells a failure of the host's networking from one of the proxy. The replica has rejoined when the
proxy has checked it back in and has had its answer to a search (HAProxy's stats; the replica's own request
counter, from 0 after the restart, agrees). Afterwards both replicas answer the same searches identically, from
the same index version, and a version the indexer job builds then reaches both.

The checks run in file order over one stack (module scope); each records what it saw in RESULT, which the last
test writes out. Every container started here is stopped here."""
from __future__ import annotations

import json
import shutil
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import httpx
import pytest

from crossprobe.models.demo import EXPECTED
from tests.deploy.conftest import REPO
from tests.deploy.stack import (API, REPLICAS, compose, machine, name, proxy_servers, readyz, running_stack,
                                searches_served, serve_pids_code, sh, version, wait)

pytestmark = pytest.mark.deploy

OUT = REPO / "docs" / "research" / "results" / "replicas.json"
RESULT: dict = {}
CLIENTS = 4
LOAD_S = 40  # at least; longer when the killed replica takes longer to rejoin (AFTER_REJOIN_S more, MAX_LOAD_S at most)
KILL_AT_S = 8
AFTER_REJOIN_S = 5
MAX_LOAD_S = 150
KILLED = "api-2"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from running_stack(tmp_path_factory, "replicas")


def served_versions() -> dict[str, str | None]:
    return {r: version(base) for r, base in REPLICAS.items()}


def restart_count(service: str) -> int:
    return int(sh(["podman", "inspect", "-f", "{{.RestartCount}}", name(service)]).stdout.strip())


def test_both_replicas_serve_the_index_through_the_proxy(stack):
    p = compose("run", "--rm", "indexer", env=stack["env"], timeout=600)
    assert "items active" in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    versions = wait("both replicas to serve the index", lambda: all((v := served_versions()).values()) and v, 90)
    assert len(set(versions.values())) == 1, versions
    wait("the proxy to check both replicas in", lambda: {s["status"] for s in proxy_servers().values()} == {"UP"},
         30)
    assert set(proxy_servers()) == set(REPLICAS)  # the proxy's servers are the compose file's replicas
    before = {r: searches_served(b) for r, b in REPLICAS.items()}
    for i in range(20):
        assert httpx.post(f"{API}/v1/search", json={"query": f"a cat {i}", "index": "photos"}, timeout=10) \
            .status_code == 200
    spread = {r: searches_served(b) - before[r] for r, b in REPLICAS.items()}
    RESULT["spread_of_20_searches"] = spread
    assert all(n > 0 for n in spread.values()) and sum(spread.values()) == 20, spread  # both get searches


def test_a_replica_killed_under_load_costs_no_request(stack):
    queries = list(EXPECTED)
    stop = threading.Event()
    outcomes: list[tuple[float, int | str, float]] = []  # (sent at, status or exception name, seconds)
    lock = threading.Lock()

    direct: list[tuple[float, int | str, float]] = []  # the control: one client on the surviving replica's own port

    def client(i: int, base: str = API, into: list = outcomes) -> None:
        n = 0
        with httpx.Client(timeout=15) as c:
            while not stop.is_set():
                t = time.monotonic()
                try:
                    got: int | str = c.post(f"{base}/v1/search", json={"query": queries[(i + n) % len(queries)],
                                                                        "index": "photos", "k": 10}).status_code
                except httpx.HTTPError as e:
                    got = f"{type(e).__name__}: {e}"
                with lock:
                    into.append((t, got, time.monotonic() - t))
                n += 1

    proxy_before = proxy_servers()
    answered_before = 0
    restarts_before = restart_count(KILLED)
    seen: dict[str, float] = {}
    with ThreadPoolExecutor(CLIENTS + 1) as pool:
        t0 = time.monotonic()
        futs = [pool.submit(client, i) for i in range(CLIENTS)]
        futs.append(pool.submit(client, 0, REPLICAS["api"], direct))
        try:
            time.sleep(KILL_AT_S)
            # SIGKILL to the replica's server process, from inside its container (no root needed on the host)
            kill = sh(["podman", "exec", name(KILLED), "python", "-c", serve_pids_code +
                       "import signal\nfor pid in serve_pids(): os.kill(pid, signal.SIGKILL)"], check=False, timeout=60)
            t_kill = time.monotonic()
            base = REPLICAS[KILLED]
            while time.monotonic() - t_kill < MAX_LOAD_S - KILL_AT_S:
                now = time.monotonic() - t_kill
                try:
                    mine = proxy_servers()[KILLED]  # the proxy's view of the killed replica
                    if "proxy_down" not in seen and mine["status"] != "UP":
                        seen["proxy_down"], answered_before = now, int(mine["hrsp_2xx"] or 0)
                    if "restarted" not in seen and restart_count(KILLED) > restarts_before:
                        seen["restarted"] = now
                    if "restarted" in seen and "ready" not in seen and readyz(base).status_code == 200:
                        seen["ready"] = now  # the new process answers on its own port (the old one is dead)
                    if "proxy_down" in seen and "proxy_up" not in seen and mine["status"] == "UP":
                        seen["proxy_up"] = now
                    # the proxy has passed it a search since and had its answer (health checks are not counted)
                    if "proxy_up" in seen and "routed" not in seen and int(mine["hrsp_2xx"] or 0) > answered_before:
                        seen["routed"] = now
                except (httpx.HTTPError, OSError):
                    pass  # the replica or the proxy's stats page between two states: read again
                if "routed" in seen and "proxy_up" in seen and time.monotonic() - t0 >= max(
                        LOAD_S, KILL_AT_S + seen["routed"] + AFTER_REJOIN_S):
                    break
                time.sleep(0.1)
        finally:
            stop.set()
            for f in futs:
                f.result()
        load_s = time.monotonic() - t0
    proxy_after = proxy_servers()
    # and the replica's own count agrees: the restarted process (from 0) has answered searches, all through the proxy
    routed_own = searches_served(REPLICAS[KILLED])

    statuses = Counter(str(s) for _, s, _ in outcomes)
    failed = [(round(t - t_kill, 2), s) for t, s, _ in outcomes if s != 200]
    lat = sorted(d for _, _, d in outcomes)
    near = [d for t, _, d in outcomes if 0 <= t - t_kill <= 5]  # sent in the 5 s after the kill

    def counter(rows: dict, col: str) -> int:
        return sum(int(r[col] or 0) for r in rows.values())

    RESULT["kill_run"] = {
        "requests": len(outcomes), "failed": len(failed), "statuses": dict(statuses), "failed_at_s": failed[:20],
        "control_direct_to_api": {"requests": len(direct), "failed_at_s": [(round(t - t_kill, 2), s)
                                                                          for t, s, _ in direct if s != 200]},
        "rejoin_s": round(seen["routed"], 2) if "routed" in seen else None,
        "rejoin_means": "from the SIGKILL until the proxy, having checked the restarted replica back in, has passed "
                        "it a search and had its 200 (HAProxy's stats: status UP, then hrsp_2xx rising)",
        "searches_the_restarted_replica_answered": routed_own,
        "timeline_s": {k: round(v, 2) for k, v in sorted(seen.items(), key=lambda kv: kv[1])},
        "killed": KILLED, "kill": "SIGKILL to its crossprobe serve process (podman exec, os.kill)",
        "kill_exec_exit": kill.returncode, "restarted_by": "podman's restart policy (restart: unless-stopped)",
        "proxy_retries": counter(proxy_after, "wretr") - counter(proxy_before, "wretr"),
        "proxy_redispatches": counter(proxy_after, "wredis") - counter(proxy_before, "wredis"),
        # HAProxy's counts, over the run, of what it could not hide: connection and response errors, sessions a
        # client or a server aborted (its stats columns econ, eresp, cli_abrt, srv_abrt)
        "proxy_errors": {c: counter(proxy_after, c) - counter(proxy_before, c)
                         for c in ("econ", "eresp", "cli_abrt", "srv_abrt")},
        "latency_ms": {"p50": round(statistics.median(lat) * 1000, 1),
                       "p99": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 1),
                       "max": round(lat[-1] * 1000, 1),
                       "max_sent_within_5s_of_the_kill": round(max(near) * 1000, 1) if near else None},
        "load": {"clients": CLIENTS, "seconds": round(load_s, 1), "kill_at_s": KILL_AT_S,
                 "request": "POST /v1/search through the proxy, k 10, make demo's 16 queries in turn, the server's "
                            "default mode and reranker; each client one request at a time (keep-alive)",
                 "ends": f"{LOAD_S} s at least, and {AFTER_REJOIN_S} s after the rejoin"},
    }
    run = RESULT["kill_run"]
    assert "restarted" in seen, (f"{KILLED} was not restarted by its restart policy within {MAX_LOAD_S} s "
                                 f"(podman inspect RestartCount stayed {restarts_before}); kill: {kill.stdout}{kill.stderr}")
    assert "proxy_down" in seen, f"the proxy never took {KILLED} out: {proxy_servers()[KILLED]}"
    assert run["rejoin_s"] is not None, f"{KILLED} did not rejoin: {run['timeline_s']}, proxy: {proxy_servers()[KILLED]}"
    assert routed_own > 0, f"the restarted {KILLED} counts no search of its own, yet the proxy says it answered some"
    assert not failed, (f"{len(failed)} of {len(outcomes)} requests failed at the client (s after the kill, status): "
                        f"{failed[:20]}\n{json.dumps(run, indent=1)}")


def test_both_replicas_answer_identically_from_the_same_version(stack):
    """Each replica on its own port: the same ranked photos with the same scores for the same search, after the kill
    run (texts searched in the run are in each replica's query cache, computed in whatever batch they came in:
    these are new texts, encoded alone by each)."""
    versions = served_versions()
    assert len(set(versions.values())) == 1 and None not in versions.values(), versions
    same, worst = 0, 0.0
    for q in EXPECTED:
        q = f"a photo of {q}"
        got = {}
        for r, base in REPLICAS.items():
            a = httpx.post(f"{base}/v1/search", json={"query": q, "index": "photos", "k": 10}, timeout=10)
            assert a.status_code == 200, a.text
            got[r] = a.json()["results"]
        a, b = got.values()
        assert [x["id"] for x in a] == [x["id"] for x in b], (q, a, b)
        assert [{k: v for k, v in x.items() if k != "score"} for x in a] == \
               [{k: v for k, v in x.items() if k != "score"} for x in b], q
        worst = max([worst, *(abs(x["score"] - y["score"]) for x, y in zip(a, b))])
        same += a == b
    RESULT["identical_answers"] = {"queries": len(EXPECTED), "same_ids_in_order": len(EXPECTED), "identical": same,
                                   "max_score_difference": worst, "version": next(iter(versions.values())),
                                   "queries_are": "'a photo of ' + each of make demo's 16, k 10, on each replica's port"}
    assert worst <= 1e-6, worst


def test_a_new_index_version_reaches_both_replicas(stack):
    """A photo added to $IMAGES and the indexer job run again: a new version, which each replica picks up at its
    next poll of Redis, with no restart; both then serve the new photo and agree on the version."""
    before = served_versions()
    new = stack["gallery"] / "coffee-again.jpg"
    shutil.copyfile(stack["gallery"] / "coffee.jpg", new)
    new.chmod(0o644)
    p = compose("run", "--rm", "indexer", env=stack["env"], timeout=600)
    t = time.monotonic()
    served_at = {}
    while len(served_at) < len(REPLICAS) and time.monotonic() - t < 60:
        for r, base in REPLICAS.items():
            if r not in served_at and version(base) not in (None, before[r]):
                served_at[r] = round(time.monotonic() - t, 2)
        time.sleep(0.1)
    after = served_versions()
    RESULT["new_version"] = {"before": before, "after": after, "served_after_s": served_at,
                             "indexer_exit": p.returncode}
    assert set(served_at) == set(REPLICAS), (f"the new version did not reach every replica in 60 s: {after} "
                                             f"(before {before})\n{(p.stdout + p.stderr)[-2000:]}")
    assert len(set(after.values())) == 1, after
    for base in REPLICAS.values():
        item = httpx.get(f"{base}/v1/items/{new.name}", params={"index": "photos"}, timeout=5)
        assert item.status_code == 200, (base, item.text)


def test_write_results(stack):
    run = RESULT["kill_run"]
    OUT.write_text(json.dumps({
        "requests": run["requests"], "failed": run["failed"], "rejoin_s": run["rejoin_s"], "replicas": len(REPLICAS),
        **RESULT,
        "proxy": "HAProxy 2.6 (deploy/haproxy/haproxy.cfg; the stand-in: Debian's haproxy "
                 + sh(["podman", "run", "--rm", "docker.io/library/haproxy:2.6", "haproxy", "-v"]).stdout.split()[2]
                 + ")",
        "command": "make image && make test-deploy",
        "machine": machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }, indent=2) + "\n")
    # every check above recorded its part (a run of some of them leaves a file that says so, and fails here)
    assert {"spread_of_20_searches", "kill_run", "identical_answers", "new_version"} <= set(RESULT), set(RESULT)
