"""Slow clients: a bounded time to send a request's head and its body.

What uvicorn offers (0.54, the h11 protocol it runs here: httptools is not installed, so http="auto" is h11):
a single timer, keep-alive (`timeout_keep_alive`). It is armed when a response ends and cancelled by the first
byte of the next request, and nothing re-arms it. Config has no header or body timeout (only keep-alive,
notify, graceful shutdown and worker health-check ones). So, before this module:

  - a connection that opens and sends nothing was never closed (no timer runs before the first request);
  - a client that sent half a request line or half its headers and stalled held its connection, its
    buffers and a file descriptor forever (slowloris);
  - a client that sent its headers with a Content-Length and then half the body held the request's task
    in receive() forever (slow POST), and one trickling a byte now and then was never cut off either.

The request head is parsed before any ASGI app exists, so an ASGI middleware cannot time it: the deadlines
live in a subclass of uvicorn's h11 protocol (one instance per connection). Both are deadlines, not idle
timers: a client that trickles one byte a second cannot extend them.

  head  the request line and headers must be complete within `header_timeout_s` of their first byte (of the
        connection opening, for its first request: so an idle new connection is closed after that time too).
        Between requests on a kept-alive connection, uvicorn's keep-alive timer bounds the idle time.
  body  the whole body (Content-Length or chunked) must have arrived within `body_timeout_s` of the end of
        the headers. The timer measures the client only: it stops when the body's last byte is parsed, so a
        slow search after that is never cut. It also runs when the app answers before reading the body (a
        413, a GET with a body): a client that keeps trickling a body nobody reads is cut at the deadline.

When a deadline passes: a client that has sent part of a request and got no response yet is answered
408 request_timeout (this API's JSON error body, `Connection: close`) and the connection is closed; an idle
connection (no byte of a new request yet) is closed without an answer, as keep-alive expiry does (an
unsolicited 408 on an idle connection confuses clients that reuse it). The app, if it was waiting for the
body, sees http.disconnect (BodyGuard then returns without answering) and any later send is dropped;
MetricsMiddleware counts the request as 408 (the scope key below). Every expiry also counts in
crossprobe_errors_total{kind="request_timeout"}.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from crossprobe.service import metrics

log = logging.getLogger("crossprobe.service")

# set in the request's ASGI scope when its body timed out: MetricsMiddleware counts it as 408, not 500
TIMED_OUT_SCOPE_KEY = "crossprobe.request_timeout"


def _timeout_response(message: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A complete HTTP/1.1 408 with this API's error JSON, written as raw bytes: h11 cannot frame a response
    while no request head has been parsed (its state machine is still IDLE), and the connection is closed
    right after, so h11's state no longer matters."""
    body = json.dumps({"error": {"code": "request_timeout", "message": message}}).encode()
    head = [b"HTTP/1.1 408 Request Timeout"]
    head += [name + b": " + value for name, value in default_headers]  # server / date, as uvicorn sends
    head += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class TimedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol plus the head and body deadlines above. Use timed_protocol(settings) to get a
    class with the settings' values (uvicorn instantiates the class it is given, one per connection)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "head" | "body" | None: what the running deadline bounds

    # ---- the protocol's events ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("head")  # uvicorn arms no timer before a connection's first request

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._sync()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # the next request may already be (partly) buffered: pipelining, or bytes that came with the last one
        self._sync()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._cancel()  # the connection becomes another protocol's (no websocket routes here; for safety)
        super().handle_websocket_upgrade(event)

    # ---- the deadline -------------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Arm, keep or cancel the deadline for where the client now is in its request (h11's view of it)."""
        if self.transport is None or self.transport.is_closing():
            self._cancel()
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            want = "body"
        elif state is h11.IDLE and (self.timeout_keep_alive_task is None or self.conn.trailing_data[0]):
            # waiting for a head that uvicorn does not time: the connection's first request, bytes of a new
            # one (uvicorn's data_received has just cancelled its keep-alive timer), or the wait after a body
            # that ended after its response (uvicorn re-arms nothing then)
            want = "head"
        else:
            # DONE: the app has the whole request (its answer may take as long as it takes); or idle between
            # requests with uvicorn's keep-alive timer running
            want = None
        if want != self._phase:
            self._cancel()
            if want is not None:
                self._arm(want)

    def _arm(self, phase: str) -> None:
        self._cancel()
        delay = self.header_timeout_s if phase == "head" else self.body_timeout_s
        self._phase = phase
        self._deadline = self.loop.call_later(delay, self._expired, phase)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, None

    def _expired(self, phase: str) -> None:
        self._deadline, self._phase = None, None
        if self.transport.is_closing():
            return
        partial = bool(self.conn.trailing_data[0]) if phase == "head" else True
        cycle = self.cycle if phase == "body" else None
        answer = partial and (cycle is None or not cycle.response_started)
        if cycle is not None:
            # the app may be waiting in receive(): it gets http.disconnect now and its later sends are dropped,
            # so nothing else is written after the 408 below
            cycle.scope[TIMED_OUT_SCOPE_KEY] = True  # type: ignore[literal-required]
            cycle.disconnected = True
            cycle.keep_alive = False
            cycle.message_event.set()
        if partial:
            metrics.error("request_timeout")
            what = (
                ("request line and headers", self.header_timeout_s)
                if phase == "head"
                else ("request body", self.body_timeout_s)
            )
            client = "%s:%d" % self.client if self.client else "?"
            log.info("%s: closed a connection whose %s did not arrive within %g s", client, *what)
            if answer:
                self.transport.write(
                    _timeout_response(
                        f"the {what[0]} did not arrive within {what[1]:g} s", self.server_state.default_headers
                    )
                )
        self.transport.close()


def timed_protocol(header_timeout_s: float, body_timeout_s: float) -> type[TimedH11Protocol]:
    """A TimedH11Protocol class with these deadlines, for uvicorn.Config(http=...)."""
    return type(
        "TimedH11Protocol",
        (TimedH11Protocol,),
        {"header_timeout_s": float(header_timeout_s), "body_timeout_s": float(body_timeout_s)},
    )
