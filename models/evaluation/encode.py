"""Batch encoding from cached backbone features, shared by training (hard-negative
mining, reranker training) and evaluation.

`PairScorer` gives every reranker the same interface: per-query and per-item
parts are computed once (that is what the index caches for CP and T-EMDE), and
`fused(q_rows, cand)` scores each query against its (R, K) shortlist.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from crossprobe.models.model import SearchModel
from crossprobe.models.region_labels import add_region

if TYPE_CHECKING:  # heads.py is imported where reranker heads are used, not by every evaluation
    from crossprobe.models.heads import HeadsModel


@contextmanager
def _eval_mode(module: torch.nn.Module):
    """Banks are the towers' inference outputs: dropout off whatever mode the caller left the model in
    (a model built to reload saved towers starts in training mode), the caller's mode restored after."""
    was = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was)


def _rows(bank: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """A float16 bank's rows idx as float32. index_select, not bank[idx]: the same values, and about twice as fast
    for the large gathers of a listwise training step (512 Lite0 grids, 32M numbers)."""
    return bank.index_select(0, idx.reshape(-1)).reshape(*idx.shape, *bank.shape[1:]).float()


def _batches(n: int, size: int):
    for s in range(0, n, size):
        yield slice(s, min(n, s + size))


@dataclass
class TextBank:
    tokens: torch.Tensor  # (N, T, d) float16
    mask: torch.Tensor  # (N, T) bool
    g: torch.Tensor  # (N, d) float32
    states: torch.Tensor  # (N, T, 384) float16 frozen MiniLM states (for TV)


@dataclass
class ImageBank:
    tokens: torch.Tensor  # (N, 49, d) float16
    g: torch.Tensor  # (N, d)
    grids: torch.Tensor  # (N, 49, 1280) float16 (for TV)
    labels: torch.Tensor | None = None  # (N, 49) int64 the head's class per cell (region_labels.py), when used


@torch.inference_mode()
def encode_texts(model: SearchModel, states: np.ndarray, masks: np.ndarray, rows, batch: int = 512) -> TextBank:
    rows = np.asarray(rows)
    m = torch.from_numpy(np.ascontiguousarray(masks[rows])).bool()
    T = int(m.sum(1).max())  # trim padding shared by every row
    m = m[:, :T]
    st = torch.from_numpy(np.ascontiguousarray(states[rows][:, :T]))
    toks, gs = [], []
    with _eval_mode(model.text) as tower:
        for sl in _batches(len(rows), batch):
            out = tower.forward_states(st[sl].float(), m[sl])
            toks.append(out.tokens.half())
            gs.append(out.g)
    return TextBank(torch.cat(toks), m, torch.cat(gs), st)


@torch.inference_mode()
def encode_images(model: SearchModel, grids: np.ndarray, rows, batch: int = 256) -> ImageBank:
    rows = np.asarray(rows)
    gr = torch.from_numpy(np.ascontiguousarray(grids[rows]))
    toks, gs, labels = [], [], []
    with _eval_mode(model.vision), _eval_mode(model.bridge):
        for sl in _batches(len(rows), batch):
            out = model.image(gr[sl].float())  # g: the bridged g_I, as the index stores it
            toks.append(out.tokens.half())
            gs.append(out.g)
            if model.cfg.region.enabled:
                labels.append(model.bridge.cell_labels(gr[sl]))
    return ImageBank(torch.cat(toks), torch.cat(gs), gr, torch.cat(labels) if labels else None)


class PairScorer:
    """Fused reranking logits for (query, candidate) pairs from precomputed banks."""

    def __init__(
        self,
        model: SearchModel | HeadsModel,  # heads (models/heads.py) have cp, temde and cfg.region under these names
        method: str,
        text: TextBank,
        images: ImageBank,
        batch_pairs: int = 4096,
        precompute: bool = True,
        region: bool = True,
    ):
        if method not in ("cp", "temde", "sm", "tv"):
            raise ValueError(f"unknown reranker {method!r}")
        self.model, self.method, self.text, self.images = model, method, text, images
        self.batch_pairs = batch_pairs
        self.region = region and model.cfg.region.weight(method) > 0
        if self.region and images.labels is None:
            raise ValueError("the region term needs the image bank's cell labels (encode_images with region labels on)")
        self.q_cache = self.i_cache = None
        if precompute:  # evaluation: per-query / per-image parts once, as the index does
            with torch.inference_mode():
                if method in ("cp", "temde"):  # joint scorers embed queries per batch (padding trimmed)
                    self.q_cache = self._cat(
                        [self.query_parts(torch.arange(s.start, s.stop)) for s in _batches(len(text.g), 1024)]
                    )
                self.i_cache = self._cat(
                    [self.item_parts(torch.arange(s.start, s.stop)) for s in _batches(len(images.g), 1024)]
                )

    @staticmethod
    def _cat(parts):
        return tuple(torch.cat(x) for x in zip(*parts))

    def query_parts(self, q: torch.Tensor) -> tuple:
        """Per-query inputs of the reranker for rows q (computed, not cached)."""
        m, t = self.model, self.text
        if self.method == "cp":
            states = _rows(t.states, q) if m.cp.cfg.uses_backbone else None
            return m.cp.encode_text(
                _rows(t.tokens, q) if m.cp.cfg.uses_tower else None, t.mask[q], states
            )  # P_t, w_bar
        if self.method == "temde":
            states = _rows(t.states, q) if m.temde.cfg.uses_backbone else None
            tokens = None if m.temde.cfg.uses_backbone else _rows(t.tokens, q)
            return (m.temde.sketch_text(tokens, t.mask[q], states),)  # s_q
        # joint scorers: trim padding to this batch's longest query (they pay per token per pair)
        ref = cast(SearchModel, m)  # sm / tv: only a SearchModel has the joint references
        mask = t.mask[q]
        T = int(mask.sum(1).max())
        if self.method == "sm":
            return ref.sm.embed_text(t.tokens[q][:, :T].float()), mask[:, :T]
        return ref.tv.embed_text(t.states[q][:, :T].float()), mask[:, :T]

    def item_parts(self, c: torch.Tensor) -> tuple:
        """Per-image inputs for item rows c (any shape; parts get c's shape prefix)."""
        m, im = self.model, self.images
        flat = c.reshape(-1)
        parts: tuple[torch.Tensor, ...]
        if self.method == "cp":
            grid = _rows(im.grids, flat) if m.cp.cfg.uses_backbone else None
            parts = m.cp.encode_image(_rows(im.tokens, flat) if m.cp.cfg.uses_tower else None, grid)  # P_v, b_bar
        elif self.method == "temde":
            grid = _rows(im.grids, flat) if m.temde.cfg.uses_backbone else None
            tokens = None if m.temde.cfg.uses_backbone else _rows(im.tokens, flat)
            parts = (m.temde.sketch_image(tokens, grid),)  # s_I
        elif self.method == "sm":  # sm / tv: only a SearchModel has the joint references
            parts = (cast(SearchModel, m).sm.embed_image(im.tokens[flat].float()),)
        else:
            parts = (cast(SearchModel, m).tv.embed_image(im.grids[flat].float()),)
        return tuple(p.reshape(*c.shape, *p.shape[1:]) for p in parts)

    def tt(self, q_rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """(R,), (R, K) -> (R, K) two-tower cosine."""
        return torch.einsum("rd,rkd->rk", self.text.g[q_rows], self.images.g[cand])

    def fused(self, q_rows, cand, grad: bool = False) -> torch.Tensor:
        """(R,) query rows, (R, K) item rows -> (R, K) fused logits."""
        q_rows, cand = torch.as_tensor(q_rows), torch.as_tensor(cand)
        R, K = cand.shape
        per = max(1, self.batch_pairs // K)
        outs = []
        ctx = torch.enable_grad() if grad else torch.inference_mode()
        with ctx:
            for s in _batches(R, per):
                outs.append(self._fused(q_rows[s], cand[s]))
        return torch.cat(outs)

    def _fused(self, q, c) -> torch.Tensor:
        m, s_tt = self.model, self.tt(q, c)
        qp = tuple(x[q] for x in self.q_cache) if self.q_cache else self.query_parts(q)
        ip = tuple(x[c] for x in self.i_cache) if self.i_cache else self.item_parts(c)
        logits = getattr(m, self.method).rerank(*qp, *ip, s_tt)
        if not self.region:
            return logits
        labels = self.images.labels
        assert labels is not None  # __init__ refuses the region term without the bank's cell labels
        bridge = cast(SearchModel, m).bridge  # heads have no region term (HeadsConfig.region is off)
        return add_region(logits, m.cfg.region, self.method, bridge.class_sims(self.text.g[q]), labels[c])
