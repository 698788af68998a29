"""The explain graph of a crossprobe checkpoint as a backend part: per-region maps for one query over image grids.

    maps(grid (K, 49, 1280), p_t (m, dc) [, q_cls (1000,)]) -> shown (K, 7, 7), probes (K, 7, 7), each summing to 1

What the shown map means depends on the checkpoint (`mode`, said on the page beside the maps): with region
labels, each cell's ImageNet label against the query (it points at the object the query names:
docs/research/explain_maps.md); else Cross-probe's attention from the query to the regions, composed over its
cross layers (models/graphs.py ExplainGraph); without cross layers nothing links the query to the regions, and
the map is where the image's own probes look.
"""

from __future__ import annotations

import numpy as np

from crossprobe.core import inputs

EXPLAIN_MODES = {
    # what the maps mean, said on the page beside them
    "query": "where this query looked: the query's text probes attend to the image's vision probes, which "
    "attend to the 7x7 regions (the two attention steps composed; Cross-probe reranker)",
    "probes": "regions the image's probes attend to (averaged over probes and heads; the checkpoint's "
    "Cross-probe has no cross layers, so the query cannot change them)",
    "labels": "how well what the ImageNet head sees in each 7x7 region matches the query (the region-label term's "
    "per-region scores, each region's share of their softmax)",
}


class ExplainHead:
    def __init__(self, session, has_cross_layers: bool):
        self.session = session
        self.side = inputs.GRID
        self.labels = "q_cls" in {i.name for i in session.get_inputs()}
        self.mode = "labels" if self.labels else "query" if has_cross_layers else "probes"

    def maps(
        self, grids: np.ndarray, p_t: np.ndarray, q_cls: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """-> (the map `mode` says, (K, 7, 7)), (the image's probes averaged, query-independent, (K, 7, 7))."""
        feed = {"grid": np.ascontiguousarray(grids, np.float32), "p_t": np.ascontiguousarray(p_t[None], np.float32)}
        if self.labels:
            if q_cls is None:
                raise ValueError("the label map needs the query's class cosines (q_cls)")
            feed["q_cls"] = np.ascontiguousarray(q_cls[None], np.float32)
        regions, probes, *label_maps = self.session.run(None, feed)
        shown = label_maps[0] if self.labels else regions
        return (
            np.stack([_renormalised(r).reshape(self.side, self.side) for r in shown]),
            np.stack([_renormalised(p).reshape(self.side, self.side) for p in probes]),
        )


def _renormalised(w: np.ndarray) -> np.ndarray:
    """Softmax outputs sum to 1 up to float32 rounding; make it exact in float64 for the JSON."""
    w = np.clip(np.asarray(w, np.float64), 0.0, None)
    return w / w.sum() if w.sum() > 0 else np.full_like(w, 1.0 / w.size)
