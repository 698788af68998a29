"""Redis as operators run it (issue 46): an ACL user with a password, TLS only, the server's CA in a file
(secure_redis.py: Debian's redis-server, certificates by trustme). Every way in (connect() for both roles, the
password file, mutual TLS, a Redis Cluster, the CLI's build, the watcher) works; each misconfiguration fails
within the role's budget with a message that says what to check; no message, repr or error output holds the
password."""
from __future__ import annotations

import time
import traceback
from urllib.parse import quote

import pytest
from pydantic import ValidationError
from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from typer.testing import CliRunner

from crossprobe.cli import index as cli
from crossprobe.indexer.jobs.settings import IndexerSettings
from benchmarks.support.local_cluster import LocalCluster, Secure
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.settings import redact_url
from crossprobe.storage.store import Store
from crossprobe.service.settings import Settings as ServiceSettings
from tests.indexer.conftest import make_images
from tests.storage.secure_redis import (PASSWORD, USER, SecureRedis, assert_no_secret, certs,  # noqa: F401
                                                password_file, secure_redis)

ROLES = (IndexerSettings, ServiceSettings)  # the batch jobs' budget (seconds) and the service's (~200 ms)
ENCODED = quote(PASSWORD, safe="")


@pytest.fixture(autouse=True)
def _no_redis_env(monkeypatch):
    for var in ("REDIS_URL", "CROSSPROBE_REDIS_CLUSTER", "CROSSPROBE_REDIS_PASSWORD_FILE", "CROSSPROBE_REDIS_CA_FILE",
                "CROSSPROBE_REDIS_CERT_FILE", "CROSSPROBE_REDIS_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def plain_redis(tmp_path_factory):
    """A redis-server without TLS: where rediss:// meets a plain port."""
    server = SecureRedis(tmp_path_factory.mktemp("redis-plain"), None)
    yield server
    server.stop()


def _whole(e: BaseException) -> str:
    """An error as a traceback prints it: its message and every chained cause's."""
    return "".join(traceback.format_exception(e))


# -- settings ---------------------------------------------------------------------------------------------------

def test_settings_show_the_url_redacted_and_errors_never_echo_it(certs, password_file, tmp_path):  # noqa: F811
    from rich.pretty import pretty_repr

    for cls in ROLES:
        s = cls(redis_url=f"rediss://{USER}:{ENCODED}@redis.example:6380/0", redis_ca_file=certs.ca)
        for text in (repr(s), str(s), pretty_repr(s)):
            assert f"rediss://{USER}:***@redis.example:6380/0" in text
            assert_no_secret(text)
    assert redact_url(f"redis://u:{ENCODED}@h1:1,u:{ENCODED}@h2:2,h3:3") == "redis://u:***@h1:1,u:***@h2:2,h3:3"
    assert redact_url(f"rediss://u:{PASSWORD}@h:1/0") == "rediss://u:***@h:1/0"  # unencoded: hidden all the same

    ok = f"rediss://{USER}:{ENCODED}@redis.example:6380/0"
    bad = {  # settings -> what the message says
        "unencoded": (dict(redis_url=f"rediss://{USER}:{PASSWORD}@redis.example:6380/0"), "percent-encoded"),
        # a / after digits would read as host "crossprobe", port 12: refused all the same
        "unencoded, digits first": (dict(redis_url=f"rediss://{USER}:12/{PASSWORD}@redis.example:6380/0"),
                                    "percent-encoded"),
        "ca on plain": (dict(redis_url=ok.replace("rediss", "redis"), redis_ca_file=certs.ca), "not rediss://"),
        "twice": (dict(redis_url=ok, redis_password_file=password_file), "given twice"),
        "no key": (dict(redis_url=ok, redis_cert_file=certs.client_cert), "both CROSSPROBE_REDIS_CERT_FILE"),
        "no file": (dict(redis_url=ok, redis_ca_file=tmp_path / "missing.pem"), "redis_ca_file\n  Path does not"),
        "file, no url": (dict(redis_password_file=password_file), "needs REDIS_URL"),
        "another field": (dict(redis_url=ok, redis_retries=99), "redis_retries"),
    }
    for cls in ROLES:
        for name, (kw, says) in bad.items():
            with pytest.raises(ValidationError) as ei:
                cls(**kw)
            assert says in str(ei.value), (name, str(ei.value))
            assert_no_secret(str(ei.value))
    # the command line's rendering of a bad setting: exit 2, the setting named, no value
    r = CliRunner().invoke(cli.index_app, ["list"], env={"REDIS_URL": bad["unencoded"][0]["redis_url"]})
    assert r.exit_code == 2 and "percent-encoded" in r.output, r.output
    assert_no_secret(r.output)


# -- connecting -------------------------------------------------------------------------------------------------

def test_url_options_split_the_url_for_redis_py(certs, password_file):  # noqa: F811
    """The URL less its user and password (plain scheme: the class says TLS), the rest as keyword arguments;
    unix:// and a URL's query (redis-py's own options, e.g. ssl_check_hostname) pass as written."""
    from crossprobe.storage.redis_conn import (ExplainedConnection, ExplainedSSLConnection,
                                                       ExplainedUnixConnection, PasswordFile, url_options)

    def opts(url, **kw):
        return url_options(IndexerSettings(redis_url=url, redis_cluster="," in url, **kw))

    assert opts("unix:///tmp/r.sock?db=2") == ("unix:///tmp/r.sock?db=2", {"connection_class": ExplainedUnixConnection})
    assert opts("redis://h:1/3") == ("redis://h:1/3", {"connection_class": ExplainedConnection})
    url, kw = opts(f"rediss://{USER}:{ENCODED}@h:6380/0?ssl_check_hostname=false", redis_ca_file=certs.ca)
    assert url == "redis://h:6380/0?ssl_check_hostname=false"
    assert kw == {"connection_class": ExplainedSSLConnection, "username": USER, "password": PASSWORD,
                  "ssl_ca_certs": str(certs.ca)}
    url, kw = opts(f"rediss://{USER}@h1:1,h2:2", redis_password_file=password_file)
    assert url == "redis://h1:1,h2:2" and "password" not in kw and "username" not in kw
    assert isinstance(kw["credential_provider"], PasswordFile)
    assert kw["credential_provider"].get_credentials() == (USER, PASSWORD)  # the file's newline dropped


def test_an_acl_user_over_tls_for_both_roles_and_by_password_file(secure_redis, certs, password_file):  # noqa: F811
    assert secure_redis.admin().acl_whoami() == USER
    for cls in ROLES:
        for kw in (dict(redis_url=secure_redis.url()),  # the password in the URL, percent-encoded
                   dict(redis_url=secure_redis.url(password=None), redis_password_file=password_file)):
            r = connect(cls(redis_ca_file=certs.ca, **kw))
            r.set(f"k:{cls.__name__}", b"\x00v")
            assert r.get(f"k:{cls.__name__}") == b"\x00v" and r.acl_whoami() == USER
            assert r.connection_pool.connection_class.__name__ == "ExplainedSSLConnection"
            r.close()


def test_the_password_file_is_read_on_each_new_connection(secure_redis, certs, tmp_path):  # noqa: F811
    """A rotated container secret: the file changes, new connections use it, no new settings or restart."""
    admin = secure_redis.admin()
    admin.acl_setuser("rotating", enabled=True, passwords=["+first-pw"], keys=["*"], commands=["+@all"])
    try:
        pw = tmp_path / "pw"
        pw.write_text("first-pw\n")
        r = connect(IndexerSettings(redis_url=secure_redis.url(password=None, user="rotating"),
                                    redis_password_file=pw, redis_ca_file=certs.ca))
        assert r.acl_whoami() == "rotating"
        admin.acl_setuser("rotating", enabled=True, passwords=["+second-pw", "-first-pw"])
        pw.write_text("second-pw")
        r.connection_pool.disconnect()  # what a dropped connection or a new pooled one does
        assert r.acl_whoami() == "rotating"
        pw.unlink()
        r.connection_pool.disconnect()
        with pytest.raises(AuthenticationError, match="cannot read CROSSPROBE_REDIS_PASSWORD_FILE"):
            r.ping()
    finally:
        admin.acl_deluser("rotating")


def test_mutual_tls(certs, tmp_path_factory):  # noqa: F811
    server = SecureRedis(tmp_path_factory.mktemp("redis-mtls"),
                         Secure(certs.ca, certs.server_cert, certs.server_key, PASSWORD, USER, mutual=True))
    try:
        s = IndexerSettings(redis_url=server.url(), redis_ca_file=certs.ca, redis_cert_file=certs.client_cert,
                            redis_key_file=certs.client_key)
        assert connect(s).ping()
        with pytest.raises(RedisConnectionError) as ei:
            connect(IndexerSettings(redis_url=server.url(), redis_ca_file=certs.ca)).ping()
        assert "CROSSPROBE_REDIS_CERT_FILE" in str(ei.value)
        assert_no_secret(_whole(ei.value))
    finally:
        server.stop()


def _cases(secure_redis, plain_redis, certs):  # noqa: F811
    """name -> (settings, the error type, what its message says to check)"""
    ca = certs.ca
    return {
        "wrong password": (dict(redis_url=secure_redis.url(password="not-the-password"), redis_ca_file=ca),
                           AuthenticationError, "refused the credentials"),
        "no credentials": (dict(redis_url=secure_redis.url(password=None, user=None), redis_ca_file=ca),
                           AuthenticationError, "refused the credentials"),
        "no CA file": (dict(redis_url=secure_redis.url()), RedisConnectionError, "CROSSPROBE_REDIS_CA_FILE must be"),
        "the wrong CA": (dict(redis_url=secure_redis.url(), redis_ca_file=certs.other_ca), RedisConnectionError,
                         "CROSSPROBE_REDIS_CA_FILE must be"),
        "redis:// to the TLS port": (dict(redis_url=secure_redis.url(scheme="redis")), RedisConnectionError,
                                     "use rediss://"),
        "rediss:// to a plain port": (dict(redis_url=plain_redis.url(), redis_ca_file=ca), RedisTimeoutError,
                                      "plain (non-TLS) port"),
    }


def test_each_misconfiguration_fails_within_the_budget_saying_what_to_check(secure_redis, plain_redis,  # noqa: F811
                                                                            certs):  # noqa: F811
    for cls in ROLES:
        for name, (kw, kind, says) in _cases(secure_redis, plain_redis, certs).items():
            s = cls(**kw)
            # the longest a connect may take: connect timeout per try, plus the backoffs (a refused login or
            # certificate is not retried; redis:// to the TLS port is, as any dropped connection)
            budget = (s.redis_retries + 1) * s.redis_connect_timeout_s + s.redis_retries * s.redis_backoff_cap_s
            t0 = time.monotonic()
            with pytest.raises(RedisError) as ei:
                connect(s).ping()
            took = time.monotonic() - t0
            assert isinstance(ei.value, kind), (cls.__name__, name, repr(ei.value))
            assert says in str(ei.value), (cls.__name__, name, str(ei.value))
            assert took < budget + 1.0, (cls.__name__, name, took)
            assert_no_secret(_whole(ei.value))
            print(f"{cls.__name__:16} {name:26} {took:5.2f} s  {str(ei.value)[:160]}")


def test_a_tls_cluster_with_an_acl_user(certs, tmp_path_factory):  # noqa: F811
    """Cluster mode over TLS (client port, bus and replication) with the ACL user: the same connect(), the
    fail-fast fetch and ping; a wrong password or CA fails as on one Redis."""
    from crossprobe.storage import cluster

    with LocalCluster(masters=3, replicas=0, secure=Secure(certs.ca, certs.server_cert, certs.server_key,
                                                           PASSWORD, USER)) as c:
        assert c.url.startswith(f"rediss://{USER}:{ENCODED}@127.0.0.1:")
        s = ServiceSettings(redis_url=c.url, redis_cluster=True, redis_ca_file=certs.ca,
                            redis_socket_timeout_s=2, redis_connect_timeout_s=2)
        r = connect(s)
        keys = [f"{{b{i}}}:k" for i in range(40)]  # spread over the masters' slots
        for k in keys:
            r.set(k, k.encode())
        assert cluster.fetch(r, keys) == [k.encode() for k in keys] and cluster.ping(r)
        assert len({r.nodes_manager.get_node_from_slot(r.keyslot(k)).name for k in keys}) == 3
        for kw, says in ((dict(redis_url=c.url.replace(ENCODED, "wrong")), "refused the credentials"),
                         (dict(redis_url=c.url, redis_ca_file=certs.other_ca), "CROSSPROBE_REDIS_CA_FILE must be")):
            kw.setdefault("redis_ca_file", certs.ca)
            with pytest.raises(Exception) as ei:  # RedisCluster connects at once: RedisClusterException
                connect(IndexerSettings(redis_cluster=True, **kw)).get(keys[0])
            assert says in str(ei.value), str(ei.value)
            assert_no_secret(_whole(ei.value))


# -- the batch jobs ---------------------------------------------------------------------------------------------

def _env(url: str, ca, root, models_dir, **more) -> dict:
    """The environment of a `crossprobe index` command (CliRunner sets it over os.environ)."""
    return {"REDIS_URL": url, "CROSSPROBE_INDEX_ROOT": str(root), "CROSSPROBE_MODELS_DIR": str(models_dir),
            "CROSSPROBE_INDEX_BATCH_SIZE": "4", "CROSSPROBE_INDEX_THREADS": "2", "CROSSPROBE_INDEX_PROGRESS": "false",
            **({"CROSSPROBE_REDIS_CA_FILE": str(ca)} if ca else {}), **more}


def test_build_list_and_watch_through_auth_and_tls(secure_redis, certs, password_file, models_dir, ckpt, bert,  # noqa: F811
                                                   tmp_path):
    from crossprobe.indexer import open_index
    from crossprobe.indexer.jobs.watch import Watcher

    secure_redis.admin().flushall()
    gallery = tmp_path / "gallery"
    make_images(gallery, 6)
    root = tmp_path / "indexes"
    # the batch jobs' user as docs/operations.md scopes it: the key prefix, every command but the dangerous ones
    user = secure_redis.add_user("indexer", ["+@all", "-@dangerous"])
    env = _env(secure_redis.url(password=None, user=user), certs.ca, root, models_dir,
               CROSSPROBE_REDIS_PASSWORD_FILE=str(password_file))
    runner = CliRunner()
    r = runner.invoke(cli.index_app, ["build", "--name", "photos", "--images", str(gallery), "--ckpt", str(ckpt)],
                      env=env)
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli.index_app, ["list", "photos"], env=env)
    assert r.exit_code == 0 and "active" in r.output, r.output
    s = IndexerSettings(redis_url=secure_redis.url(user=user), redis_ca_file=certs.ca, index_root=root,
                        models_dir=models_dir, batch_size=4, threads=2, progress=False, watch_settle_s=0.0,
                        watch_metrics_port=0)
    assert len(open_index("photos", None, s).ids) == 6
    # the watcher: its first step builds its folder's index, the next one adds a new photo
    folder = tmp_path / "watched"
    make_images(folder, 3)
    w = Watcher("watched", folder, s, ckpt=ckpt, bert=bert, say=lambda *_: None)
    assert w.step() is not None and len(open_index("watched", None, s).ids) == 3
    make_images(folder, 1, seed=9, prefix="new")
    assert w.step() is not None and len(open_index("watched", None, s).ids) == 4
    r = runner.invoke(cli.index_app, ["gc", "watched"], env=env)  # drops the replaced version's keys
    assert r.exit_code == 0, r.output
    assert len(Store(s, connect(s)).versions("watched")) == 1


def test_the_cli_fails_with_what_to_check_and_no_secret(secure_redis, plain_redis, certs, models_dir, ckpt,  # noqa: F811
                                                        tmp_path):
    gallery = tmp_path / "gallery"
    make_images(gallery, 2)
    for name, (kw, _, says) in _cases(secure_redis, plain_redis, certs).items():
        env = _env(kw["redis_url"], kw.get("redis_ca_file"), tmp_path / "indexes", models_dir)
        r = CliRunner().invoke(cli.index_app, ["build", "--name", "photos", "--images", str(gallery),
                                               "--ckpt", str(ckpt)], env=env)
        assert r.exit_code == 1 and "error:" in r.output and says in r.output, (name, r.output)
        assert_no_secret(r.output)
