"""The Host check (docs/security.md): a request whose Host header names none of this service's names is refused
400 `invalid_host` before any route runs.

Why: with no keys (the default on 127.0.0.1) any web page a local user opens could rebind its own name to
127.0.0.1 (DNS rebinding) and read every photo and its metadata through the browser; the browser then sends the
page's name as Host, which this refuses. CROSSPROBE_ALLOWED_HOSTS lists the names (ports ignored; `*` turns the
check off); the default is the loopback names. /healthz and /readyz answer any Host (orchestrators probe by
address, and they tell nothing). Image answers also carry Cross-Origin-Resource-Policy: same-origin (routes/items.py).
"""

from __future__ import annotations

from crossprobe.service import errors

OPEN_PATHS = ("/healthz", "/readyz")
LOOPBACK = ("localhost", "127.0.0.1", "::1")


def host_name(value: str) -> str:
    """A Host header -> its name, lower case, without port or IPv6 brackets ('[::1]:8000' -> '::1')."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1 : v.find("]")] if "]" in v else v
    return v.rsplit(":", 1)[0] if v.count(":") == 1 else v


class HostGuard:
    """ASGI middleware: refuses a Host outside `allowed` (names; '*' anywhere in it: any Host)."""

    def __init__(self, app, allowed: list[str]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.allowed = {host_name(a) for a in allowed if a != "*"}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.any or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope.get("headers") or () if k == b"host"), "")
        if host_name(given) not in self.allowed:
            shown = given[:100].encode("ascii", "replace").decode() or "(none)"
            msg = (
                f"Host {shown!r} is not a name of this service; set CROSSPROBE_ALLOWED_HOSTS to the names clients "
                "use (docs/security.md)"
            )
            await errors.answer("invalid_host", msg, scope=scope)(scope, receive, send)
            return
        await self.app(scope, receive, send)
