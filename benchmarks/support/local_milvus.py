"""A real Milvus server on this machine, from PyPI's `milvus` wheel: for tests, benchmarks and trying the Milvus
backend against a server (`python -m benchmarks.support.local_milvus` prints a CROSSPROBE_MILVUS_URI and
waits).

Why not milvus-lite alone: milvus-lite 3.x is a Python engine inside the calling process (brute force per
segment, its own parser); a server has its own query path, index builds, segment loading, restart recovery and
wire behaviour (timeouts, connection refused), and those are what the backend must survive. The `milvus` wheel
(2.3.5, "embedded Milvus") ships the standalone server binary (Knowhere HNSW, its own embedded etcd, local
storage: no MinIO, no Pulsar) and a `milvus-server --data DIR` launcher; it is installed into a virtualenv of its
own (`ensure_server`: pip from PyPI, ~60 MB, seconds), so it never meets the project's dependencies.

One server per LocalMilvus: a free proxy (gRPC) port, a free pair of embedded-etcd ports (the binary's embedded
etcd otherwise always takes 2379 / 2380, so a second server on the machine would fail), a temp data dir that
stop() removes. Every process is started and stopped by PID (never by name: other people's Milvus servers share
the machine). `milvus-server` is a Python wrapper that unpacks the binary into DATA/bin, writes DATA/configs/
milvus.yaml and runs `DATA/bin/milvus run standalone` as its child; the child is the server. restart() after
kill() runs that child again with the exact command line, working directory and environment it had (read from
/proc at the first start), so the server comes back on the same ports with the same data, as a supervisor would
restart it (the wrapper would pick the next free port when the old one is still in TIME_WAIT).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SERVER_VERSION = "2.3.5"  # the `milvus` wheel's server (Milvus v2.3.5); CROSSPROBE_MILVUS_SERVER_VERSION to change
REPO = Path(__file__).resolve().parents[2]


def server_venv() -> Path:
    return Path(os.environ.get("CROSSPROBE_MILVUS_SERVER_VENV") or REPO / "artifacts" / "milvus-server" / "venv")


def ensure_server(venv: Path | None = None, version: str | None = None, log=print) -> Path:
    """The `milvus-server` launcher of the wheel, installed into its own virtualenv (from PyPI) when missing ->
    its path. $CROSSPROBE_MILVUS_SERVER names another launcher (nothing is installed then)."""
    if os.environ.get("CROSSPROBE_MILVUS_SERVER"):
        return Path(os.environ["CROSSPROBE_MILVUS_SERVER"])
    venv = venv or server_venv()
    version = version or os.environ.get("CROSSPROBE_MILVUS_SERVER_VERSION") or SERVER_VERSION
    exe = venv / "bin" / "milvus-server"
    stamp = venv / f".milvus-{version}"
    if exe.exists() and stamp.exists():
        return exe
    log(f"installing milvus=={version} (the standalone server) into {venv}")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # the wheel has no dependencies (the client extra is pymilvus 2.3, not wanted here: the project's own
    # pymilvus is the client); --no-deps keeps it that way
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", f"milvus=={version}"],
                   check=True)
    stamp.touch()
    return exe


def free_port(exclude: tuple[int, ...] = ()) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port


@dataclass
class LocalMilvus:
    """One Milvus standalone server (the `milvus` wheel's) on loopback, in a temp data dir."""

    root: Path | None = None
    port: int = 0
    start_timeout_s: float = 180.0
    wrapper: subprocess.Popen | None = None
    proc: subprocess.Popen | None = None  # the server when restart() started it (else the wrapper's child)
    pid: int = 0  # the server process (DATA/bin/milvus run standalone)
    _child: dict = field(default_factory=dict)  # argv, cwd, env of the server as first started
    _tmp: str | None = None
    _log = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "milvus"

    def start(self) -> "LocalMilvus":
        exe = ensure_server()
        if self.root is None:
            self._tmp = tempfile.mkdtemp(prefix="crossprobe-milvus-")
            self.root = Path(self._tmp)
        self.root = Path(self.root).resolve()  # the server runs in its data dir: every path it is given is absolute
        self.data.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        etcd_client, etcd_peer = free_port((self.port,)), free_port((self.port,))
        etcd_conf = self.root / "embedEtcd.yaml"
        etcd_conf.write_text(f"name: default\nlisten-client-urls: http://127.0.0.1:{etcd_client}\n"
                             f"advertise-client-urls: http://127.0.0.1:{etcd_client}\n"
                             f"listen-peer-urls: http://127.0.0.1:{etcd_peer}\n"
                             f"initial-advertise-peer-urls: http://127.0.0.1:{etcd_peer}\n"
                             f"initial-cluster: default=http://127.0.0.1:{etcd_peer}\n")
        env = {**os.environ, "ETCD_CONFIG_PATH": str(etcd_conf)}
        self._log = open(self.root / "milvus-server.out", "w")  # noqa: SIM115 - closed in stop()
        try:
            self.wrapper = subprocess.Popen([str(exe), "--data", str(self.data), "--proxy-port", str(self.port),
                                             "--etcd-port", str(etcd_client)], stdout=self._log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
            self.pid = self._wait_banner()
            self._child = {"argv": _read0(f"/proc/{self.pid}/cmdline"), "cwd": os.readlink(f"/proc/{self.pid}/cwd"),
                           "env": dict(kv.split("=", 1) for kv in _read0(f"/proc/{self.pid}/environ") if "=" in kv)}
            configured = re.search(r"^proxy:\n(?:  .*\n)*?  port: (\d+)", (self.data / "configs" / "milvus.yaml").read_text(),
                                   re.M)
            if configured and int(configured.group(1)) != self.port:  # the launcher moved on from a taken port
                self.port = int(configured.group(1))
            self.wait_ready(self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_banner(self) -> int:
        """The launcher prints 'Process: PID' once the server's health endpoint says OK."""
        deadline = time.monotonic() + self.start_timeout_s
        out = self.root / "milvus-server.out"
        import psutil

        while time.monotonic() < deadline:
            m = re.search(r"Process:\s+(\d+)", out.read_text(errors="replace"))
            if m:
                return int(m.group(1))
            if self.wrapper.poll() is not None or "already stopped" in out.read_text(errors="replace"):
                break
            try:  # the server died while the launcher still polls its health endpoint (for 180 s)
                if any(c.status() == psutil.STATUS_ZOMBIE for c in psutil.Process(self.wrapper.pid).children()):
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        raise RuntimeError(f"milvus-server did not start within {self.start_timeout_s:.0f} s: "
                           f"{out.read_text(errors='replace')[-2000:]}\n{self.server_log(2000)}")

    def server_log(self, chars: int = 4000) -> str:
        p = self.data / "logs" / "milvus-stderr.log"
        return p.read_text(errors="replace")[-chars:] if p.exists() else ""

    def wait_ready(self, timeout_s: float = 120.0) -> float:
        """Until a client connects and lists collections (a restarted server also waits for its old etcd session to
        expire) -> seconds waited."""
        from pymilvus import MilvusClient

        t0 = time.monotonic()
        last: Exception | None = None
        while time.monotonic() - t0 < timeout_s:
            if not self.alive():
                raise RuntimeError(f"the Milvus server (pid {self.pid}) exited:\n{self.server_log()}")
            try:
                c = MilvusClient(uri=self.uri, timeout=2)
                try:
                    c.list_collections(timeout=2)
                    return time.monotonic() - t0
                finally:
                    c.close()
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
                time.sleep(0.25)
        raise TimeoutError(f"Milvus at {self.uri} not ready within {timeout_s:.0f} s: {last}")

    def alive(self) -> bool:
        if not self.pid:
            return False
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            return Path(f"/proc/{self.pid}/stat").read_text().split(") ")[1][0] not in "ZX"
        except (FileNotFoundError, IndexError):
            return False

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server (the launcher stays; restart() brings the server back)."""
        try:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            self.proc.wait(timeout=30)
        else:
            _wait_gone(self.pid, 30)

    def restart(self, timeout_s: float = 180.0) -> float:
        """Start the server again after kill(), exactly as it first ran (same ports and data) -> seconds until a
        client is served."""
        if self.alive():
            raise RuntimeError("the server is running; kill() it first")
        t0 = time.monotonic()
        log = open(self.data / "logs" / "milvus-stderr.log", "a")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(self._child["argv"], cwd=self._child["cwd"], env=self._child["env"],
                                     stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        log.close()
        self.pid = self.proc.pid
        self.wait_ready(timeout_s)
        return time.monotonic() - t0

    def rss_bytes(self) -> int:
        """Resident memory of the server process (the embedded etcd runs inside it)."""
        import psutil

        try:
            p = psutil.Process(self.pid)
            return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
        except psutil.NoSuchProcess:
            return 0

    def stop(self) -> None:
        """SIGCONT (a paused server cannot die otherwise), SIGTERM, then SIGKILL, each by PID; the launcher gets
        SIGINT (its own stop path); remove the temp dir."""
        if self.pid and self.alive():
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    break
            if not _wait_gone(self.pid, 5, self.proc):  # the data dir is thrown away: no need to wait long
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _wait_gone(self.pid, 10, self.proc)
        if self.wrapper is not None and self.wrapper.poll() is None:
            self.wrapper.send_signal(signal.SIGINT)
            try:
                self.wrapper.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.wrapper.kill()
                self.wrapper.wait(timeout=10)
        self.wrapper = self.proc = None
        self.pid = 0
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> "LocalMilvus":
        return self.start() if not self.pid else self

    def __exit__(self, *exc) -> None:
        self.stop()


def _read0(path: str) -> list[str]:
    return [x for x in Path(path).read_bytes().decode(errors="replace").split("\0") if x]


def _wait_gone(pid: int, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return True
        else:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
                if state in "ZX":  # a zombie: dead, its parent (the launcher) has not reaped it yet
                    return True
            except (FileNotFoundError, IndexError):
                return True
        time.sleep(0.05)
    return False


if __name__ == "__main__":  # a server to try by hand: prints its URI, stops on Ctrl-C
    with LocalMilvus() as m:
        print(f"CROSSPROBE_MILVUS_URI={m.uri}  (Milvus {SERVER_VERSION}, pid {m.pid}, data {m.data}; Ctrl-C stops it)")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
