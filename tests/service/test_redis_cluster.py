"""The service over a real Redis Cluster (CROSSPROBE_REDIS_CLUSTER=1; tests/indexer/conftest.py redis_cluster):
the same index built into the cluster answers every search exactly as on one Redis; a master paused during a
stream of searches (SIGSTOP; its replica promoted after cluster-node-timeout) degrades searches briefly, never
a 500, and they come back reranked by themselves."""
from __future__ import annotations

import threading
import time

from benchmarks.support.local_cluster import LocalCluster
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.redis_conn import connect
from crossprobe.service.server import wait_ready
from tests.indexer.conftest import redis_cluster  # noqa: F401 (fixture)
from tests.service.conftest import Built, build_index, service_settings

QUERIES = ["a red square", "a dark picture", "green and blue", "stripes"]


def _cluster_built(url: str, gallery, models_dir, ckpt, bert, root) -> Built:
    from crossprobe.indexer import open_index

    ixs = IndexerSettings(redis_url=url, redis_cluster=True, index_root=root / "indexes", models_dir=models_dir,
                        batch_size=8, threads=2, progress=False)
    r = connect(ixs)
    r.flushall()
    r.close()
    version = build_index(ixs, gallery, ckpt, bert)
    return Built(ixs, gallery, version, list(open_index("photos", None, ixs).ids))


def _client(b: Built, ckpt, artifacts, **over):
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app

    return TestClient(create_app(service_settings(b, ckpt, artifacts, redis_cluster=b.ixs.redis_cluster, **over)))


def test_search_on_the_cluster_answers_as_on_one_redis(built, redis_cluster, models_dir, svc_ckpt,  # noqa: F811
                                                       artifacts, bert, tmp_path_factory):
    cb = _cluster_built(redis_cluster.url, built.gallery, models_dir, svc_ckpt, bert,
                        tmp_path_factory.mktemp("cluster-index"))
    assert sorted(cb.ids) == sorted(built.ids)
    # one after the other: two apps starting at once would both quantize the int8 query tower into the same dir
    with _client(built, svc_ckpt, artifacts) as one:
        wait_ready(one)
        with _client(cb, svc_ckpt, artifacts) as clu:
            wait_ready(clu)
            _same_answers(one, clu, built.ids[3])


def _same_answers(one, clu, item: str) -> None:
    """Every search (3 rerank modes x 4 queries) and an item: identical ids, scores and metadata."""
    assert clu.get("/readyz").json()["feature_store"]["up"] is True
    for q in QUERIES:
        for mode in ("cp", "temde", "none"):
            body = {"query": q, "k": 5, "rerank": mode}
            a, b = one.post("/v1/search", json=body), clu.post("/v1/search", json=body)
            assert a.status_code == b.status_code == 200, (a.text, b.text)
            ra, rb = a.json(), b.json()
            assert not ra["degraded"] and not rb["degraded"], rb
            assert [h["id"] for h in ra["results"]] == [h["id"] for h in rb["results"]]
            assert [h["scores"] for h in ra["results"]] == [h["scores"] for h in rb["results"]]
            assert [_less_added(h["metadata"]) for h in ra["results"]] == \
                [_less_added(h["metadata"]) for h in rb["results"]]
    a, b = one.get(f"/v1/items/{item}").json(), clu.get(f"/v1/items/{item}").json()
    a["metadata"], b["metadata"] = _less_added(a["metadata"]), _less_added(b["metadata"])
    assert a.pop("index")["version"] != b.pop("index")["version"] and a == b  # two builds, the same item


def _less_added(meta: dict) -> dict:
    """An item's metadata less "added" (the time each build wrote it: the one thing two builds differ in)."""
    return {k: v for k, v in meta.items() if k != "added"}


def test_a_master_failover_during_a_search_stream(built, models_dir, svc_ckpt, artifacts, bert, tmp_path_factory):
    """Pause (SIGSTOP) the master holding most of the index's slots while searches run back to back."""
    with LocalCluster(node_timeout_ms=1000) as cluster:
        cb = _cluster_built(cluster.url, built.gallery, models_dir, svc_ckpt, bert,
                            tmp_path_factory.mktemp("failover-index"))
        with _client(cb, svc_ckpt, artifacts) as c:
            wait_ready(c)
            from redis.crc import key_slot

            from crossprobe.indexer import open_index

            rd = open_index("photos", None, cb.ixs)
            owners = [cluster.master_of_slot(key_slot(rd.keys.feat(i).encode())).port for i in rd.ids]
            victim = next(n for n in cluster.nodes if n.port == max(set(owners), key=owners.count))
            replica = cluster.replica_of(victim)
            log: list[tuple[float, float, int, bool, str]] = []  # start, end, status, degraded, route
            paused_at: list[float] = []

            def pause_later():
                time.sleep(1.0)
                paused_at.append(time.monotonic())
                cluster.pause(victim)

            t = threading.Thread(target=pause_later)
            t.start()
            t0 = time.monotonic()
            recovered_at = None
            try:
                while time.monotonic() - t0 < 30:
                    s = time.monotonic()
                    r = c.post("/v1/search", json={"query": QUERIES[len(log) % 4], "k": 3, "rerank": "cp"})
                    e = time.monotonic()
                    assert r.status_code == 200, r.text
                    deg = r.json()["degraded"]
                    log.append((s, e, 200, deg, "search"))
                    if len(log) % 5 == 0:  # items need Redis: 200 or 503 feature_store_unavailable, never 500
                        ri = c.get(f"/v1/items/{cb.ids[0]}")
                        assert ri.status_code in (200, 503), ri.text
                        if ri.status_code == 503:
                            assert ri.json()["error"]["code"] == "feature_store_unavailable"
                    if paused_at and not deg and s > paused_at[0] and any(x[3] for x in log):
                        recovered_at = recovered_at or e
                        if e - recovered_at > 1.0:  # reranked again for a second
                            break
                    time.sleep(0.01)
            finally:
                t.join()
                cluster.resume(victim)
            assert paused_at and recovered_at is not None, "searches never came back reranked within 30 s"
            p = paused_at[0]
            before = [x for x in log if x[1] < p]
            degraded = [x for x in log if x[3]]
            assert before and not any(x[3] for x in before)  # nothing degraded before the pause
            assert degraded and all(x[1] >= p for x in degraded)
            assert max(x[1] - x[0] for x in log) < 1.5  # no search waited for the failover
            window = max(x[1] for x in degraded) - p
            assert window < 10, window  # node timeout 1 s + election + the breaker's cool-down
            assert not any(x[3] for x in log if x[0] > recovered_at)  # once back, it stays back
            assert cluster.roles()[replica.port] == "master"
            # the old master rejoins as a replica; searches stay reranked
            deadline = time.monotonic() + 20
            while cluster.roles().get(victim.port) != "slave":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            r = c.post("/v1/search", json={"query": "a red square", "k": 3, "rerank": "cp"})
            assert r.status_code == 200 and not r.json()["degraded"]
            print(f"failover: {len(degraded)} of {len(log)} searches degraded, from the pause to the last degraded "
                  f"answer {window:.2f} s, to the first reranked one {recovered_at - p:.2f} s")
