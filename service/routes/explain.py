"""POST /v1/explain: where the Cross-probe reranker looked in each image for a query."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Response

from crossprobe.core.inference.explain import EXPLAIN_MODES
from crossprobe.service import metrics
from crossprobe.service.deps import QUERY, KeyScope, Service, read_metadata, ready, server_timing
from crossprobe.service.exceptions import ItemNotFound, NoExplainMaps
from crossprobe.service.schemas import POST_ROUTE, ExplainRequest, ExplainResponse, IndexRef, error_responses

router = APIRouter(**QUERY)


async def explain_request(body: ExplainRequest, state: Service) -> ExplainRequest:
    """The body validated, then the service ready (bad input is a 422 even while it loads)."""
    ready(state)
    if not state.explain_offered:  # before any work: the query tower, the metadata
        models = state.loaded_models
        raise NoExplainMaps(
            f"this server's model ({state.settings.model_spec} {models.fingerprint}) has no "
            f"explain maps: they show where crossprobe's own Cross-probe reranker looks, and this "
            f"model has {', '.join(models.rerankers) or 'no trained reranker'}",
            {"model": str(state.settings.model_spec)},
        )
    return body


@router.post(
    "/v1/explain",
    response_model=ExplainResponse,
    responses=error_responses(
        404,
        503,
        *POST_ROUTE,
        s422="invalid_request: the body fails validation; "
        "explain_unavailable: the served model has no explain maps (GET /v1/indexes: "
        "model.explain)",
    ),
)
async def explain(
    body: Annotated[ExplainRequest, Depends(explain_request)], state: Service, scope: KeyScope, response: Response
) -> ExplainResponse:
    """Where the Cross-probe reranker looked in each image for this query: a 7x7 weight map per id (sums to 1).

    The grid is not stored, so each image is decoded and run through the image backbone again (explainer.py;
    the graphs load on the first call). Unknown index or id: 404; more than MAX_EXPLAIN_IDS ids: 422; a model
    without explain maps (a family model): 422 explain_unavailable. An id whose
    file is gone gets no map and a reason under `unavailable`, so one missing file does not hide the others."""
    handle = state.loaded_registry.get(body.index, scope=scope)
    ids = list(dict.fromkeys(body.ids))
    unknown = [i for i in ids if i not in handle.ids]
    if unknown:
        raise ItemNotFound(
            f"{len(unknown)} of the ids are not in {handle.name}/{handle.version}: {unknown[:5]}", {"ids": unknown}
        )
    t0 = time.perf_counter()
    loop = asyncio.get_running_loop()
    # the same admission queue as searches, and the photo decodes' own (thumbnails share it): an explain decodes
    # each id's photo and runs the backbone over it
    with state.limiter.admit(), state.decoders.admit():
        q, info = await state.loaded_batcher.submit(body.query)
        # a model with explain maps (explain_request checked) is a Cross-probe one: its queries have text probes
        assert q.p_t is not None, "a model with explain maps encodes text probes"
        t = time.perf_counter()
        metas = await read_metadata(state, handle, ids, "explain")
        metadata_ms = (time.perf_counter() - t) * 1000
        loading = not state.explainer_loaded
        t = time.perf_counter()
        explainer = await loop.run_in_executor(state.pool, state.explainer)
        load_ms = (time.perf_counter() - t) * 1000
        res = await loop.run_in_executor(state.pool, explainer.explain, handle, ids, metas, q.p_t, q.q_cls)
    timings = {
        "queue": info.queue_ms,
        "encode": info.encode_ms,
        "metadata": metadata_ms,
        # the first explain of a process loads (or exports) the graphs: said, so the total adds up
        **({"load": load_ms} if loading else {}),
        **res.timings_ms,
    }
    # own stage names in crossprobe_stage_seconds: explain traffic must not move the search stages' percentiles
    metrics.observe_stages({f"explain_{k}": v for k, v in timings.items()})
    timings = {k: round(v, 3) for k, v in {**timings, "total": (time.perf_counter() - t0) * 1000}.items()}
    response.headers["Server-Timing"] = server_timing(timings)
    return ExplainResponse(
        index=IndexRef(name=handle.name, version=handle.version),
        mode=explainer.mode,
        description=EXPLAIN_MODES[explainer.mode],
        grid=explainer.grid_side,
        maps={i: np.round(m, 6).tolist() for i, m in res.maps.items()},
        probe_maps={i: np.round(m, 6).tolist() for i, m in res.probe_maps.items()},
        unavailable=res.unavailable,
        timings_ms=timings,
    )
