"""What every route shares: the route groups by who may call them, the service state, running a search
under admission control, reading metadata through the circuit breaker, and the timing / degraded headers.

Route groups (security.py: the group's dependency checks its key first): QUERY routes run the query tower
(a search key when keys are set, and a rate-limit token), SEARCH routes read indexes and items (a search key),
ADMIN routes need the admin key; OPEN routes (health, readiness, the page) need nothing, and /metrics takes
its own optional key.
"""
from __future__ import annotations

import asyncio

from fastapi import Request

from crossprobe.service import metrics, security
from crossprobe.service.pipeline import Outcome
from crossprobe.service.state import ServiceState

QUERY = dict(dependencies=security.QUERY, responses=security.QUERY_RESPONSES)
SEARCH = dict(dependencies=security.SEARCH, responses=security.SEARCH_RESPONSES)
ADMIN = dict(dependencies=security.ADMIN, responses=security.ADMIN_RESPONSES)


def svc(request: Request) -> ServiceState:
    return request.app.state.svc


def server_timing(timings_ms: dict[str, float]) -> str:
    return ", ".join(f"{k};dur={v:.3f}" for k, v in timings_ms.items())


# Response header on degraded answers: the degraded codes, comma separated (e.g. feature_store_unavailable).
# A header because /knn-service must keep clip_back's body (a bare list); /v1/search sends it too.
DEGRADED_HEADER = "X-Crossprobe-Degraded"


def degraded_headers(out: Outcome) -> dict[str, str]:
    return {DEGRADED_HEADER: ",".join(out.degraded_codes)} if out.degraded else {}


async def run_search(state: ServiceState, plan) -> Outcome:
    """Admission control around one search: 429 overloaded at once when the queue is full."""
    state.require_ready()
    with state.limiter.admit():
        out = await state.searcher.search(plan)
    # labelled by the mode the search ran with (crossprobe_search_*{rerank}); warm-up searches never come here
    metrics.observe_stages(out.timings_ms, rerank=plan.rerank, degraded=tuple(out.degraded_codes))
    if out.degraded:
        metrics.error("degraded")
    return out


async def read_metadata(state: ServiceState, handle, ids: list[str], op: str) -> list[dict | None]:
    """One MGET of metadata through the breaker; Redis down -> 503 feature_store_unavailable (at once while
    the breaker is open). Off the event loop: even a bounded Redis wait must not stall other requests."""
    return await asyncio.to_thread(state.feature_store.call, op, handle.reader.metadata, ids)
