"""The feature cache on a real Redis Cluster (3 masters + 3 replicas, tests/indexer/conftest.py redis_cluster):
build / add / delete / reindex / gc work there and write the same values as on one Redis; a shortlist fetch is
one pipeline per master; a paused master fails a fetch within its timeout instead of hanging it, and the
promoted replica serves the next one. Versions with untagged keys (built before the hash tag) stay readable
on one Redis and move to the tagged layout by reindex."""
import os
import time

import numpy as np
import pytest
import redis
from redis.crc import key_slot

from crossprobe.indexer import add, build, delete, open_index, reindex
from benchmarks.support.local_cluster import LocalCluster
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import KeyLayout, Store
from tests.indexer.conftest import make_images, without_added

QUIET = dict(log=lambda *_: None)


def _values(rd) -> dict[str, tuple[bytes, bytes]]:
    feats = rd.store.fetch([rd.keys.feat(i) for i in rd.ids])
    metas = [without_added(m) for m in rd.store.fetch([rd.keys.meta(i) for i in rd.ids])]  # "added": each run's time
    return dict(zip(rd.ids, zip(feats, metas)))


def _key_ids(rd) -> tuple[set[str], set[str]]:
    ids = {"f": set(), "m": set()}
    for k in rd.store.r.scan_iter(match=rd.keys.base + "*", count=1000):  # every master's keys
        kind, item = rd.keys.parse(k)
        ids[kind].add(item)
    return ids["f"], ids["m"]


def _masters(cluster: LocalCluster):
    return [n for n in cluster.nodes if cluster.roles().get(n.port) == "master"]


def test_index_lifecycle_on_the_cluster_matches_one_redis(cluster_settings, redis_cluster, settings, gallery, ckpt,
                                                          bert, tmp_path):
    cs = cluster_settings
    v1 = build("photos", images=gallery, settings=cs, ckpt=ckpt, bert=bert, **QUIET).version
    build("photos", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **QUIET)
    rc, rs = open_index("photos", None, cs), open_index("photos", None, settings)
    assert rc.store.cluster and not rs.store.cluster
    assert rc.manifest["keys"]["buckets"] == 64 and rc.keys.buckets == 64
    assert rc.ids == rs.ids and _values(rc) == _values(rs)  # byte-identical features and metadata
    q = rs.index.reconstruct_n(0, 3)
    assert rc.search(q, 5)[0] == rs.search(q, 5)[0]
    # every item's two keys carry the tag {photos:<bucket>}: one slot per bucket, and the slots spread over masters
    for i in rc.ids:
        tag = "{photos:%d}" % rc.keys.bucket(i)
        assert key_slot(rc.keys.feat(i).encode()) == key_slot(rc.keys.meta(i).encode()) == key_slot(tag.encode())
    per_master = [n.client().dbsize() for n in _masters(redis_cluster)]
    assert len(per_master) == 3 and all(n > 0 for n in per_master), per_master

    # add (server-side COPY: base and new keys share a slot), delete, reindex, gc: FAISS and the cluster agree
    new = tmp_path / "new"
    paths = make_images(new, 3, seed=5, prefix="new")
    ra = add("photos", manifest=_manifest(tmp_path, paths), settings=cs, ckpt=ckpt, bert=bert, **QUIET)
    assert ra.extra["added"] == 3
    rd = delete("photos", ["img_000.jpg", f"new/{paths[2].name}"], settings=cs, **QUIET)
    rr = reindex("photos", settings=cs, ckpt=ckpt, bert=bert, **QUIET)
    for res in (ra, rd, rr):
        r = open_index("photos", None, cs, version=res.version)
        assert (set(r.ids), set(r.ids)) == _key_ids(r)
    final = open_index("photos", None, cs)
    assert final.version == rr.version and len(final) == 12 + 3 - 2
    removed = dict(Store(cs, connect(cs)).gc("photos"))
    assert set(removed) == {v1, ra.version, rd.version} and all(n > 0 for n in removed.values())
    total = sum(n.client().dbsize() for n in _masters(redis_cluster))
    assert total == 2 * len(final) + 2  # the active version's values + `active` + `versions`
    assert final.features(final.ids)["p_v"].shape[0] == len(final)


def _manifest(tmp_path, paths):
    import json

    p = tmp_path / "add.jsonl"
    p.write_text("".join(json.dumps({"id": f"new/{q.name}", "uri": str(q)}) + "\n" for q in paths))
    return p


def _write_values(store: Store, keys: KeyLayout, n: int, size: int = 2624) -> list[str]:
    ids = [f"item/{i:05d}.jpg" for i in range(n)]
    with store.r.pipeline(transaction=False) as p:
        for i in ids:
            p.set(keys.feat(i), os.urandom(size))
        p.execute()
    return ids


def test_a_shortlist_is_one_pipeline_per_master(cluster_settings, redis_cluster, monkeypatch):
    store = Store(cluster_settings, connect(cluster_settings))
    keys = KeyLayout("crossprobe", "fetch", "v1", 64)
    ids = _write_values(store, keys, 500)
    shortlist = [ids[i] for i in np.random.default_rng(0).choice(len(ids), 100, replace=False)]
    want = store.mget([keys.feat(i) for i in shortlist])  # redis-py's mget_nonatomic
    masters = _masters(redis_cluster)
    for m in masters:
        m.client().config_resetstat()
    executes = []
    real = redis.connection.AbstractConnection.send_packed_command

    def counting(self, *a, **k):  # a spy on redis-py's connections: each packet sent is one round trip to a node
        executes.append(self.port)
        return real(self, *a, **k)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    got = store.fetch([keys.feat(i) for i in shortlist])
    monkeypatch.undo()
    assert got == want and all(v is not None for v in got)
    slots = {key_slot(keys.feat(i).encode()) for i in shortlist}
    assert len(slots) <= 64
    assert sorted(executes) == sorted(set(executes)) and len(executes) <= 3  # one round trip per master touched
    mgets = {m.port: int(m.client().info("commandstats").get("cmdstat_mget", {}).get("calls", 0)) for m in masters}
    assert sum(mgets.values()) == len(slots)  # one MGET per slot, no retries
    assert {p for p, n in mgets.items() if n} == set(executes)


def test_a_paused_master_fails_a_fetch_fast_and_the_promoted_replica_serves_the_next(models_dir, tmp_path):
    with LocalCluster(node_timeout_ms=1000) as cluster:
        # the service's timeouts (service/settings.py): 200 ms per call, one retry of a refused connection
        s = IndexerSettings(redis_url=cluster.url, redis_cluster=True, index_root=tmp_path, redis_socket_timeout_s=0.2,
                     redis_connect_timeout_s=0.2, redis_retries=1, redis_backoff_base_s=0.01, redis_backoff_cap_s=0.05)
        store = Store(s, connect(s))
        keys = KeyLayout("crossprobe", "fo", "v1", 64)
        ids = _write_values(store, keys, 100)
        want = store.fetch([keys.feat(i) for i in ids])
        victim = cluster.master_of_slot(key_slot(keys.feat(ids[0]).encode()))
        replica = cluster.replica_of(victim)
        cluster.pause(victim)
        paused_at = time.monotonic()
        t = time.perf_counter()
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            store.fetch([keys.feat(i) for i in ids])
        assert time.perf_counter() - t < 1.0  # one socket timeout + a slot table refresh, not the failover
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            store.ping()
        # cluster-node-timeout 1 s: the replica is promoted; the next fetches (each refreshing the table after a
        # failure) reach it
        deadline = time.monotonic() + 20
        while True:
            try:
                got = store.fetch([keys.feat(i) for i in ids])
                break
            except (redis.ConnectionError, redis.TimeoutError):
                assert time.monotonic() < deadline, "no fetch succeeded within 20 s of the pause"
                time.sleep(0.1)
        recovered_s = time.monotonic() - paused_at
        assert got == want
        assert cluster.roles()[replica.port] == "master"
        assert store.ping()
        cluster.resume(victim)  # the old master rejoins as a replica of the promoted one
        deadline = time.monotonic() + 20
        while cluster.roles().get(victim.port) != "slave":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert store.fetch([keys.feat(i) for i in ids]) == want
        assert recovered_s < 10, recovered_s


def test_untagged_keys_are_refused_on_a_cluster(cluster_settings, gallery, ckpt, bert):
    with pytest.raises(ValueError, match="KEY_BUCKETS=0"):
        build("flat", images=gallery, settings=cluster_settings.model_copy(update={"key_buckets": 0}), ckpt=ckpt,
              bert=bert, **QUIET)


def test_versions_with_untagged_keys_stay_readable_and_reindex_moves_them(settings, gallery, ckpt, bert, tmp_path):
    """key_buckets=0 writes exactly the layout of versions built before the hash tag: <...>:f:<id>, a manifest
    "keys" without buckets. Such a version is served, add keeps its layout (COPY), reindex moves it."""
    old = settings.model_copy(update={"key_buckets": 0})
    v0 = build("legacy", images=gallery, settings=old, ckpt=ckpt, bert=bert, **QUIET).version
    rd = open_index("legacy", None, settings)
    assert rd.manifest["keys"] == {"active": "crossprobe:legacy:active",
                                   "features": f"crossprobe:legacy:{v0}:f:{{id}}",
                                   "metadata": f"crossprobe:legacy:{v0}:m:{{id}}"}
    assert settings.key_buckets == 64 and rd.keys.buckets == 0
    assert rd.store.r.exists(f"crossprobe:legacy:{v0}:f:img_003.bmp") == 1
    feats = rd.features(rd.ids)
    paths = make_images(tmp_path / "more", 2, seed=9, prefix="more")
    va = add("legacy", manifest=_manifest(tmp_path, paths), settings=settings, ckpt=ckpt, bert=bert, **QUIET).version
    ra = open_index("legacy", None, settings)
    assert ra.version == va and ra.keys.buckets == 0  # add keeps its base's layout
    assert np.array_equal(ra.features(rd.ids)["p_v"], feats["p_v"])
    vr = reindex("legacy", settings=settings, ckpt=ckpt, bert=bert, **QUIET).version
    rr = open_index("legacy", None, settings)
    assert rr.version == vr and rr.keys.buckets == 64 and set(rr.ids) == set(ra.ids)
    assert np.allclose(rr.features(rd.ids)["p_v"], feats["p_v"])
    Store(settings, connect(settings)).gc("legacy")
    assert not list(rd.store.r.scan_iter(match=f"crossprobe:legacy:{v0}:*"))
