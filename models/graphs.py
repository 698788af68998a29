"""The ONNX graphs' modules: what each exported graph computes, over a SearchModel's trained parts.

  query_tower   input_ids, attention_mask (B, T) -> g_q (B, d), p_t (B, m, dc), w_bar (B, dc), s_q (B, N*K)
                (+ q_cls (B, 1000) with region labels: cosines with the class table)
  image_tower   grid (B, 49, 1280) -> g_i (B, d), p_v (B, n, dc), b_bar (B, dc), s_i (B, N*K)
                (+ labels (B, 49) int64 with region labels: the head's class per cell)
  cp_scorer     p_t (1, m, dc), w_bar (1, dc), p_v (K, n, dc), b_bar (K, dc), s_tt (K,) -> logits (K,)
  temde_scorer  s_q (1, NK), s_i (K, NK), s_tt (K,) -> logits (K,)
                (both scorers + q_cls (1, 1000), labels (K, 49) when the method has a region weight)
  explain       grid (K, 49, 1280), p_t (1, m, dc) -> regions (K, 49), probe_regions (K, 49)
                (+ q_cls (1, 1000) -> label_regions (K, 49) with region labels: each cell's label against the query)
  sm_scorer / tv_scorer  the references, for timing against CP.

Reranker heads on another model's backbone (models/heads.py: no region labels, no explain maps):
  image_head    tokens (B, P, W) -> p_v (B, n, dc), b_bar (B, dc), s_i (B, N*K)
  text_head     tokens (B, T, W_t), attention_mask (B, T) -> p_t (B, m, dc), w_bar (B, dc), s_q (B, N*K)
  cp_scorer, temde_scorer  as above

models/export.py writes them to files; this module only says what they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.core import inputs
from crossprobe.models.model import SearchModel
from crossprobe.models.region_labels import SCALE, add_region

if TYPE_CHECKING:  # for casts only: zodiac is imported only where a config asks for it (layers.Block)
    from crossprobe.models.layers import Attention
    from crossprobe.models.research.zodiac import ZodiacAttention


class QueryGraph(nn.Module):
    def __init__(self, model: SearchModel):
        super().__init__()
        self.m = model

    def forward(self, input_ids, attention_mask):
        t = self.m.text(input_ids, attention_mask)
        p_t, w_bar = self.m.cp.encode_text(t.tokens, t.mask, t.states)
        out = (t.g, p_t, w_bar, self.m.temde.sketch_text(t.tokens, t.mask, t.states))
        return out + (self.m.bridge.class_sims(t.g),) if self.m.cfg.region.enabled else out


class ImageGraph(nn.Module):
    def __init__(self, model: SearchModel):
        super().__init__()
        self.m = model

    def forward(self, grid):
        v = self.m.image(grid)  # g_i bridged with the ImageNet labels when the checkpoint has a bridge
        p_v, b_bar = self.m.cp.encode_image(v.tokens, grid)
        out = (v.g, p_v, b_bar, self.m.temde.sketch_image(v.tokens, grid))
        return out + (self.m.bridge.cell_labels(grid),) if self.m.cfg.region.enabled else out


class _RegionTerm(nn.Module):
    """A scorer graph's region term (region_labels.py): extra inputs q_cls (1, 1000), labels (K, 49)."""

    def __init__(self, model: SearchModel, method: str):
        super().__init__()
        self.cfg, self.method = model.cfg.region, method

    @property
    def on(self) -> bool:
        return self.cfg.weight(self.method) > 0

    def add(self, logits, q_cls, labels):
        if not self.on:
            return logits
        return add_region(logits[None], self.cfg, self.method, q_cls, labels[None])[0]


class CPScorer(_RegionTerm):
    def __init__(self, model: SearchModel):
        super().__init__(model, "cp")
        self.cp = model.cp

    def forward(self, p_t, w_bar, p_v, b_bar, s_tt, q_cls=None, labels=None):
        K = p_v.shape[0]
        s = self.cp.score(p_t.expand(K, -1, -1), w_bar.expand(K, -1), p_v, b_bar)
        return self.add(self.cp.fusion(s_tt, s), q_cls, labels)


class TemdeScorer(_RegionTerm):
    def __init__(self, model: SearchModel):
        super().__init__(model, "temde")
        self.temde = model.temde

    def forward(self, s_q, s_i, s_tt, q_cls=None, labels=None):
        return self.add(self.temde.fusion(s_tt, self.temde.score(s_q, s_i)), q_cls, labels)


def attention_probs(attn: nn.Module, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
    """The attention probabilities (B, h, Tq, Tk) that `attn` (layers.Attention or zodiac.ZodiacAttention)
    uses for queries x (B, Tq, D) over ctx (B, Tk, D), no mask (probes and the 49 regions are all real).
    Recomputed from the module's own weights because its forward runs the fused
    scaled_dot_product_attention kernel, which never materialises them."""
    B, Tq, _ = x.shape
    Tk = ctx.shape[1]
    # attn is typed nn.Module (Block.attn); both kinds carry the same int `h` / `hd` and Linear `q` / `kv`.
    scale = cast(int, attn.hd) ** -0.5
    if hasattr(attn, "q2"):  # ZoDIAC: GELU on the inputs, on q / k and on the logits (zodiac.py)
        z = cast("ZodiacAttention", attn)
        q = z._heads(z.q(F.gelu(x)))
        k = z._heads(z.kv(F.gelu(ctx)).chunk(2, dim=-1)[0])
        return F.gelu(q @ k.transpose(-1, -2) * scale).softmax(-1)
    a = cast("Attention", attn)
    q = a.q(x).view(B, Tq, a.h, a.hd).transpose(1, 2)
    k = a.kv(ctx).view(B, Tk, 2, a.h, a.hd)[:, :, 0].transpose(1, 2)
    return (q @ k.transpose(-1, -2) * scale).softmax(-1)


class ExplainGraph(nn.Module):
    """Where Cross-probe looked in each image for one query: a weight per 7x7 region, summing to 1.

    Two attention steps lead from the query to the regions:
      1. the n vision probes attend to the 49 regions (ProbePool, per image: R, n x 49);
      2. in the l cross layers over [P_t ; P_v] the m text probes attend to the vision probes.
    Step 2 is composed over the layers by attention rollout (Abnar & Zuidema 2020: each layer's
    head-averaged attention mixed half-and-half with the identity for the residual path, multiplied
    layer by layer); the text rows' mass on the vision columns, summed over the text probes (each
    adds to the query vector q with the same weight) and normalised, gives t (n,), the share of the
    query's attention each vision probe received. The map is t @ R: query-dependent, and for l = 1
    exactly the text probes' head-averaged attention to the vision probes times R.

    `probe_regions` is R averaged over probes (query-independent: the regions the image's probes
    attend to); it is `regions` too when the CP has no cross layers (then nothing links the two).
    With CP inputs "tower" the regions are the vision tower's tokens, which already mix the grid
    through its self-attention, so the map is one attention step removed from the pixels; with
    "backbone" (the committed checkpoint) they are the raw Lite0 grid cells.

    The probes' outputs P_v are recomputed here from the grid (the service does not keep the grid)
    rather than read from Redis (float16 there): a map from the same forward pass it explains.
    """

    def __init__(self, model: SearchModel):
        super().__init__()
        self.m = model

    def forward(self, grid, p_t, q_cls=None):
        maps = self._attention(grid, p_t)
        if q_cls is None:
            return maps
        return maps + (label_regions(self.m, grid, q_cls),)

    def _attention(self, grid, p_t):
        cp = self.m.cp
        K = grid.shape[0]
        tokens = self.m.vision(grid).tokens if cp.cfg.uses_tower else None
        x = cp._embed(tokens, grid, "vision_in", "vision_bb")
        if cp.cfg.uses_backbone:
            x = x + cp.pos
        pool = cp.vision_probes
        probes = pool.probes.unsqueeze(0).expand(K, -1, -1)
        r = attention_probs(pool.attn, pool.ln_q(probes), pool.ln_kv(x)).mean(1)  # (K, n, 49)
        probe_regions = r.mean(1)
        if len(cp.cross) == 0:
            return probe_regions, probe_regions
        m, n = p_t.shape[1], cp.cfg.n
        h = torch.cat([p_t.expand(K, -1, -1) + cp.type_emb[0], pool(x) + cp.type_emb[1]], dim=1)  # (K, m+n, d)
        eye = torch.eye(m + n, dtype=h.dtype)
        roll = eye.expand(K, -1, -1)
        for i, blk in enumerate(cp.cross):
            hn = blk.ln1(h)
            a = attention_probs(blk.attn, hn, hn).mean(1)  # (K, m+n, m+n), rows sum to 1
            roll = (0.5 * a + 0.5 * eye) @ roll
            if i + 1 < len(cp.cross):
                h = blk(h)
        t = roll[:, :m, m:].sum(1)  # (K, n)
        t = t / t.sum(-1, keepdim=True).clamp_min(1e-12)
        return (t.unsqueeze(1) @ r).squeeze(1), probe_regions


def label_regions(model: SearchModel, grid: torch.Tensor, q_cls: torch.Tensor) -> torch.Tensor:
    """(K, 49, 1280) grid, (1, 1000) the query's class cosines -> (K, 49) a weight per cell, summing to 1: how well
    each cell's ImageNet label matches the query, the region term's own per-cell scores (region_labels.py), as a
    softmax at the logit scale the term is added at (SCALE), so a cell's share is its part of exp(SCALE * score)."""
    labels = model.bridge.cell_labels(grid)  # (K, 49)
    cells = q_cls[0][labels]  # (K, 49)
    return (SCALE * cells).softmax(-1)


class JointScorer(nn.Module):
    """SM or TV: one embedded query (1, T, d) against K embedded images (K, 49, d)."""

    def __init__(self, module):
        super().__init__()
        self.mod = module

    def forward(self, t, t_mask, v, s_tt):
        K = v.shape[0]
        s = self.mod.score(t.expand(K, -1, -1), t_mask.expand(K, -1), v)
        return self.mod.fusion(s_tt, s)


def _mask(T: int) -> torch.Tensor:
    """(2, T): one full row, one with 3 padding positions."""
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, T - 3 :] = 0
    return mask


def scorer_inputs(model, K: int = 7) -> dict[str, tuple]:
    """cp_scorer's and temde_scorer's example inputs (a SearchModel's or reranker heads')."""
    cp, te = model.cp.cfg, model.temde.cfg  # modules' own configs (a frontier variant may be swapped in)
    dc, nk = cp.d, te.N * te.K
    return {
        "cp_scorer": (
            torch.randn(1, cp.m, dc),
            torch.randn(1, dc),
            torch.randn(K, cp.n, dc),
            torch.randn(K, dc),
            torch.rand(K),
        )
        + region_inputs(model, "cp", K),
        "temde_scorer": (torch.rand(1, nk), torch.rand(K, nk), torch.rand(K)) + region_inputs(model, "temde", K),
    }


def example_inputs(model: SearchModel, K: int = 7, T: int = 9) -> dict[str, tuple]:
    cp = model.cp.cfg
    ids = torch.randint(1000, 2000, (2, T))
    ids[:, 0] = 101
    return {
        "query_tower": (ids, _mask(T)),
        "image_tower": (torch.randn(2, inputs.GRID * inputs.GRID, inputs.IMAGE_FEAT_DIM).abs(),),
        **scorer_inputs(model, K),
        **(reference_inputs(model, K, T) if hasattr(model, "sm") else {}),
        # a real grid is ReLU6 output: non-negative
        "explain": (torch.rand(K, inputs.GRID * inputs.GRID, inputs.IMAGE_FEAT_DIM) * 6, torch.randn(1, cp.m, cp.d))
        + ((F.normalize(torch.randn(1, 1000), dim=-1),) if model.cfg.region.enabled else ()),
    }


def reference_inputs(model: SearchModel, K: int, T: int) -> dict[str, tuple]:
    """Example inputs of the research-only SM / TV scorers (a model built with references=True)."""
    return {
        "sm_scorer": (
            torch.randn(1, T, model.sm.cfg.d),
            torch.ones(1, T, dtype=torch.bool),
            torch.randn(K, 49, model.sm.cfg.d),
            torch.rand(K),
        ),
        "tv_scorer": (
            torch.randn(1, T, model.tv.cfg.d),
            torch.ones(1, T, dtype=torch.bool),
            torch.randn(K, 49, model.tv.cfg.d),
            torch.rand(K),
        ),
    }


GRAPHS = {
    # outputs named dynamic too: traced at batch 2, a reshape's output (the T-EMDE sketch) otherwise keeps a declared
    # batch of 2, which ONNX Runtime warns about on every other batch size (the values were right)
    "query_tower": (
        QueryGraph,
        ["input_ids", "attention_mask"],
        ["g_q", "p_t", "w_bar", "s_q"],
        {
            "input_ids": {0: "B", 1: "T"},
            "attention_mask": {0: "B", 1: "T"},
            **{o: {0: "B"} for o in ("g_q", "p_t", "w_bar", "s_q")},
        },
    ),
    "image_tower": (
        ImageGraph,
        ["grid"],
        ["g_i", "p_v", "b_bar", "s_i"],
        {"grid": {0: "B"}, **{o: {0: "B"} for o in ("g_i", "p_v", "b_bar", "s_i")}},
    ),
    "cp_scorer": (
        CPScorer,
        ["p_t", "w_bar", "p_v", "b_bar", "s_tt"],
        ["logits"],
        {"p_v": {0: "K"}, "b_bar": {0: "K"}, "s_tt": {0: "K"}},
    ),
    "temde_scorer": (TemdeScorer, ["s_q", "s_i", "s_tt"], ["logits"], {"s_i": {0: "K"}, "s_tt": {0: "K"}}),
    "sm_scorer": (
        lambda m: JointScorer(m.sm),
        ["t", "t_mask", "v", "s_tt"],
        ["logits"],
        {"t": {1: "T"}, "t_mask": {1: "T"}, "v": {0: "K"}, "s_tt": {0: "K"}},
    ),
    "tv_scorer": (
        lambda m: JointScorer(m.tv),
        ["t", "t_mask", "v", "s_tt"],
        ["logits"],
        {"t": {1: "T"}, "t_mask": {1: "T"}, "v": {0: "K"}, "s_tt": {0: "K"}},
    ),
    "explain": (
        ExplainGraph,
        ["grid", "p_t"],
        ["regions", "probe_regions"],
        {"grid": {0: "K"}, "regions": {0: "K"}, "probe_regions": {0: "K"}},
    ),
}

# the research-only references' scorers (models/research/): exported for timing them, never for serving
REFERENCE_GRAPHS = ("sm_scorer", "tv_scorer")


def available(model: SearchModel) -> tuple[str, ...]:
    """The graphs `model` can be exported to: the SM / TV scorers only where it was built with its references."""
    return tuple(n for n in GRAPHS if n not in REFERENCE_GRAPHS or hasattr(model, "sm"))


# Reranker heads on another model's backbone (models/heads.py): its image and text heads, and the same scorers
class HeadsImageGraph(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, tokens):
        return self.m.encode_image(tokens)


class HeadsTextGraph(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, tokens, attention_mask):
        return self.m.encode_text(tokens, attention_mask)


# the modules are built over a HeadsModel here (the scorers' classes are annotated with SearchModel, whose cp, temde and
# cfg.region names heads share)
HEADS_GRAPHS: dict[str, tuple[Callable[..., nn.Module], list[str], list[str], dict]] = {
    "image_head": (
        HeadsImageGraph,
        ["tokens"],
        ["p_v", "b_bar", "s_i"],
        {"tokens": {0: "B"}, **{o: {0: "B"} for o in ("p_v", "b_bar", "s_i")}},
    ),
    "text_head": (
        HeadsTextGraph,
        ["tokens", "attention_mask"],
        ["p_t", "w_bar", "s_q"],
        {
            "tokens": {0: "B", 1: "T"},
            "attention_mask": {0: "B", 1: "T"},
            **{o: {0: "B"} for o in ("p_t", "w_bar", "s_q")},
        },
    ),
    "cp_scorer": GRAPHS["cp_scorer"],
    "temde_scorer": GRAPHS["temde_scorer"],
}


def heads_example_inputs(model, K: int = 7, T: int = 9) -> dict[str, tuple]:
    c = model.cfg
    return {
        "image_head": (torch.randn(2, c.cells, c.image_width),),
        "text_head": (torch.randn(2, T, c.text_width), _mask(T)),
        **scorer_inputs(model, K),
    }


def region_inputs(model, method: str, K: int) -> tuple:
    """The scorer graph's extra inputs when the method has a region weight: q_cls (1, 1000), labels (K, 49)."""
    if model.cfg.region.weight(method) <= 0:
        return ()
    return F.normalize(torch.randn(1, 1000), dim=-1), torch.randint(0, 1000, (K, inputs.GRID * inputs.GRID))


def io_names(model: SearchModel, name: str) -> tuple[list[str], list[str], dict]:
    """GRAPHS[name]'s input names, output names and dynamic axes with what this model's region labels add."""
    _, inputs, outputs, dynamic = GRAPHS[name]
    inputs, outputs, dynamic = list(inputs), list(outputs), dict(dynamic)
    region = model.cfg.region
    if name == "query_tower" and region.enabled:
        outputs.append("q_cls")
    elif name == "image_tower" and region.enabled:
        outputs.append("labels")
    elif name == "explain" and region.enabled:
        inputs.append("q_cls")
        outputs.append("label_regions")
        dynamic["label_regions"] = {0: "K"}
    elif name in ("cp_scorer", "temde_scorer") and region.weight(name.split("_")[0]) > 0:
        inputs += ["q_cls", "labels"]
        dynamic["labels"] = {0: "K"}
    return inputs, outputs, dynamic
