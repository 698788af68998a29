"""The Searcher: a plan in, an Outcome out. resolve (the version, the mode, the ids and vectors the plan
names) -> encode (the text's query tower through the batcher, the vector part in a worker) -> the stages after
encode (stages.AFTER_ENCODE), in one worker thread per request."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import BaseModel

from crossprobe.core.inference import Backend, QueryVectors
from crossprobe.core.runtime import StageTimer
from crossprobe.service import metrics, query_image
from crossprobe.service.batcher import EncodeInfo, QueryBatcher
from crossprobe.service.breaker import FeatureStore
from crossprobe.service.exceptions import InvalidRequest, ItemNotFound
from crossprobe.service.pipeline import stages
from crossprobe.service.pipeline.plan import Plan
from crossprobe.service.pipeline.run import Outcome, Run
from crossprobe.service.query_cache import QueryCache
from crossprobe.service.registry import IndexHandle, Registry
from crossprobe.service.settings import Settings
from crossprobe.storage.ann import AnnUnavailable


class Searcher:
    def __init__(
        self,
        settings: Settings,
        models: Backend,
        registry: Registry,
        batcher: QueryBatcher,
        pool: Executor,
        feature_store: FeatureStore,
    ):
        self.settings, self.models, self.registry, self.batcher, self.pool = settings, models, registry, batcher, pool
        self.fs = feature_store
        self.cache = QueryCache(int(settings.query_cache_mb * 2**20))

    def plan(self, req: BaseModel | None = None, **given: Any) -> Plan:
        """The plan of a request model (SearchRequest, ImageSearchParams) and a route's translations: Plan.from_request
        with this server's settings and model (its rerankers and calibration)."""
        return Plan.from_request(req, self.settings, self.models, **given)

    async def search(self, plan: Plan) -> Outcome:
        t0 = time.perf_counter()
        handle, plan = self.resolve(plan)
        clock = StageTimer()
        q, info = await self.encode(plan, handle, clock)
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(self.pool, self._after_encode, q, handle, plan, clock)
        out.batch_size = info.batch_size if info is not None else 1
        out.plan = plan  # the plan as it ran on this index (its mode, its reranker)
        out.timings_ms["total"] = (time.perf_counter() - t0) * 1000
        return out

    def resolve(self, plan: Plan) -> tuple[IndexHandle, Plan]:
        """The version to search (404 / 503 before any work) and the plan as it runs there (Plan.on_index: its mode
        and reranker); the plan's "like" ids must be in it (404) and its raw vector of its dimension (422)."""
        handle = self.registry.get(plan.index, scope=plan.scope)
        plan = plan.on_index(handle.keywords is not None)
        if plan.like:
            unknown = [i for i in plan.like if i not in handle.ids]
            if unknown:
                raise ItemNotFound(
                    f'{len(unknown)} of the "like" ids are not in {handle.name}/{handle.version}: {unknown[:5]}',
                    {"ids": unknown[:100]},
                )
        if plan.embedding is not None and len(plan.embedding) != handle.reader.d:
            raise InvalidRequest(
                f"invalid request: embedding_input has {len(plan.embedding)} "
                f"values; index {handle.name} holds vectors of {handle.reader.d}"
            )
        return handle, plan

    async def encode(self, plan: Plan, handle: IndexHandle, clock: StageTimer) -> tuple[QueryVectors, Any]:
        """queue + encode (the text, through the batcher) beside the vector part (decode_image + encode_image,
        like, or a raw vector) -> the query vectors, their ANN query (1 - w) g_q + w v renormalised when both
        are given, and the batcher's info (None without a text)."""
        loop = asyncio.get_running_loop()
        vector = info = None
        text_job = self._text(plan.query) if plan.query is not None else None
        if plan.image is not None or plan.like or plan.embedding is not None:
            vec_job = loop.run_in_executor(self.pool, self._query_vector, plan, handle, clock)
            if text_job is not None:  # the text's query tower and the image's towers run at the same time
                (q, info), vector = await asyncio.gather(text_job, vec_job)
            else:
                vector = await vec_job
                q = QueryVectors(vector, None, None, None)
        else:  # no vector part: a text alone (every request model and route asks for at least one)
            assert text_job is not None, "a plan with neither a text nor a vector part"
            q, info = await text_job
        if info is not None:
            clock.add("queue", info.queue_ms / 1000)
            clock.add("encode", info.encode_ms / 1000)
        if text_job is not None and vector is not None:
            mixed = (1.0 - plan.weight) * q.g_q.astype(np.float32) + plan.weight * vector
            q = replace(q, g_q=_unit(mixed, q.g_q))
        return q, info

    async def _text(self, text: str) -> tuple[QueryVectors, EncodeInfo]:
        """The text's query vectors: from the cache (its lookup is the encode time), else through the batcher."""
        start = time.perf_counter()
        key = (self.models.fingerprint, self.models.query_precision, text)
        cached = self.cache.get(key)
        if cached is not None:
            return cached, EncodeInfo(0.0, (time.perf_counter() - start) * 1000, 1, cached=True)
        q, info = await self.batcher.submit(text)
        self.cache.put(key, q)
        return q, info

    def _query_vector(self, plan: Plan, handle: IndexHandle, clock: StageTimer) -> np.ndarray:
        """The vector part of a query, unit norm: an image's g_I, the mean of stored vectors, or a raw vector."""
        if plan.image is not None:
            with clock.stage("decode_image"):
                px = query_image.pixels(
                    plan.image,
                    self.settings.query_image_max_pixels,
                    preprocess=self.models.preprocessor(),
                    size=self.models.image_size,
                    reduce=self.models.reduced_decoding,
                )
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
    def _after_encode(
        self, q: QueryVectors, handle: IndexHandle, plan: Plan, clock: StageTimer, retried: bool = False
    ) -> Outcome:
        try:
            return self._ranked(q, handle, plan, clock, retried)
        except AnnUnavailable as e:  # a Milvus down or past its timeout: nothing to answer from, say so (no 500)
            metrics.error("ann_unavailable")
            raise AnnUnavailable(f"the vector engine of {handle.name}/{handle.version} is unavailable: {e}") from None

    def _ranked(
        self, q: QueryVectors, handle: IndexHandle, plan: Plan, clock: StageTimer, retried: bool = False
    ) -> Outcome:
        run = Run(plan, handle, q, clock, retried)
        try:
            for stage in stages.AFTER_ENCODE:
                stage(self, run)
        except stages.VersionGone as gone:  # the version was deleted under this request: the newer one answers
            return self._ranked(q, gone.newer, plan, clock, retried=True)
        return run.outcome()


def _unit(v: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """v / |v| as float32; `fallback` (unit norm already) when v is (numerically) zero: two opposite vectors."""
    v = np.asarray(v, np.float32)
    n = float(np.linalg.norm(v))
    return v / n if n > 1e-6 else np.asarray(fallback, np.float32)
