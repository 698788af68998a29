"""One search's state between its stages (Run), what it answers (Outcome) and one ranked result (RankedItem).

A Run is made after encode, for one index version, and each stage of stages.py reads and fills it in turn:
the shortlist (ids with their two-tower scores), the reranker's logits, the ranking over the shortlist
(positions into ids, best first), the page, and what the answer reports beside it (degraded parts, filter
and dedup counts, facets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from crossprobe.core.inference import QueryVectors
from crossprobe.core.runtime import StageTimer
from crossprobe.service import hybrid
from crossprobe.service.pipeline.plan import Plan
from crossprobe.service.registry import IndexHandle
from crossprobe.storage.ann.base import Filtered


@dataclass
class RankedItem:
    id: str
    score: float
    ann: float
    rerank: float | None
    relevance: float | None = None  # P(match) from the checkpoint's calibration (text queries; else None)
    metadata: dict | None = None
    keyword: float | None = None  # BM25 score of a keyword hit (modes hybrid and keyword)
    coverage: float | None = None  # the share of the query's words a keyword hit holds
    highlights: list[dict] | None = None  # the matched words of a keyword hit (hybrid.highlights)


@dataclass
class Outcome:
    hits: list[RankedItem]
    tail: list[RankedItem]
    handle: IndexHandle
    timings_ms: dict[str, float]
    batch_size: int = 1
    deduplicated: int = 0  # results dropped as near duplicates (plan.dedup)
    filtered: dict | None = None  # with plan.filter: {"matching", "exact", "method"}
    facets: dict | None = None  # with plan.facets: {"tags": {tag: items}}
    degraded: list[tuple[str, str]] = field(default_factory=list)  # (code, message): why part of the path was skipped
    total: int = 0  # ranked results of the whole answer (every page): the shortlist after filter, dedup, min_score
    keyword: hybrid.KeywordOutcome | None = None  # modes hybrid and keyword: the parsed query and its hits
    plan: Plan | None = None  # the plan as it ran (Plan.on_index): what the answer reports

    @property
    def degraded_codes(self) -> list[str]:
        return list(dict.fromkeys(code for code, _ in self.degraded))

    @property
    def degraded_reason(self) -> str | None:
        return "; ".join(f"{code}: {msg}" for code, msg in self.degraded) or None


def _empty() -> np.ndarray:
    return np.zeros(0, np.float32)


@dataclass
class Run:
    plan: Plan
    handle: IndexHandle  # the one version every stage reads (taken once per request)
    q: QueryVectors
    clock: StageTimer
    retried: bool = False  # already answering from a newer version (stage fetch: the version was deleted)
    exclude: set[str] = field(init=False)  # "like" items: what the query is made of, never results
    prepared: object | None = None  # the backend's form of plan.filter (FAISS: the row mask, reused by facets)
    filtered: Filtered | None = None  # the filtered ANN search's counts (stage ann, with a filter)
    # the shortlist: candidate ids, their two-tower scores, the reranker's logits (None: not reranked)
    ids: list[str] = field(default_factory=list)
    ann: np.ndarray = field(default_factory=_empty)
    kw: hybrid.KeywordOutcome | None = None  # modes hybrid and keyword (stage keyword)
    features: dict[str, np.ndarray] | None = None  # the shortlist's stored features (stage fetch; None: not fetched)
    logits: np.ndarray | None = None
    # the ranking: the scores it is by, positions into ids (best first), which are keyword hits, relevance
    final: np.ndarray = field(default_factory=_empty)
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    is_kw: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    relevance: np.ndarray | None = None
    deduplicated: int = 0
    total: int = 0  # the ranked answer's length, every page together (stage page)
    hits: list[RankedItem] = field(default_factory=list)  # the page (metadata, highlights)
    tail: list[RankedItem] = field(default_factory=list)  # ranked ids after the page (plan.tail)
    facets: dict | None = None
    degraded: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.exclude = set(self.plan.like)

    @property
    def reader(self):
        return self.handle.reader

    def outcome(self) -> Outcome:
        f = self.filtered
        return Outcome(
            self.hits,
            self.tail,
            self.handle,
            self.clock.ms(),
            deduplicated=self.deduplicated,
            degraded=self.degraded,
            total=self.total,
            keyword=self.kw,
            facets=self.facets,
            plan=self.plan,
            filtered=None if f is None else {"matching": f.matching, "exact": f.exact, "method": f.how},
        )
