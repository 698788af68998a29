"""Request bodies are checked before any route (or FastAPI's JSON parser) sees them.

  size   Content-Length above Settings.max_body_bytes -> 413 too_large at once; a chunked body is counted
         while it arrives and refused as soon as it passes the limit, so no route ever buffers more.
  depth  JSON nested deeper than MAX_JSON_DEPTH -> 422 invalid_request. Python's json parser recurses:
         a body of 100,000 '[' made /knn-service and /metadata answer 500 (RecursionError). The check
         cannot recurse: string literals are cut out with one regex, then the depth is the largest
         prefix sum of +1 / -1 over the remaining brackets (numpy), linear in the body size. Bodies with
         at most MAX_JSON_DEPTH brackets in all (every ordinary request) skip even that. Binary bodies (an
         image upload: image/*, application/octet-stream, multipart/form-data) are not JSON and are not
         checked: their bytes hold '[' and '{' at random.

The checked body is then replayed to the app unchanged.
"""

from __future__ import annotations

import numpy as np

from crossprobe.service import errors
from crossprobe.service.settings import MAX_JSON_DEPTH

BINARY_TYPES = (b"image/", b"application/octet-stream", b"multipart/form-data")


def json_depth(raw: bytes) -> int:
    """Deepest nesting of [ and { in raw (JSON text; brackets inside strings do not count). No recursion and
    no backtracking: a few vectorised passes, linear in len(raw) (a regex over string literals can be made
    quadratic by a body of unterminated escaped quotes)."""
    opens = raw.count(b"[") + raw.count(b"{")
    if opens <= MAX_JSON_DEPTH:
        return opens  # an upper bound, already small enough
    a = np.frombuffer(raw, np.uint8)
    pos = np.arange(len(a))
    # a quote is escaped when an odd run of backslashes precedes it
    last_plain = np.maximum.accumulate(np.where(a != ord("\\"), pos, -1))
    run = pos - 1 - np.concatenate(([-1], last_plain[:-1]))  # backslashes just before each position
    quote = (a == ord('"')) & (run % 2 == 0)
    outside = np.cumsum(quote) % 2 == 0  # an even number of real quotes so far: not inside a string
    outside &= ~quote
    steps = np.where(
        outside & ((a == ord("[")) | (a == ord("{"))), 1, np.where(outside & ((a == ord("]")) | (a == ord("}"))), -1, 0)
    )
    return int(np.cumsum(steps).max(initial=0))


class BodyGuard:
    """ASGI middleware: the size limit on every route, the depth limit on every body."""

    def __init__(self, app, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> None:
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(
                scope, receive, send, 413, "too_large", f"body of {int(length)} bytes; the limit is {self.max_bytes}"
            )
            return
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)  # no body read by any route
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(
                    scope,
                    receive,
                    send,
                    413,
                    "too_large",
                    f"body of more than {self.max_bytes} bytes; the limit is {self.max_bytes}",
                )
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        binary = headers.get(b"content-type", b"").lower().lstrip().startswith(BINARY_TYPES)
        if not binary and json_depth(raw) > self.max_depth:
            await self._refuse(
                scope,
                receive,
                send,
                422,
                "invalid_request",
                f"invalid request: body: JSON nested deeper than {self.max_depth} levels",
            )
            return
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would report it

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope, receive, send, status: int, code: str, message: str) -> None:
        await errors.answer(code, message, status=status, scope=scope)(scope, receive, send)  # counted there
