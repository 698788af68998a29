"""Every Prometheus metric of the service, in one registry, exposed at GET /metrics.

Durations are histograms in seconds (Prometheus convention; Grafana computes
p50/p95/p99 from the buckets). Metrics live at module level, created once per
process: several apps in one process (the tests) share them, which is what
prometheus-client expects. One uvicorn worker process per service instance:
with several workers each would expose only its own numbers.

Searches are timed twice on purpose: crossprobe_stage_seconds{stage} (every
stage of every caller, the explain route's own stage names included) and, with
the rerank mode the search ran, crossprobe_search_stage_seconds{stage, rerank}
and crossprobe_search_seconds{rerank}: cp costs a few ms more than none, so
percentiles over all modes move with the traffic mix; per mode they move only
when the service does (deploy/'s dashboard and the p99 alert read these).
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.routing import Match

from crossprobe.service.http_timeouts import TIMED_OUT_SCOPE_KEY

REGISTRY = CollectorRegistry(auto_describe=True)

# request latencies on 2 CPU cores span ~1 ms (ann) to ~1 s (an overloaded queue)
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

STAGE_SECONDS = Histogram(
    "crossprobe_stage_seconds",
    "Time per request-path stage (queue, encode, ann, fetch, rerank, metadata)",
    ["stage"],
    buckets=_BUCKETS,
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "crossprobe_request_seconds",
    "HTTP request latency by route template and status",
    ["endpoint", "status"],
    buckets=_BUCKETS,
    registry=REGISTRY,
)
REQUESTS = Counter(
    "crossprobe_requests", "HTTP requests by route template and status", ["endpoint", "status"], registry=REGISTRY
)
ERRORS = Counter(
    "crossprobe_errors", "Errors by kind (the JSON error code, or an internal kind)", ["kind"], registry=REGISTRY
)
INDEX_ITEMS = Gauge("crossprobe_index_items", "Items in the served version of each index", ["index"], registry=REGISTRY)
INDEX_VERSION = Gauge(
    "crossprobe_index_version_info",
    "1 for the served version of each index",
    ["index", "version", "fingerprint"],
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "crossprobe_batch_size",
    "Queries per query-tower run (micro-batching)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    registry=REGISTRY,
)
QUERY_CACHE = Counter(
    "crossprobe_query_cache_total",
    "Text queries answered from the query-vector cache (hit) or by the query tower (miss)",
    ["result"],
    registry=REGISTRY,
)
for _result in ("hit", "miss"):  # both series exist from the start (a dashboard's ratio has a denominator)
    QUERY_CACHE.labels(_result)
QUERY_CACHE_BYTES = Gauge(
    "crossprobe_query_cache_bytes", "Bytes of query vectors the query-vector cache holds", registry=REGISTRY
)
IN_FLIGHT = Gauge("crossprobe_searches_in_flight", "Searches admitted and not yet answered", registry=REGISTRY)
RELOADS = Counter(
    "crossprobe_reloads", "Index version switches and failed attempts", ["index", "outcome"], registry=REGISTRY
)
# the feature store (Redis) and its circuit breaker (service/breaker.py)
FEATURE_STORE_UP = Gauge(
    "crossprobe_feature_store_up",
    "1 while the feature store (Redis) is usable (circuit closed); 0 while the breaker is open or half-open",
    registry=REGISTRY,
)
FEATURE_STORE_ERRORS = Counter(
    "crossprobe_feature_store_errors",
    "Redis calls that failed to reach Redis, by kind (timeout | connection), after redis-py's retries",
    ["kind"],
    registry=REGISTRY,
)
FEATURE_STORE_SKIPPED = Counter(
    "crossprobe_feature_store_skipped",
    "Redis calls skipped at once because the circuit was open, by operation (fetch | metadata | item | ...)",
    ["op"],
    registry=REGISTRY,
)
FEATURE_STORE_TRANSITIONS = Counter(
    "crossprobe_feature_store_breaker_transitions",
    "Circuit breaker state changes, by the state entered (open | half_open | closed)",
    ["to"],
    registry=REGISTRY,
)

# -- by rerank mode (the request's mode: a degraded search that skipped its rerank keeps the mode it asked for) --
RERANK_MODES = ("cp", "temde", "none")  # settings.Rerank
# pipeline/stages.py; fetch + rerank: not none. decode_image / encode_image: image queries; like: stored vectors;
# filter:
# the metadata bitmap (the first filtered search of a version also reads its metadata); dedup; keyword and
# highlight: modes hybrid and keyword (hybrid.py)
SEARCH_STAGES = (
    "queue",
    "encode",
    "decode_image",
    "encode_image",
    "like",
    "filter",
    "ann",
    "keyword",
    "fetch",
    "rerank",
    "dedup",
    "metadata",
    "highlight",
)
DEGRADED_REASONS = (
    "feature_store_unavailable",
    "features_missing",
    "fetch_failed",
    "metadata_failed",
    "keyword_failed",
)  # pipeline/stages.py
SEARCH_SECONDS = Histogram(
    "crossprobe_search_seconds",
    "Search latency inside the service (the pipeline from queue to metadata: the timings_ms total) by rerank mode",
    ["rerank"],
    buckets=_BUCKETS,
    registry=REGISTRY,
)
SEARCH_STAGE_SECONDS = Histogram(
    "crossprobe_search_stage_seconds",
    "Time per search stage (queue, encode, ann, fetch, rerank, metadata) by rerank mode",
    ["stage", "rerank"],
    buckets=_BUCKETS,
    registry=REGISTRY,
)
DEGRADED = Counter(
    "crossprobe_degraded_answers",
    "Searches answered degraded (part of the path skipped), by rerank "
    "mode and reason code; an answer with two reasons counts once under each",
    ["rerank", "reason"],
    registry=REGISTRY,
)
INDEXES_SERVED = Gauge(
    "crossprobe_indexes_served", "Indexes with a served version (0: /readyz says not ready)", registry=REGISTRY
)
# the rate limit (security.py); label `endpoint` as crossprobe_requests_total's, so the two divide in PromQL
RATE_LIMITED_ROUTES = ("/v1/search", "/v1/search/image", "/v1/explain", "/knn-service")  # the routes with a rate limit
RATE_LIMITED = Counter(
    "crossprobe_rate_limited",
    "Requests refused by the per-key / per-client rate limit (429 rate_limited), by route template",
    ["endpoint"],
    registry=REGISTRY,
)

# Every known label combination exists from the start at 0 (Prometheus' advice for labelled metrics): a rate
# over a series that appeared mid-window misses its first increments, and a panel or alert over "no series"
# says "no data" instead of 0.
for _mode in RERANK_MODES:
    SEARCH_SECONDS.labels(_mode)
    for _stage in SEARCH_STAGES:
        if _mode != "none" or _stage not in ("fetch", "rerank"):  # none never fetches features nor reranks
            SEARCH_STAGE_SECONDS.labels(_stage, _mode)
    for _reason in DEGRADED_REASONS:
        DEGRADED.labels(_mode, _reason)
for _route in RATE_LIMITED_ROUTES:
    RATE_LIMITED.labels(_route)

_served: dict[str, tuple[str, str]] = {}  # index -> (version, fingerprint) currently exported as info


def observe_stages(timings_ms: dict[str, float], rerank: str | None = None, degraded: tuple[str, ...] = ()) -> None:
    """One answer's stage timings. rerank: the mode a search ran with (labels crossprobe_search_* and its
    degraded reasons); None for callers that are not searches (the explain route's explain_* stages)."""
    for stage, ms in timings_ms.items():
        if stage == "total":
            if rerank is not None:
                SEARCH_SECONDS.labels(rerank).observe(ms / 1000.0)
            continue
        STAGE_SECONDS.labels(stage).observe(ms / 1000.0)
        if rerank is not None:
            SEARCH_STAGE_SECONDS.labels(stage, rerank).observe(ms / 1000.0)
    for code in degraded:
        DEGRADED.labels(rerank or "unknown", code).inc()


def observe_request(endpoint: str, status: int, seconds: float) -> None:
    REQUEST_SECONDS.labels(endpoint, str(status)).observe(seconds)
    REQUESTS.labels(endpoint, str(status)).inc()


def error(kind: str) -> None:
    ERRORS.labels(kind).inc()


def rate_limited(endpoint: str) -> None:
    RATE_LIMITED.labels(endpoint).inc()


def index_served(name: str, version: str, fingerprint: str, items: int) -> None:
    """A new version of `name` is live: move the info gauge's labels, set the item count."""
    old = _served.get(name)
    if old and old != (version, fingerprint):
        try:
            INDEX_VERSION.remove(name, *old)
        except KeyError:
            pass
    _served[name] = (version, fingerprint)
    INDEX_VERSION.labels(name, version, fingerprint).set(1)
    INDEX_ITEMS.labels(name).set(items)
    INDEXES_SERVED.set(len(_served))


def index_dropped(name: str) -> None:
    """`name` is no longer served (it was dropped): its gauges go."""
    old = _served.pop(name, None)
    if old:
        try:
            INDEX_VERSION.remove(name, *old)
            INDEX_ITEMS.remove(name)
        except KeyError:
            pass
    INDEXES_SERVED.set(len(_served))


def render() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


# ---- the middleware that times every request ------------------------------------------------------------
class MetricsMiddleware:
    """Latency and count per route template and status (templates, not raw paths: bounded label values)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if scope.get(TIMED_OUT_SCOPE_KEY):  # the body's deadline passed: the protocol answered 408 itself
                status = 408
            observe_request(_route_template(scope), status, time.perf_counter() - start)


def _route_template(scope) -> str:
    route = scope.get("route")
    if route is None:  # no route chosen yet (BodyGuard's 413 / 422, a 408): look for one that matches fully
        route = _full_match(getattr(getattr(scope.get("app"), "router", None), "routes", ()), scope)
    return getattr(route, "path", None) or "unmatched"


def _full_match(routes, scope):
    for r in routes:
        # FastAPI 0.16x keeps an included router as one entry (an _IncludedRouter, with no path of its own):
        # without this descent every answer given before routing was counted as "unmatched"
        inner = getattr(r, "original_router", None)
        if inner is not None:
            found = _full_match(inner.routes, scope)
            if found is not None:
                return found
        elif r.matches(scope)[0] == Match.FULL:
            return r
    return None
