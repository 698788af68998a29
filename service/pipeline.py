"""The request path as named, timed stages:

  queue -> encode -> ann -> fetch -> rerank -> metadata
  (batcher)  (query    (FAISS on   (ONE MGET of   (cp_scorer or     (MGET of the
             tower)     the pinned  the shortlist's temde_scorer,     final k)
                        version)    feature values) one run over K)

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
from redis.exceptions import RedisError

from crossprobe.service import metrics
from crossprobe.service.backend import IndexHandle, Models, QueryVectors, Registry
from crossprobe.service.batcher import QueryBatcher
from crossprobe.service.breaker import FeatureStore, FeatureStoreUnavailable
from crossprobe.service.errors import feature_store_unavailable
from crossprobe.service.settings import MAX_SHORTLIST, Settings


class StageClock:
    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - t) * 1000


@dataclass
class Plan:
    query: str
    k: int
    rerank: str  # cp | temde | none
    shortlist: int
    index: str | None = None
    min_score: float | None = None
    tail: int = 0  # ranked ids to return after the first k, without metadata (clip-retrieval's num_result_ids)


@dataclass
class Hit:
    id: str
    score: float
    ann: float
    rerank: float | None
    metadata: dict | None = None


@dataclass
class Outcome:
    hits: list[Hit]
    tail: list[Hit]
    handle: IndexHandle
    timings_ms: dict[str, float]
    batch_size: int = 1
    degraded: list[tuple[str, str]] = field(default_factory=list)  # (code, message): why part of the path was skipped

    @property
    def degraded_codes(self) -> list[str]:
        return list(dict.fromkeys(code for code, _ in self.degraded))

    @property
    def degraded_reason(self) -> str | None:
        return "; ".join(f"{code}: {msg}" for code, msg in self.degraded) or None


class Searcher:
    def __init__(self, settings: Settings, models: Models, registry: Registry, batcher: QueryBatcher,
                 pool: Executor, feature_store: FeatureStore):
        self.settings, self.models, self.registry, self.batcher, self.pool = settings, models, registry, batcher, pool
        self.fs = feature_store

    def plan(self, query: str, k: int, rerank: str | None = None, shortlist: int | None = None,
             index: str | None = None, min_score: float | None = None, tail: int = 0) -> Plan:
        """Fill in the server's defaults (validation already happened in the schema)."""
        return Plan(query, k, rerank or self.settings.default_rerank,
                    shortlist if shortlist is not None
                    else min(max(self.settings.default_shortlist, k + tail), MAX_SHORTLIST),
                    index, min_score, tail)

    async def search(self, plan: Plan) -> Outcome:
        t0 = time.perf_counter()
        handle = self.registry.get(plan.index)  # 404 / 503 before any work
        q, info = await self.batcher.submit(plan.query)
        clock = StageClock()
        clock.ms["queue"], clock.ms["encode"] = info.queue_ms, info.encode_ms
        out = await asyncio.get_running_loop().run_in_executor(self.pool, self._after_encode, q, handle, plan, clock)
        out.batch_size = info.batch_size
        out.timings_ms["total"] = (time.perf_counter() - t0) * 1000
        return out

    # ---- the stages after encode: one worker thread per request ---------------------
    def _after_encode(self, q: QueryVectors, handle: IndexHandle, plan: Plan, clock: StageClock,
                      retried: bool = False) -> Outcome:
        reader = handle.reader
        degraded: list[tuple[str, str]] = []
        with clock.stage("ann"):
            found, scores = reader.search(q.g_q[None], plan.shortlist)
        ids = found[0]
        ann = np.asarray(scores[0][: len(ids)], np.float32)

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
                    return self._after_encode(q, newer, plan, clock, retried=True)
                metrics.error("fetch_missing")
                degraded.append(("features_missing", f"rerank skipped, features missing in Redis: {e}"))
            except (RedisError, ValueError) as e:  # an error reply / a value of the wrong size
                metrics.error("fetch_failed")
                degraded.append(("fetch_failed", f"rerank skipped, feature fetch failed: {type(e).__name__}: {e}"))
            else:
                with clock.stage("rerank"):
                    logits = np.asarray(self.models.rerank(plan.rerank, q, feats, ann), np.float32)

        final = logits if logits is not None else ann
        order = np.argsort(-final, kind="stable") if logits is not None else np.arange(len(ids))
        if plan.min_score is not None:
            order = order[final[order] >= plan.min_score]
        order = order[: plan.k + plan.tail]
        ranked = [Hit(ids[i], float(final[i]), float(ann[i]), None if logits is None else float(logits[i]))
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
        return Outcome(hits, tail, handle, clock.ms, degraded=degraded)

    def _redis_down(self, e: FeatureStoreUnavailable) -> None:
        """Redis is down: count it; with CROSSPROBE_REDIS_DOWN_SEARCH=fail the search answers 503 (else it degrades)."""
        if self.settings.redis_down_search == "fail":
            raise feature_store_unavailable(e, self.fs.retry_after_s) from None  # counted by its error handler
        metrics.error("feature_store_unavailable")


def public_metadata(meta: dict | None, expose_uri: bool) -> dict | None:
    """The indexer's metadata minus the file's path on our disk (unless configured otherwise)."""
    if meta is None or expose_uri:
        return meta
    return {k: v for k, v in meta.items() if k != "uri"}
