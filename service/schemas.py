"""Request and response shapes of the HTTP API (/v1 and the clip-retrieval compatible routes).

/v1 requests forbid unknown fields: a misspelt "shortlsit" must fail loudly, not be
ignored. The clip-retrieval routes ignore unknown fields instead, because that
API's clients send options this service does not have.

The OpenAPI document (/openapi.json) says what each route answers: every error status with the error JSON
(error_responses below), and two rules JSON Schema cannot state exactly, written as:
  format "visible-text"  a query must hold at least one visible character: only whitespace, control, zero-width,
                         private-use or other invisible characters is "blank", 422 (is_invisible below says which
                         Unicode categories; an exact pattern would be a character class of some 700 Unicode
                         ranges). Declared by QueryText on every query text, JSON field or query parameter alike
  x-constraints          cross-field rules, e.g. /v1/search's "shortlist >= k" (422 when broken)
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from crossprobe.service.hybrid import Mode
from crossprobe.service.settings import MAX_K, MAX_LIKE, MAX_QUERY_CHARS, MAX_SHORTLIST, Rerank
from crossprobe.storage.filter_model import MAX_FILTER_CONDITIONS, FilterNode, count_conditions


def _integral(v: Any) -> Any:
    """An integer field's value: JSON Schema's "integer" includes 2.0 (a number with a zero fraction;
    schemathesis sends such values, and so do encoders that write every number as a float), which a strict int
    refused: 2.0 counts as 2. Everything else stays strict: 2.5, true and "2" are 422. Used as a mode="before"
    field validator, not as an Annotated BeforeValidator: with one of those inside `int | None`, pydantic
    writes the field's bounds into the JSON schema as "ge" / "le" (not JSON Schema), so clients (and
    schemathesis) saw no bounds at all."""
    if isinstance(v, list):
        return [_integral(x) for x in v]
    return int(v) if isinstance(v, float) and v.is_integer() else v


ItemId = Annotated[str, Field(min_length=1, max_length=1024)]
ItemIdOrIds = ItemId | Annotated[list[ItemId], Field(min_length=1, max_length=MAX_LIKE)]

# ---- query texts: one rule and one type for every route that takes a text, as a JSON field or a query parameter
# Visible: a character whose Unicode general category is a letter (L*), mark (M*), number (N*), punctuation (P*) or
# symbol (S*), other than the "blank" letters and symbols below. Invisible: control (Cc: NUL...), format (Cf:
# zero-width space / joiners, BOM, bidi marks, soft hyphen, tag characters), unassigned (Cn, by the server's Unicode
# database: Python 3.11's is Unicode 14.0), private use (Co), surrogate (Cs), every separator (Zs, Zl, Zp); plus the
# blank letters and symbols that Unicode classifies as visible (Hangul fillers, braille blank). A query made only of
# invisible characters is blank, 422: the tokenizer would see nothing (or [UNK]s) and the search would rank images
# by noise. Private use is invisible (issue 36): a private-use code point has no standard glyph or meaning, only
# what one application's font gives it (icon fonts), and the text tower never sees it: MiniLM's tokenizer
# (BertNormalizer clean_text) deletes every one, U+E000..U+F8FF and planes 15-16, so the query reaches the model
# empty (tests/service/test_schemas.py checks this).
_INVISIBLE_CATEGORIES = {"Cc", "Cf", "Cn", "Co", "Cs", "Zs", "Zl", "Zp"}
_BLANK_CHARS = {"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800"}


def is_invisible(text: str) -> bool:
    return all(ch in _BLANK_CHARS or unicodedata.category(ch) in _INVISIBLE_CATEGORIES for ch in text)


def visible_or_error(text: str, what: str) -> str:
    if is_invisible(text):
        raise ValueError(f"{what} is blank (only whitespace, control or invisible characters)")
    return text


def _visible_query(text: str) -> str:
    return visible_or_error(text, "query")


# the format of query texts in the OpenAPI document (see the module's docstring), and what it means, in every
# query text's description
VISIBLE_TEXT = {"format": "visible-text"}
VISIBLE_TEXT_HELP = (
    "at least one visible character, i.e. one outside the Unicode categories "
    f"{', '.join(sorted(_INVISIBLE_CATEGORIES))} (control, format / zero-width, unassigned, private "
    "use, surrogate, separators) and not a blank filler ("
    f"{', '.join(f'U+{ord(c):04X}' for c in sorted(_BLANK_CHARS))}); a text of only such "
    "characters is blank: 422"
)
# A query text, the same wherever a route takes one (/v1/search's and /v1/explain's "query", /v1/search/image's
# `query` parameter; /knn-service's "text" is documented from it): 1 to MAX_QUERY_CHARS characters, format
# visible-text in the document, blank: 422 "query is blank" (each use adds VISIBLE_TEXT_HELP to its description)
QueryText = Annotated[
    str, Field(min_length=1, max_length=MAX_QUERY_CHARS, json_schema_extra=VISIBLE_TEXT), AfterValidator(_visible_query)
]


# ---- metadata filters: the condition tree is the storage layer's (crossprobe.storage.filter_model) -----
MAX_FACETS = 50  # tags in a facets answer

# ---- keyword and hybrid search (service/hybrid.py) ----------------------------------------------------------------
MODE_HELP = (
    "hybrid (the default where the index has a keyword index and the request a query text): the keyword "
    "index's best matches (file name, caption, tags, the words read in the image, the manifest's text "
    "fields; BM25) join the vector shortlist, are reranked with it, and the two orders are fused; vector: "
    "vectors only; keyword: the keyword index alone (needs a query with a word that is not a stop word, "
    'else 422). Words are ORed; a "quoted phrase" must appear as written'
)


# ---- pages and order ---------------------------------------------------------------------------------------------
Sort = Literal["relevance", "date_taken", "-date_taken", "date_added", "-date_added"]
SORT_HELP = (
    "the order of the ranked results (those above min_relevance and min_score, after filter and dedup): relevance (the "
    "default); date_taken / date_added: oldest first, -date_taken / -date_added: newest first (date taken: "
    'EXIF DateTimeOriginal or the manifest\'s "taken"; date added: when the item entered the index). '
    "Items without that date come last, in relevance order"
)
OFFSET_HELP = (
    "the page: ranked results to skip before the k returned (0: the first page). Every page of the same "
    "request comes from the same ranking (the shortlist does not grow with the offset); an offset at or "
    "past `total` gives an empty page (200, next_offset null). At most "
    f"{MAX_SHORTLIST} (the largest shortlist: no search ranks more); more: 422"
)


class SearchRequest(BaseModel):
    """A search: a text (`query`), an image (`image`), indexed items (`like`), or a text with one of the other two.
    Rules that span fields, which JSON Schema cannot express (so they are listed under x-constraints); broken:
    422 invalid_request. shortlist >= k when shortlist is given (k defaults to 10); at least one of query, image,
    like; not both image and like; min_relevance only with a query alone."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "x-constraints": [
                "shortlist >= k",
                "at least one of query, image, like",
                "not both image and like",
                "min_relevance only with a query alone (no image, no like)",
                "image is a base64-encoded image file",
                "each filter condition: exactly one of eq, in or a range, with values of its field's type",
            ]
        },
    )

    query: QueryText | None = Field(None, description=f"text to search images for: {VISIBLE_TEXT_HELP}")
    image: str | None = Field(
        None,
        min_length=1,
        description="an image to search with, base64 (standard or URL-safe "
        "alphabet; a data: URL prefix is allowed): JPEG, PNG, WebP, GIF, BMP, TIFF, HEIC/HEIF, "
        "AVIF or camera RAW (DNG, CR2, NEF, ARW...: its embedded preview), at most "
        "CROSSPROBE_QUERY_IMAGE_MAX_BYTES decoded bytes and CROSSPROBE_QUERY_IMAGE_MAX_PIXELS "
        "pixels (else 413 too_large); not an image: 422 invalid_image. Ranked by the image "
        'tower\'s vector (what the index stores); alone, no reranker runs (rerank "none")',
    )
    like: ItemIdOrIds | None = Field(
        None,
        description=f"more like this: an item id of the index, or up to {MAX_LIKE} "
        "(their stored vectors averaged, renormalised); these items are not among the "
        "results; an unknown id: 404 item_not_found",
    )
    weight: float = Field(
        0.5,
        ge=0,
        le=1,
        strict=True,
        allow_inf_nan=False,
        description="with query and image (or like): the ANN query is (1 - weight) x the text's "
        "vector + weight x the image's (or the items'), renormalised. Ignored otherwise",
    )
    dedup: float | None = Field(
        None,
        gt=0,
        le=1,
        strict=True,
        allow_inf_nan=False,
        description="collapse near duplicates: drop a result whose stored vector has a "
        "cosine >= this with a result ranked above it (e.g. 0.95)",
    )
    filter: FilterNode | None = Field(
        None,
        description="only items whose metadata passes: a condition "
        '{"field", "eq" | "in" | "gt"/"gte"/"lt"/"lte"} or '
        '{"and": [...]} / {"or": [...]} of them (fields: tags, format, camera, '
        "caption, width, height, taken, and the index manifest's own fields; at most "
        f"{MAX_FILTER_CONDITIONS} conditions). Applied inside "
        "the ANN search: k results whenever k items match",
    )
    facets: bool = Field(
        False,
        strict=True,
        description="also count the items per tag among all the items that "
        f"pass the filter (all the index's items without one): the answer's facets.tags, the "
        f"{MAX_FACETS} most frequent tags",
    )
    k: int = Field(10, ge=1, le=MAX_K, strict=True, description="results to return")
    rerank: Rerank | None = Field(
        None,
        description="cp | temde | none (default: the server's "
        "CROSSPROBE_DEFAULT_RERANK); without a query text: none (see rerank_skipped). "
        "A reranker the served model has no trained head for (GET /v1/indexes: "
        "model.rerankers) is 422 reranker_unavailable; left out, such a default runs none",
    )
    shortlist: int | None = Field(
        None,
        ge=1,
        le=MAX_SHORTLIST,
        strict=True,
        description="ANN candidates to rerank; must be >= k (else 422; see "
        "x-constraints). Default: max(server default, k)",
    )
    index: str | None = Field(None, min_length=1, max_length=64, description="index name (default: the server's)")
    # strict: a JSON number only (an int is fine); true / false / "1e2" are refused, not coerced
    min_score: float | None = Field(
        None, strict=True, allow_inf_nan=False, description="drop results whose score is lower (a JSON number)"
    )
    min_relevance: float | None = Field(
        None,
        ge=0,
        le=1,
        strict=True,
        allow_inf_nan=False,
        description="drop results whose relevance (the calibrated probability that "
        "they match) is lower, e.g. 0.1: a query for something the index does not "
        "hold can return nothing. A text query alone (else 422)",
    )
    offset: int = Field(0, ge=0, le=MAX_SHORTLIST, strict=True, description=OFFSET_HELP)
    sort: Sort = Field("relevance", description=SORT_HELP)
    mode: Mode | None = Field(None, description=MODE_HELP)

    @field_validator("k", "shortlist", "offset", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        return _integral(v)

    @model_validator(mode="after")
    def _shortlist_covers_k(self) -> "SearchRequest":
        if self.shortlist is not None and self.shortlist < self.k:
            raise ValueError(f"shortlist ({self.shortlist}) must be >= k ({self.k})")
        if self.query is None and self.image is None and self.like is None:
            raise ValueError("send a query, an image or like (at least one)")
        if self.image is not None and self.like is not None:
            raise ValueError("send image or like, not both")
        if self.min_relevance is not None and (self.query is None or self.image is not None or self.like is not None):
            raise ValueError(
                "min_relevance needs a text query alone (relevance is calibrated on text queries; an "
                'image or "like" query has none)'
            )
        if self.filter is not None and count_conditions(self.filter) > MAX_FILTER_CONDITIONS:
            raise ValueError(f"filter: more than {MAX_FILTER_CONDITIONS} conditions")
        return self

    @property
    def like_ids(self) -> list[str]:
        return [] if self.like is None else [self.like] if isinstance(self.like, str) else list(self.like)


class ImageSearchParams(BaseModel):
    """POST /v1/search/image's query parameters (the body is the image itself): the same names and meanings as
    SearchRequest's fields, so one plan is built from either (pipeline/plan.py); `filter` is the filter as JSON
    text (parsed by the route: a query parameter is a string)."""

    k: int = Field(10, ge=1, le=MAX_K, description="results to return")
    query: QueryText | None = Field(None, description=f"a text to combine with the image: {VISIBLE_TEXT_HELP}")
    weight: float = Field(0.5, ge=0, le=1, description="the image's weight beside query")
    rerank: Rerank | None = Field(
        None,
        description="with query: cp | temde | none (one the served model has: "
        "GET /v1/indexes' model.rerankers, else 422 reranker_unavailable)",
    )
    index: str | None = Field(None, min_length=1, max_length=64)
    dedup: float | None = Field(None, gt=0, le=1, description="near-duplicate cosine")
    filter: str | None = Field(
        None,
        max_length=16_384,
        description="a metadata filter as JSON text, the same as "
        '/v1/search\'s "filter" (not JSON, or not such a filter: 422)',
        json_schema_extra={
            "contentMediaType": "application/json",
            "x-constraints": ["JSON text of /v1/search's filter"],
        },
    )
    offset: int = Field(0, ge=0, le=MAX_SHORTLIST, description=OFFSET_HELP)
    sort: Sort = Field("relevance", description=SORT_HELP)


class Scores(BaseModel):
    ann: float = Field(description="two-tower cosine g_q . g_I (the FAISS inner product)")
    rerank: float | None = Field(description="reranker logit (fused with the two-tower score); null for rerank=none")
    keyword: float | None = Field(
        None, description="BM25 score of a keyword match (modes hybrid and keyword); null when the item matched no word"
    )
    keyword_coverage: float | None = Field(
        None,
        description="the share of the query's words a keyword match "
        "holds, 0..1 (1 with quoted phrases: they are required); hybrid "
        "search weighs the match by it",
    )


class Highlight(BaseModel):
    field: str = Field(
        description="name (the file name), caption, tags, text (the words read in the image) or "
        "fields (the manifest's text fields)"
    )
    text: str = Field(description="the field's text as indexed")
    spans: list[list[int]] = Field(description="[start, end) character offsets of the matched words in text")


class Hit(BaseModel):
    id: str
    score: float = Field(description="the ranking score: scores.rerank when reranked, else scores.ann")
    relevance: float | None = Field(
        None,
        description="the probability that this result matches the query, "
        "calibrated per rerank mode on dev captions (0..1, comparable across modes); "
        'null for image and "like" queries, or a checkpoint without calibration',
    )
    scores: Scores
    metadata: dict[str, Any] | None
    highlights: list[Highlight] | None = Field(None, description="a keyword match's matched words, per field")


class IndexRef(BaseModel):
    name: str
    version: str


class ItemResponse(BaseModel):
    id: str
    index: IndexRef
    metadata: dict[str, Any] | None = Field(
        description="as the indexer stored it (no file path unless CROSSPROBE_EXPOSE_URI)"
    )


class IndexInfo(BaseModel):
    name: str
    version: str
    count: int = Field(description="items in the served version")
    fingerprint: str = Field(description="the fingerprint of the model the version was built with")
    model: str | None = Field(
        description="the model spec the version was built with (CROSSPROBE_MODEL's form); "
        "null for a version built before specs were recorded (a crossprobe checkpoint)"
    )
    factory: str | None = Field(description="the ANN index (FAISS factory string, or the vector engine's)")
    created: str | None = Field(description="when the version was built (ISO 8601)")
    default: bool = Field(description="the index searched when a request names none")


class QueryLimits(BaseModel):
    query_image_bytes: int = Field(description="CROSSPROBE_QUERY_IMAGE_MAX_BYTES: the largest query image, bytes")
    query_image_pixels: int = Field(description="CROSSPROBE_QUERY_IMAGE_MAX_PIXELS: the largest query image, pixels")


class ServedModel(BaseModel):
    spec: str = Field(
        description="the model this service runs (CROSSPROBE_MODEL): crossprobe:<checkpoint>, "
        "open_clip:..., hf:..., immich:..."
    )
    fingerprint: str = Field(description="its fingerprint: an index is served only when built with this one")
    rerankers: list[Literal["cp", "temde"]] = Field(
        description="the rerankers it has trained heads for; [] for a "
        "two-tower model (searches then rank by the two-tower score)"
    )
    default_rerank: Rerank = Field(
        description="the reranker a search that names none runs: the server's "
        "CROSSPROBE_DEFAULT_RERANK where the model has it, else none"
    )
    explain: bool = Field(description="POST /v1/explain has maps for this model (else 422 explain_unavailable)")
    relevance: bool = Field(description="results carry a calibrated relevance and min_relevance is accepted")


class IndexesResponse(BaseModel):
    model: ServedModel | None = Field(description="the served model and what it offers; null while it loads")
    indexes: list[IndexInfo] = Field(
        description="the served indexes the request's key may read (all of them without keys), by name"
    )
    default: str | None = Field(
        description="the index of a request that names none (for a key limited to other "
        "indexes than the server's default: its own first); null before one is served"
    )
    unavailable: dict[str, str] = Field(
        description="name -> why its active version is not served (an older one may be); the key's indexes only"
    )
    limits: QueryLimits = Field(description="what a client can check before it sends a query image")


class ModelRef(BaseModel):
    fingerprint: str
    query_precision: str  # "fp32" | "int8": which query-tower graph encoded the query


class FilterInfo(BaseModel):
    matching: int = Field(description='items of the served version that pass the filter ("like" items not counted)')
    exact: bool = Field(
        description="every matching item was considered (false only when an HNSW index returned "
        "fewer than k and more than CROSSPROBE_FILTER_EXACT_MAX items match)"
    )
    method: str = Field(
        description="faiss-idselector (FAISS searched only the matching rows) | exact-scan (their "
        "stored vectors scanned) | none-match"
    )


class KeywordInfo(BaseModel):
    words: list[str] = Field(description="the query's words looked up (lower case; stop words and punctuation dropped)")
    phrases: list[str] = Field(description="quoted phrases, each required")
    hits: int = Field(description="keyword matches found (at most the hybrid candidates, or the shortlist)")
    ignored_terms: int = Field(description="words and phrases past the first 16, not looked up")


class SearchResponse(BaseModel):
    results: list[Hit] = Field(description="the page: at most k results from `offset` on")
    total: int = Field(
        description="ranked results of the whole answer, every page together: the shortlist's "
        "candidates less those dropped by filter, like, min_score, min_relevance and dedup (at most the shortlist; "
        "with a filter, filtered.matching counts every item that passes it)"
    )
    offset: int = Field(description="the request's offset: results[0] is result offset + 1 of total")
    next_offset: int | None = Field(description="the offset of the next page; null on the last page (or past it)")
    sort: Sort = Field(description="the order of the results (the request's sort)")
    index: IndexRef
    model: ModelRef
    query_kind: str = Field(description="what was searched for: text, image, like, or text+image / text+like")
    rerank: Rerank = Field(description="the reranker that ran: none for a query without text, and in mode keyword")
    rerank_skipped: str | None = Field(
        None,
        description="why rerank is none although the request (or the server's "
        "default) asked for a reranker: the query had no text, mode keyword, or "
        "the server's default reranker is not trained for the served model",
    )
    mode: Mode = Field(description="the mode that ran (see the request's mode)")
    mode_note: str | None = Field(None, description="why mode differs from the one asked for")
    keyword: KeywordInfo | None = Field(
        None,
        description="modes hybrid and keyword: the query's words as looked "
        "up, and how many items matched (among hybrid's candidates)",
    )
    deduplicated: int = Field(0, description="results dropped as near duplicates (dedup)")
    filtered: FilterInfo | None = Field(None, description="with a filter: how many items passed it")
    facets: dict[str, dict[str, int]] | None = Field(
        None,
        description='with facets: {"tags": {tag: items}}, the '
        f"{MAX_FACETS} most frequent tags among the items that pass "
        "the filter (or all items), most frequent first",
    )
    timings_ms: dict[str, float] = Field(
        description="per stage: queue, encode (text), decode_image, encode_image "
        "(image), like (stored vectors), ann, fetch, rerank, dedup, metadata; total"
    )
    degraded: bool = Field(
        description="true when part of the path failed and a fallback answered (see reason); "
        "also said by the X-Crossprobe-Degraded header (the codes)"
    )
    degraded_reason: str | None = Field(
        None,
        description="'code: message' per skipped part, '; ' separated; codes: "
        "feature_store_unavailable (Redis down: ANN order, no metadata), "
        "features_missing, fetch_failed, metadata_failed, keyword_failed (the "
        "keyword index could not be read: the vector side alone)",
    )


# /v1/explain: the page explains the results it shows (at most its largest k); each id costs a decode and a
# backbone run (~20 ms of CPU), so a request is bounded like a search's k is
MAX_EXPLAIN_IDS = 32


class ExplainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: QueryText = Field(..., description=f"the query the maps are for: {VISIBLE_TEXT_HELP}")
    ids: list[ItemId] = Field(
        ...,
        min_length=1,
        max_length=MAX_EXPLAIN_IDS,
        description=f"item ids of the index (1 to {MAX_EXPLAIN_IDS}; repeats count once)",
    )
    index: str | None = Field(None, min_length=1, max_length=64, description="index name (default: the server's)")


class ExplainResponse(BaseModel):
    index: IndexRef
    mode: Literal["labels", "query", "probes"] = Field(
        description="labels: how well each region's ImageNet label matches the query (checkpoints with region "
        "labels); query: query-dependent attention (text probes -> vision probes -> regions); probes: the "
        "image's probes averaged"
    )
    description: str = Field(description="what the maps show, in words")
    grid: int = Field(description="maps are grid x grid, row-major from the image's top-left")
    maps: dict[str, list[list[float]]] = Field(description="id -> grid x grid weights, >= 0, summing to 1")
    probe_maps: dict[str, list[list[float]]] = Field(
        description="id -> the query-independent map (the image's "
        "vision probes over the regions, averaged), summing to 1"
    )
    unavailable: dict[str, str] = Field(description="id -> why it has no map (its file is gone or unreadable)")
    timings_ms: dict[str, float] = Field(
        description="queue, encode, metadata, decode, backbone, attention; total; "
        "load on the process's first explain (the graphs are loaded then)"
    )


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorResponse(BaseModel):
    error: ErrorBody


# What each error status means, for the OpenAPI document. 401 / 403 / 429 of the key and rate-limit checks are
# declared by security.py's route groups; the statuses here are the routes' own and the middlewares'.
ERROR_DESCRIPTIONS: dict[int, str] = {
    404: "index_not_found: no such index here; item_not_found: an id is not in the served version",
    408: "request_timeout: the body did not arrive within CROSSPROBE_BODY_TIMEOUT_S of the headers (the "
    "connection is closed; http_timeouts.py)",
    413: "too_large: the body is longer than CROSSPROBE_MAX_BODY_BYTES (every route; from Content-Length, or "
    "counted while it arrives)",
    422: "invalid_request: the body or a parameter fails validation (not JSON, not UTF-8, nested deeper than 32 "
    "levels, a field out of range or unknown...)",
    503: "not_ready: models or indexes still loading (Retry-After); index_unavailable: the index cannot be "
    "served (e.g. built with another model: the message names both models and what to do); "
    "feature_store_unavailable: Redis is down (Retry-After)",
}


# the 413 of every route that takes an image: one wording for the OpenAPI document
IMAGE_TOO_LARGE = (
    "too_large: the body is longer than CROSSPROBE_MAX_BODY_BYTES, or the image is over "
    "CROSSPROBE_QUERY_IMAGE_MAX_BYTES bytes or CROSSPROBE_QUERY_IMAGE_MAX_PIXELS pixels"
)


def error_responses(*statuses: int, **described: str) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses=` for these statuses, each with the error JSON; described: status as "s404" -> a
    description for this route instead of ERROR_DESCRIPTIONS' (keyword names cannot be numbers)."""
    return {s: {"model": ErrorResponse, "description": described.get(f"s{s}", ERROR_DESCRIPTIONS[s])} for s in statuses}


# BodyGuard answers 413 on every route (a GET with a long body too) and, on every route that reads a body
# (POST), 422 for JSON nested too deep; the body deadline (408) applies where a body is read
ANY_ROUTE = (413,)
POST_ROUTE = (408, 413, 422)


# ---- clip-retrieval (rom1504/clip-retrieval clip_back) ----------------------------
def _knn_documented(schema: dict[str, Any]) -> None:
    """KnnRequest's OpenAPI schema: the requests /knn-service answers 200. The model itself accepts more
    (image_url, a text modality) so that the route can refuse those with 422 "unsupported", which says more
    than a validation error; here they are what they are for a client: values that get a 422."""
    props = schema["properties"]
    props["text"] = {
        "anyOf": [{"type": "null"}, TypeAdapter(QueryText).json_schema()],
        "default": None,
        "description": f"a text query: {VISIBLE_TEXT_HELP}. One of text, image, embedding_input is "
        "needed (x-constraints); the first given of embedding_input, image, text is used, as in "
        "clip_back",
    }
    props["image"] = {
        "anyOf": [{"type": "null"}, {"type": "string", "minLength": 1}],
        "default": None,
        "description": "an image query, base64 (as clip_back): ranked by the image tower's vector, "
        "not reranked. Not an image: 422 invalid_image; over the size limits: 413 too_large",
    }
    props["embedding_input"] = {
        "anyOf": [{"type": "null"}, {"type": "array", "items": {"type": "number"}, "minItems": 1}],
        "default": None,
        "description": "a query vector of the index's dimension (GET /v1/indexes: "
        "the model's d), e.g. a g_I another call returned; renormalised. Another length, "
        "all zeros: 422",
    }
    props["modality"] = {
        "enum": ["image"],
        "default": "image",
        "description": 'the index searched: images. "text" (a text index) is 422 unsupported',
    }
    props["image_url"] = {
        "anyOf": [{"type": "null"}, {"type": "string", "maxLength": 0}],
        "default": None,
        "description": "fetching URLs is not supported (the service reaches out to nowhere): "
        'anything but null or "" is 422 unsupported; send the image itself as "image"',
    }
    schema.pop("required", None)
    schema["x-constraints"] = [
        "at least one of text, image, embedding_input",
        "embedding_input has the index's dimension and is not all zeros",
        "image is a base64-encoded image file",
    ]


class KnnRequest(BaseModel):
    """clip_back's /knn-service body (posted as JSON whatever the Content-Type; clip-retrieval's front-end sends
    text/plain). Unknown fields are ignored. Types are strict, as /v1's numbers are: a JSON boolean for the
    switches, a JSON integer for the counts (clip_back's clients send those; "5" or "true" is 422)."""

    model_config = ConfigDict(extra="ignore", strict=True, json_schema_extra=_knn_documented)

    text: str | None = Field(None, max_length=MAX_QUERY_CHARS)
    image: str | None = Field(None, min_length=1)  # base64 image (query by image); "" is 422, as documented
    image_url: str | None = None  # refused: no outbound fetches
    # a query vector of the index's d; [] is 422 (the document says minItems 1), not "no vector"
    embedding_input: list[float] | None = Field(None, min_length=1, max_length=4096)
    modality: Literal["image", "text"] = "image"  # which index to search: images (text -> image search)
    num_images: int = Field(40, ge=1)  # results with metadata; clamped to MAX_K
    num_result_ids: int | None = Field(None, ge=1)  # ranked ids returned (metadata only for the first num_images)
    indice_name: str | None = Field(None, max_length=64)
    use_mclip: bool = False
    deduplicate: bool = True  # as clip_back: near duplicates (cosine >= DEDUP_COSINE) of a better result dropped
    use_safety_model: bool = False  # accepted, not applied (no safety model here)
    use_violence_detector: bool = False  # accepted, not applied
    aesthetic_score: str | int | None = ""  # accepted, not applied
    aesthetic_weight: str | float | None = ""

    @field_validator("num_images", "num_result_ids", "aesthetic_score", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        return _integral(v)


class MetadataRequest(BaseModel):
    """clip_back's /metadata body (JSON whatever the Content-Type; unknown fields ignored, strict types)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    ids: list[str | int] = Field(
        ...,
        max_length=MAX_SHORTLIST,
        description='ids of the index (integers are read as their decimal text); unknown ones get "metadata": null',
    )
    indice_name: str | None = Field(None, max_length=64)

    @field_validator("ids", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        return _integral(v)


class KnnResult(BaseModel):
    """One /knn-service result: the first num_images carry url, caption and the item's metadata fields; the
    rest, up to num_result_ids, only id and similarity (clip_back's shape)."""

    model_config = ConfigDict(extra="allow")

    id: str
    similarity: float = Field(description="the ranking score (higher is better)")
    url: str | None = Field(
        None, description="/v1/items/{id}/image?index=... (absolute, under CROSSPROBE_PUBLIC_URL, when that is set)"
    )
    caption: str | None = None


class MetadataEntry(BaseModel):
    id: str
    metadata: dict[str, Any] | None = Field(
        description="url, caption and the item's metadata; null for an id that is not in the index"
    )
