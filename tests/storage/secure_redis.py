"""A real Redis as managed services run it: Debian's redis-server (built with TLS) listening on TLS only (port 0,
tls-port N) with an ACL user and password and the default user off, certificates made by trustme. Fixtures for
tests/storage/test_redis_secure.py and tests/service/test_redis_secure.py.

PASSWORD holds the characters a URL must percent-encode (/ ? # @ :), so every test also shows the encoding and
that no form of it (raw or encoded) reaches a message.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from benchmarks.support.local_cluster import Secure, binaries, free_ports

PASSWORD = "s3cr3t-Tok/en?x#y@z:9"
USER = "crossprobe"


def secret_forms(password: str = PASSWORD) -> list[str]:
    """Every way the password could leak into text: as given, percent-encoded, or cut at a URL delimiter (an
    unencoded / in a URL makes its first part a 'port')."""
    return [password, quote(password, safe=""), re.split(r"[/?#@:]", password)[0]]


def assert_no_secret(text: str) -> None:
    for form in secret_forms():
        assert form not in text, f"the Redis password ({form!r}) appears in: {text[:2000]}"


@dataclass
class Certs:
    ca: Path  # signed the server's and the client's certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: "the wrong CA"


def make_certs(d: Path) -> Certs:
    import trustme

    d.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("crossprobe-client")
    c = Certs(*(d / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key", "other-ca.pem")))
    ca.cert_pem.write_to_path(str(c.ca))
    other.cert_pem.write_to_path(str(c.other_ca))
    for leaf, cert, key in ((server, c.server_cert, c.server_key), (client, c.client_cert, c.client_key)):
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
    return c


class SecureRedis:
    """One redis-server process (TLS only + ACL user when secure, else plain), on a free loopback port, in-memory,
    stopped by PID."""

    def __init__(self, d: Path, secure: Secure | None):
        self.dir, self.secure = d, secure
        self.port = free_ports(1)[0]
        server, _ = binaries(tls=True)
        listen = secure.server_args(self.port) if secure else ["--port", str(self.port)]
        d.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([server, *listen, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--dir", str(d), "--logfile", str(d / "redis.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.admin().ping():
                    return
            except redis.RedisError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (d / "redis.log").read_text()[-2000:] if (d / "redis.log").exists() else ""
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start: {log}")
            time.sleep(0.05)

    def admin(self) -> redis.Redis:
        """A client that knows the way in (the tests' own: not crossprobe's connect())."""
        kw = self.secure.client_kwargs() if self.secure else {}
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=2, **kw)

    def add_user(self, name: str, commands: list[str], keys: str = "crossprobe:*") -> str:
        """An ACL user as an operator would scope it (PASSWORD, the key prefix only) -> its name."""
        self.admin().acl_setuser(name, enabled=True, reset=True, passwords=[f"+{PASSWORD}"], keys=[keys],
                                 commands=commands)
        return name

    def url(self, password: str | None = PASSWORD, scheme: str = "rediss", user: str | None = USER) -> str:
        auth = quote(user, safe="") if user else ""
        auth += f":{quote(password, safe='')}" if password is not None else ""
        return f"{scheme}://{auth + '@' if auth else ''}127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("redis-tls"))


@pytest.fixture(scope="session")
def secure_redis(certs, tmp_path_factory):
    """TLS only (no plain port) and the ACL user USER / PASSWORD; the default user off."""
    server = SecureRedis(tmp_path_factory.mktemp("redis-secure"),
                         Secure(certs.ca, certs.server_cert, certs.server_key, PASSWORD, USER))
    yield server
    server.stop()


@pytest.fixture()
def password_file(tmp_path) -> Path:
    p = tmp_path / "redis_password"
    p.write_text(PASSWORD + "\n")  # as `echo` or an editor leaves it
    return p
