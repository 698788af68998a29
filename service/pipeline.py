"""The request path as named, timed stages:

  queue -> encode -> ann -> fetch -> rerank -> metadata
  (batcher)  (query    (FAISS on   (ONE MGET of   (cp_scorer or     (MGET of the
             tower)     the pinned  the shortlist's temde_scorer,     final k)
                        version)    feature values) one run over K)

What is searched for: a text (the query tower's g_q), an image (decode_image -> encode_image:
the indexer's backbone + image tower, so the query vector is a g_I as the index stores them), the stored
vectors of indexed items ("like": their mean, renormalised, read from the version's vectors.npy; stage
like), or a raw vector (clip-retrieval's embedding_input). With a text and a vector together the ANN query
is (1 - w) g_q + w v, renormalised (w: the request's weight, default 0.5), and the rerankers run with the
text's probes and this combined cosine as their two-tower score. Without a text nothing can rerank: the
ANN order is the answer (rerank "none", said in the response with the reason). Items given as "like" are
never among the results. dedup: results whose stored vectors have a cosine >= the threshold with a result
ranked above them are dropped (clip-retrieval's deduplicate; stage dedup).

Relevance: a text query's results carry a calibrated relevance, the probability that each matches
(models/calibration.py, per rerank mode); min_relevance drops the results below it, so a query for something
the index does not hold can return nothing.

Pages: everything above is the whole ranked answer (the shortlist, less the filter's, "like"'s, min_score's,
min_relevance's and dedup's drops); `sort` may reorder it by date taken or added (stage sort, from the version's metadata columns);
its length is the answer's total, and the page is its [offset, offset + k) slice, so every page of the same
request comes from the same ranking (the shortlist does not grow with the offset). Metadata is read for the
page only.

The handle (one index version) is taken once per request, so every stage reads
the same version even if a new one goes live meanwhile. The two-tower score the
rerankers fuse with, s_tt = g_q . g_I, is the FAISS inner product itself (exact
for Flat and HNSW, which store full vectors; approximate under IVF-PQ).

Failures that are not the client's fault degrade instead of failing: if the
feature fetch fails the shortlist keeps its ANN order; if metadata cannot be
read the results come without it. The response then says degraded: true and why
(Outcome.degraded: (code, message) pairs). Both Redis calls go through the
feature store's circuit breaker (breaker.py): while Redis is down they are skipped
at once (code feature_store_unavailable), or, with CROSSPROBE_REDIS_DOWN_SEARCH=fail,
the search answers 503 feature_store_unavailable.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace

import numpy as np
from redis.exceptions import RedisError

from crossprobe.indexer.storage.ann import AnnUnavailable
from crossprobe.indexer.storage.ann.base import UnsupportedFilter
from crossprobe.indexer.storage import filter_columns
from crossprobe.service import hybrid, metrics, query_image
from crossprobe.models.inference import Backend, QueryVectors
from crossprobe.service.registry import IndexHandle, Registry
from crossprobe.models.runtime import StageTimer
from crossprobe.service.batcher import QueryBatcher
from crossprobe.service.breaker import FeatureStore, FeatureStoreUnavailable
from crossprobe.service.exceptions import InvalidRequest, ItemNotFound
from crossprobe.service.schemas import MAX_FACETS
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

    @property
    def kind(self) -> str:
        """text | image | like | embedding, joined by "+" when a text and a vector are combined."""
        parts = [name for name, on in (("text", self.query is not None), ("image", self.image is not None),
                                       ("like", bool(self.like)), ("embedding", self.embedding is not None)) if on]
        return "+".join(parts)


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

    @property
    def degraded_codes(self) -> list[str]:
        return list(dict.fromkeys(code for code, _ in self.degraded))

    @property
    def degraded_reason(self) -> str | None:
        return "; ".join(f"{code}: {msg}" for code, msg in self.degraded) or None


class Searcher:
    def __init__(self, settings: Settings, models: Backend, registry: Registry, batcher: QueryBatcher,
                 pool: Executor, feature_store: FeatureStore):
        self.settings, self.models, self.registry, self.batcher, self.pool = settings, models, registry, batcher, pool
        self.fs = feature_store

    def plan(self, query: str | None, k: int, rerank: str | None = None, shortlist: int | None = None,
             index: str | None = None, min_score: float | None = None, tail: int = 0, *, image: bytes | None = None,
             like: list[str] | None = None, embedding: np.ndarray | None = None, weight: float = 0.5,
             dedup: float | None = None, filter: object | None = None, facets: bool = False, offset: int = 0,
             sort: str = "relevance", min_relevance: float | None = None, mode: str | None = None) -> Plan:
        """Fill in the server's defaults (validation already happened in the schema)."""
        like = list(dict.fromkeys(like or []))
        # (a text alone is SearchRequest's rule; what the schema cannot know is whether this checkpoint has curves)
        if min_relevance is not None and self.models.calibration is None:
            raise InvalidRequest("invalid request: min_relevance: this server's checkpoint has no "
                                 "calibration.json (research/calibration/fit.py makes one)")
        rr = rerank or self.settings.default_rerank
        skipped = None
        if query is None and rr != "none":  # nothing to rerank with: the rerankers score a text against images
            skipped = (f"rerank {rr} needs a text query; a query without one ranks by the ANN cosine of its "
                       f"vector (send \"query\" too to rerank)")
            rr = "none"
        if shortlist is None:
            shortlist = min(max(self.settings.default_shortlist, k + tail), MAX_SHORTLIST)
        return Plan(query, k, rr, shortlist, index, min_score, tail, image=image, like=like, embedding=embedding,
                    weight=weight, dedup=dedup, filter=filter, facets=facets, rerank_skipped=skipped, offset=offset,
                    sort=sort, min_relevance=min_relevance, mode=mode)

    async def search(self, plan: Plan) -> Outcome:
        t0 = time.perf_counter()
        handle = self.registry.get(plan.index)  # 404 / 503 before any work
        plan.mode, plan.mode_note = hybrid.resolve(plan.mode, plan.query is not None, handle.keywords is not None)
        if plan.mode == "keyword" and plan.rerank != "none":
            plan.rerank, plan.rerank_skipped = "none", "mode keyword ranks by the keyword index's BM25 alone"
        if plan.like:
            unknown = [i for i in plan.like if i not in handle.ids]
            if unknown:
                raise ItemNotFound(f"{len(unknown)} of the \"like\" ids are not in "
                                   f"{handle.name}/{handle.version}: {unknown[:5]}", {"ids": unknown[:100]})
        if plan.embedding is not None and len(plan.embedding) != handle.reader.d:
            raise InvalidRequest(f"invalid request: embedding_input has {len(plan.embedding)} "
                                 f"values; index {handle.name} holds vectors of {handle.reader.d}")
        loop = asyncio.get_running_loop()
        clock = StageTimer()
        vector = None
        info = None
        text_job = self.batcher.submit(plan.query) if plan.query is not None else None
        if plan.image is not None or plan.like or plan.embedding is not None:
            vec_job = loop.run_in_executor(self.pool, self._query_vector, plan, handle, clock)
            if text_job is not None:  # the text's query tower and the image's towers run at the same time
                (q, info), vector = await asyncio.gather(text_job, vec_job)
            else:
                vector = await vec_job
                q = QueryVectors(vector, None, None, None)
        else:
            q, info = await text_job
        if info is not None:
            clock.add("queue", info.queue_ms / 1000)
            clock.add("encode", info.encode_ms / 1000)
        if text_job is not None and vector is not None:
            mixed = (1.0 - plan.weight) * q.g_q.astype(np.float32) + plan.weight * vector
            q = replace(q, g_q=_unit(mixed, q.g_q))
        out = await loop.run_in_executor(self.pool, self._after_encode, q, handle, plan, clock)
        out.batch_size = info.batch_size if info is not None else 1
        out.timings_ms["total"] = (time.perf_counter() - t0) * 1000
        return out

    def _query_vector(self, plan: Plan, handle: IndexHandle, clock: StageTimer) -> np.ndarray:
        """The vector part of a query, unit norm: an image's g_I, the mean of stored vectors, or a raw vector."""
        if plan.image is not None:
            with clock.stage("decode_image"):
                px = query_image.pixels(plan.image, self.settings.query_image_max_pixels,
                                        preprocess=self.models.preprocessor(), size=self.models.image_size)
            self.models.warm("image")  # loaded by the warm-up; the first call otherwise
            with clock.stage("encode_image"):
                return self.models.encode_images(px[None]).g[0]
        if plan.like:
            with clock.stage("like"):
                vs = handle.reader.vectors(plan.like)
                return _unit(vs.mean(axis=0), vs[0])
        # in float64 and scaled by its largest value before the norm: every finite JSON vector that is not all
        # zeros has a direction (values past float32's range were inf, values below it 0, and a norm under 1e-6
        # came back unnormalised)
        v = np.asarray(plan.embedding, np.float64)
        if not np.isfinite(v).all() or not v.any():
            raise InvalidRequest("invalid request: embedding_input must be finite and not all zero")
        v = v / np.abs(v).max()
        return (v / np.linalg.norm(v)).astype(np.float32)

    # ---- the stages after encode: one worker thread per request ---------------------
    def _after_encode(self, q: QueryVectors, handle: IndexHandle, plan: Plan, clock: StageTimer,
                      retried: bool = False) -> Outcome:
        try:
            return self._ranked(q, handle, plan, clock, retried)
        except AnnUnavailable as e:  # a Milvus down or past its timeout: nothing to answer from, say so (no 500)
            metrics.error("ann_unavailable")
            raise AnnUnavailable(f"the vector engine of {handle.name}/{handle.version} is unavailable: {e}") from None

    def _ranked(self, q: QueryVectors, handle: IndexHandle, plan: Plan, clock: StageTimer,
                retried: bool = False) -> Outcome:
        reader = handle.reader
        degraded: list[tuple[str, str]] = []
        exclude = set(plan.like)
        filtered = None
        prepared = None  # the backend's form of plan.filter (FAISS: the row mask, reused by facets)
        if plan.filter is not None:
            with clock.stage("filter"):  # the backend's own form: a FAISS row bitmap, or a Milvus expression
                try:
                    prepared = reader.ann.prepare_filter(plan.filter, reader.rows(list(exclude)) if exclude else [],
                                                         lambda: self._columns(handle))
                except (filter_columns.UnknownField, UnsupportedFilter) as e:
                    raise InvalidRequest(f"invalid request: filter: {e}") from None
            with clock.stage("ann"):
                filtered = reader.ann.search_filtered(q.g_q, plan.shortlist, prepared, reader.vectors_at,
                                                      self.settings.filter_exact_max)
            ids = [reader.ids[r] for r in filtered.rows]
            ann = np.asarray(filtered.scores, np.float32)
        else:
            with clock.stage("ann"):
                found, scores = reader.search(q.g_q[None], min(plan.shortlist + len(exclude), len(reader) or 1))
            ids = found[0]
            ann = np.asarray(scores[0][: len(ids)], np.float32)
            if exclude:  # "like" items are what the query is made of: never results
                keep = [j for j, i in enumerate(ids) if i not in exclude][: plan.shortlist]
                ids, ann = [ids[j] for j in keep], ann[keep]

        kw = None
        if plan.mode in ("hybrid", "keyword"):
            with clock.stage("keyword"):
                kw = hybrid.keyword_stage(handle.keywords, plan.query, plan.shortlist if plan.mode == "keyword" else
                                          self.settings.hybrid_candidates, _allow(reader, self._row_mask(handle, plan, prepared), exclude),
                                          required=plan.mode == "keyword")
            if kw.error:
                metrics.error("keyword_failed")
                degraded.append(("keyword_failed", f"keyword side skipped: {kw.error}"))
            known = set() if plan.mode == "keyword" else set(ids)
            extra = [i for i, _ in kw.hits if i not in known]
            if plan.mode == "keyword":
                ids, ann = [], np.zeros(0, np.float32)
            if extra:  # keyword hits the shortlist lacks: their exact two-tower score, from the stored vectors
                ids = ids + extra
                ann = np.concatenate([ann, reader.vectors(extra) @ q.g_q.astype(np.float32)]).astype(np.float32)

        logits = None
        if plan.rerank != "none" and ids:
            try:
                with clock.stage("fetch"):
                    feats = self.fs.call("fetch", reader.features, ids)  # one MGET
            except FeatureStoreUnavailable as e:
                self._redis_down(e)
                degraded.append(("feature_store_unavailable", f"rerank skipped, ANN order kept: {e}"))
            except KeyError as e:
                newer = self.registry.current(handle.name)
                if not retried and newer is not None and newer is not handle:
                    # our version was deleted (gc) after a newer one went live: answer from the newer one
                    metrics.error("version_gone_retried")
                    return self._ranked(q, newer, plan, clock, retried=True)
                metrics.error("fetch_missing")
                degraded.append(("features_missing", f"rerank skipped, features missing in Redis: {e}"))
            except (RedisError, ValueError) as e:  # an error reply / a value of the wrong size
                metrics.error("fetch_failed")
                degraded.append(("fetch_failed", f"rerank skipped, feature fetch failed: {type(e).__name__}: {e}"))
            else:
                with clock.stage("rerank"):
                    logits = np.asarray(self.models.rerank(plan.rerank, q, feats, ann), np.float32)

        final = logits if logits is not None else ann
        order = np.argsort(-final, kind="stable") if logits is not None or kw is not None else np.arange(len(ids))
        is_kw = np.zeros(len(ids), bool)
        if plan.mode == "keyword":  # BM25 order; the score is BM25's
            final, order, is_kw[:] = np.asarray([s for _, s in kw.hits], np.float32), np.arange(len(ids)), True
        elif kw is not None and kw.hits:
            order, is_kw = hybrid.fuse(final, order, ids, kw, self.settings.hybrid_k, self.settings.hybrid_weight,
                                       self.settings.hybrid_coverage_power)
        if plan.min_score is not None:
            order = order[(final[order] >= plan.min_score) | is_kw[order]]
        relevance = None if plan.mode == "keyword" else self._relevance(plan, final, "none" if logits is None else plan.rerank)
        if plan.min_relevance is not None and relevance is not None:
            order = order[(relevance[order] >= plan.min_relevance) | is_kw[order]]
        dropped = 0
        if plan.dedup is not None and len(order) > 1:
            with clock.stage("dedup"):  # over the whole ranked answer: `total` counts what every page can show
                order, dropped = _dedup(order, reader.vectors([ids[i] for i in order]), plan.dedup, len(order))
        if plan.sort != "relevance" and len(order) > 1:
            with clock.stage("sort"):
                order = self._by_date(order, ids, handle, plan.sort, degraded)
        total = len(order)
        order = order[plan.offset: plan.offset + plan.k + plan.tail]
        kws, cov = (kw.scores, kw.coverage) if kw is not None else ({}, {})
        ranked = [RankedItem(ids[i], float(final[i]), float(ann[i]), None if logits is None else float(logits[i]),
                             None if relevance is None else round(float(relevance[i]), 4), keyword=kws.get(ids[i]),
                             coverage=cov.get(ids[i]))
                  for i in order]
        hits, tail = ranked[: plan.k], ranked[plan.k:]

        with clock.stage("metadata"):
            try:
                metas = self.fs.call("metadata", reader.metadata, [h.id for h in hits]) if hits else []
            except FeatureStoreUnavailable as e:
                self._redis_down(e)
                degraded.append(("feature_store_unavailable", f"metadata omitted: {e}"))
                metas = [None] * len(hits)
            except RedisError as e:
                metrics.error("metadata_failed")
                degraded.append(("metadata_failed", f"metadata unavailable: {type(e).__name__}: {e}"))
                metas = [None] * len(hits)
        for h, m in zip(hits, metas):
            h.metadata = public_metadata(m, self.settings.expose_uri)
        if kw is not None and kw.hits and hits:
            with clock.stage("highlight"):
                marks = hybrid.highlights(handle.keywords, kw, [h.id for h in hits])
            for h in hits:
                h.highlights = marks.get(h.id)
        facets = None
        if plan.facets:
            with clock.stage("facets"):  # over the metadata columns, whichever backend holds the vectors
                cols = self._columns(handle)
                mask = prepared if isinstance(prepared, np.ndarray) else (
                    cols.mask(plan.filter) if plan.filter is not None else None)  # Milvus: its own mask
                facets = {"tags": cols.tag_counts(mask, MAX_FACETS)}
        return Outcome(hits, tail, handle, clock.ms(), deduplicated=dropped, degraded=degraded, total=total, keyword=kw,
                       filtered=None if filtered is None else
                       {"matching": filtered.matching, "exact": filtered.exact, "method": filtered.how},
                       facets=facets)

    def _row_mask(self, handle: IndexHandle, plan: Plan, prepared) -> np.ndarray | None:
        """The filter as a mask over the version's rows: FAISS's prepared filter is one; a Milvus version's is an
        expression, so the mask comes from the metadata columns (as facets do)."""
        if plan.filter is None or isinstance(prepared, np.ndarray):
            return prepared
        return self._columns(handle).mask(plan.filter)

    def _relevance(self, plan: Plan, final: np.ndarray, mode: str) -> np.ndarray | None:
        """Each candidate's calibrated relevance under the mode that ranked it (a degraded search that kept the
        ANN order: "none"'s curve on the ANN cosine); None for queries that are not a text alone."""
        cal = self.models.calibration
        if cal is None or plan.kind != "text" or not len(final):
            return None
        return cal.relevance(mode, final)

    def _by_date(self, order: np.ndarray, ids: list[str], handle: IndexHandle, sort: str,
                 degraded: list[tuple[str, str]]) -> np.ndarray:
        """The ranked results (above the cutoff, deduplicated) reordered by a date of their metadata columns:
        taken (EXIF DateTimeOriginal, or the manifest's) or added (when the item entered the index); "-" first:
        newest first. Items without that date come last; ties and the undated keep their relevance order (a
        stable sort). Redis down before the columns were read: relevance order, said as degraded."""
        try:
            cols = self._columns(handle)
        except FeatureStoreUnavailable as e:
            self._redis_down(e)
            degraded.append(("feature_store_unavailable", f"sort {sort} skipped, relevance order kept: {e}"))
            return order
        field_name = sort.lstrip("-").removeprefix("date_")
        dates = cols.cols[field_name].dates[np.asarray(handle.reader.rows([ids[i] for i in order]), np.int64)]
        undated = np.isnan(dates)
        key = np.where(undated, 0.0, -dates if sort.startswith("-") else dates)
        return order[np.lexsort((key, undated))]  # primary: dated first; then the date; stable: relevance order

    def _columns(self, handle: IndexHandle) -> filter_columns.Columns:
        """The version's metadata columns (read once per version, MGETs of 1,000). Redis down: no filter can be
        answered, so 503 feature_store_unavailable (not a degraded answer: unfiltered results would be wrong)."""
        try:
            return handle.columns.get(lambda: self.fs.call("filter_metadata", filter_columns.all_metadata, handle.reader))
        except FeatureStoreUnavailable:
            raise  # answered 503 feature_store_unavailable (errors.py)

    def _redis_down(self, e: FeatureStoreUnavailable) -> None:
        """Redis is down: count it; with CROSSPROBE_REDIS_DOWN_SEARCH=fail the search answers 503 (else it degrades)."""
        if self.settings.redis_down_search == "fail":
            raise e  # answered 503 feature_store_unavailable (errors.py), counted there
        metrics.error("feature_store_unavailable")


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


def _unit(v: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """v / |v| as float32; `fallback` (unit norm already) when v is (numerically) zero: two opposite vectors."""
    v = np.asarray(v, np.float32)
    n = float(np.linalg.norm(v))
    return v / n if n > 1e-6 else np.asarray(fallback, np.float32)


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


def public_metadata(meta: dict | None, expose_uri: bool) -> dict | None:
    """The indexer's metadata minus the file's path on our disk (unless configured otherwise)."""
    if meta is None or expose_uri:
        return meta
    return {k: v for k, v in meta.items() if k != "uri"}
