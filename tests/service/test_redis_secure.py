"""The service over Redis as operators run it (tests/storage/secure_redis.py: Debian's redis-server on TLS
only, an ACL user with a password): `crossprobe serve` reranks through AUTH + TLS with the password from a file;
with a wrong password, without the CA or with redis:// to the TLS port, /readyz says the feature store is
unreachable and what to check, and neither /readyz nor the service's log (at debug level) holds the password."""
from __future__ import annotations

import logging
import time

import httpx
import pytest

from crossprobe.indexer import open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from tests.storage.secure_redis import (PASSWORD, assert_no_secret, certs, password_file,  # noqa: F401
                                                secret_forms, secure_redis)
from tests.service import live
from tests.service.conftest import Built, build_index, service_settings


@pytest.fixture(scope="module")
def tls_built(built, secure_redis, certs, models_dir, svc_ckpt, bert, tmp_path_factory) -> Built:  # noqa: F811
    """`built`'s gallery, indexed into the TLS-only Redis as the ACL user."""
    secure_redis.admin().flushall()
    ixs = IndexerSettings(redis_url=secure_redis.url(), redis_ca_file=certs.ca, models_dir=models_dir,
                          index_root=tmp_path_factory.mktemp("tls-index") / "indexes", batch_size=8, threads=2,
                          progress=False)
    version = build_index(ixs, built.gallery, svc_ckpt, bert)
    return Built(ixs, built.gallery, version, list(open_index("photos", None, ixs).ids))


def test_serve_reranks_through_auth_and_tls(tls_built, secure_redis, certs, password_file, svc_ckpt,  # noqa: F811
                                            artifacts, tmp_path):
    log = tmp_path / "serve.log"
    # the service's user as docs/operations.md scopes it: read-only, the key prefix only
    reader = secure_redis.add_user("reader", ["-@all", "+@read", "+@connection"])
    with live.serve(tls_built, svc_ckpt, artifacts, log, REDIS_URL=secure_redis.url(password=None, user=reader),
                    CROSSPROBE_REDIS_PASSWORD_FILE=str(password_file), CROSSPROBE_REDIS_CA_FILE=str(certs.ca),
                    CROSSPROBE_LOG_LEVEL="debug") as base:
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.get("/readyz").json()["feature_store"]["up"] is True
            for rerank in ("cp", "temde"):
                r = http.post("/v1/search", json={"query": "a red square", "k": 3, "rerank": rerank})
                assert r.status_code == 200 and not r.json()["degraded"] and len(r.json()["results"]) == 3, r.text
            item = http.get(f"/v1/items/{tls_built.ids[0]}")  # metadata: read from Redis
            assert item.status_code == 200 and item.json()["id"] == tls_built.ids[0], item.text
            # the password changes on the server but not in the file (a rotation gone wrong), the service's
            # connections dropped: searches degrade, never a 500; the password back, reranked again, no restart
            admin = secure_redis.admin()
            admin.acl_setuser(reader, enabled=True, reset_passwords=True, passwords=["+rotated-elsewhere"])
            admin.client_kill_filter(user=reader)
            _searches_until(http, degraded=True)
            assert "refused the credentials" in http.get("/readyz").json()["feature_store"]["last_error"]
            admin.acl_setuser(reader, enabled=True, reset_passwords=True, passwords=[f"+{PASSWORD}"])
            _searches_until(http, degraded=False)
    assert_no_secret(log.read_text())


def _searches_until(http, degraded: bool, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        r = http.post("/v1/search", json={"query": "a red square", "k": 3, "rerank": "cp"})
        assert r.status_code == 200, r.text
        if r.json()["degraded"] is degraded:
            return
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)


def _unreachable(get, timeout_s: float = 60) -> dict:
    """/readyz once the feature store is seen down (the background PING opens the breaker) -> its JSON."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = get("/readyz")
        body = r.json()
        fs = body.get("feature_store") or body.get("error", {}).get("details", {}).get("feature_store") or {}
        if fs.get("up") is False:
            assert r.status_code == 503, r.text
            return body
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)


def _misconfigured(secure_redis, certs) -> dict:  # noqa: F811
    """name -> (settings that differ, what /readyz says to check)"""
    return {
        "wrong password": (dict(redis_url=secure_redis.url(password="not-the-password"), redis_ca_file=certs.ca),
                           "refused the credentials"),
        "no CA file": (dict(redis_url=secure_redis.url()), "CROSSPROBE_REDIS_CA_FILE must be"),
        "redis:// to the TLS port": (dict(redis_url=secure_redis.url(scheme="redis")), "use rediss://"),
    }


@pytest.mark.parametrize("case", ["wrong password", "no CA file", "redis:// to the TLS port"])
def test_readyz_says_the_feature_store_is_unreachable_without_the_secret(case, tls_built, secure_redis,  # noqa: F811
                                                                         certs, svc_ckpt, artifacts,  # noqa: F811
                                                                         caplog):
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app

    over, says = _misconfigured(secure_redis, certs)[case]
    caplog.set_level(logging.DEBUG)  # every logger, redis-py's included
    settings = service_settings(tls_built, svc_ckpt, artifacts, **over)
    with TestClient(create_app(settings)) as c:
        body = _unreachable(c.get)
        assert body["error"]["code"] == "not_ready"
        assert "the feature store (Redis) is unreachable" in body["error"]["message"], body
        assert says in body["error"]["details"]["feature_store"]["last_error"], body
        seen = [c.get(path).text for path in ("/readyz", "/healthz", "/metrics", "/v1/indexes")]
        r = c.post("/v1/search", json={"query": "a red square", "k": 3})
        assert r.status_code == 503, r.text  # no index could be read: not ready, never a 500
        seen.append(r.text)
    assert_no_secret("\n".join(seen))
    assert caplog.records and "feature store (Redis)" in caplog.text
    assert_no_secret(caplog.text)


def test_a_live_service_with_a_wrong_password_logs_no_secret(tls_built, secure_redis, certs, svc_ckpt,  # noqa: F811
                                                             artifacts, tmp_path):
    """The real process (`crossprobe serve`, debug log level): stdout and stderr hold no form of the password."""
    log = tmp_path / "serve.log"
    typed = "wr0ng-Passw0rd/#1"  # a wrong password: not in the log either
    with live.serve(tls_built, svc_ckpt, artifacts, log, ready=False, REDIS_URL=secure_redis.url(password=typed),
                    CROSSPROBE_REDIS_CA_FILE=str(certs.ca), CROSSPROBE_LOG_LEVEL="debug") as base:
        with httpx.Client(base_url=base, timeout=30) as http:
            body = _unreachable(http.get)
            assert "refused the credentials" in body["error"]["details"]["feature_store"]["last_error"], body
            assert_no_secret(http.get("/readyz").text)
    text = log.read_text()
    assert "refused the credentials" in text, text[-3000:]
    assert_no_secret(text)
    assert not [f for f in secret_forms(typed) if f in text]
