"""Keyword and hybrid search: the stages a search's `mode` adds to the request path (pipeline/stages.py).

  vector   the two-tower shortlist, reranked (what crossprobe always did)
  keyword  the version's keyword index alone (storage/keyword.py: BM25 over file name, caption, tags,
           the image's OCR text and the manifest's string fields); no reranker
  hybrid   the default where the served version has a keyword index: the keyword stage's best
           `hybrid_candidates` items join the vector shortlist before the reranker (an item no vector would
           have found, e.g. a receipt by its number, is reranked like the others); the reranked order and the
           keyword order are then fused by weighted reciprocal rank fusion,
               fused = 1 / (K + vector rank) + w c^p / (K + keyword rank)    (items without a keyword hit: first term)
           where c is the share of the query's words the item holds (1 with quoted phrases: they are required),
           so that a caption query whose one word sits in some photo's text does not lift that photo; K, w and
           p chosen on dev sets (docs/research/text_search.md). A keyword hit is not cut by
           min_score or min_relevance: it holds the query's words, whatever its calibrated relevance.

Filters apply to both sides: the keyword stage passes over items the filter (and "like") exclude.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np

from crossprobe.service.exceptions import InvalidRequest
from crossprobe.storage import keyword

log = logging.getLogger("crossprobe.service")

Mode = Literal["hybrid", "vector", "keyword"]  # a search's `mode` (schemas.py takes it from here)


@dataclass
class KeywordOutcome:
    query: keyword.KeywordQuery
    hits: list[tuple[str, float]] = field(default_factory=list)  # (id, BM25 score), best first
    coverage: dict[str, float] = field(default_factory=dict)  # id -> the share of the query's words it holds
    docs: dict[str, dict] = field(default_factory=dict)  # id -> its stored fields (read once: coverage, highlights)
    error: str | None = None  # the keyword index could not answer (the search goes on without it: degraded)

    @property
    def scores(self) -> dict[str, float]:
        return dict(self.hits)

    def info(self) -> dict:
        return {
            "words": self.query.words,
            "phrases": self.query.phrases,
            "hits": len(self.hits),
            "ignored_terms": self.query.dropped,
        }


def resolve(requested: str | None, has_text: bool, has_index: bool) -> tuple[str, str | None]:
    """The mode that runs -> (mode, why it differs from the request's, or None). Default: hybrid where the
    version has a keyword index and the query a text, else vector. keyword without either: 422."""
    if requested == "keyword":
        if not has_text:
            raise InvalidRequest("invalid request: mode keyword needs a query text")
        if not has_index:
            raise InvalidRequest(
                "invalid request: mode keyword: this index version has no usable keyword index "
                "(built before them, or unreadable: see the server's log); `crossprobe index "
                "reindex NAME` makes one"
            )
        return "keyword", None
    if requested == "vector":
        return "vector", None
    if has_text and has_index:
        return "hybrid", None
    why = None
    if requested == "hybrid":
        why = (
            "hybrid needs a query text; ranked by vectors"
            if not has_text
            else "this index version has no usable keyword index (built before them, or unreadable: see the server's "
            "log); ranked by vectors"
        )
    return "vector", why


def keyword_stage(
    index: keyword.KeywordIndex | None,
    text: str,
    limit: int,
    allow: Callable[[str], bool] | None,
    required: bool,
    max_depth: int | None = None,
) -> KeywordOutcome:
    """BM25's best `limit` items for the query text. required (mode keyword): a query that keeps no word after
    stop words and punctuation are dropped is 422; in hybrid it only leaves the vector side alone. index None (a
    search retried on a newer version that was built without one): 422 in mode keyword, the vectors alone in
    hybrid, saying so."""
    q = keyword.parse(text)
    if q.empty:
        if required:
            raise InvalidRequest(
                "invalid request: mode keyword: the query has no word to look up (only stop "
                "words or punctuation); search with mode vector or hybrid"
            )
        return KeywordOutcome(q)
    if index is None:
        if required:
            raise InvalidRequest(
                "invalid request: mode keyword: this index's active version has no keyword index; search with "
                "mode vector, or rebuild it with keywords"
            )
        return KeywordOutcome(q, error="the index's active version has no keyword index")
    try:
        hits = index.search(q, limit, allow, max_depth)
        ids = [i for i, _ in hits]
        docs = index.documents(ids)
        return KeywordOutcome(q, hits, index.coverage(q, ids, docs), docs)
    except (
        OSError,
        ValueError,
        RuntimeError,
    ) as e:  # a damaged index, a disk error: the vectors still answer, and say so
        log.warning("keyword index %s failed: %s: %s", index.path, type(e).__name__, e)
        return KeywordOutcome(q, error=f"{type(e).__name__}: {e}")


def fuse(
    final: np.ndarray, ranked: np.ndarray, ids: list[str], kw: KeywordOutcome, k: float, weight: float, power: float
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted reciprocal rank fusion of the reranked order and the keyword order, each keyword match's weight
    scaled by its coverage ** power (the share of the query's words it holds).
    final: each candidate's ranking score; ranked: candidate positions in their vector order (best first).
    -> (positions in fused order, a bool mask of the candidates that are keyword hits)."""
    n = len(ids)
    fused = np.zeros(n, np.float64)
    fused[ranked] = 1.0 / (k + 1 + np.arange(len(ranked)))
    is_kw = np.zeros(n, bool)
    pos = {item_id: j for j, item_id in enumerate(ids)}
    for r, (item_id, _) in enumerate(kw.hits):
        j = pos.get(item_id)
        if j is not None:
            fused[j] += weight * kw.coverage.get(item_id, 1.0) ** power / (k + 1 + r)
            is_kw[j] = True
    # ties (two candidates without keyword hits cannot tie; equal sums can): the vector order decides
    rank_v = np.empty(n, np.int64)
    rank_v[ranked] = np.arange(len(ranked))
    order = np.lexsort((rank_v, -fused))
    return order[np.isin(order, ranked)], is_kw


def highlights(index: keyword.KeywordIndex | None, kw: KeywordOutcome | None, ids: list[str]) -> dict[str, list[dict]]:
    """The matched words of each keyword hit among ids: {id: [{"field", "text", "spans": [[start, end]]}]}."""
    if index is None or kw is None or not kw.hits:
        return {}
    hit = kw.scores
    try:
        found = index.highlights(kw.query, [i for i in ids if i in hit], kw.docs)
    except (OSError, ValueError, RuntimeError) as e:  # the results stand without their marks
        log.warning("keyword highlights from %s failed: %s: %s", index.path, type(e).__name__, e)
        return {}
    return {
        i: [{"field": h.field, "text": h.text, "spans": [list(s) for s in h.spans]} for h in hs]
        for i, hs in found.items()
    }
