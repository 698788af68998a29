"""The batch jobs' Settings: StorageSettings plus every knob of build / add / delete / reindex.

Environment: CROSSPROBE_INDEX_<FIELD> (e.g. CROSSPROBE_INDEX_BATCH_SIZE), except where a field names its
variable (CROSSPROBE_ANN_BACKEND, RAY_ADDRESS, CROSSPROBE_PUSHGATEWAY_*), and the shared storage fields
(storage/settings.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from crossprobe.core.inference.decode import DEFAULT_MAX_PIXELS
from crossprobe.storage.settings import StorageSettings


class IndexerSettings(StorageSettings):
    model_config = SettingsConfigDict(env_prefix="CROSSPROBE_INDEX_")

    # (StorageSettings' own defaults are the batch jobs': a pipeline of redis_batch values may take a while on a
    # busy server, and a build would rather wait seconds than fail; still bounded, so a paused Redis fails the
    # build instead of hanging it)

    # pixels a file may decode to, checked on its header before any decode (decompression bombs, huge scans):
    # after reduced decoding, so a JPEG of up to 64x this (draft at 1/8 scale: a 200 MP photo decodes as 3 MP) and
    # a HEIC with a thumbnail pass; PNG, TIFF, WebP, AVIF and HEIC without thumbnail decode in full (a 48-50 MP
    # phone HEIC: ~150 MB while it decodes). Over it: an "oversized" skip
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, ge=1)
    # how photos are decoded for the model. reference: as its reference decodes them (crossprobe's own checkpoint:
    # reduced, JPEG draft; every exported family: the full picture, reduced only as far as max_pixels needs), so the
    # index holds the reference's embeddings. reduced: JPEG draft and HEIC thumbnails for every model, faster on
    # large JPEGs, at the cost of that parity (both measured: docs/research/decode.md)
    decode: Literal["reference", "reduced"] = "reference"
    # symbolic links in an indexed folder: inside = followed where they stay inside the folder, skipped (a counted
    # "link_outside") where they leave it, so whoever may write into the folder cannot make the service show any
    # file its user can read; all = followed wherever they lead (an album linked in from another disk; the version
    # records where they lead as its image roots, which the service checks every file it opens against)
    follow_links: Literal["inside", "all"] = "inside"
    quantization: Literal["float16", "int8"] = "float16"  # layout of P_v, b_bar, s_I in Redis (int8: + a scale)
    batch_size: int = Field(32, ge=1)  # also the commit unit of a resumable build
    # decode threads overlapping the encoder. Unset: 1, or 2 with OCR (as before OCR moved out of the decode
    # threads; with OCR one and two are about level on two cores: docs/research/text_search.md)
    workers: int | None = Field(None, ge=1, le=8)

    def reduce_for(self, reduced_decoding: bool) -> bool:
        """Whether to decode reduced for a model whose reference does so or not (Backend.reduced_decoding)."""
        return self.decode == "reduced" or reduced_decoding

    @property
    def decode_workers(self) -> int:
        return self.workers or (2 if self.ocr else 1)

    # image-tower head runtime: onnx is faster than PyTorch eager (docs/research/indexer.md); torch for checking
    head: Literal["onnx", "torch"] = "onnx"
    factory: str | None = None  # force a faiss.index_factory string; default chosen by size
    flat_max: int = 20_000  # below this many vectors: exact "Flat"
    hnsw_max: int = 2_000_000  # below this: "HNSW32"; beyond: IVF-PQ trained on a sample
    throttle_s: float = Field(
        0.0, ge=0
    )  # sleep after each committed batch (a shared machine; tests use it to kill mid-build)
    progress: bool = True  # tqdm bar
    # reindex: refuse to activate when more than this fraction of the old version's items could not be
    # re-encoded (their sources vanished or went bad since they were indexed); the new version is kept, inactive
    reindex_max_lost: float = Field(0.01, ge=0, le=1)

    # index-time OCR (ocr.py): the words in each photo become its metadata "text", searchable by keyword. Unset:
    # as the version a job starts from was built (add, reindex, watch keep an index's OCR on), else off; off by
    # default because it costs indexing speed (docs/research/text_search.md)
    ocr: bool | None = None
    # the text gate (core/text_gate.py): a photo is read where a grid cell's probability of writing reaches this.
    # Unset: the trained gate's (chosen on dev); lower finds more words, slower; 0: no gate, every photo read whole
    # (a library of documents and screenshots: docs/research/text_search.md)
    ocr_gate_threshold: float | None = Field(None, ge=0, lt=1)

    # -- ANN backend (storage/ann/): where NEW versions keep their vectors' index -----------------------------
    # faiss: index.faiss in the version directory, searched in the service's process; milvus: a collection per
    # version (<prefix>_<name>_<version>) in the Milvus at milvus_uri. The service reads each version from the
    # backend its manifest names, so switching affects only versions built afterwards
    ann_backend: Literal["faiss", "milvus"] = Field(
        "faiss", validation_alias=AliasChoices("CROSSPROBE_ANN_BACKEND", "ann_backend")
    )
    # one build call (insert batch, flush, index build + load) waits at most this long
    milvus_build_timeout_s: float = Field(1800.0, gt=0, le=86_400)
    # index type of a new collection: AUTO = FLAT below flat_max vectors, HNSW above (as FAISS's factory)
    milvus_index: Literal["AUTO", "FLAT", "HNSW", "IVF_FLAT"] = "AUTO"
    milvus_hnsw_m: int = Field(32, ge=4, le=128)  # HNSW graph degree (FAISS's HNSW32 has 32)
    milvus_hnsw_ef_construction: int = Field(40, ge=8, le=2048)  # HNSW build beam (FAISS's default: 40)
    milvus_ivf_nlist: int | None = Field(None, ge=1, le=65_536)  # IVF_FLAT lists; unset: 4 sqrt(n), a power of 2

    # -- engine (ray_engine.py): who runs decode -> encode for build / add / reindex ------------------------
    # single: this process (decode threads + one encoder); ray: Ray Data, an actor pool of encoders (one per GPU, else
    # CPU)
    engine: Literal["single", "ray"] = "single"
    ray_address: str | None = Field(
        None, validation_alias=AliasChoices("RAY_ADDRESS", "ray_address")
    )  # a Ray cluster; unset: start a local Ray
    ray_num_cpus: int | None = Field(None, ge=1)  # CPUs of the local Ray instance (default: this machine's)
    ray_actors: int | None = Field(None, ge=1)  # encoder actors (default: one per GPU, else CPUs - decode tasks)
    ray_object_store_mb: int = Field(1024, ge=100)  # object store of the local Ray instance (pixels in flight)
    ray_temp_dir: Path | None = None  # the local Ray instance's session dir root (default: Ray's /tmp/ray)

    # -- Pushgateway (push.py): build and reindex push their progress while running and at the end -----
    # Variables named CROSSPROBE_PUSHGATEWAY_*, not CROSSPROBE_INDEX_*: one deployment setting for every batch job.
    # Pushgateway URL (http://host:9091) for the progress of build and reindex; unset: nothing is pushed
    pushgateway_url: str | None = Field(None, validation_alias="CROSSPROBE_PUSHGATEWAY_URL")
    # one push (connect + reply) waits at most this long; a down or hung gateway must not stall the job, and the
    # pushes run in a thread of their own, so this bounds only how long the job's end waits for its final push
    pushgateway_timeout_s: float = Field(2.0, gt=0, le=60, validation_alias="CROSSPROBE_PUSHGATEWAY_TIMEOUT_S")
    # progress pushes this often (Prometheus scrapes the gateway every 15-60 s: finer gains nothing)
    pushgateway_interval_s: float = Field(5.0, gt=0, le=3600, validation_alias="CROSSPROBE_PUSHGATEWAY_INTERVAL_S")

    # -- watch (watch.py): `crossprobe index watch` keeps an index in step with a folder ----------------------
    # a changed file is read once its mtime is this old: a copy in progress is not indexed half-written
    watch_settle_s: float = Field(1.0, ge=0, le=3600)
    watch_events: bool = True  # wake on inotify events (watchdog) where they start; False: polling scans only
    watch_poll_s: float = Field(2.0, gt=0, le=3600)  # scan interval without events (inotify limits, network mounts)
    # a full scan at least this often even with events: an overflowed inotify queue drops events silently
    watch_rescan_s: float = Field(300.0, gt=0, le=86_400)
    watch_batch_max: int = Field(500, ge=1)  # changed files per version: bounds a batch's time, so its lag
    # a scan that would delete more than this fraction of the index holds its deletes (a disk not mounted, a
    # folder emptied by mistake) and says so; adds and changes go on
    watch_max_delete: float = Field(0.5, ge=0, le=1)
    # a version the watcher replaced is removed this long afterwards: a service polling `active` (1 s) may still
    # read it. Each version holds a copy of every item's Redis values, so a long grace multiplies Redis memory
    watch_gc_grace_s: float = Field(15.0, ge=0)
    watch_metrics_port: int = Field(9109, ge=0, le=65_535)  # the watcher's Prometheus /metrics; 0: none
    watch_metrics_addr: str = "0.0.0.0"  # the address /metrics listens on (127.0.0.1: this machine only)
