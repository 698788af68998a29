"""Building blocks shared by the towers and rerankers.

Attention is written out (not nn.MultiheadAttention) so that padding masks,
export to ONNX and later attention variants all live in one readable place.
Masks are boolean with True = real token, False = padding.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

NEG_INF = -1e4  # large but finite, so an all-padding row cannot produce NaN in fp16/ONNX


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, D), (B, T) bool -> (B, D) mean over real tokens only."""
    if mask is None:
        return x.mean(1)
    m = mask.to(x.dtype).unsqueeze(-1)
    return (x * m).sum(1) / m.sum(1).clamp_min(1.0)


class Attention(nn.Module):
    """Multi-head attention: queries (B, Tq, D) over keys/values (B, Tk, D)."""

    def __init__(self, d: int, heads: int, dropout: float = 0.0):
        super().__init__()
        assert d % heads == 0, (d, heads)
        self.h, self.hd = heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)
        self.dropout = dropout

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        ctx_mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        x_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, Tq, D) queries, (B, Tk, D) keys/values, (B, Tk) bool ctx_mask -> (B, Tq, D).
        bias: optional additive logits (B, h, Tq, Tk) (ACE-RPE's relative positions).
        x_mask is unused here (padded queries are ignored downstream); ZoDIAC needs it."""
        B, Tq, D = x.shape
        Tk = ctx.shape[1]
        q = self.q(x).view(B, Tq, self.h, self.hd).transpose(1, 2)  # (B, h, Tq, hd)
        k, v = self.kv(ctx).view(B, Tk, 2, self.h, self.hd).permute(2, 0, 3, 1, 4).unbind(0)  # 2 x (B, h, Tk, hd)
        # fused kernel (scaled_dot_product_attention); mask broadcast over heads and queries
        am = None if ctx_mask is None else ctx_mask[:, None, None, :]
        if bias is not None:
            am = bias if am is None else bias.masked_fill(~am, NEG_INF)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=am, dropout_p=self.dropout if self.training else 0.0)
        return self.out(o.transpose(1, 2).reshape(B, Tq, D))


ATTENTION_KINDS = ("standard", "zodiac")


class Block(nn.Module):
    """Pre-LN transformer self-attention block. attention="zodiac" swaps in ZoDIAC
    attention (research/zodiac.py); bias is an optional additive (B, h, T, T) logit term."""

    def __init__(
        self,
        d: int,
        heads: int,
        mlp_ratio: int = 4,
        dropout: float = 0.1,
        attention: str = "standard",
        zodiac_dropout: float = 0.2,
    ):
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, not {attention!r}")
        self.ln1 = nn.LayerNorm(d)
        if attention == "standard":
            self.attn: nn.Module = Attention(d, heads, dropout)
        else:  # a research variant (its ablation: docs/research/): imported only where a config asks for it
            from crossprobe.models.research.zodiac import ZodiacAttention

            self.attn = ZodiacAttention(d, heads, dropout, zodiac_dropout)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, mlp_ratio * d), nn.GELU(), nn.Linear(mlp_ratio * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, T, d) tokens, (B, T) bool mask, (B, h, T, T) bias -> (B, T, d)."""
        h = self.ln1(x)
        x = x + self.drop(self.attn(h, h, mask, bias, x_mask=mask))
        return x + self.drop(self.mlp(self.ln2(x)))


class SelfAttentivePooling(nn.Module):
    """SEAM-style multi-hop self-attentive pooling.

    A = softmax_T(W2 tanh(W1 H^T)) with `hops` rows; pooled = mean over hops of A H.
    (B, T, D), (B, T) -> (B, D); `penalty` is ||A A^T - I||_F^2 averaged over the batch
    (zero when the hops attend to disjoint tokens), stored after each forward.
    """

    def __init__(self, d: int, hops: int = 1, hidden: int = 128):
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, hops, bias=False)
        self.hops = hops
        self.penalty = torch.zeros(())

    def attention(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        logits = self.w2(torch.tanh(self.w1(x))).transpose(1, 2)  # (B, hops, T)
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, :], NEG_INF)
        return logits.softmax(-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, D), (B, T) bool mask -> (B, D)."""
        a = self.attention(x, mask)  # (B, hops, T)
        if self.hops > 1 and self.training:
            self.penalty = frobenius_penalty(a)
        return (a @ x).mean(1)  # (B, D)


def frobenius_penalty(a: torch.Tensor) -> torch.Tensor:
    """SEAM's diversity penalty ||A A^T - I||_F^2 for (B, hops, T) attention rows,
    averaged over the batch: zero when every hop is one-hot on its own token."""
    eye = torch.eye(a.shape[1], device=a.device, dtype=a.dtype)
    return ((a @ a.transpose(1, 2) - eye) ** 2).sum((1, 2)).mean()


def grid_positions(grid: int, d: int) -> torch.Tensor:
    """Fixed 2D sine-cosine position table (grid*grid, d): half the channels encode
    the row, half the column, so regions know where they are in the image."""
    assert d % 4 == 0
    quarter = d // 4
    freq = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float32) / quarter))
    ys, xs = torch.meshgrid(
        torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32), indexing="ij"
    )
    parts = []
    for coord in (ys.flatten(), xs.flatten()):
        ang = coord[:, None] * freq[None, :]
        parts += [ang.sin(), ang.cos()]
    return torch.cat(parts, dim=1)


class Fusion(nn.Module):
    """Learned late fusion of the first-stage score with a reranker's score:
    logit = alpha * s_tt + beta * s_rerank. Trained jointly with the reranker so it
    learns what the shortlist's own order already knows: a reranker that replaces the
    two-tower score outright ranks worse (docs/research/rerank_experiments.md)."""

    def __init__(self, alpha: float = 20.0, beta: float = 10.0):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self.beta = nn.Parameter(torch.tensor(float(beta)))

    def forward(self, s_tt: torch.Tensor, s_rerank: torch.Tensor) -> torch.Tensor:
        """(Q, K) two-tower scores, (Q, K) reranker scores -> (Q, K) logits (any matching shapes)."""
        return self.alpha * s_tt + self.beta * s_rerank


class ProbePool(nn.Module):
    """`count` learned probes cross-attend to a token sequence (one pre-LN block):
    (B, T, D) tokens -> (B, count, D) probes. This is per modality and therefore
    precomputable per image."""

    def __init__(self, count: int, d: int, heads: int, dropout: float = 0.1):
        super().__init__()
        self.probes = nn.Parameter(torch.randn(count, d) * 0.02)
        self.ln_q = nn.LayerNorm(d)
        self.ln_kv = nn.LayerNorm(d)
        self.attn = Attention(d, heads, dropout)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, D) tokens, (B, T) bool mask -> (B, count, D) probes."""
        p = self.probes.unsqueeze(0).expand(tokens.shape[0], -1, -1)  # (B, count, D)
        p = p + self.attn(self.ln_q(p), self.ln_kv(tokens), mask)
        return p + self.mlp(self.ln2(p))


def joint_pairs(score, t: torch.Tensor, t_mask: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Score each query against each of its K candidates with a joint pair scorer:
    (Q, T, d) queries, (Q, T) masks, (Q, K, N, d) candidates -> (Q, K) scores."""
    Q, K = v.shape[:2]
    s = score(
        t.unsqueeze(1).expand(-1, K, -1, -1).flatten(0, 1),
        t_mask.unsqueeze(1).expand(-1, K, -1).flatten(0, 1),
        v.flatten(0, 1),
    )
    return s.view(Q, K)
