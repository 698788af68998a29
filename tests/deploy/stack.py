"""The compose stack of `make test-deploy`, for tests/deploy/test_stack.py and tests/deploy/test_replicas.py: podman
and podman-compose run as a user would, each container checked right after `up`, and the helpers both modules
use. Each module brings the stack up for itself (`running_stack`) and takes it down at its end: they never run at
once (the ports are the compose file's own), and neither depends on what the other did to it.

podman-compose 1.0 (Debian's) names containers <project>_<service>_1, has no --profile (it runs a profile's
service by its name) and ignores depends_on's health conditions (podman runs no health checks without systemd)."""
from __future__ import annotations

import csv
import io
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.deploy.conftest import REPO, STACK_SECRETS

PROJECT = "cpdeploy"
# grafana: no image reachable here (its dashboard's queries run against the stack's Prometheus)
SERVICES = ["redis", "api", "api-2", "proxy", "prometheus", "pushgateway"]
API = "http://127.0.0.1:8000"  # the proxy: what users and the page reach
REPLICAS = {"api": "http://127.0.0.1:8001", "api-2": "http://127.0.0.1:8002"}  # each replica's own port
PROXY_STATS = "http://127.0.0.1:8404/stats;csv"
PROM = "http://127.0.0.1:9090"


def name(service: str, project: str = PROJECT) -> str:
    return f"{project}_{service}_1"  # podman-compose 1.0's container names


def sh(cmd: list[str], timeout: float = 600, check: bool = True, env: dict | None = None,
       merged: bool = False) -> subprocess.CompletedProcess:
    """merged: stderr into stdout in the order written (p.stderr is then "")."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if merged else {"capture_output": True}
    p = subprocess.run(cmd, text=True, timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})}, **streams)
    p.stderr = p.stderr or ""
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def compose(*args: str, env: dict, project: str = PROJECT, files: tuple[Path, ...] = (),
            **kw) -> subprocess.CompletedProcess:
    fs = [a for f in (REPO / "docker-compose.yml", *files) for a in ("-f", str(f))]
    # unbuffered: podman-compose's echo of each podman command stays before that command's own output
    return sh(["podman-compose", "-p", project, *fs, *args], env={**env, "PYTHONUNBUFFERED": "1"}, **kw)


def down(env: dict, project: str = PROJECT, files: tuple[Path, ...] = ()) -> None:
    """`down -v`, and the project's network, which podman-compose 1.0 leaves behind."""
    compose("down", "-v", env=env, project=project, files=files, check=False, timeout=300)
    sh(["podman", "network", "rm", "-f", f"{project}_default"], check=False, timeout=60)


def not_running(services: list[str], project: str = PROJECT) -> dict[str, str]:
    """service -> what podman says of its container when it does not exist or does not run: its state, exit code,
    the runtime's error and its last log lines."""
    bad = {}
    for s in services:
        p = sh(["podman", "inspect", "--format", "{{.State.Status}}\t{{.State.ExitCode}}\t{{.State.Error}}",
                name(s, project)], check=False, timeout=30)
        if p.returncode != 0:
            bad[s] = "no container"
            continue
        status, code, error = (p.stdout.strip().split("\t") + ["", ""])[:3]
        if status != "running":
            logs = sh(["podman", "logs", "--tail", "10", name(s, project)], check=False, timeout=30)
            bad[s] = (status + (f", exit code {code}" if status == "exited" else "") + (f", {error}" if error else "")
                      + "".join(f"\n      log: {ln}" for ln in (logs.stdout + logs.stderr).strip().splitlines()))
    return bad


def podman_errors(compose_output: str, project: str) -> dict[str, list[str]]:
    """service -> the Error lines podman printed under podman-compose's `podman run` / `podman start` of its
    container (podman-compose 1.0 echoes each command, then podman's own output)."""
    said: dict[str, list[str]] = {}
    current = ""
    for line in compose_output.splitlines():
        if m := re.match(rf"podman (?:run --name=|start ){re.escape(project)}_(.+?)_1\b", line):
            current = m.group(1)
        elif line.startswith("Error") and "no such volume" not in line:  # podman-compose probes, then makes volumes
            said.setdefault(current, []).append(line)
    return said


def up(*services: str, env: dict, project: str = PROJECT, files: tuple[Path, ...] = ()) -> None:
    """`up -d`, then each container checked at once: it exists and runs. podman-compose 1.0 returns 0 when a
    `podman run` failed (no catatonit for --init, a network podman cannot make, a command not found), and every
    check after it would wait for a connection that is refused: fail here instead, quoting podman."""
    p = compose("up", "-d", *services, env=env, project=project, files=files, timeout=300, merged=True)
    bad = not_running(list(services), project)
    if bad:
        said = podman_errors(p.stdout, project)
        pytest.fail(f"containers that did not start after `podman-compose up -d` (which returned {p.returncode}):\n"
                    + "\n".join(f"  {s}: {state}" + "".join(f"\n    podman: {ln}" for ln in said.get(s, []))
                                for s, state in bad.items()), pytrace=False)


def alive(*services: str) -> bool:
    """For wait(): a container that stopped fails the wait at once, with podman's account of it."""
    bad = not_running(list(services))
    assert not bad, "\n".join(f"{s}: {state}" for s, state in bad.items())
    return True


def wait(what: str, check, timeout_s: float, step: float = 0.2):
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        try:
            if (v := check()):
                return v
        except (httpx.HTTPError, OSError) as e:
            last = e
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last error: {last})")


def readyz(base: str = API) -> httpx.Response:
    return httpx.get(f"{base}/readyz", timeout=2)


def version(base: str, index: str = "photos") -> str | None:
    """The version of `index` a replica serves (its /readyz), None while it serves none."""
    r = readyz(base)
    return r.json().get("indexes", {}).get(index) if r.status_code == 200 else None


def search(q: str, base: str = API, **kw) -> httpx.Response:
    return httpx.post(f"{base}/v1/search", json={"query": q, "index": "photos", **kw}, timeout=10)


def started_at(service: str) -> str:
    return sh(["podman", "inspect", "-f", "{{.State.StartedAt}}", name(service)]).stdout.strip()


def proxy_servers(backend: str = "replicas") -> dict[str, dict[str, str]]:
    """HAProxy's view of each replica in `backend` (its stats CSV): server name -> status (UP, DOWN, MAINT ...),
    wretr (requests retried), wredis (redispatched to another server) and more."""
    text = httpx.get(PROXY_STATS, timeout=2).text.lstrip("# ")
    return {row["svname"]: row for row in csv.DictReader(io.StringIO(text))
            if row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND")}


def searches_served(base: str) -> float:
    """The replica's own count of /v1/search requests answered (its /metrics, every status)."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return sum(float(m.group(1)) for m in
               re.finditer(r'^crossprobe_requests_total\{[^}]*endpoint="/v1/search"[^}]*\} (\S+)$', text, re.M))


def resolves_redis() -> None:
    """Each replica finds `redis` by name on the compose network: podman's CNI fallback (netavark or aardvark-dns
    missing) makes networks without DNS, where the api would run and wait for a Redis it cannot name."""
    for replica in REPLICAS:
        p = sh(["podman", "exec", name(replica), "python", "-c", "import socket; socket.getaddrinfo('redis', 6379)"],
               check=False, timeout=30)
        if p.returncode != 0:
            backend = sh(["podman", "info", "--format", "{{.Host.NetworkBackend}}"], check=False).stdout.strip()
            pytest.fail(f"`redis` does not resolve in the {replica} container (podman's network backend: {backend}; "
                        f"netavark with aardvark-dns gives DNS, scripts/container-setup.sh sets them up):\n"
                        f"{p.stderr.strip()[-1500:]}", pytrace=False)


def machine() -> dict:
    """The machine a result was measured on: CPU, cores, kernel, the container tools' versions, the load."""
    # podman-compose 1.0 also prints podman's version and its own exit code: its line names podman-compose(r)
    versions = {t: next(ln for ln in sh([t, "--version"], check=False).stdout.splitlines()
                        if ln.startswith(("podman-compose", f"{t} version"))).split()[2]
                for t in ("podman", "podman-compose", "buildah")}
    return {"cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                         if ln.startswith("model name")), platform.processor()),
            "cores": os.cpu_count(), "kernel": platform.release(), **versions,
            # other jobs on the machine move every timing: their load, over the last 1, 5, 15 minutes
            "load_average_at_end": [round(x, 1) for x in os.getloadavg()]}


def running_stack(tmp_path_factory, label: str):
    """Generator for a module fixture: the sample photos as $IMAGES, `up -d` of SERVICES, each checked; yields
    {"env", "gallery", "root", "t0", "started"} and, at the end, keeps every started container's log beside the
    photos and takes the stack down."""
    if shutil.which("podman-compose") is None or shutil.which("podman") is None:
        pytest.fail("podman and podman-compose are missing: `make test-deploy` installs them (scripts/container-setup.sh)")
    for image in ("crossprobe:cpu", "docker.io/library/haproxy:2.6"):
        if sh(["podman", "image", "exists", image], check=False).returncode != 0:
            pytest.fail(f"no image {image}: `make image` builds it (`make test-deploy` runs it first)")
    from crossprobe.models.demo import write_sample_gallery

    root = tmp_path_factory.mktemp(label)
    gallery = write_sample_gallery(root / "gallery")
    for p in [root, gallery, *gallery.iterdir()]:  # readable by the containers' uid 10001
        p.chmod(0o755 if p.is_dir() else 0o644)
    env = {"IMAGES": str(gallery), **STACK_SECRETS}  # the file wants it, though Grafana is left out here
    down(env)
    t0 = time.monotonic()
    started = list(SERVICES)
    try:
        up(*SERVICES, env=env)
        resolves_redis()
        yield {"env": env, "gallery": gallery, "root": root, "t0": t0, "started": started}
    finally:
        for s in started:
            logs = sh(["podman", "logs", name(s)], check=False, timeout=30)
            (root / f"{s}.log").write_text(logs.stdout + logs.stderr)
        down(env)


# Python, run in a replica's container (`podman exec ... python -c`): serve_pids() -> the PIDs of its `crossprobe
# serve` process. PID 1, the compose file's init, has the same command line after `--`: it is left out
serve_pids_code = """import os, pathlib
def serve_pids():
    out = []
    for p in pathlib.Path('/proc').glob('[0-9]*'):
        try: cmd = (p / 'cmdline').read_bytes().split(b'\\0')
        except OSError: continue
        if p.name != '1' and any(c.endswith(b'crossprobe') for c in cmd) and b'serve' in cmd:
            out.append(int(p.name))
    return out
"""
