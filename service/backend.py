"""Backend: the models (ONNX Runtime) and the served index versions (FAISS + Redis).

Layering as in text-embeddings-inference: router (app.py, FastAPI routes) ->
queue/batcher (batcher.py) -> backend (this file). Nothing here knows HTTP.

Models: query_tower / cp_scorer / temde_scorer graphs of one checkpoint, exported
once into <artifacts_dir>/<fingerprint>/ (a temp dir renamed into place, so a
killed export never leaves half a graph) and run with ONNX Runtime (CUDA
provider when present). When the graphs already exist nothing imports the
PyTorch model, so a restart takes seconds.

Explainer: POST /v1/explain's per-region attention maps (the image backbone graph and
models/export.py's explain graph, loaded on the first explain call: a service that is never
asked pays nothing for them).

Registry: name -> IndexHandle (one pinned version: its ANN index (FAISS, or a Milvus collection), ids, Redis keys).
A new version is loaded completely beside the old one, then the dict is
replaced by a new dict in one assignment: a request that already took a handle
finishes on its version; the next request sees the new one.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from redis.exceptions import RedisError

from crossprobe.models import runtime
from crossprobe.indexer.ann import AnnUnavailable
from crossprobe.indexer.reader import FingerprintMismatch, IndexReader, open_index
from crossprobe.indexer.redis_conn import connect
from crossprobe.indexer.store import NAME_RE, Store
from crossprobe.service import metrics
from crossprobe.service.errors import ApiError
from crossprobe.service import filters
from crossprobe.service.settings import Settings

log = logging.getLogger("crossprobe.service")

GRAPHS = ("query_tower", "cp_scorer", "temde_scorer")
# exported with GRAPHS while the PyTorch model is loaded anyway (a second or so), but not required for them to
# count as present: a directory exported before the graph existed gets it on the first /v1/explain instead
EXPLAIN_GRAPH = "explain"
# the image tower (models/export.py ImageGraph, the indexer's head): query by image, exported the same way
IMAGE_GRAPH = "image_tower"
# crossprobe.models.checkpoint.DEFAULT_CHECKPOINT, without importing torch just to know a path
DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[1] / "models" / "checkpoints" / "default"  # the sibling package


def checkpoint_fingerprint(ckpt: Path | None) -> str:
    path = Path(ckpt or DEFAULT_CHECKPOINT)
    cfg = path / "config.json"
    if not cfg.exists():
        raise FileNotFoundError(f"no checkpoint at {path} (train one with `crossprobe train`, or set CROSSPROBE_CKPT)")
    return json.loads(cfg.read_text())["fingerprint"]


def ensure_onnx(artifacts: Path, ckpt: Path | None, bert=None) -> Path:
    """<artifacts>/<fingerprint>/ holding the three graphs, exported now if missing (atomically)."""
    fp = checkpoint_fingerprint(ckpt)
    final = Path(artifacts) / fp
    if all((final / f"{g}.onnx").exists() for g in GRAPHS):
        return final
    from crossprobe.models import checkpoint
    from crossprobe.models.export import export_all

    final.parent.mkdir(parents=True, exist_ok=True)
    log.info("exporting ONNX graphs of checkpoint %s into %s", fp, final)
    model, meta = checkpoint.load(ckpt, bert)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".export-"))
    try:
        export_all(model, tmp, meta["fingerprint"], names=GRAPHS + (EXPLAIN_GRAPH, IMAGE_GRAPH))
        if final.exists():  # an incomplete directory (a graph deleted by hand): set it aside, then replace
            aside = final.with_name(f".{fp}.old-{os.getpid()}")
            os.replace(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished first: its graphs are as good as ours
            if not all((final / f"{g}.onnx").exists() for g in GRAPHS):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def ensure_graph(graphs: Path, name: str, ckpt: Path | None, bert=None) -> Path:
    """<graphs>/<name>.onnx, exported now if missing (a graphs directory older than the graph: explain,
    image_tower). Written in a temp dir beside it and renamed, so a reader never sees half a graph."""
    path = graphs / f"{name}.onnx"
    if path.exists():
        return path
    from crossprobe.models import checkpoint
    from crossprobe.models.export import export_all

    log.info("exporting the %s graph of checkpoint %s into %s", name, graphs.name, path)
    model, meta = checkpoint.load(ckpt, bert)
    tmp = Path(tempfile.mkdtemp(dir=graphs, prefix=".export-"))
    try:
        export_all(model, tmp, meta["fingerprint"], names=(name,))
        os.replace(tmp / path.name, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def ensure_int8_query(graphs: Path) -> Path:
    """<graphs>/query_tower.int8.onnx, quantized from the fp32 graph once (atomically)."""
    path = graphs / "query_tower.int8.onnx"
    if not path.exists():
        from crossprobe.models.export import quantize_query_tower

        log.info("quantizing the query tower to int8 into %s", path)
        quantize_query_tower(graphs / "query_tower.onnx", path)
    return path


@dataclass(frozen=True)
class QueryVectors:
    """The query tower's outputs for one query."""
    g_q: np.ndarray  # (d,) unit norm: the ANN query
    p_t: np.ndarray  # (m, dc) text probes (CP)
    w_bar: np.ndarray  # (dc,) mean text token (CP)
    s_q: np.ndarray  # (nk,) T-EMDE sketch
    q_cls: np.ndarray | None = None  # (1000,) cosines with the class table, with region labels (models/region_labels.py)


class Models:
    def __init__(self, settings: Settings, bert=None):
        from crossprobe.models import backbones as bb

        self.fingerprint = checkpoint_fingerprint(settings.ckpt)
        graphs = ensure_onnx(settings.artifacts_dir, settings.ckpt, bert)
        self.graphs = graphs
        self._settings, self._bert = settings, bert  # for the explainer, made on first use
        self._explainer: Explainer | None = None
        self._explainer_lock = threading.Lock()
        self._image: ImageQueryEncoder | None = None
        self._image_lock = threading.Lock()
        self._bb = bb
        self.tokenizer = bb.load_tokenizer()
        self.query_precision = settings.query_precision
        query_graph = graphs / "query_tower.onnx"
        if settings.query_precision == "int8":
            query_graph = ensure_int8_query(graphs)
        if settings.ort_shared_pool:  # one pool for all graphs (models/runtime.py says why)
            runtime.share_thread_pool(settings.threads or 0)
        spin = settings.ort_spinning
        self.query = runtime.session(query_graph, settings.threads, spin)
        self.scorers = {"cp": runtime.session(graphs / "cp_scorer.onnx", settings.threads, spin),
                        "temde": runtime.session(graphs / "temde_scorer.onnx", settings.threads, spin)}
        # scorers that add the region-label term take the query's class cosines and the candidates' cell labels
        self.region = {k: "labels" in {i.name for i in s.get_inputs()} for k, s in self.scorers.items()}
        self.providers = self.query.get_providers()

    def encode(self, texts: list[str]) -> list[QueryVectors]:
        """A batch of queries -> query vectors. fp32: one run for the batch (padding is masked, so
        batching does not change results). int8: one unpadded run per query, because dynamic
        quantization scales activations by the min/max of the whole input tensor, so batch-mates
        and padding would change a query's vectors."""
        groups = [texts] if self.query_precision == "fp32" else [[t] for t in texts]
        out: list[QueryVectors] = []
        for group in groups:
            ids, mask = self._bb.tokenize(self.tokenizer, group)
            g, p_t, w_bar, s_q, *q_cls = self.query.run(None, {"input_ids": ids, "attention_mask": mask})
            out += [QueryVectors(g[i], p_t[i], w_bar[i], s_q[i], q_cls[0][i] if q_cls else None) for i in range(len(group))]
        return out

    def rerank(self, kind: str, q: QueryVectors, feats: dict[str, np.ndarray], s_tt: np.ndarray) -> np.ndarray:
        """One query against its K candidates in one scorer run -> fused logits (K,)."""
        s_tt = np.ascontiguousarray(s_tt, np.float32)
        if kind == "cp":
            feed = {"p_t": q.p_t[None], "w_bar": q.w_bar[None], "p_v": feats["p_v"], "b_bar": feats["b_bar"],
                    "s_tt": s_tt}
        elif kind == "temde":
            feed = {"s_q": q.s_q[None], "s_i": feats["s_i"], "s_tt": s_tt}
        else:
            raise ValueError(f"unknown reranker {kind!r}")
        if self.region[kind]:
            feed["q_cls"], feed["labels"] = q.q_cls[None], feats["labels"]
        return self.scorers[kind].run(None, feed)[0]

    @property
    def explainer_loaded(self) -> bool:
        return self._explainer is not None

    def explainer(self) -> "Explainer":
        """The explain graphs, loaded (exported first if missing) on the first call; thread-safe."""
        with self._explainer_lock:
            if self._explainer is None:
                self._explainer = Explainer(self._settings, self.graphs, self._bert)
            return self._explainer

    def image_encoder(self) -> "ImageQueryEncoder":
        """The image backbone + image tower (query by image), loaded on the first call (the warm-up makes it);
        thread-safe."""
        with self._image_lock:
            if self._image is None:
                self._image = ImageQueryEncoder(self._settings, self.graphs, self._bert)
            return self._image


class ImageQueryEncoder:
    """Query by image: pixels -> the bridged g_I, exactly what the indexer stores for an image.

    The indexer's own encode stage (indexer/encoder.py Encoder: models/data/features.py's backbone session,
    then the image_tower graph), pointed at the service's artifacts: the backbone graph (one for all
    checkpoints) at <artifacts_dir>/image_backbone.onnx, shared with the explainer, and the head at
    <artifacts_dir>/<fingerprint>/image_tower.onnx beside the query tower. The Encoder then needs no PyTorch
    model (the head graph exists). Both sessions run on the process's shared ONNX Runtime pool when it is on."""

    def __init__(self, settings: Settings, graphs: Path, bert=None):
        from crossprobe.indexer.encoder import Encoder
        from crossprobe.indexer.redis_conn import Settings as IndexSettings

        ensure_graph(graphs, IMAGE_GRAPH, settings.ckpt, bert)
        ixs = IndexSettings(model_dir=Path(settings.artifacts_dir), threads=settings.threads, head="onnx",
                            progress=False)
        self.encoder = Encoder(ixs, settings.ckpt)
        if self.encoder.fingerprint != graphs.name:
            raise ValueError(f"image tower of {self.encoder.fingerprint}, query tower of {graphs.name}")
        self.d = self.encoder.dims.d

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """(B, 3, 224, 224) float32 -> (B, d) unit-norm g_I."""
        return self.encoder.head(self.encoder.backbone(np.ascontiguousarray(pixels, np.float32))).g


EXPLAIN_MODES = {
    # what the maps mean, said on the page beside them
    "query": "where this query looked: the query's text probes attend to the image's vision probes, which "
             "attend to the 7x7 regions (the two attention steps composed; Cross-probe reranker)",
    "probes": "regions the image's probes attend to (averaged over probes and heads; the checkpoint's "
              "Cross-probe has no cross layers, so the query cannot change them)",
}


@dataclass
class ExplainMaps:
    maps: dict[str, np.ndarray]  # id -> (7, 7) query-dependent weights, sum 1
    probe_maps: dict[str, np.ndarray]  # id -> (7, 7) the same image's probes averaged (query-independent), sum 1
    unavailable: dict[str, str]  # id -> why no map (its file is gone or cannot be decoded any more)
    timings_ms: dict[str, float]


class Explainer:
    """Per-region attention maps of Cross-probe for one query and a few indexed images.

    The 7x7 grid is not stored (Redis holds the probes made from it, not the 49 x 1280 features), so each
    image is decoded again exactly as the indexer decoded it (indexer.decode) and run through the same
    frozen backbone graph, then the explain graph (models/export.py ExplainGraph) maps (grid, the query's
    P_t) to weights. Grids of recently explained images are kept (an LRU of GRID_CACHE entries, 250 KB
    each, keyed by index, version and id), because the page explains the same results again when the
    reranker or the query changes."""

    GRID_CACHE = 64

    def __init__(self, settings: Settings, graphs: Path, bert=None):
        from crossprobe.models import backbones as bb
        from crossprobe.models.data.features import image_backbone_session

        self.settings = settings
        self.grid_side = bb.GRID
        # the indexer's backbone graph (one for all checkpoints), exported into the service's artifacts dir
        self.backbone = image_backbone_session(Path(settings.artifacts_dir), threads=settings.threads)
        self.session = runtime.session(ensure_graph(graphs, EXPLAIN_GRAPH, settings.ckpt, bert), settings.threads,
                                       settings.ort_spinning)
        # the exported graph returns the probe map for both outputs when CP has no cross layers
        self.mode = "query" if self._has_cross_layers() else "probes"
        self._grids: OrderedDict[tuple[str, str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _has_cross_layers(self) -> bool:
        cfg_path = Path(self.settings.ckpt or DEFAULT_CHECKPOINT) / "config.json"
        try:
            return json.loads(cfg_path.read_text())["model"]["cp"].get("layers", 1) > 0
        except (OSError, KeyError, ValueError):
            return True

    def explain(self, handle: IndexHandle, ids: list[str], metas: list[dict | None], p_t: np.ndarray) -> ExplainMaps:
        from crossprobe.indexer.decode import decode_one
        from crossprobe.indexer.sources import Item, Skip

        timings = {"decode": 0.0, "backbone": 0.0, "attention": 0.0}
        unavailable: dict[str, str] = {}
        grids: dict[str, np.ndarray] = {}
        todo: list[tuple[str, np.ndarray]] = []
        t = time.perf_counter()
        for item_id, meta in zip(ids, metas):
            cached = self._cached((handle.name, handle.version, item_id))
            if cached is not None:
                grids[item_id] = cached
                continue
            uri = (meta or {}).get("uri")
            if not uri:
                unavailable[item_id] = "no file recorded for this item"
                continue
            r = decode_one(Item(item_id, uri), self.settings.image_max_pixels)
            if isinstance(r, Skip):
                unavailable[item_id] = f"the indexed file cannot be read any more ({r.reason})"
                continue
            todo.append((item_id, r[0]))
        timings["decode"] = (time.perf_counter() - t) * 1000
        if todo:
            t = time.perf_counter()
            out = self.backbone.run(None, {"pixels": np.stack([px for _, px in todo])})[0]
            timings["backbone"] = (time.perf_counter() - t) * 1000
            for (item_id, _), g in zip(todo, out):
                grids[item_id] = g
                self._remember((handle.name, handle.version, item_id), g)
        maps: dict[str, np.ndarray] = {}
        probe_maps: dict[str, np.ndarray] = {}
        done = [i for i in ids if i in grids]
        if done:
            t = time.perf_counter()
            regions, probes = self.session.run(None, {"grid": np.stack([grids[i] for i in done]).astype(np.float32),
                                                      "p_t": np.ascontiguousarray(p_t[None], np.float32)})
            timings["attention"] = (time.perf_counter() - t) * 1000
            side = self.grid_side
            for i, r, p in zip(done, regions, probes):
                maps[i] = _renormalised(r).reshape(side, side)
                probe_maps[i] = _renormalised(p).reshape(side, side)
        return ExplainMaps(maps, probe_maps, unavailable, timings)

    def _cached(self, key: tuple[str, str, str]) -> np.ndarray | None:
        with self._lock:
            g = self._grids.get(key)
            if g is not None:
                self._grids.move_to_end(key)
            return g

    def _remember(self, key: tuple[str, str, str], grid: np.ndarray) -> None:
        with self._lock:
            self._grids[key] = grid
            self._grids.move_to_end(key)
            while len(self._grids) > self.GRID_CACHE:
                self._grids.popitem(last=False)


def _renormalised(w: np.ndarray) -> np.ndarray:
    """Softmax outputs sum to 1 up to float32 rounding; make it exact in float64 for the JSON."""
    w = np.clip(np.asarray(w, np.float64), 0.0, None)
    return w / w.sum() if w.sum() > 0 else np.full_like(w, 1.0 / w.size)


class IndexHandle:
    """One loaded, immutable version of an index."""

    def __init__(self, reader: IndexReader):
        self.reader = reader
        self.name, self.version = reader.name, reader.version
        self.ids = frozenset(reader.ids)  # membership test for /v1/items: only indexed ids are readable
        self.loaded_at = time.time()
        self.columns = filters.ColumnCache()  # metadata columns for filters, read on the first filtered search

    def __len__(self) -> int:
        return len(self.reader)

    def info(self) -> dict:
        m = self.reader.manifest
        return {"name": self.name, "version": self.version, "count": len(self), "fingerprint": m["fingerprint"],
                "factory": m.get("factory"), "created": m.get("created")}


class Registry:
    def __init__(self, settings: Settings, fingerprint: str):
        self.settings = settings
        self.ixs = settings.indexer_settings()
        self.store = Store(self.ixs, connect(self.ixs))
        self.fingerprint = fingerprint
        self.handles: dict[str, IndexHandle] = {}  # replaced, never mutated: readers may hold the old dict
        self.problems: dict[str, str] = {}  # name -> why its active version is not served (old one may be)
        self._refused: dict[str, str] = {}  # name -> active version that failed to load
        self._lock = threading.Lock()  # one refresh at a time (poller and /admin/reload)
        if settings.threads:
            import faiss

            faiss.omp_set_num_threads(settings.threads)  # process-wide: FAISS and ORT share the same cores

    # ---- lookups (request path) ------------------------------------------------
    def default_name(self) -> str | None:
        if self.settings.default_index:
            return self.settings.default_index
        return min(self.handles) if self.handles else None

    def get(self, name: str | None) -> IndexHandle:
        name = name or self.default_name()
        if name is None:
            raise ApiError(503, "not_ready", "no index is being served yet", headers={"Retry-After": "1"})
        h = self.handles.get(name)
        if h is not None:
            return h
        if name in self.problems:
            raise ApiError(503, "index_unavailable", f"index {name!r} cannot be served: {self.problems[name]}")
        raise ApiError(404, "index_not_found", f"no index {name!r} here; served: {sorted(self.handles)}")

    def current(self, name: str) -> IndexHandle | None:
        return self.handles.get(name)

    # ---- loading (background) --------------------------------------------------
    def wanted(self) -> list[str]:
        if self.settings.index_names:
            return self.settings.index_names
        return [n for n in self.store.names() if NAME_RE.match(n) and self.store.active(n)]

    def load(self, name: str, version: str) -> IndexHandle:
        reader = open_index(name, self.fingerprint, self.ixs, version=version, store=self.store)
        h = IndexHandle(reader)
        if len(h):  # touch what a query touches (pages of the FAISS index, one MGET) before going live
            reader.search(np.zeros((1, reader.d), np.float32), 1)
            reader.features(reader.ids[:1])
            if self.settings.filter_preload:
                t = time.perf_counter()
                try:
                    h.columns.get(lambda: filters.all_metadata(reader))
                    log.info("%s/%s: filter columns of %d items read in %.2f s", name, version, len(h),
                             time.perf_counter() - t)
                except RedisError as e:  # not fatal: the first filtered search reads them (or answers 503)
                    metrics.error("filter_preload")
                    log.warning("%s/%s: filter columns not preloaded (%s); read on the first filtered search",
                                name, version, e)
        return h

    def refresh(self, force: bool = False) -> dict[str, dict]:
        """Serve each wanted index's active version; load changed ones fully, then swap. -> per-name outcome.
        A version that failed to load is not retried on every poll (a big index is costly to read), only
        when `active` moves again or with force (POST /admin/reload)."""
        with self._lock:
            out: dict[str, dict] = {}
            try:
                names = self.wanted()
            except Exception as e:  # noqa: BLE001 - Redis down: keep serving what is loaded, retry next poll
                metrics.error("reload_redis")
                log.warning("cannot list indexes: %s", e)
                return {n: {"version": h.version, "changed": False, "error": str(e)} for n, h in self.handles.items()}
            for name in names:
                cur = self.handles.get(name)
                try:
                    active = self.store.active(name)
                except Exception as e:  # noqa: BLE001 - Redis down: keep serving what is loaded
                    out[name] = self._failed(name, cur, None, f"cannot read the active version: {e}", "redis")
                    continue
                if active is None:
                    out[name] = self._failed(name, cur, None, "no active version (never built, or its key was "
                                             "deleted)", "no_active")
                    continue
                if cur is not None and cur.version == active:
                    self.problems.pop(name, None)  # e.g. a refused version was rolled back
                    out[name] = {"version": active, "changed": False}
                    continue
                if not force and self._refused.get(name) == active:
                    out[name] = {"version": cur.version if cur else None, "changed": False,
                                 "error": self.problems.get(name)}
                    continue
                try:
                    h = self.load(name, active)
                except FingerprintMismatch as e:
                    out[name] = self._failed(name, cur, active, str(e), "fingerprint_mismatch")
                    continue
                except AnnUnavailable as e:  # the vector engine is down or starting: retried at the next poll
                    out[name] = self._failed(name, cur, None, f"{type(e).__name__}: {e}", "ann_unavailable")
                    continue
                except Exception as e:  # noqa: BLE001 - a bad version never takes down the served one
                    out[name] = self._failed(name, cur, active, f"{type(e).__name__}: {e}", "load_failed")
                    continue
                self.handles = {**self.handles, name: h}  # the swap: one reference assignment
                self.problems.pop(name, None)
                self._refused.pop(name, None)
                metrics.index_served(name, h.version, h.reader.fingerprint, len(h))
                metrics.RELOADS.labels(name, "switched" if cur else "loaded").inc()
                log.info("index %s: serving version %s (%d items)%s", name, h.version, len(h),
                         f", was {cur.version}" if cur else "")
                out[name] = {"version": h.version, "changed": True, "previous": cur.version if cur else None}
            return out

    def _failed(self, name: str, cur: IndexHandle | None, version: str | None, why: str, kind: str) -> dict:
        """Record why `name` could not be (re)loaded; the served version, if any, stays."""
        if self.problems.get(name) != why:  # count and log a problem once, not once per poll
            metrics.RELOADS.labels(name, kind).inc()
            metrics.error(f"reload_{kind}")
            log.warning("index %s: %s%s", name, why, f" (still serving {cur.version})" if cur else "")
        self.problems[name] = why
        if version is not None:
            self._refused[name] = version
        return {"version": cur.version if cur else None, "changed": False, "error": why}
