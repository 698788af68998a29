"""The service's Settings: StorageSettings (index root, Redis, ANN, Milvus: shared with the batch jobs) plus the
server's own knobs. Environment prefix CROSSPROBE_; docs/configuration.md lists every variable.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal, cast

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from crossprobe.core import SERVED_RERANK
from crossprobe.core.inference.languages import flores
from crossprobe.core.int8 import MIN_COSINE
from crossprobe.service import profiles
from crossprobe.service.profiles import Profile
from crossprobe.storage.settings import StorageSettings

Rerank = Literal["cp", "temde", "none"]
MAX_K = 200
MAX_SHORTLIST = 1000
MAX_QUERY_CHARS = 512
MAX_LIKE = 32  # /v1/search "like": at most this many item ids (their stored vectors are averaged)
MAX_JSON_DEPTH = 32  # request bodies nest 2 levels; deeper ones are refused before any (recursive) JSON parser


class Settings(StorageSettings):
    model_config = SettingsConfigDict(env_prefix="CROSSPROBE_")

    # A search gives up on a dead or paused Redis within ~250 ms (then answers degraded), where a batch job waits
    # seconds; 200 ms still leaves room for one MGET of a 1000-candidate shortlist (~3 MB) on a busy host.
    # threads unset: the model's measured profile (service/profiles.py: 1 for crossprobe's own query tower, 2 on
    # pools that do not spin for a CLIP-sized one), and FAISS on one thread. Milvus: a search waits 1 s at most,
    # then answers 503 ann_unavailable.
    ROLE_DEFAULTS = {
        "redis_socket_timeout_s": 0.2,
        "redis_connect_timeout_s": 0.2,
        "redis_retries": 1,
        "redis_backoff_base_s": 0.01,
        "redis_backoff_cap_s": 0.05,
        "redis_health_check_interval_s": 5.0,
        "milvus_timeout_s": 1.0,
    }

    # -- server ----------------------------------------------------------------
    host: str = "127.0.0.1"  # bind address; 0.0.0.0 in a container (the Dockerfile sets it)
    port: int = Field(8000, ge=0, le=65535)  # 0: any free port (tests)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"  # uvicorn's and crossprobe's loggers
    access_log: bool = True  # uvicorn's per-request log line; /metrics has the same facts in aggregate
    # origins whose pages may call the API from a browser, comma separated (e.g. clip-retrieval's front-end on
    # another host, which also needs public_base_url); "*" = any origin. "" (default): no CORS headers at all,
    # so browsers let only pages served by this service read its answers
    cors_origins: str = ""
    # the names clients reach this service by (the Host header; ports ignored), comma separated: any other Host is
    # refused 400 invalid_host (a web page rebinding its name to this address cannot read the photos: host_guard.py).
    # Behind a proxy or in a compose network add the names it is reached by (api, search.example.org); "*": any
    allowed_hosts: str = "localhost,127.0.0.1,::1"
    # serve without any search key on an address other than loopback: refused at start-up unless this is true
    # (every photo and its metadata would be open to the network); a compose stack that publishes the port on
    # 127.0.0.1 only sets it
    allow_open_network: bool = False

    # -- access control (docs/security.md; service/security.py) -----------------------------------------------
    # search keys, comma separated: when set (here or in api_keys_file) every search, item and index route
    # (/v1/search, /v1/explain, /v1/indexes, /v1/items/..., /knn-service, /indices-list, /metadata) needs the
    # header X-API-Key with one of them: 401 unauthorized without it, 403 forbidden with any other value.
    # A key followed by index names (spaces between: `KEY photos archive`) reads those indexes only; others
    # answer it as indexes that do not exist (docs/security.md). Unset: those routes are open
    api_keys: SecretStr | None = None
    # a file of search keys, one per line ('#' comments; `KEY [INDEX ...]` as in api_keys), added to api_keys: for
    # keys kept out of the environment (a mounted Docker / Kubernetes secret; the environment shows in
    # /proc/<pid>/environ, `docker inspect` and every child process). Read once at start-up; missing, unreadable
    # or empty: start-up fails
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
    # failed key attempts (401 / 403 on any key group) per client address: this many at once, refilled at
    # auth_failures_per_minute; beyond: 429 rate_limited before the key is even compared (guessing keys is slow)
    auth_failures_burst: int = Field(10, ge=1, le=100_000)
    auth_failures_per_minute: float = Field(6.0, gt=0, le=100_000)

    # -- model -----------------------------------------------------------------
    # which model: CROSSPROBE_MODEL (or the older CROSSPROBE_CKPT), StorageSettings' (the batch jobs read the same)
    # (where its graphs live: StorageSettings.models_dir, the folder the batch jobs read too)

    # the language queries are in, for the models told it: Immich's NLLB folders put its FLORES-200 code before each
    # query, as Immich does with its user's language (core/inference/languages.py). An ISO 639-1 code (pl) or a
    # FLORES-200 one (pol_Latn); every other model reads a query in whatever language it is written
    query_language: str = "en"
    # query tower graph: "fp32" = exactly what `crossprobe eval` measures; "int8" = MiniLM layers dynamically
    # quantized per channel: faster to encode, but it loses a little out-of-domain R@1, and quality on people's own
    # photos comes first (docs/research/query_tower_quant.md, docs/research/service_quality.md)
    query_precision: Literal["fp32", "int8"] = "fp32"
    # int8 query graphs are checked against fp32 on fixed probe queries when loaded and refused below this cosine,
    # naming the host's int8 kernel path (crossprobe.core.int8); lower it to accept a model that cannot hold it
    int8_min_cosine: float = Field(MIN_COSINE, ge=0.0, le=1.0)
    # one ONNX Runtime thread pool shared by all graphs (its workers spin), faster per query than a spinning pool
    # per graph for crossprobe's own model (core/runtime.py, docs/research/ort_threading.md). Process-wide: once
    # made, every ONNX Runtime session of the process uses it. Unset: the model's profile (service/profiles.py)
    ort_shared_pool: bool | None = None
    # per-graph pools only (ort_shared_pool=false): idle workers spin; costs idle CPU. Unset: the model's profile
    ort_spinning: bool | None = None

    # -- index versions to serve (where they live and how to reach Redis: StorageSettings) --------------------
    indexes: str = ""  # comma-separated names to serve; "" = every index under index_root with an active version
    default_index: str | None = None  # for requests without "index"; default: the first served name

    # -- Redis faults (docs/operations.md) ----------------------------------------------------------------------
    # the Redis client budget (redis_* timeouts and retries) is StorageSettings'; the service's values are in
    # ROLE_DEFAULTS above
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
    # for requests without "rerank": cp | temde | none. T-EMDE with region labels: the best out of domain on the dev
    # sets, and faster than CP (docs/research/region_labels.md)
    default_rerank: Rerank = cast(Rerank, SERVED_RERANK)
    default_shortlist: int = Field(100, ge=1, le=MAX_SHORTLIST)  # raised to k when a request asks for more
    # hybrid search (hybrid.py): the keyword index's best this many join the vector shortlist before the rerank;
    # the two orders are then fused by weighted reciprocal rank fusion, 1/(K + vector rank) + w c^p/(K + keyword
    # rank), c the share of the query's words the match holds. K, w, p: chosen on the dev sets
    # (docs/research/text_search.md)
    hybrid_candidates: int = Field(20, ge=1, le=MAX_SHORTLIST)
    hybrid_k: float = Field(20.0, gt=0)  # K: larger flattens the rank differences within each order
    hybrid_weight: float = Field(1.0, ge=0)  # w: the keyword order's weight against the vector order's (1)
    hybrid_coverage_power: float = Field(2.0, ge=0)  # p: a keyword match counts w * coverage ** p

    # -- batching and overload ---------------------------------------------------
    # the query-vector cache (query_cache.py): at most this many MiB of the vectors of texts already searched, per
    # process; a repeated text skips the queue and the query tower. 0: off
    query_cache_mb: float = Field(32.0, ge=0, le=4096)
    batching: bool = True  # group concurrent queries into one query-tower run
    batch_max: int = Field(16, ge=1, le=256)  # the most queries in one query-tower run
    batch_wait_ms: float = Field(2.0, ge=0, le=1000)  # how long a lone query waits for company (bounded)
    # query-tower batches run at once, each on a thread of its own. Unset: the model's profile (service/profiles.py)
    query_encoders: int | None = Field(None, ge=1, le=16)
    queue_size: int = Field(64, ge=1)  # searches admitted at once (waiting or running); the next gets 429
    # thumbnails (GET /v1/items/{id}/image) and explain maps decode indexed photos per request, up to ~100 MP each
    # (image_max_pixels): at most this many such requests at once; the next gets 429 overloaded with Retry-After
    decode_max_in_flight: int = Field(4, ge=1, le=1024)
    workers: int = Field(4, ge=1, le=64)  # threads for the ann / fetch / rerank / metadata stages

    # -- hot reload --------------------------------------------------------------
    # poll each index's `active` key (one GET per index: 1 s keeps `crossprobe index watch`'s lag low); 0 = only POST
    # /admin/reload
    reload_interval_s: float = Field(1.0, ge=0)

    # -- items -------------------------------------------------------------------
    image_max_side: int = Field(512, ge=16, le=4096)  # GET /v1/items/{id}/image resizes to fit this
    image_quality: int = Field(85, ge=1, le=95)  # JPEG quality of the resized image
    # refuse to decode files that decode bigger (after JPEG draft / a HEIC's thumbnail; the indexer's max_pixels)
    image_max_pixels: int = Field(100_000_000, ge=1)
    expose_uri: bool = False  # include the indexed file's path in metadata (off: it tells clients our disk layout)
    # the address browsers reach this service at (e.g. https://search.example.org, or with a path prefix): image
    # URLs in answers (/knn-service, /metadata) are <public_base_url>/v1/items/<id>/image. clip-retrieval's
    # front-end (a page on another origin) needs it, and CROSSPROBE_CORS_ORIGINS. Unset: root-relative
    # (/v1/items/...). Never taken from the request (Host, X-Forwarded-Host: any client chooses those; a
    # poisoned cache or an injected link otherwise). CROSSPROBE_PUBLIC_URL wins when both names are set
    public_base_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        validation_alias=AliasChoices("CROSSPROBE_PUBLIC_URL", "CROSSPROBE_PUBLIC_BASE_URL"),
    )

    # -- query by image (/v1/search "image", /knn-service "image") ----------------------------------------------
    # the decoded image's bytes at most (the base64 text is a third longer, and the whole body must also fit
    # max_body_bytes); longer: 413 too_large
    query_image_max_bytes: int = Field(768 * 1024, ge=1024)
    # the pixels the image decodes to (width x height from its header; a JPEG's at its draft scale, a HEIC's
    # thumbnail when it has one), checked before any pixel is decoded (a decompression bomb is a few KB of PNG);
    # more: 413 too_large. Also Pillow's own limit (its DecompressionBombError) for the decode itself
    query_image_max_pixels: int = Field(25_000_000, ge=1)

    # -- metadata filters (/v1/search "filter"; storage/filter_columns.py)
    # ----------------------------------------------
    # with an HNSW / IVF index, a filter that at most this many items pass is answered by scanning their stored
    # vectors exactly (~1 ms per 4,000 at d=256); more: FAISS with the filter's bitmap (approximate, as unfiltered)
    filter_exact_max: int = Field(20_000, ge=0)
    # a filtered keyword search reads at most this many of a word's best hits to find the ones the filter passes
    # (repeated deeper, 8x at a time, up to it): past it the words side answers with those it found, the vectors
    # side is unaffected. Bounds what one search over a common word and a filter that passes few items costs
    keyword_filter_max_depth: int = Field(100_000, ge=1)
    # read a version's metadata into filter columns while loading it (before it goes live), so the first filtered
    # search does not pay for it (one MGET pass: docs/research/search_features.md); false: on the
    # first filtered search instead (a service whose clients never filter saves the memory)
    filter_preload: bool = True

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
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, le=3600
    )  # an idle kept-alive connection is closed after this (uvicorn's timeout_keep_alive)

    # -- start-up ----------------------------------------------------------------
    warmup: bool = True  # one full query per rerank mode before /readyz says yes
    load_in_background: bool = True  # listen at once (healthz up, readyz 503) while models and indexes load

    @functools.cached_property
    def profile(self) -> Profile:
        """How the query tower runs: the model's measured profile (service/profiles.py), with what is set here over
        it. Worked out once (a reranker-heads checkpoint's config is read to know its backbone)."""
        p = profiles.for_model(self.model_spec)
        return Profile(
            threads=self.threads or p.threads,
            shared_pool=p.shared_pool if self.ort_shared_pool is None else self.ort_shared_pool,
            spinning=p.spinning if self.ort_spinning is None else self.ort_spinning,
            encoders=self.query_encoders or p.encoders,
        )

    @field_validator("query_language")
    @classmethod
    def _known_language(cls, v: str) -> str:
        flores(v)  # a code it cannot map is refused at start-up, naming what is accepted
        return v

    @property
    def index_names(self) -> list[str]:
        return [n.strip() for n in self.indexes.split(",") if n.strip()]

    @property
    def allowed_host_list(self) -> list[str]:
        return [h.strip() for h in self.allowed_hosts.split(",") if h.strip()]

    @property
    def cors_list(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]
