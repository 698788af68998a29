"""Request and response shapes of the HTTP API (/v1 and the clip-retrieval compatible routes).

/v1 requests forbid unknown fields: a misspelt "shortlsit" must fail loudly, not be
ignored. The clip-retrieval routes ignore unknown fields instead, because that
API's clients send options this service does not have.
"""
from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from crossprobe.service.settings import MAX_K, MAX_QUERY_CHARS, MAX_SHORTLIST, Rerank


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, description="text to search images for")
    k: int = Field(10, ge=1, le=MAX_K, strict=True, description="results to return")
    rerank: Rerank | None = Field(None, description="cp | temde | none (default: the server's CROSSPROBE_DEFAULT_RERANK)")
    shortlist: int | None = Field(None, ge=1, le=MAX_SHORTLIST, strict=True,
                                  description="ANN candidates to rerank, >= k (default: max(server default, k))")
    index: str | None = Field(None, min_length=1, max_length=64, description="index name (default: the server's)")
    # strict: a JSON number only (an int is fine); true / false / "1e2" are refused, not coerced
    min_score: float | None = Field(None, strict=True, allow_inf_nan=False,
                                    description="drop results whose score is lower (a JSON number)")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        return visible_or_error(v, "query")

    @model_validator(mode="after")
    def _shortlist_covers_k(self) -> "SearchRequest":
        if self.shortlist is not None and self.shortlist < self.k:
            raise ValueError(f"shortlist ({self.shortlist}) must be >= k ({self.k})")
        return self


class Scores(BaseModel):
    ann: float = Field(description="two-tower cosine g_q . g_I (the FAISS inner product)")
    rerank: float | None = Field(description="reranker logit (fused with the two-tower score); null for rerank=none")


class Hit(BaseModel):
    id: str
    score: float = Field(description="the ranking score: scores.rerank when reranked, else scores.ann")
    scores: Scores
    metadata: dict[str, Any] | None


class IndexRef(BaseModel):
    name: str
    version: str


class ModelRef(BaseModel):
    fingerprint: str
    query_precision: str  # "fp32" | "int8": which query-tower graph encoded the query


class SearchResponse(BaseModel):
    results: list[Hit]
    index: IndexRef
    model: ModelRef
    rerank: Rerank
    timings_ms: dict[str, float] = Field(description="per stage: queue, encode, ann, fetch, rerank, metadata; total")
    degraded: bool = Field(description="true when part of the path failed and a fallback answered (see reason); "
                           "also said by the X-Crossprobe-Degraded header (the codes)")
    degraded_reason: str | None = Field(None, description="'code: message' per skipped part, '; ' separated; codes: "
                                        "feature_store_unavailable (Redis down: ANN order, no metadata), "
                                        "features_missing, fetch_failed, metadata_failed")


# /v1/explain: the page explains the results it shows (at most its largest k); each id costs a decode and a
# backbone run (~20 ms of CPU), so a request is bounded like a search's k is
MAX_EXPLAIN_IDS = 32
ItemId = Annotated[str, Field(min_length=1, max_length=1024)]


class ExplainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, description="the query the maps are for")
    ids: list[ItemId] = Field(..., min_length=1, max_length=MAX_EXPLAIN_IDS,
                              description=f"item ids of the index (1 to {MAX_EXPLAIN_IDS}; repeats count once)")
    index: str | None = Field(None, min_length=1, max_length=64, description="index name (default: the server's)")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        return visible_or_error(v, "query")


class ExplainResponse(BaseModel):
    index: IndexRef
    mode: Literal["query", "probes"] = Field(description="query: query-dependent maps (text probes -> vision "
                                             "probes -> regions); probes: the image's probes averaged")
    description: str = Field(description="what the maps show, in words")
    grid: int = Field(description="maps are grid x grid, row-major from the image's top-left")
    maps: dict[str, list[list[float]]] = Field(description="id -> grid x grid weights, >= 0, summing to 1")
    probe_maps: dict[str, list[list[float]]] = Field(description="id -> the query-independent map (the image's "
                                                     "vision probes over the regions, averaged), summing to 1")
    unavailable: dict[str, str] = Field(description="id -> why it has no map (its file is gone or unreadable)")
    timings_ms: dict[str, float] = Field(description="queue, encode, metadata, decode, backbone, attention; total; "
                                              "load on the process's first explain (the graphs are loaded then)")


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorResponse(BaseModel):
    error: ErrorBody


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (401, 403, 404, 422, 429, 503)
}


# Characters that draw nothing: control (NUL...), format (zero-width space / joiners, BOM, bidi marks, soft
# hyphen), unassigned / private / surrogate, every separator; plus the "blank" letters and symbols that Unicode
# classifies as visible (Hangul fillers, braille blank). A query made only of these is blank: the tokenizer
# would see nothing (or [UNK]s) and the search would rank images by noise.
_INVISIBLE_CATEGORIES = {"Cc", "Cf", "Cn", "Co", "Cs", "Zs", "Zl", "Zp"}
_BLANK_CHARS = {"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800"}


def is_invisible(text: str) -> bool:
    return all(ch in _BLANK_CHARS or unicodedata.category(ch) in _INVISIBLE_CATEGORIES for ch in text)


def visible_or_error(text: str, what: str) -> str:
    if is_invisible(text):
        raise ValueError(f"{what} is blank (only whitespace, control or invisible characters)")
    return text


# ---- clip-retrieval (rom1504/clip-retrieval clip_back) ----------------------------
class KnnRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str | None = Field(None, max_length=MAX_QUERY_CHARS)
    image: str | None = None  # base64 image: refused until image queries exist
    image_url: str | None = None
    embedding_input: list[float] | None = None
    modality: Literal["image", "text"] = "image"  # which index to search: images (text -> image search)
    num_images: int = Field(40, ge=1)  # results with metadata; clamped to MAX_K
    num_result_ids: int | None = Field(None, ge=1)  # ranked ids returned (metadata only for the first num_images)
    indice_name: str | None = Field(None, max_length=64)
    use_mclip: bool = False
    deduplicate: bool = True  # accepted; an index holds one entry per id already
    use_safety_model: bool = False  # accepted, not applied (no safety model here)
    use_violence_detector: bool = False  # accepted, not applied
    aesthetic_score: str | int | None = ""  # accepted, not applied
    aesthetic_weight: str | float | None = ""


class MetadataRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ids: list[str | int] = Field(..., max_length=MAX_SHORTLIST)
    indice_name: str | None = Field(None, max_length=64)
