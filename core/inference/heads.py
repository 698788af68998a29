"""Reranker heads on another model's backbone behind the inference seam: `crossprobe:<heads checkpoint dir>`.

A heads checkpoint (models/heads.py; `crossprobe train --backbone SPEC --data PATH` makes one) names its backbone
by spec; HeadsBackend runs that backbone's own backend (exported.py) and adds the heads' graphs, exported into
<graphs>/<heads fingerprint>/ by models/export.py:

    image_grid       the backbone's image graph            -> patch tokens (B, P, W) and its embedding
    image_features   g = the backbone's embedding at unit norm; image_head.onnx: tokens -> p_v, b_bar, s_i
    encode_texts     the backbone's text graph              -> g_q (its embedding at unit norm), token states;
                     text_head.onnx: token states, mask     -> p_t, w_bar, s_q
    rerank           cp_scorer.onnx, temde_scorer.onnx      one query against its K candidates, fused with s_tt

So the two-tower ranking is the backbone's own, and the index stores the heads' item features (dims.item from the
heads' config). Its fingerprint is the heads checkpoint's, which covers the backbone's: an index built with it is
refused by any other model. Serving needs no torch when the graphs are exported (`crossprobe train` exports them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from crossprobe.core import graph_files, read_config, runtime
from crossprobe.core.inference.base import Backend, ImageFeatures, ImageGrid, QueryVectors, RuntimeOptions
from crossprobe.core.inference.crossprobe import scorer_feed
from crossprobe.core.inference.exported import ExportedBackend, unit
from crossprobe.core.inference.layout import FeatureDims, ItemDims

KIND = "heads"  # models/heads.py's config.json "kind" (not imported: that module needs torch)


class BackboneChanged(ValueError):
    """The backbone spec of a heads checkpoint now names other weights than the heads were trained on."""


def backbone_spec(ckpt: Path | None) -> str | None:
    """The backbone spec of a crossprobe checkpoint dir holding reranker heads (config.json's kind "heads"), or None:
    a crossprobe checkpoint of its own."""
    if ckpt is None or not (Path(ckpt) / "config.json").is_file():
        return None
    try:
        meta = read_config(ckpt)
    except ValueError:
        return None  # not JSON: CrossprobeBackend says what is wrong with it
    return meta.get("backbone") if meta.get("kind") == KIND else None


def heads_dims(d: int, model_cfg: dict) -> FeatureDims:
    """The features per image: the backbone's two-tower width and the heads' item features (no region labels)."""
    cp, te = model_cfg["cp"], model_cfg["temde"]
    return FeatureDims(d, ItemDims(int(cp["n"]), int(cp["d"]), int(te["N"]) * int(te["K"]), 0))


class HeadsBackend(Backend):
    family = "heads"
    rerankers = ("cp", "temde")
    calibration = None  # relevance curves are fitted per model: none for heads yet

    def __init__(self, ckpt: Path, opts: RuntimeOptions, backbone: ExportedBackend):
        """backbone: the backend of the spec the checkpoint names (inference.load makes it)."""
        super().__init__()
        self.ckpt, self.opts, self.backbone = Path(ckpt), opts, backbone
        self.meta = read_config(self.ckpt)
        if backbone.fingerprint != self.meta["backbone_fingerprint"]:
            raise BackboneChanged(
                f"heads {self.ckpt} were trained on backbone {self.meta['backbone']} with fingerprint "
                f"{self.meta['backbone_fingerprint']}; that spec now gives {backbone.fingerprint} (other weights): "
                f"train the heads again on it (`crossprobe train --backbone {self.meta['backbone']} --data ...`)"
            )
        self.fingerprint = self.meta["fingerprint"]
        self.dims = heads_dims(backbone.dims.d, self.meta["model"])
        self.image_size = backbone.image_size
        self.reduced_decoding = backbone.reduced_decoding
        self.spec = f"crossprobe:{self.ckpt}"

    # ---- parts -----------------------------------------------------------------------------------------
    def _session(self, name: str):
        def make():
            folder = graph_files.ensure_heads_graphs(self.graphs_root, self.ckpt, fingerprint=self.fingerprint)
            return runtime.session(folder / f"{name}.onnx", self.opts.threads, self.opts.spinning, self.opts.device)

        return self._part(name, make)

    def prepare(self) -> None:
        self.backbone.prepare()
        graph_files.ensure_heads_graphs(self.graphs_root, self.ckpt, fingerprint=self.fingerprint)

    def warm(self, *parts: str) -> None:
        """parts: "search" (the backbone's text graph, the text head, both scorers), "image"; "explain" has nothing
        to load (no explain maps for heads)."""
        for p in parts:
            if p in ("search", "text"):
                self.backbone.warm("search")
                for name in ("text_head", "cp_scorer", "temde_scorer"):
                    self._session(name)
            elif p == "image":
                self.backbone.warm("image")
                self._session("image_head")
            elif p != "explain":
                raise ValueError(f"unknown part {p!r} (search, image)")

    def sessions(self) -> dict[str, Any]:
        return {
            **{f"backbone.{k}": v for k, v in self.backbone.sessions().items()},
            **{k: v for k, v in self._parts.items() if hasattr(v, "get_providers")},
        }

    @property
    def providers(self) -> list[str]:
        return self.backbone.providers

    # ---- images ----------------------------------------------------------------------------------------
    def preprocessor(self):
        return self.backbone.preprocessor()

    def image_grid(self, pixels: np.ndarray) -> ImageGrid:
        return self.backbone.image_grid(pixels)

    def image_features(self, grid: ImageGrid) -> ImageFeatures:
        """cells (B, P, W), pooled (B, d) -> g (B, d), p_v (B, n, dc), b_bar (B, dc), s_i (B, N*K)."""
        p_v, b_bar, s_i = self._session("image_head").run(
            None, {"tokens": np.ascontiguousarray(grid.cells, np.float32)}
        )
        assert grid.pooled is not None, "the backbone's image graph gives its pooled embedding"
        return ImageFeatures(unit(grid.pooled), p_v, b_bar, s_i, None)

    # ---- texts -----------------------------------------------------------------------------------------
    def encode_texts(self, texts: list[str]) -> list[QueryVectors]:
        """One run of each graph for the batch: the heads mask the padding, so batching changes no query's vectors."""
        emb, tokens, mask = self.backbone.text_tokens(texts)
        p_t, w_bar, s_q = self._session("text_head").run(
            None, {"tokens": np.ascontiguousarray(tokens, np.float32), "attention_mask": np.asarray(mask, np.int64)}
        )
        return [QueryVectors(g, p_t[i], w_bar[i], s_q[i]) for i, g in enumerate(unit(emb))]

    # ---- scoring ---------------------------------------------------------------------------------------
    def rerank(self, kind: str, q: QueryVectors, feats: dict[str, np.ndarray], s_tt: np.ndarray) -> np.ndarray:
        self.require_reranker(kind)
        return self._session(f"{kind}_scorer").run(None, scorer_feed(kind, q, feats, s_tt))[0]
