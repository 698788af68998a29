"""What every route shares: the route groups by who may call them, the service state as a dependency, running a
search under admission control, reading metadata through the circuit breaker, and the timing / degraded headers.

Route groups (security.py: the group's dependency checks its key first): QUERY routes run the query tower
(a search key when keys are set, and a rate-limit token), SEARCH routes read indexes and items (a search key),
ADMIN routes need the admin key; OPEN routes (health, readiness, the page) need nothing, and /metrics takes
its own optional key.

Dependencies are declared as route parameters. `state: Service` is the service state, loading or ready. A route
that needs it loaded gets its input through a dependency of its own (routes/*.py) that calls ready(state) AFTER
the route's parameters and body are validated: bad input is a 422 even while the service loads, and a valid
request is 503 not_ready until it has loaded. (A dependency that checked readiness by itself would run before
FastAPI validates the route's own parameters, and answer 503 to bad input.)
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Depends, Request

from crossprobe.service import metrics, security
from crossprobe.service.pipeline import Outcome, Plan
from crossprobe.service.scope import Scope
from crossprobe.service.state import ServiceState

# APIRouter's keywords for each group (APIRouter(**QUERY)): Any, since the values are of different types
QUERY: dict[str, Any] = dict(dependencies=security.QUERY, responses=security.QUERY_RESPONSES)
SEARCH: dict[str, Any] = dict(dependencies=security.SEARCH, responses=security.SEARCH_RESPONSES)
ADMIN: dict[str, Any] = dict(dependencies=security.ADMIN, responses=security.ADMIN_RESPONSES)


def service_state(request: Request) -> ServiceState:
    return request.app.state.svc


Service = Annotated[ServiceState, Depends(service_state)]


async def key_scope(caller: Annotated[security.Caller, Depends(security.search_client)]) -> Scope:
    """The indexes the request's search key may read (every index without keys): every SEARCH / QUERY route that
    names or defaults to an index, or lists them, looks them up within it (registry.get(..., scope=),
    Scope.visible). search_client already ran for the route group: FastAPI hands back its cached answer."""
    return caller.scope


KeyScope = Annotated[Scope, Depends(key_scope)]


def ready(state: ServiceState) -> ServiceState:
    """The state once models, indexes and the warm-up are done; before: 503 not_ready (with Retry-After)."""
    state.require_ready()
    return state


def server_timing(timings_ms: dict[str, float]) -> str:
    return ", ".join(f"{k};dur={v:.3f}" for k, v in timings_ms.items())


# Response header on degraded answers: the degraded codes, comma separated (e.g. feature_store_unavailable).
# A header because /knn-service must keep clip_back's body (a bare list); /v1/search sends it too.
DEGRADED_HEADER = "X-Crossprobe-Degraded"


def degraded_headers(out: Outcome) -> dict[str, str]:
    return {DEGRADED_HEADER: ",".join(out.degraded_codes)} if out.degraded else {}


async def run_search(state: ServiceState, plan: Plan) -> Outcome:
    """Admission control around one search: 429 overloaded at once when the queue is full. Readiness was checked
    once, by the dependency that made the plan (only a ready service's searcher makes one)."""
    with state.limiter.admit():
        out = await state.loaded_searcher.search(plan)
    ran = out.plan or plan
    # labelled by the mode the search ran with (crossprobe_search_*{rerank}); warm-up searches never come here
    metrics.observe_stages(out.timings_ms, rerank=ran.rerank, degraded=tuple(out.degraded_codes))
    if out.degraded:
        metrics.error("degraded")
    return out


async def read_metadata(state: ServiceState, handle, ids: list[str], op: str) -> list[dict | None]:
    """One MGET of metadata through the breaker; Redis down -> 503 feature_store_unavailable (at once while
    the breaker is open). Off the event loop: even a bounded Redis wait must not stall other requests."""
    return await asyncio.to_thread(state.feature_store.call, op, handle.reader.metadata, ids)
