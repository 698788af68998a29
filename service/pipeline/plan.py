"""What one search runs: the Plan, built from the request model in one call (Plan.from_request).

The request models (schemas.py: SearchRequest, the upload's ImageSearchParams) are validated by FastAPI; a plan
takes the fields it shares with them BY NAME, so a field is written once in the model and once here, and
what a route must translate (an upload's bytes, a filter sent as JSON text, clip_back's options) it passes
as keywords. The server's defaults are filled in here, and what the schema cannot know (whether this
checkpoint has calibration curves).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from pydantic import BaseModel

from crossprobe.service import query_image
from crossprobe.service.exceptions import InvalidRequest
from crossprobe.service.scope import EVERY, Scope
from crossprobe.service.settings import MAX_SHORTLIST, Settings


@dataclass
class Plan:
    query: str | None
    k: int
    rerank: str  # cp | temde | none
    shortlist: int
    index: str | None = None
    min_score: float | None = None
    tail: int = 0  # ranked ids to return after the first k, without metadata (clip-retrieval's num_result_ids)
    image: bytes | None = None  # an image file's bytes (decoded in the decode_image stage)
    like: list[str] = field(default_factory=list)  # item ids: their stored vectors, averaged; excluded from results
    embedding: np.ndarray | None = None  # a raw query vector (d,) (clip-retrieval's embedding_input)
    weight: float = 0.5  # the vector part's weight beside a text: (1 - w) g_q + w v, renormalised
    dedup: float | None = None  # drop results with cosine >= this to a result ranked above them
    facets: bool = False  # count items per tag among those passing the filter (stage facets)
    filter: object | None = None  # filter_model.FilterNode: only rows whose metadata passes (filter_columns.py)
    rerank_skipped: str | None = None  # why rerank is "none" when the request asked for another (no text)
    offset: int = 0  # the page: ranked results skipped before the k returned
    sort: str = "relevance"  # relevance | date_taken | -date_taken | date_added | -date_added (stage sort)
    min_relevance: float | None = None  # drop results whose calibrated relevance is lower (text queries only)
    mode: str | None = None  # hybrid | vector | keyword: as requested (None: the default), then as run (hybrid.py)
    mode_note: str | None = None  # why the mode that ran differs from the one asked for
    scope: Scope = EVERY  # the indexes the caller's key may read (scope.py): `index` is looked up within it

    @property
    def kind(self) -> str:
        """text | image | like | embedding, joined by "+" when a text and a vector are combined."""
        parts = [name for name, on in (("text", self.query is not None), ("image", self.image is not None),
                                       ("like", bool(self.like)), ("embedding", self.embedding is not None)) if on]
        return "+".join(parts)

    @classmethod
    def from_request(cls, req: BaseModel | None, settings: Settings, calibration: Any, **given: Any) -> "Plan":
        """The plan of a request: `req`'s fields that are the plan's (same name, same meaning), then `given`
        (the route's translations; they win), then the server's defaults. `image` may still be base64 text
        (SearchRequest's): decoded here (422 invalid_image, 413 too_large). Validation already happened in the
        request model; calibration: the checkpoint's curves (None: it has none, so min_relevance is a 422)."""
        names = {f.name for f in fields(cls)}
        values = {n: getattr(req, n) for n in type(req).model_fields if n in names} if req is not None else {}
        values.update(given)
        values.setdefault("query", None)
        like = values.get("like") or []
        values["like"] = list(dict.fromkeys([like] if isinstance(like, str) else like))
        if isinstance(values.get("image"), str):
            values["image"] = query_image.b64_bytes(values["image"], settings.query_image_max_bytes)
        # (a text alone is SearchRequest's rule; what the schema cannot know is whether this checkpoint has curves)
        if values.get("min_relevance") is not None and calibration is None:
            raise InvalidRequest("invalid request: min_relevance: this server's checkpoint has no "
                                 "calibration.json (research/calibration/fit.py makes one)")
        rerank = values.get("rerank") or settings.default_rerank
        if values["query"] is None and rerank != "none":  # nothing to rerank with: the rerankers score a text
            values["rerank_skipped"] = (f"rerank {rerank} needs a text query; a query without one ranks by the ANN "
                                        f"cosine of its vector (send \"query\" too to rerank)")
            rerank = "none"
        values["rerank"] = rerank
        if values.get("shortlist") is None:
            values["shortlist"] = min(max(settings.default_shortlist, values["k"] + values.get("tail", 0)),
                                      MAX_SHORTLIST)
        return cls(**values)
