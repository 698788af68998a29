"""T-EMDE: sketches over trainable centroids as a cheap cross-modal scorer.

coder(x) = BatchNorm(Linear(x)) split into N partitions of `inner` dims; each
partition's soft assignment over its K centroids is softmax(-||x - c||^2 / tau)
with a learned temperature. A sequence's sketch sums the assignments over its
tokens (or regions) and L2-normalises each partition, giving N*K numbers that
are comparable across modalities because the centroids are shared.
s_temde = <s_q, s_I> / N (in [-1, 1]); the ranking logit fuses it with the
two-tower score, like the other rerankers.

`inputs` as for CP (cross_probe.py): "tower" codes the towers' tokens, "backbone"
the frozen MiniLM states and the raw Lite0 grid regions, features the towers have
not fitted to the training split.

merge() turns independently trained T-EMDEs into one wider T-EMDE scoring their mean:
the default checkpoint's is 3 seeded members of N 20 (training/run.py, members_by_method).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.core import inputs
from crossprobe.models.layers import Fusion


@dataclass
class TemdeConfig:
    """Defaults: one trained member of the served T-EMDE. The served checkpoint merges 3 of them (merge(),
    TrainConfig.members_by_method), so its config.json says N 60. ModelConfig.from_dict reads a config.json
    saved under older defaults as it was trained."""

    d_in: int = 256  # tower width (SearchModel sets it to the vision tower's d)
    N: int = 20  # partitions of one member (a merged T-EMDE: the members' sum)
    K: int = 8  # centroids per partition
    inner: int = 8  # coder dims per partition
    inputs: str = "backbone"  # "tower" | "backbone" (module docstring)

    def __post_init__(self):
        if self.inputs not in ("tower", "backbone"):
            raise ValueError(f"TemdeConfig.inputs must be 'tower' or 'backbone', got {self.inputs!r}")

    @property
    def uses_backbone(self) -> bool:  # same question as CrossProbeConfig.uses_backbone, so callers ask both alike
        return self.inputs == "backbone"


class TemdeCoder(nn.Module):
    """(B, T, d_feat) -> (B, T, N, K) soft assignments (rows sum to 1 over K)."""

    def __init__(self, cfg: TemdeConfig, centroids: nn.Parameter, log_tau: nn.Parameter, d_feat: int):
        super().__init__()
        self.cfg = cfg
        self.lin = nn.Linear(d_feat, cfg.N * cfg.inner)
        self.bn = nn.BatchNorm1d(cfg.N * cfg.inner)
        self.centroids = centroids  # shared (N, K, inner)
        self.log_tau = log_tau

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_feat) -> (B, T, N, K)."""
        B, T, _ = x.shape
        z = self.bn(self.lin(x).reshape(B * T, -1)).view(B * T, self.cfg.N, self.cfg.inner)
        # softmax over K of -||z - c||^2 / tau = softmax of (2 z.c - ||c||^2) / tau: ||z||^2 is the same for
        # every centroid of a partition, so it drops out exactly. One batched matmul instead of materialising
        # (B, T, N, K, inner) differences, which makes training steps two to three times faster on CPU
        # (docs/research/bridge.md, "Larger T-EMDE sketches")
        zc = torch.einsum("rni,nki->rnk", z, self.centroids)  # (B*T, N, K)
        logits = (2 * zc - (self.centroids**2).sum(-1)) / self.log_tau.exp()
        if self.cfg.K > 8:
            return logits.softmax(-1).view(B, T, self.cfg.N, self.cfg.K)
        # a short K: softmax over dim 1 of a (B*T, K, N) view, the same numbers, vectorised across N instead of
        # one 8-wide row at a time: faster at K 8, slower at K 16, hence only for a short K
        # (docs/research/bridge.md, "Larger T-EMDE sketches")
        return logits.transpose(1, 2).softmax(1).transpose(1, 2).unflatten(0, (B, T))  # a view: no copy


class Temde(nn.Module):
    def __init__(
        self, cfg: TemdeConfig, text_width: int = inputs.TEXT_FEAT_DIM, image_width: int = inputs.IMAGE_FEAT_DIM
    ):
        """text_width, image_width: the backbone features' widths, as for CrossProbe (cross_probe.py)."""
        super().__init__()
        self.cfg = cfg
        self.centroids = nn.Parameter(torch.randn(cfg.N, cfg.K, cfg.inner))
        self.log_tau = nn.Parameter(torch.tensor(1.0).log())
        self.text_coder = TemdeCoder(cfg, self.centroids, self.log_tau, text_width if cfg.uses_backbone else cfg.d_in)
        self.image_coder = TemdeCoder(cfg, self.centroids, self.log_tau, image_width if cfg.uses_backbone else cfg.d_in)
        self.fusion = Fusion()

    @staticmethod
    def raw_sketch(assign: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, N, K) assignments -> (B, N, K) summed over real tokens (additive over parts)."""
        if mask is not None:
            assign = assign * mask[:, :, None, None].to(assign.dtype)
        return assign.sum(1)

    @staticmethod
    def normalize(raw: torch.Tensor) -> torch.Tensor:
        """(B, N, K) -> (B, N*K), unit L2 norm within each partition."""
        return F.normalize(raw, dim=-1).flatten(1)

    def sketch_text(
        self, tokens: torch.Tensor | None, mask: torch.Tensor, states: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, T, d_in) tower tokens or (B, T, 384) frozen MiniLM states (per `inputs`), (B, T) -> s_q (B, N*K)."""
        return self.normalize(self.raw_sketch(self.text_coder(self._pick(tokens, states)), mask.bool()))

    def sketch_image(self, tokens: torch.Tensor | None, grid: torch.Tensor | None = None) -> torch.Tensor:
        """(B, 49, d_in) tower tokens or (B, 49, 1280) Lite0 grid (per `inputs`) -> s_I (B, N*K)."""
        return self.normalize(self.raw_sketch(self.image_coder(self._pick(tokens, grid))))

    def _pick(self, tokens, feats):
        if not self.cfg.uses_backbone:
            return tokens
        if feats is None:
            raise ValueError("T-EMDE with inputs='backbone' needs the backbone features")
        return feats

    def score(self, s_q: torch.Tensor, s_i: torch.Tensor) -> torch.Tensor:
        """(..., N*K) x (..., N*K) -> (...) similarity in [-1, 1]."""
        return (s_q * s_i).sum(-1) / self.cfg.N

    def rerank(self, s_q: torch.Tensor, s_i: torch.Tensor, s_tt: torch.Tensor) -> torch.Tensor:
        """(Q, NK), (Q, K, NK), (Q, K) -> fused logits (Q, K)."""
        return self.fusion(s_tt, self.score(s_q.unsqueeze(1), s_i))


def merge(members: list[Temde]) -> Temde:
    """Independently trained T-EMDEs -> one T-EMDE holding all their partitions (N = the sum of theirs) whose
    score, <s_q, s_I> / N, is the members' N-weighted mean score: an ensemble served as one wider sketch through
    the same graphs, index field and scorer. Each member's temperature is folded into its coder's BatchNorm
    scale and its centroids (the squared distances scale by s^2 when both do), so the members share the merged
    module's one temperature. Members must agree on K, inner and inputs; the fusion weight is the caller's to fit."""
    first = members[0].cfg
    if any(
        (m.cfg.K, m.cfg.inner, m.cfg.inputs, m.cfg.d_in) != (first.K, first.inner, first.inputs, first.d_in)
        for m in members
    ):
        raise ValueError("merged T-EMDEs must share K, inner, inputs and d_in")
    out = Temde(replace(first, N=sum(m.cfg.N for m in members)))
    tau = members[0].log_tau.exp()
    scales = [(tau / m.log_tau.exp()).sqrt() for m in members]
    with torch.no_grad():
        out.log_tau.copy_(members[0].log_tau)
        out.centroids.copy_(torch.cat([m.centroids * s for m, s in zip(members, scales)]))
        for side in ("text_coder", "image_coder"):
            o, coders = getattr(out, side), [getattr(m, side) for m in members]
            o.lin.weight.copy_(torch.cat([c.lin.weight for c in coders]))
            o.lin.bias.copy_(torch.cat([c.lin.bias for c in coders]))
            o.bn.weight.copy_(torch.cat([c.bn.weight * s for c, s in zip(coders, scales)]))
            o.bn.bias.copy_(torch.cat([c.bn.bias * s for c, s in zip(coders, scales)]))
            o.bn.running_mean.copy_(torch.cat([c.bn.running_mean for c in coders]))
            o.bn.running_var.copy_(torch.cat([c.bn.running_var for c in coders]))
    return out.eval()


class TemdePool(nn.Module):
    """T-EMDE as a pooling layer (the T-EMDE paper's replacement of the global
    self-attention module): a sequence's global vector comes from its summed soft
    assignments. (B, T, d), (B, T) -> (B, d).

    coder: Linear, then LayerNorm per partition (not the scorer's BatchNorm: a
    pooled vector must not depend on the rest of the batch or on padding), soft
    assignment over K centroids per partition, masked sum over tokens, per-partition
    L2 norm, and a linear map of the N*K sketch back to d.
    """

    def __init__(self, d: int, N: int = 16, K: int = 16, inner: int = 16):
        super().__init__()
        self.N, self.K, self.inner = N, K, inner
        self.lin = nn.Linear(d, N * inner)
        self.ln = nn.LayerNorm(inner)
        self.centroids = nn.Parameter(torch.randn(N, K, inner))
        self.log_tau = nn.Parameter(torch.tensor(float(inner)).log())  # start near unit-scale distances
        self.out = nn.Linear(N * K, d)
        self.penalty = torch.zeros(())  # same interface as SelfAttentivePooling (no penalty here)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, d), (B, T) bool mask -> (B, d)."""
        B, T, _ = x.shape
        z = self.ln(self.lin(x).view(B, T, self.N, 1, self.inner))  # (B, T, N, 1, inner)
        assign = (-((z - self.centroids) ** 2).sum(-1) / self.log_tau.exp()).softmax(-1)  # (B, T, N, K)
        sketch = Temde.raw_sketch(assign, mask)  # (B, N, K) summed over real tokens
        return self.out(Temde.normalize(sketch))  # (B, d)
