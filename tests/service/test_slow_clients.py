"""Slow clients against `crossprobe serve` over real sockets (service/http_timeouts.py): a client that sends part
of a request line, its headers or its body and stalls (or trickles) is answered 408 and cut off within the
deadline plus slack; an idle new connection is closed silently; a slow client that finishes in time is served.

Both deadlines are fixed (not idle timers): the trickling clients below send a byte every 0.2 s and are cut
all the same. The server runs with 2 s deadlines; SLACK covers a busy 2-core host."""
from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest

from tests.service import live

HEAD_S = 2.0  # CROSSPROBE_HEADER_TIMEOUT_S of the server under test
BODY_S = 2.0  # CROSSPROBE_BODY_TIMEOUT_S
SLACK = 2.0


@pytest.fixture(scope="module")
def base(built, svc_ckpt, artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("slow") / "server.log"
    with live.serve(built, svc_ckpt, artifacts, log, CROSSPROBE_HEADER_TIMEOUT_S=str(HEAD_S),
                    CROSSPROBE_BODY_TIMEOUT_S=str(BODY_S), CROSSPROBE_MAX_BODY_BYTES="4096") as url:
        yield url


def _connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _until_closed(sock: socket.socket, t0: float, limit_s: float, trickle: bytes = b"") -> tuple[bytes, float]:
    """Read until the server closes -> (everything it sent, seconds since t0). trickle: send these bytes one
    at a time every 0.2 s meanwhile (a slowloris that keeps making progress)."""
    got, pos = b"", 0
    sock.settimeout(0.2)
    while time.monotonic() - t0 < limit_s:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            if pos < len(trickle):
                try:
                    sock.sendall(trickle[pos:pos + 1])
                except OSError:  # closed under us: the next recv says how
                    pass
                pos += 1
            continue
        except ConnectionResetError:
            return got, time.monotonic() - t0
        if not chunk:
            return got, time.monotonic() - t0
        got += chunk
    raise AssertionError(f"still open after {limit_s} s; got {got[:200]!r}")


def _assert_408(raw: bytes) -> None:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), raw[:300]
    assert re.search(rb"(?im)^connection: close\r?$", head), head
    assert json.loads(body)["error"]["code"] == "request_timeout", body


def _search_body() -> bytes:
    return json.dumps({"query": "a red square", "k": 2, "rerank": "none"}).encode()


@pytest.mark.parametrize("sent", [b"GET /heal", b"POST /v1/search HTTP/1.1\r\nHost: localhost\r\nContent-Ty",
                                  b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"])
def test_half_a_head_then_silence_gets_408(base, sent):
    with _connect(base) as s:
        t0 = time.monotonic()
        s.sendall(sent)
        raw, took = _until_closed(s, t0, HEAD_S + SLACK)
    _assert_408(raw)
    assert HEAD_S - 0.1 <= took <= HEAD_S + SLACK, took


def test_a_trickled_head_is_cut_at_the_deadline(base):
    """One byte every 0.2 s keeps making progress, but the head deadline does not move."""
    head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + b"X-Pad: " + b"a" * 200 + b"\r\n\r\n"
    with _connect(base) as s:
        t0 = time.monotonic()
        raw, took = _until_closed(s, t0, HEAD_S + SLACK, trickle=head)
    _assert_408(raw)
    assert HEAD_S - 0.1 <= took <= HEAD_S + SLACK, took


def test_an_idle_new_connection_is_closed_silently(base):
    with _connect(base) as s:
        t0 = time.monotonic()
        raw, took = _until_closed(s, t0, HEAD_S + SLACK)
    assert raw == b""  # nothing of a request came: no 408 (an unsolicited answer confuses clients reusing it)
    assert HEAD_S - 0.1 <= took <= HEAD_S + SLACK, took


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_half_a_body_then_silence_gets_408(base, framing):
    body = _search_body()
    if framing == "content-length":
        head = f"POST /v1/search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        part = body[: len(body) // 2]
    else:
        head = "POST /v1/search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
        part = b"%x\r\n%s\r\n" % (len(body) // 2, body[: len(body) // 2])
    with _connect(base) as s:
        s.sendall(head.encode() + b"\r\n\r\n")
        t0 = time.monotonic()
        s.sendall(part)
        raw, took = _until_closed(s, t0, BODY_S + SLACK)
    _assert_408(raw)
    assert BODY_S - 0.1 <= took <= BODY_S + SLACK, took


def test_a_trickled_body_is_cut_at_the_deadline(base):
    body = b" " * 300 + _search_body()  # leading whitespace is valid JSON: only the pace is wrong
    head = (f"POST /v1/search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with _connect(base) as s:
        s.sendall(head)
        t0 = time.monotonic()
        raw, took = _until_closed(s, t0, BODY_S + SLACK, trickle=body)
    _assert_408(raw)
    assert BODY_S - 0.1 <= took <= BODY_S + SLACK, took


def test_a_body_nobody_reads_is_cut_too(base):
    """Content-Length over CROSSPROBE_MAX_BODY_BYTES: 413 at once, before the body. A client that keeps
    trickling that body afterwards is closed at the body deadline (uvicorn alone would hold it: its keep-alive
    timer is cancelled by each byte and never re-armed)."""
    head = b"POST /v1/search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    with _connect(base) as s:
        s.sendall(head)
        t0 = time.monotonic()
        raw, took = _until_closed(s, t0, BODY_S + SLACK, trickle=b"x" * 1000)
    assert raw.startswith(b"HTTP/1.1 413 "), raw[:200]
    assert BODY_S - 0.1 <= took <= BODY_S + SLACK, took


def test_a_slow_client_that_finishes_in_time_is_served(base):
    """Head and body each sent in pieces over ~1 s (half the deadline), then a second request on the same
    kept-alive connection after a pause: both answered 200, nothing cut."""
    body = _search_body()
    head = (f"POST /v1/search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with _connect(base) as s:
        for data in (head, body):
            for i in range(5):
                s.sendall(data[i * len(data) // 5:(i + 1) * len(data) // 5])
                time.sleep(0.25)
        first = _read_response(s)
        assert first.startswith(b"HTTP/1.1 200 "), first[:300]
        assert len(json.loads(first.partition(b"\r\n\r\n")[2])["results"]) == 2
        time.sleep(1.0)  # idle between requests: keep-alive's business (5 s), not the head deadline
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        second = _read_response(s)
        assert second.startswith(b"HTTP/1.1 200 "), second[:300]


def _read_response(s: socket.socket) -> bytes:
    """One response with a Content-Length body (all this service sends for these routes)."""
    s.settimeout(30)
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = s.recv(65536)
        assert chunk, raw
        raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    n = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(rest) < n:
        chunk = s.recv(65536)
        assert chunk, raw
        rest += chunk
    return head + b"\r\n\r\n" + rest


def test_timeouts_are_counted(base):
    body = _search_body()
    with _connect(base) as s:  # one body timeout of its own, so this test stands alone
        s.sendall(f"POST /v1/search HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:5])
        _assert_408(_until_closed(s, time.monotonic(), BODY_S + SLACK)[0])
    text = httpx.get(f"{base}/metrics").text
    m = re.search(r'^crossprobe_errors_total\{kind="request_timeout"\} (\d+)', text, re.M)
    assert m and int(float(m.group(1))) >= 1, text[:500]
    # a body that timed out reached its route: counted there as 408, not as the 500 of an unanswered request
    assert re.search(r'^crossprobe_requests_total\{endpoint="/v1/search",status="408"\} [1-9]', text, re.M), [ln for ln in text.splitlines() if ln.startswith("crossprobe_requests_total")]
