"""benchmarks/loadgen.py, the load generator of benchmarks/load_bench.py and redis_faults.py --rate, against a real
`crossprobe serve` (uvicorn on a loopback port) and real sockets: what it counts must be what happened."""
from __future__ import annotations

import asyncio
import socket

import pytest

from benchmarks.loadgen import Generator, search_requests
from tests.service import live


@pytest.fixture(scope="module")
def base(built, svc_ckpt, artifacts, tmp_path_factory):
    with live.serve(built, svc_ckpt, artifacts, tmp_path_factory.mktemp("loadgen") / "server.log") as url:
        yield url


def _gen(base: str, rerank: str = "cp", timeout_s: float = 10.0) -> Generator:
    host, port = base.removeprefix("http://").split(":")
    return Generator(host, int(port), search_requests(host, int(port), ["a dog", "a red car"], rerank, "photos"),
                     timeout_s)


def test_open_loop_sends_on_schedule_and_counts_answers(base):
    run = asyncio.run(_gen(base).open_loop(rate=20, seconds=1.0))
    assert len(run.records) == 20
    assert all(r.status == 200 and r.degraded is False for r in run.records)
    due = sorted(r.start for r in run.records)
    gaps = [b - a for a, b in zip(due, due[1:])]
    assert min(gaps) == pytest.approx(0.05, abs=1e-6) and max(gaps) == pytest.approx(0.05, abs=1e-6)
    s = run.summary()
    assert s["ok"] == 20 and s["errors"] == 0 and s["degraded"] == 0
    assert 0 < s["p50_ms"] <= s["p99_ms"] <= s["max_ms"] < 10_000
    assert 0 < s["client_cpu_ms_per_request"] < 50


@pytest.mark.parametrize("rerank", ["cp", "temde", "none"])
def test_closed_loop_keeps_each_connection_busy(base, rerank):
    run = asyncio.run(_gen(base, rerank).closed_loop(clients=3, n=12))
    assert len(run.records) == 12 and all(r.status == 200 for r in run.records)
    assert run.summary()["qps"] > 0


def test_a_refused_connection_is_an_error_not_a_crash():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        run = asyncio.run(Generator("127.0.0.1", port, search_requests("127.0.0.1", port, ["x"], "cp", None), 2.0)
                          .closed_loop(clients=2, n=4))
    assert len(run.records) == 4 and run.summary()["errors"] == 4
    assert {r.status for r in run.records} == {"ConnectionRefusedError"}


def test_a_server_that_never_answers_times_out_at_the_deadline():
    async def main():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
        port = server.sockets[0].getsockname()[1]
        try:
            return await Generator("127.0.0.1", port, search_requests("127.0.0.1", port, ["x"], "cp", None),
                                   0.3).open_loop(rate=10, seconds=0.3)
        finally:
            server.close()

    run = asyncio.run(main())
    assert [r.status for r in run.records] == ["timeout"] * 3
    assert all(0.3 <= r.end - r.start < 1.0 for r in run.records)


def test_a_connection_the_server_closed_while_idle_is_retried_once(built, svc_ckpt, artifacts, tmp_path):
    """uvicorn closes a kept-alive connection idle longer than CROSSPROBE_KEEP_ALIVE_TIMEOUT_S; a request written
    on it just after gets EOF before any answer. The generator sends it again on a new connection and says so,
    instead of counting the server's keep-alive as a failed search."""
    with live.serve(built, svc_ckpt, artifacts, tmp_path / "server.log", CROSSPROBE_KEEP_ALIVE_TIMEOUT_S="0.2") as url:
        run = asyncio.run(_gen(url).open_loop(rate=2, seconds=2.0))  # 0.5 s between requests: each finds it closed
    assert [r.status for r in run.records] == [200] * 4
    assert run.summary()["stale_connection_retries"] == 3  # all but the first, which opened the connection
