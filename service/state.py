"""Service state and lifecycle: load models and indexes, warm up, poll for new versions, shut down.

Loading runs as a background task of the FastAPI lifespan (Settings.load_in_background):
the server listens at once, /healthz answers, /readyz and the search routes answer 503
until the models, every index and one warm-up query per reranker are done, so the
first real query never pays for a cold start.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from crossprobe.core import inference
from crossprobe.core.inference import Backend
from crossprobe.service import metrics
from crossprobe.service.batcher import Limiter, QueryBatcher
from crossprobe.service.breaker import FeatureStore
from crossprobe.service.exceptions import NotReady
from crossprobe.service.explainer import Explainer
from crossprobe.service.pipeline import Searcher
from crossprobe.service.registry import Registry
from crossprobe.service.settings import Settings

log = logging.getLogger("crossprobe.service")

T = TypeVar("T")


def _warmup_image() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (120, 80, 40)).save(buf, "JPEG")
    return buf.getvalue()


def load_model(settings: Settings, bert=None) -> Backend:
    """The service's model with its parts for a search loaded: the query tower and the scorers now; the image
    towers and the explain graph on first use (the warm-up makes the image towers), so a service never asked for
    them pays nothing."""
    model = inference.load(
        settings.model_spec,
        inference.RuntimeOptions(
            graphs=settings.models,
            download_timeout_s=settings.download_timeout,
            threads=settings.profile.threads,
            spinning=settings.profile.spinning,
            shared_pool=settings.profile.shared_pool,
            query_precision=settings.query_precision,
            query_language=settings.query_language,
            bert=bert,
            int8_min_cosine=settings.int8_min_cosine,
            device=settings.device,
            precision=settings.device_precision,
        ),
    )
    model.warm("search")
    return model


class ServiceState:
    def __init__(self, settings: Settings, bert=None):
        self.settings = settings
        self._bert = bert  # tests pass an already loaded MiniLM, used only if the ONNX graphs must be exported
        self.models: Backend | None = None  # the model behind the inference seam (crossprobe.core.inference)
        self._explainer: Explainer | None = None
        self._explainer_lock = threading.Lock()
        self.registry: Registry | None = None
        self.batcher: QueryBatcher | None = None
        self.searcher: Searcher | None = None
        self.limiter = Limiter(settings.queue_size)
        # thumbnails and explain maps decode photos per request: a few at once, the next answered 429 at once
        self.decoders = Limiter(
            settings.decode_max_in_flight, "photo decodes", "CROSSPROBE_DECODE_MAX_IN_FLIGHT", False
        )
        self.pool = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="stage")
        # every Redis call of the request path goes through its circuit breaker (breaker.py)
        self.feature_store = FeatureStore(settings.redis_breaker_failures, settings.redis_breaker_cooldown_s, log=log)
        self.warmed = False
        self.failure: str | None = None  # why start-up failed (readyz says it)
        self._tasks: list[asyncio.Task] = []
        self._reload_lock: asyncio.Lock | None = None

    # ---- readiness ---------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.warmed and self.registry is not None and bool(self.registry.handles)

    def why_not_ready(self) -> str:
        if self.failure:
            return f"start-up failed: {self.failure}"
        if self.models is None:
            return "loading models"
        if self.registry is None or not self.registry.handles:
            where = self.settings.index_names or f"under {self.settings.index_root}"
            probs = "; ".join(f"{n}: {why}" for n, why in (self.registry.problems if self.registry else {}).items())
            fs = self.feature_store  # the versions are listed in Redis: say so when it cannot be reached
            down = "" if fs.up else f"; the feature store (Redis) is unreachable: {fs.breaker.last_error}"
            return f"no index served yet ({where}){f': {probs}' if probs else ''}{down}"
        return "warming up"

    def require_ready(self) -> None:
        if not self.ready:
            raise NotReady(self.why_not_ready())

    # ---- the parts start() loads -------------------------------------------------------
    # A ready service has them all (start() sets them before the warm-up that makes it ready): the routes check
    # readiness first (deps.ready), then read them here. Before they are loaded: 503 not_ready, as require_ready.
    def _loaded(self, part: T | None) -> T:
        if part is None:
            raise NotReady(self.why_not_ready())
        return part

    @property
    def loaded_models(self) -> Backend:
        return self._loaded(self.models)

    @property
    def loaded_registry(self) -> Registry:
        return self._loaded(self.registry)

    @property
    def loaded_batcher(self) -> QueryBatcher:
        return self._loaded(self.batcher)

    @property
    def loaded_searcher(self) -> Searcher:
        return self._loaded(self.searcher)

    # ---- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        self._reload_lock = asyncio.Lock()
        try:
            models, registry = await asyncio.to_thread(self._load)
            self.models, self.registry = models, registry
            settings = self.settings
            self.batcher = batcher = QueryBatcher(
                lambda texts: self.loaded_models.encode_texts(texts),
                settings.batch_max,
                settings.batch_wait_ms / 1000,
                settings.batching,
                busy=lambda n: self.limiter.in_flight > n,
                encoders=settings.profile.encoders,
            )
            batcher.start()
            self.searcher = Searcher(settings, models, registry, batcher, self.pool, self.feature_store)
            await self.warmup()
        except Exception as e:  # noqa: BLE001 - readyz reports it; the process stays up for inspection
            log.exception("start-up failed")
            metrics.error("startup")
            self.failure = f"{type(e).__name__}: {e}"
            return
        if self.settings.reload_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._poll(), name="index-poller"))
        if self.settings.redis_probe_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._probe_redis(), name="redis-probe"))
        log.info(
            "ready: model %s, indexes %s, providers %s",
            models.fingerprint,
            {n: h.version for n, h in registry.handles.items()},
            models.providers,
        )

    def _load(self) -> tuple[Backend, Registry]:
        models = load_model(self.settings, self._bert)
        registry = Registry(self.settings, models.fingerprint, str(self.settings.model_spec))
        registry.refresh()
        return models, registry

    @property
    def explain_offered(self) -> bool:
        """Whether the model has explain maps, known without loading them (Backend.explains: a family model's has
        none; one that makes none after all is refused when the explainer loads)."""
        return self.models is not None and self.models.explains

    @property
    def explainer_loaded(self) -> bool:
        return self._explainer is not None

    def explainer(self) -> Explainer:
        """The explain maps' parts, loaded (exported first if missing) on the first call; thread-safe."""
        with self._explainer_lock:
            if self._explainer is None:
                self._explainer = Explainer(self.settings, self.loaded_models)
            return self._explainer

    async def warmup(self) -> None:
        """One query per reranker through the whole path (first ORT runs allocate; first MGET connects), and one
        image query (loads the image backbone and tower: query by image's first request pays no load)."""
        name = self.registry.default_name() if self.registry else None
        if self.settings.warmup and name in (self.registry.handles if self.registry else {}):
            searcher = self.loaded_searcher
            for rerank in self.loaded_models.rerankers or ("none",):
                await searcher.search(searcher.plan(query="a photo", k=1, rerank=rerank, index=name))
            await searcher.search(searcher.plan(k=1, rerank="none", index=name, image=_warmup_image()))
        self.warmed = True

    async def reload(self, force: bool = False) -> dict[str, dict]:
        """Check every index's active version now; load and swap changed ones (poller and /admin/reload)."""
        registry, lock = self.registry, self._reload_lock
        if registry is None:
            raise NotReady(self.why_not_ready())
        assert lock is not None, "start() makes the reload lock before it loads the registry"
        async with lock:
            return await asyncio.to_thread(registry.refresh, force)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reload_interval_s)
            try:
                await self.reload()
            except Exception:  # noqa: BLE001 - keep polling; the registry already logged and counted it
                log.exception("index poll failed")

    async def _probe_redis(self) -> None:
        """PING Redis every redis_probe_interval_s through the breaker: recovery within one interval of Redis
        coming back, whether or not searches arrive; a Redis that dies while idle is noticed too (/readyz)."""
        store = self.loaded_registry.store  # the client (and pool) every reader of the registry uses
        while True:
            await asyncio.sleep(self.settings.redis_probe_interval_s)
            try:
                # not the stage pool: a paused Redis must not take a search's thread, even for 200 ms.
                # store.ping: PING the Redis, or every master of a cluster (a failover is found here too)
                await asyncio.to_thread(self.feature_store.probe, store.ping)
            except Exception:  # noqa: BLE001 - keep probing; FeatureStore counted and logged it
                log.exception("Redis probe failed")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        if self.batcher:
            await self.batcher.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def spawn_start(self) -> None:
        self._tasks.append(asyncio.create_task(self.start(), name="service-start"))
