"""The stages after encode, one function each, in the order AFTER_ENCODE runs them over one Run (run.py).

Each takes the searcher (its settings, models, registry and feature store: what every request shares) and the
request's Run, and reads and fills the Run. A timed stage times itself under its name (the stage's name in
timings_ms, Server-Timing and crossprobe_search_stage_seconds): filter, ann, keyword, fetch, rerank, dedup,
sort, metadata, highlight, facets; the untimed ones (order, relevance, cutoffs, page) are array work on the
shortlist.

Failures that are not the client's fault degrade (Run.degraded: (code, message)) instead of failing: fetch
failed -> the ANN order; metadata unreadable -> results without it; the keyword index unreadable -> the vector
side alone; Redis down before a date sort -> relevance order. Redis down is counted by redis_down, which answers
503 instead with CROSSPROBE_REDIS_DOWN_SEARCH=fail. A version deleted under the request: VersionGone, and the
searcher answers from the newer version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
from redis.exceptions import RedisError

from crossprobe.service import hybrid, metrics
from crossprobe.service.breaker import FeatureStoreUnavailable
from crossprobe.service.exceptions import InvalidRequest
from crossprobe.service.pipeline.run import RankedItem, Run
from crossprobe.service.registry import IndexHandle
from crossprobe.service.schemas import MAX_FACETS
from crossprobe.storage import filter_columns
from crossprobe.storage.ann.base import UnsupportedFilter

if TYPE_CHECKING:
    from crossprobe.core.calibration import Calibration
    from crossprobe.service.pipeline.searcher import Searcher


class VersionGone(Exception):
    """Stage fetch found the request's version deleted (gc) after a newer one went live: answer from `newer`."""

    def __init__(self, newer: IndexHandle):
        super().__init__(newer.version)
        self.newer = newer


# ---- the shortlist ------------------------------------------------------------------------------------------------
def filter_rows(sr: Searcher, r: Run) -> None:
    """filter: the plan's filter in the vector backend's own form (a FAISS row bitmap, a Milvus expression),
    "like" rows excluded. A field the version cannot filter on: 422."""
    if r.plan.filter is None:
        return
    reader = r.reader
    with r.clock.stage("filter"):
        try:
            r.prepared = reader.ann.prepare_filter(
                r.plan.filter, reader.rows(list(r.exclude)) if r.exclude else [], lambda: columns(sr, r.handle)
            )
        except (filter_columns.UnknownField, UnsupportedFilter) as e:
            raise InvalidRequest(f"invalid request: filter: {e}") from None


def ann(sr: Searcher, r: Run) -> None:
    """ann: the shortlist, the plan.shortlist nearest vectors (inside the filter), without the "like" items."""
    reader, plan = r.reader, r.plan
    if plan.filter is not None:
        with r.clock.stage("ann"):
            r.filtered = reader.ann.search_filtered(
                r.q.g_q, plan.shortlist, r.prepared, reader.vectors_at, sr.settings.filter_exact_max
            )
        r.ids = [reader.ids[row] for row in r.filtered.rows]
        r.ann = np.asarray(r.filtered.scores, np.float32)
        return
    with r.clock.stage("ann"):
        found, scores = reader.search(r.q.g_q[None], min(plan.shortlist + len(r.exclude), len(reader) or 1))
    r.ids = found[0]
    r.ann = np.asarray(scores[0][: len(r.ids)], np.float32)
    if r.exclude:  # "like" items are what the query is made of: never results
        keep = [j for j, i in enumerate(r.ids) if i not in r.exclude][: plan.shortlist]
        r.ids, r.ann = [r.ids[j] for j in keep], r.ann[keep]


def keyword(sr: Searcher, r: Run) -> None:
    """keyword (modes hybrid and keyword): the keyword index's best matches join the shortlist (mode keyword:
    they are the shortlist), with their exact two-tower score from the stored vectors."""
    plan, reader = r.plan, r.reader
    if plan.mode not in ("hybrid", "keyword"):
        return
    alone = plan.mode == "keyword"
    index, text = r.handle.keywords, plan.query
    # Plan.on_index gives these modes only to a text query (a retry on a newer version may find no keyword index:
    # keyword_stage answers that)
    assert text is not None, f"mode {plan.mode} without a text"
    with r.clock.stage("keyword"):
        r.kw = kw = hybrid.keyword_stage(
            index,
            text,
            plan.shortlist if alone else sr.settings.hybrid_candidates,
            _allow(reader, _row_mask(sr, r), r.exclude),
            required=alone,
            max_depth=sr.settings.keyword_filter_max_depth,
        )
    if kw.error:
        metrics.error("keyword_failed")
        r.degraded.append(("keyword_failed", f"keyword side skipped: {kw.error}"))
    known = set() if alone else set(r.ids)
    extra = [i for i, _ in kw.hits if i not in known]
    if alone:
        r.ids, r.ann = [], np.zeros(0, np.float32)
    if extra:  # keyword hits the shortlist lacks: their exact two-tower score, from the stored vectors
        r.ids = r.ids + extra
        r.ann = np.concatenate([r.ann, reader.vectors(extra) @ r.q.g_q.astype(np.float32)]).astype(np.float32)


# ---- rerank -------------------------------------------------------------------------------------------------------
def fetch(sr: Searcher, r: Run) -> None:
    """fetch: the shortlist's stored features, ONE MGET through the breaker. Failed: no rerank, said as
    degraded; the version deleted meanwhile: VersionGone (once)."""
    if r.plan.rerank == "none" or not r.ids:
        return
    try:
        with r.clock.stage("fetch"):
            r.features = sr.fs.call("fetch", r.reader.features, r.ids)  # one MGET
    except FeatureStoreUnavailable as e:
        redis_down(sr, e)
        r.degraded.append(("feature_store_unavailable", f"rerank skipped, ANN order kept: {e}"))
    except KeyError as e:
        newer = sr.registry.current(r.handle.name)
        if not r.retried and newer is not None and newer is not r.handle:
            # our version was deleted (gc) after a newer one went live: answer from the newer one
            metrics.error("version_gone_retried")
            raise VersionGone(newer) from None
        metrics.error("fetch_missing")
        r.degraded.append(("features_missing", f"rerank skipped, features missing in Redis: {e}"))
    except (RedisError, ValueError) as e:  # an error reply / a value of the wrong size
        metrics.error("fetch_failed")
        r.degraded.append(("fetch_failed", f"rerank skipped, feature fetch failed: {type(e).__name__}: {e}"))


def rerank(sr: Searcher, r: Run) -> None:
    """rerank: the plan's reranker over the fetched shortlist, one run over K (its logits fuse the two-tower
    score, the FAISS inner product)."""
    if r.features is None:
        return
    with r.clock.stage("rerank"):
        r.logits = np.asarray(sr.models.rerank(r.plan.rerank, r.q, r.features, r.ann), np.float32)


# ---- the ranking --------------------------------------------------------------------------------------------------
def order(sr: Searcher, r: Run) -> None:
    """The ranking over the shortlist: by the logits (else the ANN cosine); mode keyword: BM25's order and
    score; hybrid: the two orders fused (hybrid.fuse)."""
    r.final = r.logits if r.logits is not None else r.ann
    r.order = np.argsort(-r.final, kind="stable") if r.logits is not None or r.kw is not None else np.arange(len(r.ids))
    r.is_kw = np.zeros(len(r.ids), bool)
    if r.plan.mode == "keyword":  # BM25 order; the score is BM25's
        assert r.kw is not None, "stage keyword runs in mode keyword"
        r.final, r.order = np.asarray([s for _, s in r.kw.hits], np.float32), np.arange(len(r.ids))
        r.is_kw[:] = True
    elif r.kw is not None and r.kw.hits:
        s = sr.settings
        r.order, r.is_kw = hybrid.fuse(
            r.final, r.order, r.ids, r.kw, s.hybrid_k, s.hybrid_weight, s.hybrid_coverage_power
        )


def relevance(sr: Searcher, r: Run) -> None:
    """Each candidate's calibrated relevance under the mode that ranked it (a degraded search that kept the ANN
    order: "none"'s curve on the ANN cosine); none for queries that are not a text alone, nor in mode keyword."""
    cal = cast("Calibration | None", sr.models.calibration)  # Backend declares it an object
    if cal is None or r.plan.kind != "text" or not len(r.final) or r.plan.mode == "keyword":
        return
    r.relevance = cal.relevance("none" if r.logits is None else r.plan.rerank, r.final)


def cutoffs(sr: Searcher, r: Run) -> None:
    """min_score and min_relevance drop candidates below them; keyword hits are exempt from both."""
    plan = r.plan
    if plan.min_score is not None:
        r.order = r.order[(r.final[r.order] >= plan.min_score) | r.is_kw[r.order]]
    if plan.min_relevance is not None and r.relevance is not None:
        r.order = r.order[(r.relevance[r.order] >= plan.min_relevance) | r.is_kw[r.order]]


def dedup(sr: Searcher, r: Run) -> None:
    """dedup: drop a result whose stored vector has a cosine >= plan.dedup with one ranked above it, over the
    whole ranked answer (`total` counts what every page can show)."""
    if r.plan.dedup is None or len(r.order) <= 1:
        return
    with r.clock.stage("dedup"):
        r.order, r.deduplicated = _dedup(
            r.order, r.reader.vectors([r.ids[i] for i in r.order]), r.plan.dedup, len(r.order)
        )


def sort(sr: Searcher, r: Run) -> None:
    """sort: the ranked answer reordered by a date of the metadata columns (plan.sort other than relevance)."""
    if r.plan.sort == "relevance" or len(r.order) <= 1:
        return
    with r.clock.stage("sort"):
        r.order = _by_date(sr, r)


def page(sr: Searcher, r: Run) -> None:
    """The page: the ranked answer's [offset, offset + k) slice as results, then plan.tail ids after it."""
    plan, kw = r.plan, r.kw
    r.total = len(r.order)
    kws, cov = (kw.scores, kw.coverage) if kw is not None else ({}, {})
    ranked = [
        RankedItem(
            r.ids[i],
            float(r.final[i]),
            float(r.ann[i]),
            None if r.logits is None else float(r.logits[i]),
            None if r.relevance is None else round(float(r.relevance[i]), 4),
            keyword=kws.get(r.ids[i]),
            coverage=cov.get(r.ids[i]),
        )
        for i in r.order[plan.offset : plan.offset + plan.k + plan.tail]
    ]
    r.hits, r.tail = ranked[: plan.k], ranked[plan.k :]


# ---- what the page shows ------------------------------------------------------------------------------------------
def metadata(sr: Searcher, r: Run) -> None:
    """metadata: the page's metadata, one MGET through the breaker (unreadable: results without it, degraded)."""
    hits = r.hits
    with r.clock.stage("metadata"):
        try:
            metas = sr.fs.call("metadata", r.reader.metadata, [h.id for h in hits]) if hits else []
        except FeatureStoreUnavailable as e:
            redis_down(sr, e)
            r.degraded.append(("feature_store_unavailable", f"metadata omitted: {e}"))
            metas = [None] * len(hits)
        except RedisError as e:
            metrics.error("metadata_failed")
            r.degraded.append(("metadata_failed", f"metadata unavailable: {type(e).__name__}: {e}"))
            metas = [None] * len(hits)
    for h, m in zip(hits, metas):
        h.metadata = public_metadata(m, sr.settings.expose_uri)


def highlight(sr: Searcher, r: Run) -> None:
    """highlight: the matched words of the page's keyword hits."""
    if r.kw is None or not r.kw.hits or not r.hits:
        return
    with r.clock.stage("highlight"):
        marks = hybrid.highlights(r.handle.keywords, r.kw, [h.id for h in r.hits])
    for h in r.hits:
        h.highlights = marks.get(h.id)


def facets(sr: Searcher, r: Run) -> None:
    """facets: items per tag among those passing the filter, over the metadata columns, whichever backend holds
    the vectors."""
    plan = r.plan
    if not plan.facets:
        return
    with r.clock.stage("facets"):
        cols = columns(sr, r.handle)
        mask = (
            r.prepared
            if isinstance(r.prepared, np.ndarray)
            else (cols.mask(plan.filter) if plan.filter is not None else None)
        )  # Milvus: its own mask
        r.facets = {"tags": cols.tag_counts(mask, MAX_FACETS)}


# the request path after encode, in order (Searcher._ranked runs it)
AFTER_ENCODE = (
    filter_rows,
    ann,
    keyword,
    fetch,
    rerank,
    order,
    relevance,
    cutoffs,
    dedup,
    sort,
    page,
    metadata,
    highlight,
    facets,
)


# ---- what the stages share ----------------------------------------------------------------------------------------
def columns(sr: Searcher, handle: IndexHandle) -> filter_columns.Columns:
    """The version's metadata columns (read once per version, MGETs of 1,000). Redis down: no filter can be
    answered, so 503 feature_store_unavailable (not a degraded answer: unfiltered results would be wrong)."""
    return handle.columns.get(lambda: sr.fs.call("filter_metadata", filter_columns.all_metadata, handle.reader))


def redis_down(sr: Searcher, e: FeatureStoreUnavailable) -> None:
    """Redis is down: count it; with CROSSPROBE_REDIS_DOWN_SEARCH=fail the search answers 503 (else it degrades)."""
    if sr.settings.redis_down_search == "fail":
        raise e  # answered 503 feature_store_unavailable (errors.py), counted there
    metrics.error("feature_store_unavailable")


def public_metadata(meta: dict | None, expose_uri: bool) -> dict | None:
    """The indexer's metadata minus the file's path on our disk (unless configured otherwise)."""
    if meta is None or expose_uri:
        return meta
    return {k: v for k, v in meta.items() if k != "uri"}


def _row_mask(sr: Searcher, r: Run) -> np.ndarray | None:
    """The filter as a mask over the version's rows: FAISS's prepared filter is one; a Milvus version's is an
    expression, so the mask comes from the metadata columns (as facets do)."""
    if r.plan.filter is None:
        return None  # no filter: stage filter prepared none
    if isinstance(r.prepared, np.ndarray):
        return r.prepared
    return columns(sr, r.handle).mask(r.plan.filter)


def _allow(reader, prepared, exclude: set[str]):
    """The keyword stage's filter: an id passes when the filter's row mask passes its row and it is not a "like"
    item; None: everything passes."""
    if not isinstance(prepared, np.ndarray) and not exclude:
        return None

    def allow(item_id: str) -> bool:
        if item_id in exclude:
            return False
        return not isinstance(prepared, np.ndarray) or bool(prepared[reader.rows([item_id])[0]])

    return allow


def _by_date(sr: Searcher, r: Run) -> np.ndarray:
    """The ranked results (above the cutoff, deduplicated) reordered by a date of their metadata columns:
    taken (EXIF DateTimeOriginal, or the manifest's) or added (when the item entered the index); "-" first:
    newest first. Items without that date come last; ties and the undated keep their relevance order (a
    stable sort). Redis down before the columns were read: relevance order, said as degraded."""
    sort_by = r.plan.sort
    try:
        cols = columns(sr, r.handle)
    except FeatureStoreUnavailable as e:
        redis_down(sr, e)
        r.degraded.append(("feature_store_unavailable", f"sort {sort_by} skipped, relevance order kept: {e}"))
        return r.order
    field_name = sort_by.lstrip("-").removeprefix("date_")
    dates = cols.cols[field_name].dates[np.asarray(r.reader.rows([r.ids[i] for i in r.order]), np.int64)]
    undated = np.isnan(dates)
    key = np.where(undated, 0.0, -dates if sort_by.startswith("-") else dates)
    return r.order[np.lexsort((key, undated))]  # primary: dated first; then the date; stable: relevance order


def _dedup(order: np.ndarray, vectors: np.ndarray, threshold: float, want: int) -> tuple[np.ndarray, int]:
    """Greedy, in rank order: keep a candidate unless its cosine with a kept one is >= threshold (the vectors
    are unit norm). Stops once `want` are kept. -> (kept positions, how many were dropped before that).
    The cosines come from one matrix product (a 1,000-candidate shortlist: 1M cosines, about a millisecond)."""
    sims = vectors @ vectors.T
    keep = np.zeros(len(order), bool)
    kept = dropped = 0
    for pos in range(len(order)):
        if kept >= want:
            break
        if kept and float(sims[pos, keep].max()) >= threshold:
            dropped += 1
            continue
        keep[pos] = True
        kept += 1
    return order[keep], dropped
