"""POST /v1/explain's per-region attention maps of Cross-probe for one query and a few indexed images."""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crossprobe.models import DEFAULT_CHECKPOINT, export, runtime
from crossprobe.service.registry import IndexHandle
from crossprobe.service.settings import Settings

EXPLAIN_MODES = {
    # what the maps mean, said on the page beside them
    "query": "where this query looked: the query's text probes attend to the image's vision probes, which "
             "attend to the 7x7 regions (the two attention steps composed; Cross-probe reranker)",
    "probes": "regions the image's probes attend to (averaged over probes and heads; the checkpoint's "
              "Cross-probe has no cross layers, so the query cannot change them)",
    "labels": "how well what the ImageNet head sees in each 7x7 region matches the query (the region-label term's "
              "per-region scores, each region's share of their softmax)",
}


@dataclass
class ExplainMaps:
    maps: dict[str, np.ndarray]  # id -> (7, 7) query-dependent weights, sum 1 (what `mode` says)
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
        from crossprobe.models import inputs
        from crossprobe.models.data.features import image_backbone_session

        self.settings = settings
        self.grid_side = inputs.GRID
        # the indexer's backbone graph (one for all checkpoints), exported into the service's artifacts dir
        self.backbone = image_backbone_session(Path(settings.artifacts_dir), threads=settings.threads)
        explain = export.ensure_graphs(graphs.parent, ["explain"], settings.ckpt, bert=bert,
                                       fingerprint=graphs.name) / "explain.onnx"
        self.session = runtime.session(explain, settings.threads, settings.ort_spinning)
        # with region labels the map is each cell's label against the query (it points at the object the query
        # names: docs/research/explain_maps.md); else Cross-probe's attention. The exported graph returns the probe
        # map for both attention outputs when CP has no cross layers
        self.labels = "q_cls" in {i.name for i in self.session.get_inputs()}
        self.mode = "labels" if self.labels else "query" if self._has_cross_layers() else "probes"
        self._grids: OrderedDict[tuple[str, str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _has_cross_layers(self) -> bool:
        cfg_path = Path(self.settings.ckpt or DEFAULT_CHECKPOINT) / "config.json"
        try:
            return json.loads(cfg_path.read_text())["model"]["cp"].get("layers", 1) > 0
        except (OSError, KeyError, ValueError):
            return True

    def explain(self, handle: IndexHandle, ids: list[str], metas: list[dict | None], p_t: np.ndarray,
                q_cls: np.ndarray | None = None) -> ExplainMaps:
        """q_cls: the query's (1000,) class cosines, which the label map needs (QueryVectors.q_cls)."""
        from crossprobe.indexer.jobs.decode import decode_one
        from crossprobe.indexer.jobs.sources import Item, Skip

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
            feed = {"grid": np.stack([grids[i] for i in done]).astype(np.float32),
                    "p_t": np.ascontiguousarray(p_t[None], np.float32)}
            if self.labels:
                if q_cls is None:
                    raise ValueError("the label map needs the query's class cosines (q_cls)")
                feed["q_cls"] = np.ascontiguousarray(q_cls[None], np.float32)
            regions, probes, *label_maps = self.session.run(None, feed)
            timings["attention"] = (time.perf_counter() - t) * 1000
            side = self.grid_side
            shown = label_maps[0] if self.labels else regions
            for i, r, p in zip(done, shown, probes):
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
