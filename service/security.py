"""Who may call what: search keys, the admin key, the metrics key, and the rate limit (docs/security.md).

  group    routes                                                      header                     key unset
  search   /v1/search[/image], /v1/explain, /v1/indexes,                 X-API-Key: <search key>  open
           /v1/items/{id}[/image], /knn-service, /indices-list, /metadata
  admin    /admin/*                                                    X-Admin-Key: <admin key>   403 admin_disabled
  metrics  /metrics                                                    Authorization: Bearer <k>  open
  open     /healthz, /readyz, / and /static/* (the page), /docs, /openapi.json

Each group is a FastAPI dependency on its routers (service/routes/), which also declares the header
as an OpenAPI security scheme. Header missing: 401 `unauthorized` (with WWW-Authenticate); present but not a
key of this group: 403 `forbidden`. A key opens its own group only: start-up fails when one string is
configured for two groups, so a search key can never be the admin key or the metrics key.

Scopes: a search key may be limited to named indexes (`KEY INDEX [INDEX ...]`, load_search_keys; scope.py). The
check answers the request's Caller, with its key's scope; each route looks its index up within that scope
(deps.KeyScope -> registry.get / visible), so an index outside it is answered as one that does not exist.

Comparison: the SHA-256 of the presented key against the SHA-256 of every configured key of the group, with
hmac.compare_digest and without stopping at a match. Equal-length digests, all compared: the time taken
tells neither which key matched, nor whether one did, nor how long the keys are. Keys are never logged nor
echoed: error messages name the header, never a value; uvicorn's access log has no headers.

Keys fail closed: a key shorter than MIN_KEY_LENGTH, CROSSPROBE_API_KEYS set to nothing but commas, or a keys file
with none stops the start; so does serving without search keys on an address other than loopback, unless
CROSSPROBE_ALLOW_OPEN_NETWORK says so. A wrong key (403) counts against the client address: after
auth_failures_burst of them, refilled at auth_failures_per_minute, the next attempt is 429 `rate_limited` before its
key is compared (a missing key, 401, is no guess and does not count).

Rate limit (Settings.rate_limit_rps > 0): a token bucket per search key, or per client address when no
search keys are set, over the routes that run the query tower or the image towers (/v1/search[/image],
/v1/explain, /knn-service: the
CPU-bound ones; items, images and /metadata follow from a search's results, and the page loads a dozen
thumbnails per search). A request takes one token; the bucket holds `rate_limit_burst` and refills at
`rate_limit_rps`. Empty: 429 `rate_limited` with Retry-After = the whole seconds until one token is back,
counted in crossprobe_rate_limited_total{endpoint}. Authentication comes first, so a request without a valid
key never spends anyone's tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Hashable

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from crossprobe.service import metrics
from crossprobe.service.exceptions import AdminDisabled, CrossprobeError, Forbidden, RateLimited, Unauthorized
from crossprobe.service.schemas import ErrorResponse
from crossprobe.service.scope import EVERY, Scope
from crossprobe.service.settings import Settings
from crossprobe.storage.store import NAME_RE

API_KEY_HEADER = "X-API-Key"
ADMIN_KEY_HEADER = "X-Admin-Key"

# auto_error=False: the dependencies below answer themselves, in this API's error JSON (FastAPI's own would be
# {"detail": ...}); the schemes are there for the OpenAPI document ("securitySchemes" and each route's "security")
_search_scheme = APIKeyHeader(
    name=API_KEY_HEADER,
    scheme_name="SearchKey",
    auto_error=False,
    description="A search key; needed only when the server sets CROSSPROBE_API_KEYS or CROSSPROBE_API_KEYS_FILE",
)
_admin_scheme = APIKeyHeader(
    name=ADMIN_KEY_HEADER,
    scheme_name="AdminKey",
    auto_error=False,
    description="The admin key (CROSSPROBE_ADMIN_KEY); never a search key",
)
_metrics_scheme = HTTPBearer(
    scheme_name="MetricsKey",
    auto_error=False,
    description="The metrics key; needed only when the server sets CROSSPROBE_METRICS_KEY",
)

MIN_KEY_LENGTH = 16  # characters of a key (any group): a short key is guessed; `openssl rand -hex 32` gives 64
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")  # what an HTTP header value can carry as sent, no spaces or commas
# between a key and its index names: ASCII spaces and tabs only (a no-break space inside a key stays an error)
_BLANKS = re.compile(r"[ \t]+")


def _digest(key: str) -> bytes:
    # latin-1: Starlette decodes header bytes as latin-1, so this gives back the bytes the client sent;
    # configured keys are visible ASCII (checked at start-up), the same bytes in either encoding
    return hashlib.sha256(key.encode("latin-1", "replace")).digest()


def matching(given: str | None, digests: list[bytes]) -> int | None:
    """Position of the configured key (by its digest) that equals `given`, or None. Every digest is compared,
    a match does not end the loop: constant time in the keys, whichever matches."""
    if not given:
        return None
    d = _digest(given)
    found = None
    for i, ref in enumerate(digests):
        if hmac.compare_digest(d, ref):
            found = i
    return found


def _secret(value: SecretStr | None) -> str | None:
    """A configured key, or None when unset or blank (CROSSPROBE_ADMIN_KEY= in a compose file means 'no key')."""
    if value is None:
        return None
    return value.get_secret_value().strip() or None


def _check(key: str, what: str) -> str:
    # the message names the key by its place, never by its value (start-up errors are logged)
    if not _VISIBLE_ASCII.fullmatch(key) or "," in key:
        raise ValueError(f"{what}: only visible ASCII characters, no spaces or commas, can be sent in a header")
    if len(key) < MIN_KEY_LENGTH:
        raise ValueError(f"{what}: shorter than {MIN_KEY_LENGTH} characters (make one: openssl rand -hex 32)")
    return key


def _entry(text: str, what: str) -> tuple[str, Scope]:
    """One search-key entry: `KEY` (every index) or `KEY INDEX [INDEX ...]` (those only), split on spaces and tabs,
    which no key can hold (_check) and no index name either (NAME_RE): every entry that was a valid key before
    scopes existed means the same key now. Nothing of the entry is quoted in an error: a key pasted where an
    index name belongs must not reach the logs."""
    key, *names = _BLANKS.split(text.strip())  # the ends stripped of any whitespace, as before scopes
    _check(key, what)
    for n, name in enumerate(names, 1):
        if not NAME_RE.match(name):
            raise ValueError(
                f"{what}: index name {n} is not an index name (letters, digits, '_', '.', '-'; "
                "names are separated by spaces)"
            )
    return key, Scope(tuple(dict.fromkeys(names))) if names else EVERY


def load_search_keys(settings: Settings) -> dict[str, Scope]:
    """CROSSPROBE_API_KEYS (entries comma separated) + CROSSPROBE_API_KEYS_FILE (one entry per line, '#'
    comments) -> each search key and the indexes it reads. A key given twice must be given the same indexes."""
    entries: list[tuple[str, Scope, str]] = []
    if (env := _secret(settings.api_keys)) is not None:
        for n, e in enumerate((e for e in env.split(",") if e.strip()), 1):
            what = f"CROSSPROBE_API_KEYS: key {n}"
            entries.append((*_entry(e, what), what))
        if not entries:  # "," or ", ,": set, yet no key; open routes would be the opposite of what was meant
            raise ValueError("CROSSPROBE_API_KEYS is set but holds no key (only commas and spaces)")
    if settings.api_keys_file is not None:
        path = settings.api_keys_file
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            why = e.strerror or type(e).__name__
            raise ValueError(f"CROSSPROBE_API_KEYS_FILE: cannot read {path} ({why})") from None
        except UnicodeDecodeError:
            raise ValueError(f"CROSSPROBE_API_KEYS_FILE: {path} is not UTF-8 text") from None
        lines = [(f"CROSSPROBE_API_KEYS_FILE: line {n}", ln.strip()) for n, ln in enumerate(text.splitlines(), 1)]
        from_file = [(*_entry(ln, what), what) for what, ln in lines if ln and not ln.startswith("#")]
        if not from_file:
            # an empty secret (a mount that failed, a template never filled) must not leave the routes open
            raise ValueError(f"CROSSPROBE_API_KEYS_FILE: {path} holds no keys")
        entries += from_file
    keys: dict[str, tuple[Scope, str]] = {}
    for key, scope, what in entries:
        if key in keys and keys[key][0] != scope:
            raise ValueError(f"{what} repeats the key of {keys[key][1]} with other indexes: list a key once")
        keys.setdefault(key, (scope, what))
    return {key: scope for key, (scope, _) in keys.items()}


class RateLimiter:
    """Token buckets, one per client: `rate` tokens a second up to `burst`; a request takes one.

    Memory is bounded: the buckets sit in an LRU (OrderedDict, most recent last). A bucket idle for
    burst / rate seconds has refilled, which is the same as having none, so those are dropped from the cold end
    as requests come (nothing is lost); beyond `max_clients` buckets the least recently used is dropped too,
    and that client starts again with a full bucket (the cap forgets, it never refuses anyone)."""

    def __init__(self, rate: float, burst: int, max_clients: int, clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or burst < 1 or max_clients < 1:
            raise ValueError("rate > 0, burst >= 1 and max_clients >= 1")
        self.rate, self.burst, self.max_clients, self.clock = float(rate), int(burst), int(max_clients), clock
        self._full_after_s = self.burst / self.rate
        self._buckets: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()  # who -> (tokens, at)
        self._lock = threading.Lock()  # callers are on the event loop today; a lock keeps it right from threads

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, who: Hashable) -> float:
        """One token for `who` -> 0.0; or, none left, the seconds until there is one (nothing taken)."""
        now = self.clock()
        with self._lock:
            old = self._buckets.pop(who, None)
            tokens = float(self.burst) if old is None else min(self.burst, old[0] + (now - old[1]) * self.rate)
            while self._buckets:  # sweep the cold end: refilled buckets, and any over the cap
                _, at = next(iter(self._buckets.values()))
                if now - at < self._full_after_s and len(self._buckets) < self.max_clients:
                    break
                self._buckets.popitem(last=False)
            if tokens >= 1:
                self._buckets[who] = (tokens - 1, now)
                return 0.0
            self._buckets[who] = (tokens, now)
            return (1 - tokens) / self.rate

    def peek(self, who: Hashable) -> float:
        """0.0 when `who` has a token left, else the seconds until it has one: nothing taken."""
        now = self.clock()
        with self._lock:
            old = self._buckets.get(who)
        if old is None:
            return 0.0
        tokens = min(self.burst, old[0] + (now - old[1]) * self.rate)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate


class Access:
    """One app's access control: the search keys (digests), the metrics key, the rate limiter.

    The admin key is read from the settings at each admin request, as before this module: it can be switched
    off at run time (the tests do). Raises ValueError at start-up on a key that cannot work."""

    def __init__(self, settings: Settings):
        self.settings = settings
        keys = load_search_keys(settings)  # key -> the indexes it reads
        admin, metrics_key = _secret(settings.admin_key), _secret(settings.metrics_key)
        if admin is not None:
            _check(admin, "CROSSPROBE_ADMIN_KEY")
        if metrics_key is not None:
            _check(metrics_key, "CROSSPROBE_METRICS_KEY")
        for name, key in (("CROSSPROBE_ADMIN_KEY", admin), ("CROSSPROBE_METRICS_KEY", metrics_key)):
            if key is not None and key in keys:
                raise ValueError(f"{name} is also a search key: each group (search, admin, metrics) needs its own")
        if admin is not None and admin == metrics_key:
            raise ValueError("CROSSPROBE_METRICS_KEY equals CROSSPROBE_ADMIN_KEY: each group needs its own key")
        self._search = [_digest(k) for k in keys]
        self._scopes = list(keys.values())  # the scope of the key whose digest is at the same position
        self._metrics = [_digest(metrics_key)] if metrics_key is not None else []
        self.limiter = (
            RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst, settings.rate_limit_max_clients)
            if settings.rate_limit_rps > 0
            else None
        )
        # failed key attempts per client address, every group: guessing a key costs time
        self.failures = RateLimiter(
            settings.auth_failures_per_minute / 60, settings.auth_failures_burst, settings.rate_limit_max_clients
        )
        if not self._search and not settings.allow_open_network and not is_loopback(settings.host):
            raise ValueError(
                f"serving on {settings.host} without search keys would open every photo and its metadata to the "
                "network: set CROSSPROBE_API_KEYS (or CROSSPROBE_API_KEYS_FILE), bind 127.0.0.1, or set "
                "CROSSPROBE_ALLOW_OPEN_NETWORK=true where the port is reachable only by whom it should be"
            )

    def check_failures(self, request: Request) -> None:
        """Before a key is compared: 429 for a client address whose failed attempts are used up."""
        wait_s = self.failures.peek(_address(request))
        if wait_s > 0:
            retry = max(1, math.ceil(wait_s))
            raise RateLimited(
                f"too many failed key attempts from this address; retry after {retry} s", retry_after_s=retry
            )

    def failed(self, request: Request, error: CrossprobeError) -> CrossprobeError:
        """Count one failed attempt of this client address, and give the error back to raise."""
        self.failures.take(_address(request))
        return error

    @property
    def search_keys_on(self) -> bool:
        return bool(self._search)

    @property
    def metrics_key_on(self) -> bool:
        return bool(self._metrics)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _address(request: Request) -> str:
    return request.client.host if request.client else ""


def access(request: Request) -> Access:
    return request.app.state.access


def _unauthorized(message: str, scheme: str = "APIKey") -> Unauthorized:
    # RFC 9110: a 401 names the scheme to use (for an API key there is no registered one; FastAPI says APIKey)
    return Unauthorized(message, scheme)


# ---- dependencies, one per route group ------------------------------------------------------------------
@dataclass(frozen=True)
class Caller:
    """Who sent a search-group request: its rate-limit identity (the key's position when keys are set, else the
    client address) and the indexes it may read."""

    who: tuple[str, str | int]  # ("address", the client's host) or ("key", the key's position)
    scope: Scope


async def search_client(request: Request, key: Annotated[str | None, Security(_search_scheme)]) -> Caller:
    """Every search-group route: checks X-API-Key when search keys are set -> the caller (FastAPI caches the
    answer for the request: the rate limit and the routes' key_scope (deps.py) read the same one)."""
    acc = access(request)
    if not acc.search_keys_on:
        return Caller(("address", request.client.host if request.client else ""), EVERY)
    if not key:
        raise _unauthorized(f"this route needs a search key in the {API_KEY_HEADER} header")
    acc.check_failures(request)
    i = matching(key, acc._search)
    if i is None:
        raise acc.failed(request, Forbidden(f"the {API_KEY_HEADER} header does not hold a search key of this service"))
    return Caller(("key", i), acc._scopes[i])


async def rate_limit(request: Request, caller: Annotated[Caller, Depends(search_client)]) -> None:
    """The query routes (after search_client): one token."""
    limiter = access(request).limiter
    if limiter is None:
        return
    wait_s = limiter.take(caller.who)
    if wait_s > 0:
        metrics.rate_limited(getattr(request.scope.get("route"), "path", None) or "unmatched")
        retry = max(1, math.ceil(wait_s))  # Retry-After is whole seconds; rounding down would retry too early
        whose = "search key" if caller.who[0] == "key" else "client address"
        raise RateLimited(
            f"rate limit of this {whose} reached ({limiter.rate:g} requests/s, "
            f"burst {limiter.burst}); retry after {retry} s",
            retry_after_s=retry,
        )


async def admin_client(request: Request, key: Annotated[str | None, Security(_admin_scheme)]) -> None:
    """Every /admin/* route: X-Admin-Key must be CROSSPROBE_ADMIN_KEY (search keys never open these)."""
    acc = access(request)
    admin = _secret(acc.settings.admin_key)
    if admin is None:
        raise AdminDisabled("admin endpoints are off (set CROSSPROBE_ADMIN_KEY)")
    if not key:
        raise _unauthorized(f"admin routes need the admin key in the {ADMIN_KEY_HEADER} header")
    acc.check_failures(request)
    if matching(key, [_digest(admin)]) is None:
        raise acc.failed(request, Forbidden(f"the {ADMIN_KEY_HEADER} header does not hold the admin key"))


async def metrics_client(
    request: Request, cred: Annotated[HTTPAuthorizationCredentials | None, Security(_metrics_scheme)]
) -> None:
    """GET /metrics: Authorization: Bearer <CROSSPROBE_METRICS_KEY> when that is set, else open."""
    acc = access(request)
    if not acc.metrics_key_on:
        return
    if cred is None:
        raise _unauthorized("/metrics needs the metrics key as `Authorization: Bearer <key>`", scheme="Bearer")
    acc.check_failures(request)
    if matching(cred.credentials, acc._metrics) is None:
        raise acc.failed(request, Forbidden("the Authorization header does not hold the metrics key"))


# ---- OpenAPI: the answers each group adds to its routes ------------------------------------------------
def document_optional_keys(app, acc: Access) -> None:
    """In this app's OpenAPI document, a scheme with no key configured is optional ("security": [{}, {...}]),
    so a client generated from it does not insist on a header the server ignores."""
    optional = {name for name, on in (("SearchKey", acc.search_keys_on), ("MetricsKey", acc.metrics_key_on)) if not on}
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            for item in build().get("paths", {}).values():  # build() caches its answer in app.openapi_schema
                for op in item.values():
                    sec = op.get("security") if isinstance(op, dict) else None
                    if sec and {} not in sec and any(optional & set(req) for req in sec):
                        sec.insert(0, {})
        return app.openapi_schema

    app.openapi = openapi


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


SEARCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _error("unauthorized: no X-API-Key header (only when the server has search keys)"),
    403: _error("forbidden: the X-API-Key header holds no search key of this service"),
}
QUERY_RESPONSES: dict[int | str, dict[str, Any]] = {
    **SEARCH_RESPONSES,
    429: _error(
        "rate_limited: this key's (or address's) rate limit is reached; overloaded: the admission queue "
        "is full. Retry after Retry-After seconds"
    ),
}
ADMIN_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _error("unauthorized: no X-Admin-Key header"),
    403: _error("forbidden: the X-Admin-Key header holds another value; admin_disabled: no admin key is set"),
}
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _error("unauthorized: no `Authorization: Bearer` header (only when the server has a metrics key)"),
    403: _error("forbidden: the bearer token is not the metrics key"),
}

# the dependencies as route-group arguments: APIRouter(dependencies=SEARCH, responses=SEARCH_RESPONSES)
SEARCH = [Depends(search_client)]
QUERY = [Depends(search_client), Depends(rate_limit)]
ADMIN = [Depends(admin_client)]
METRICS = [Depends(metrics_client)]
