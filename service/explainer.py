"""POST /v1/explain's per-region maps for one query and a few indexed images.

The grid is not stored (the feature store holds the probes made from it, not the 49 x 1280 features), so each
image is decoded again exactly as the indexer decoded it (crossprobe.core.inference.decode, with the model's own
preprocessing), run through the model's backbone (Backend.image_grid), then its explain head maps (grid, the
query's P_t) to weights (crossprobe.core.inference.explain). Grids of recently explained images are kept (an LRU
of GRID_CACHE entries, 250 KB each, keyed by index, version and id), because the page explains the same results
again when the reranker or the query changes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from crossprobe.core.inference import Backend
from crossprobe.core.inference.decode import Unreadable, decode_file
from crossprobe.service.exceptions import NoExplainMaps
from crossprobe.service.registry import IndexHandle
from crossprobe.service.settings import Settings


@dataclass
class ExplainMaps:
    maps: dict[str, np.ndarray]  # id -> (7, 7) query-dependent weights, sum 1 (what `mode` says)
    probe_maps: dict[str, np.ndarray]  # id -> (7, 7) the same image's probes averaged (query-independent), sum 1
    unavailable: dict[str, str]  # id -> why no map (its file is gone or cannot be decoded any more)
    timings_ms: dict[str, float]


class Explainer:
    GRID_CACHE = 64

    def __init__(self, settings: Settings, model: Backend):
        self.settings, self.model = settings, model
        self.head = model.explainer()  # loads (exports first if missing) the explain graph
        if self.head is None:
            raise NoExplainMaps(
                f"this server's model ({settings.model_spec} {model.fingerprint}) has no explain maps",
                {"model": str(settings.model_spec)},
            )
        model.warm("image")  # the backbone the grids come from
        self.mode, self.grid_side = self.head.mode, self.head.side
        self._grids: OrderedDict[tuple[str, str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def explain(
        self,
        handle: IndexHandle,
        ids: list[str],
        metas: list[dict | None],
        p_t: np.ndarray,
        q_cls: np.ndarray | None = None,
    ) -> ExplainMaps:
        """q_cls: the query's (1000,) class cosines, which the label map needs (QueryVectors.q_cls)."""
        timings = {"decode": 0.0, "backbone": 0.0, "attention": 0.0}
        t = time.perf_counter()
        grids, todo, unavailable = self._decode(handle, ids, metas)
        timings["decode"] = (time.perf_counter() - t) * 1000
        if todo:
            t = time.perf_counter()
            out = self.model.image_grid(np.stack([px for _, px in todo])).cells
            timings["backbone"] = (time.perf_counter() - t) * 1000
            for (item_id, _), g in zip(todo, out):
                grids[item_id] = g
                self._remember((handle.name, handle.version, item_id), g)
        maps: dict[str, np.ndarray] = {}
        probe_maps: dict[str, np.ndarray] = {}
        done = [i for i in ids if i in grids]
        if done:
            t = time.perf_counter()
            shown, probes = self.head.maps(np.stack([grids[i] for i in done]), p_t, q_cls)
            timings["attention"] = (time.perf_counter() - t) * 1000
            maps, probe_maps = dict(zip(done, shown)), dict(zip(done, probes))
        return ExplainMaps(maps, probe_maps, unavailable, timings)

    def _decode(self, handle: IndexHandle, ids: list[str], metas: list[dict | None]):
        """-> (grids remembered, [(id, pixels)] to run through the backbone, {id: why unavailable})."""
        grids: dict[str, np.ndarray] = {}
        todo: list[tuple[str, np.ndarray]] = []
        unavailable: dict[str, str] = {}
        for item_id, meta in zip(ids, metas):
            cached = self._cached((handle.name, handle.version, item_id))
            if cached is not None:
                grids[item_id] = cached
                continue
            uri = (meta or {}).get("uri")
            if not uri:
                unavailable[item_id] = "no file recorded for this item"
                continue
            if not handle.file_allowed(uri):  # a path written into Redis, or a link made since: never opened
                unavailable[item_id] = "its recorded file lies outside the index's image folders"
                continue
            # the model's reference decoding, as a build with CROSSPROBE_INDEX_DECODE=reference made its vectors
            m = self.model
            r = decode_file(uri, self.settings.image_max_pixels, m.preprocessor(), m.image_size, m.reduced_decoding)
            if isinstance(r, Unreadable):
                unavailable[item_id] = f"the indexed file cannot be read any more ({r.reason})"
                continue
            todo.append((item_id, r[0]))
        return grids, todo, unavailable

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
