"""crossprobe's own model behind the inference seam: a checkpoint's graphs over ONNX Runtime.

    image_grid       image_backbone.onnx          pixels (B, 3, 224, 224) -> grid (B, 49, 1280): EfficientNet-Lite0,
                                                  one graph for every checkpoint, at the top of the graphs folder
    image_features   <fp>/image_tower.onnx        grid -> g_I (bridged), p_v, b_bar, s_i [, labels]
                     (or the PyTorch module, image_head = "torch", for checking the graph)
    encode_texts     <fp>/query_tower.onnx        input_ids, attention_mask -> g_q, p_t, w_bar, s_q [, q_cls]
                     (query_tower.int8.onnx with query_precision int8)
    rerank           <fp>/cp_scorer.onnx, <fp>/temde_scorer.onnx   one query against its K candidates
    explainer        <fp>/explain.onnx            the per-region maps (explain.py)
    text_gate        models/checkpoints/text_gate  the OCR gate over this backbone's grid (core/text_gate.py)

What each graph computes is models/graphs.py; models/export.py writes them into <graphs>/<fingerprint>/ once,
atomically. When the wanted graphs exist, nothing here imports torch or loads the PyTorch model (the container
image has no torch), so a restart takes seconds.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from crossprobe.core import DEFAULT_CHECKPOINT, graph_files, inputs, int8, read_config, runtime, torch_side
from crossprobe.core.inference.base import Backend, ImageFeatures, ImageGrid, QueryVectors, RuntimeOptions
from crossprobe.core.inference.layout import FeatureDims, ItemDims

# the graphs a service needs to answer a search, and what it exports beside them while the model is loaded
SEARCH_PARTS = ("query", "scorers")


class CrossprobeBackend(Backend):
    family = "crossprobe"
    image_size = inputs.IMAGE_SIZE
    reduced_decoding = True  # its reference is inputs.load_image, which drafts (what it was trained and tested on)
    rerankers = ("cp", "temde")
    explains = True

    def __init__(self, ckpt: Path | None, opts: RuntimeOptions, identity: tuple[str, FeatureDims] | None = None):
        """identity: (fingerprint, dims) when the caller knows them already (the Ray engine's actors, which get no
        in-memory model to fingerprint: the driver exported its graphs for them, prepare)."""
        super().__init__()
        self.ckpt, self.opts = ckpt, opts
        self.fingerprint, self.dims = identity or describe(ckpt, opts.model, opts.graphs)
        self.query_precision = opts.query_precision
        if opts.shared_pool:  # one pool for all graphs (core/runtime.py says why); before any session
            runtime.share_thread_pool(opts.threads or 0)

    @functools.cached_property
    def calibration(self):
        """Relevance curves fitted for this checkpoint (core/calibration.py); None: results carry no relevance."""
        from crossprobe.core.calibration import Calibration

        return Calibration.load(self.ckpt or DEFAULT_CHECKPOINT)

    @property
    def graph_dir(self) -> Path:
        return self.graphs_root / self.fingerprint

    def _session(self, path: Path):
        return runtime.session(path, self.opts.threads, self.opts.spinning, self.opts.device)

    def _export(self, names: tuple[str, ...], also: tuple[str, ...] = ()) -> Path:
        """<graphs>/<fingerprint>/ with `names` exported (and `also`, while the model is loaded anyway)."""
        return graph_files.ensure_graphs(
            self.graphs_root,
            names,
            self.ckpt,
            model=self.opts.model,
            bert=self.opts.bert,
            fingerprint=self.fingerprint,
            also=also,
        )

    def warm(self, *parts: str) -> None:
        """parts: "search" (the query tower and both scorers, exporting the explain and image graphs beside them
        when anything is missing), "image" (backbone + image tower), "explain"."""
        for p in parts:
            if p == "search":
                self._export(graph_files.SEARCH_GRAPHS, also=graph_files.SERVICE_GRAPHS)
                self._query(), self._scorer("cp"), self._scorer("temde")
            elif p == "image":
                self._backbone(), self._head()
            elif p == "explain":
                self.explainer()
            else:
                raise ValueError(f"unknown part {p!r} (search, image, explain)")

    def sessions(self) -> dict[str, Any]:
        """The ONNX Runtime sessions loaded so far, by part (query, cp, temde, backbone, head, explain)."""
        out = {}
        for name, part in self._parts.items():
            s = part[0] if isinstance(part, tuple) else getattr(part, "session", part)
            if hasattr(s, "get_providers"):
                out[name] = s
        return out

    @property
    def providers(self) -> list[str]:
        s = next(iter(self.sessions().values()), None)
        return s.get_providers() if s is not None else []

    # ---- images ----------------------------------------------------------------------------------------
    def preprocessor(self):
        return inputs.load_image  # squashed to 224 x 224, Lite's scaling (core/inputs.py)

    def _backbone(self):
        return self._part("backbone", lambda: self._session(graph_files.ensure_backbone(self.graphs_root)))

    def _head(self):
        """The image tower: its ONNX graph (exported first if missing), or the PyTorch module (image_head torch)."""

        def make():
            if self.opts.image_head == "torch":  # checking the graph against the PyTorch module
                checkpoint = torch_side.module("checkpoint", "image_head torch")
                model = self.opts.model or checkpoint.load(self.ckpt, self.opts.bert, references=False)[0]
                graph = torch_side.module("graphs", "image_head torch").ImageGraph(model)
                return torch_side.module("torch_backend", "image_head torch").numpy_module(graph)
            return self._session(self._export(("image_tower",)) / "image_tower.onnx")

        return self._part("head", make)

    def prepare(self) -> None:
        """Export what image_grid / image_features need without building a session: the Ray engine's driver
        calls it once, so that its actors only load graphs (N actors never export one file at once)."""
        graph_files.ensure_backbone(self.graphs_root)
        if self.opts.image_head == "onnx":
            self._export(("image_tower",))

    def image_grid(self, pixels: np.ndarray) -> ImageGrid:
        """(B, 3, 224, 224) float32 -> cells (B, 49, 1280) float32 (the image tower makes g from them)."""
        return ImageGrid(self._backbone().run(None, {"pixels": np.ascontiguousarray(pixels, np.float32)})[0])

    def image_features(self, grid: ImageGrid) -> ImageFeatures:
        """cells (B, 49, 1280) -> g (B, d), p_v (B, n, dc), b_bar (B, dc), s_i (B, nk) [, labels (B, 49)]."""
        head, cells = self._head(), grid.cells
        out = head(cells) if self.opts.image_head == "torch" else head.run(None, {"grid": cells})
        g, p_v, b_bar, s_i, *labels = out
        return ImageFeatures(np.ascontiguousarray(g, np.float32), p_v, b_bar, s_i, labels[0] if labels else None)

    # ---- texts -----------------------------------------------------------------------------------------
    def _query(self):
        def make():
            graphs = self._export(graph_files.SEARCH_GRAPHS, also=graph_files.SERVICE_GRAPHS)
            fp32, tokenizer = self._session(graphs / "query_tower.onnx"), inputs.load_tokenizer()
            if self.query_precision != "int8":
                return fp32, tokenizer
            weights = int8.weight_format()
            q8 = self._session(graph_files.ensure_int8_query(graphs, weights))
            self.int8_check = int8.check(
                lambda ts: self._run_query(fp32, tokenizer, ts)[0],
                lambda t: self._run_query(q8, tokenizer, [t])[0],
                self.opts.int8_min_cosine,
                weights,
                f"checkpoint {self.fingerprint}",
            )
            return q8, tokenizer

        return self._part("query", make)

    @staticmethod
    def _run_query(session, tokenizer, texts: list[str]) -> list[np.ndarray]:
        """-> g, p_t, w_bar, s_q [, q_cls] for a batch of texts."""
        ids, mask = inputs.tokenize(tokenizer, texts)
        return session.run(None, {"input_ids": ids, "attention_mask": mask})

    def encode_texts(self, texts: list[str]) -> list[QueryVectors]:
        """fp32: one run for the batch (padding is masked, so batching does not change results). int8: one
        unpadded run per query, because dynamic quantization scales activations by the min/max of the whole
        input tensor, so batch-mates and padding would change a query's vectors."""
        session, tokenizer = self._query()
        groups = [texts] if self.query_precision == "fp32" else [[t] for t in texts]
        out: list[QueryVectors] = []
        for group in groups:
            g, p_t, w_bar, s_q, *q_cls = self._run_query(session, tokenizer, group)
            out += [
                QueryVectors(g[i], p_t[i], w_bar[i], s_q[i], q_cls[0][i] if q_cls else None) for i in range(len(group))
            ]
        return out

    # ---- scoring ---------------------------------------------------------------------------------------
    def _scorer(self, kind: str):
        """(session, whether it adds the region-label term: it then takes q_cls and the candidates' labels)."""

        def make():
            s = self._session(
                self._export(graph_files.SEARCH_GRAPHS, also=graph_files.SERVICE_GRAPHS) / f"{kind}_scorer.onnx"
            )
            return s, "labels" in {i.name for i in s.get_inputs()}

        return self._part(kind, make)

    def rerank(self, kind: str, q: QueryVectors, feats: dict[str, np.ndarray], s_tt: np.ndarray) -> np.ndarray:
        """One query against its K candidates in one scorer run -> fused logits (K,)."""
        feed = scorer_feed(kind, q, feats, s_tt)
        session, region = self._scorer(kind)
        if region:
            assert q.q_cls is not None, "a query tower with region labels gives q_cls"
            feed["q_cls"], feed["labels"] = q.q_cls[None], feats["labels"]
        return session.run(None, feed)[0]

    # ---- optional parts --------------------------------------------------------------------------------
    def explainer(self):
        from crossprobe.core.inference.explain import ExplainHead

        return self._part(
            "explain",
            lambda: ExplainHead(self._session(self._export(("explain",)) / "explain.onnx"), self._has_cross_layers()),
        )

    def _has_cross_layers(self) -> bool:
        if self.opts.model is not None:
            return self.opts.model.cfg.cp.layers > 0
        try:
            return read_config(self.ckpt or DEFAULT_CHECKPOINT)["model"]["cp"].get("layers", 1) > 0
        except (OSError, KeyError, ValueError):
            return True

    def text_gate(self, threshold: float | None = None):
        """The gate trained on EfficientNet-Lite0's grid: the same backbone for every crossprobe checkpoint."""
        from crossprobe.core.text_gate import TextGate

        return TextGate.load(threshold=threshold)


def scorer_feed(kind: str, q: QueryVectors, feats: dict[str, np.ndarray], s_tt: np.ndarray) -> dict[str, np.ndarray]:
    """cp_scorer's or temde_scorer's inputs (models/graphs.py) for one query against its K candidates."""
    s_tt = np.ascontiguousarray(s_tt, np.float32)
    assert q.p_t is not None and q.w_bar is not None and q.s_q is not None, "a crossprobe query tower's vectors"
    if kind == "cp":
        return {"p_t": q.p_t[None], "w_bar": q.w_bar[None], "p_v": feats["p_v"], "b_bar": feats["b_bar"], "s_tt": s_tt}
    if kind == "temde":
        return {"s_q": q.s_q[None], "s_i": feats["s_i"], "s_tt": s_tt}
    raise ValueError(f"unknown reranker {kind!r}")


# ---- what a checkpoint is, without loading it ------------------------------------------------------------
def describe(ckpt: Path | None = None, model=None, graphs: Path | None = None) -> tuple[str, FeatureDims]:
    """(fingerprint, dims) from the checkpoint's config.json (cheap), or of an in-memory model. graphs: the graphs
    folder; where this fingerprint's image tower is exported there, the dims are read off the graph, so that
    nothing imports torch (the container image has none: docs/deployment.md)."""
    if model is not None:  # tests, notebooks: the fingerprint checkpoint.save would record
        return _fingerprint_of(model), model_dims(model.cfg.to_dict())
    path = Path(ckpt or DEFAULT_CHECKPOINT)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (train one with `crossprobe train`, or pass --ckpt)")
    meta = read_config(path)
    head = Path(graphs) / meta["fingerprint"] / "image_tower.onnx" if graphs else None
    if head is not None and head.exists():
        return meta["fingerprint"], graph_dims(head)
    return meta["fingerprint"], model_dims(meta["model"])


def model_dims(model_cfg: dict) -> FeatureDims:
    c = torch_side.module("model", "reading a checkpoint whose image tower is not exported").ModelConfig.from_dict(
        model_cfg
    )
    return FeatureDims(c.vision.d, ItemDims(c.cp.n, c.cp.d, c.temde.N * c.temde.K, 49 if c.region.enabled else 0))


def graph_dims(head: Path) -> FeatureDims:
    """The dims of an exported image tower: one run on a zero grid (the graph's shapes are partly symbolic), once
    per file: a job asks for them when it plans the version and again when its encoder starts."""
    st = Path(head).stat()
    return _graph_dims(str(head), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _graph_dims(head: str, _mtime_ns: int, _size: int) -> FeatureDims:
    grid = np.zeros((1, inputs.GRID * inputs.GRID, inputs.IMAGE_FEAT_DIM), np.float32)
    g, p_v, _, s_i, *labels = runtime.session(Path(head), threads=1).run(None, {"grid": grid})
    return FeatureDims(
        g.shape[1], ItemDims(p_v.shape[1], p_v.shape[2], s_i.shape[1], labels[0].shape[1] if labels else 0)
    )


def _fingerprint_of(model) -> str:
    """The fingerprint checkpoint.save would record for this in-memory model."""
    checkpoint = torch_side.module("checkpoint", "an in-memory model")
    return checkpoint.fingerprint(checkpoint.stored(model.trained_state_dict()), model.cfg.to_dict())
