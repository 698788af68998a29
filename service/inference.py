"""The checkpoint's graphs as the service runs them (ONNX Runtime; the CUDA provider when present).

Models: the query tower and the two scorer graphs (cp, temde) of one checkpoint, from
<artifacts_dir>/<fingerprint>/ (models/export.py exports them once, atomically). When the graphs
exist nothing imports the PyTorch model, so a restart takes seconds. The explainer (explainer.py)
and the image tower (query by image) are loaded on first use: a service never asked pays nothing.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from crossprobe.models import DEFAULT_CHECKPOINT, calibration, export, runtime
from crossprobe.service.settings import Settings

if TYPE_CHECKING:
    from crossprobe.service.explainer import Explainer


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
        from crossprobe.models import inputs

        self.fingerprint = export.checkpoint_fingerprint(settings.ckpt)
        graphs = export.ensure_graphs(settings.artifacts_dir, export.SEARCH_GRAPHS, settings.ckpt, bert=bert,
                                      fingerprint=self.fingerprint, also=export.SERVICE_GRAPHS)
        self.graphs = graphs
        self._settings, self._bert = settings, bert  # for the explainer, made on first use
        self._explainer: Explainer | None = None
        self._explainer_lock = threading.Lock()
        self._image: ImageQueryEncoder | None = None
        self._image_lock = threading.Lock()
        self._inputs = inputs
        self.tokenizer = inputs.load_tokenizer()
        self.query_precision = settings.query_precision
        query_graph = graphs / "query_tower.onnx"
        if settings.query_precision == "int8":
            query_graph = export.ensure_int8_query(graphs)
        if settings.ort_shared_pool:  # one pool for all graphs (models/runtime.py says why)
            runtime.share_thread_pool(settings.threads or 0)
        spin = settings.ort_spinning
        self.query = runtime.session(query_graph, settings.threads, spin)
        self.scorers = {"cp": runtime.session(graphs / "cp_scorer.onnx", settings.threads, spin),
                        "temde": runtime.session(graphs / "temde_scorer.onnx", settings.threads, spin)}
        # scorers that add the region-label term take the query's class cosines and the candidates' cell labels
        self.region = {k: "labels" in {i.name for i in s.get_inputs()} for k, s in self.scorers.items()}
        self.providers = self.query.get_providers()
        # relevance curves fitted for this checkpoint (models/calibration.py); None: results carry no relevance
        self.calibration = calibration.Calibration.load(settings.ckpt or DEFAULT_CHECKPOINT)

    def encode(self, texts: list[str]) -> list[QueryVectors]:
        """A batch of queries -> query vectors. fp32: one run for the batch (padding is masked, so
        batching does not change results). int8: one unpadded run per query, because dynamic
        quantization scales activations by the min/max of the whole input tensor, so batch-mates
        and padding would change a query's vectors."""
        groups = [texts] if self.query_precision == "fp32" else [[t] for t in texts]
        out: list[QueryVectors] = []
        for group in groups:
            ids, mask = self._inputs.tokenize(self.tokenizer, group)
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
                from crossprobe.service.explainer import Explainer

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

    The indexer's own encode stage (indexer/jobs/encoder.py Encoder: models/data/features.py's backbone session,
    then the image_tower graph), pointed at the service's artifacts: the backbone graph (one for all
    checkpoints) at <artifacts_dir>/image_backbone.onnx, shared with the explainer, and the head at
    <artifacts_dir>/<fingerprint>/image_tower.onnx beside the query tower. The Encoder then needs no PyTorch
    model (the head graph exists). Both sessions run on the process's shared ONNX Runtime pool when it is on."""

    def __init__(self, settings: Settings, graphs: Path, bert=None):
        from crossprobe.indexer.jobs.encoder import Encoder
        from crossprobe.indexer.jobs.settings import IndexerSettings

        export.ensure_graphs(graphs.parent, ["image_tower"], settings.ckpt, bert=bert, fingerprint=graphs.name)
        ixs = IndexerSettings(model_dir=Path(settings.artifacts_dir), threads=settings.threads, head="onnx",
                            progress=False)
        self.encoder = Encoder(ixs, settings.ckpt)
        if self.encoder.fingerprint != graphs.name:
            raise ValueError(f"image tower of {self.encoder.fingerprint}, query tower of {graphs.name}")
        self.d = self.encoder.dims.d

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """(B, 3, 224, 224) float32 -> (B, d) unit-norm g_I."""
        return self.encoder.head(self.encoder.backbone(np.ascontiguousarray(pixels, np.float32))).g
