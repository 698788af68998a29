"""What one search runs: the Plan, built from the request model in one call (Plan.from_request).

The request models (schemas.py: SearchRequest, the upload's ImageSearchParams) are validated by FastAPI; a plan
takes the fields it shares with them BY NAME, so a field is written once in the model and once here, and
what a route must translate (an upload's bytes, a filter sent as JSON text, clip_back's options) it passes
as keywords. The server's defaults are filled in here, and what the schema cannot know: what the served model
offers (its trained rerankers, its calibration curves).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
from pydantic import BaseModel

from crossprobe.service import hybrid, query_image
from crossprobe.service.exceptions import InvalidRequest, NoReranker
from crossprobe.service.scope import EVERY, Scope
from crossprobe.service.settings import MAX_SHORTLIST, Settings


@dataclass(frozen=True)
class Plan:
    """Built once (from_request), never changed: what depends on the index searched (the mode, and the reranker
    that follows from it) makes a new plan (on_index). The rerank decision is this module's alone."""

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
    rerank_skipped: str | None = None  # why rerank is "none" when another was wanted (no text, not trained)
    offset: int = 0  # the page: ranked results skipped before the k returned
    sort: str = "relevance"  # relevance | date_taken | -date_taken | date_added | -date_added (stage sort)
    min_relevance: float | None = None  # drop results whose calibrated relevance is lower (text queries only)
    mode: str | None = None  # hybrid | vector | keyword: as requested (None: the default); on_index: as it runs
    mode_note: str | None = None  # why the mode that ran differs from the one asked for
    scope: Scope = EVERY  # the indexes the caller's key may read (scope.py): `index` is looked up within it

    @property
    def kind(self) -> str:
        """text | image | like | embedding, joined by "+" when a text and a vector are combined."""
        parts = [
            name
            for name, on in (
                ("text", self.query is not None),
                ("image", self.image is not None),
                ("like", bool(self.like)),
                ("embedding", self.embedding is not None),
            )
            if on
        ]
        return "+".join(parts)

    def on_index(self, has_keywords: bool) -> "Plan":
        """This plan on an index with (or without) a keyword index: the mode that runs there (hybrid.resolve), and
        no reranker under mode keyword (BM25 alone ranks)."""
        mode, note = hybrid.resolve(self.mode, self.query is not None, has_keywords)
        rerank, skipped = self.rerank, self.rerank_skipped
        if mode == "keyword" and rerank != "none":
            rerank, skipped = "none", "mode keyword ranks by the keyword index's BM25 alone"
        return replace(self, mode=mode, mode_note=note, rerank=rerank, rerank_skipped=skipped)

    @classmethod
    def from_request(cls, req: BaseModel | None, settings: Settings, model: Any, **given: Any) -> "Plan":
        """The plan of a request: `req`'s fields that are the plan's (same name, same meaning), then `given`
        (the route's translations; they win), then the server's defaults. `image` may still be base64 text
        (SearchRequest's): decoded here (422 invalid_image, 413 too_large). Validation already happened in the
        request model; what it cannot know is the served model's (a Backend: its `rerankers`, its `calibration`):
        a reranker it lacks, named, is a 422 reranker_unavailable; the server's default it lacks runs "none",
        said in rerank_skipped; min_relevance without calibration is a 422."""
        names = {f.name for f in fields(cls)}
        values = {n: getattr(req, n) for n in type(req).model_fields if n in names} if req is not None else {}
        values.update(given)
        values.setdefault("query", None)
        like = values.get("like") or []
        values["like"] = list(dict.fromkeys([like] if isinstance(like, str) else like))
        if isinstance(values.get("image"), str):
            values["image"] = query_image.b64_bytes(values["image"], settings.query_image_max_bytes)
        # (a text alone is SearchRequest's rule; what the schema cannot know is whether this model has curves)
        if values.get("min_relevance") is not None and model.calibration is None:
            raise InvalidRequest(
                f"invalid request: min_relevance: this server's model ({served(settings, model)}) "
                f"has no relevance calibration (a crossprobe checkpoint's calibration.json, made by "
                f"research/calibration/fit.py); results carry no relevance: use min_score"
            )
        values["rerank"], values["rerank_skipped"] = _reranker(
            values.get("rerank"), values["query"] is not None, settings, model
        )
        if values.get("shortlist") is None:
            values["shortlist"] = min(
                max(settings.default_shortlist, values["k"] + values.get("tail", 0)), MAX_SHORTLIST
            )
        return cls(**values)


def _reranker(asked: str | None, has_text: bool, settings: Settings, model: Any) -> tuple[str, str | None]:
    """(the reranker that runs, why it is "none" when another was wanted). A reranker the model has no trained head
    for: named by the request, a 422 (the client asked for something this server cannot do); the server's
    default, "none" with the reason (a two-tower model serves every search that does not insist)."""
    if asked not in (None, "none") and asked not in model.rerankers:
        have = ", ".join(model.rerankers) or "none: two-tower only"
        raise NoReranker(
            f"rerank {asked}: this server's model ({served(settings, model)}) has no trained {asked} "
            f'reranker (it has: {have}); send rerank "none" or leave rerank out to rank by the '
            f"two-tower score, or serve a model with trained heads (crossprobe train --backbone SPEC)",
            {"rerank": asked, "rerankers": list(model.rerankers)},
        )
    rerank = asked or default_rerank(settings, model)
    if asked is None and rerank != settings.default_rerank:
        return "none", (
            f"the server's default reranker {settings.default_rerank} is not trained for this model "
            f"({served(settings, model)}: {', '.join(model.rerankers) or 'two-tower only'}); "
            f"ranked by the two-tower score"
        )
    if not has_text and rerank != "none":  # nothing to rerank with: the rerankers score a text
        return "none", (
            f"rerank {rerank} needs a text query; a query without one ranks by the ANN cosine of its "
            f'vector (send "query" too to rerank)'
        )
    return rerank, None


def default_rerank(settings: Settings, model: Any) -> str:
    """The reranker a request that names none gets: the server's default where this model has it, else "none"."""
    return settings.default_rerank if settings.default_rerank in model.rerankers else "none"


def served(settings: Settings, model: Any) -> str:
    """The served model in words: its spec and fingerprint."""
    return f"{settings.model_spec} {model.fingerprint}"
