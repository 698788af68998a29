"""ONNX export (`crossprobe export`): the graphs the indexer and the service run.

  query_tower.onnx  input_ids, attention_mask (B, T) -> g_q (B, d), p_t (B, m, dc),
                    w_bar (B, dc), s_q (B, N*K)          [everything per query]
  image_tower.onnx  grid (B, 49, 1280) -> g_i, p_v (B, n, dc), b_bar (B, dc),
                    s_i (B, N*K)                          [everything cached per image]
  cp_scorer.onnx    p_t (1, m, dc), w_bar (1, dc), p_v (K, n, dc), b_bar (K, dc),
                    s_tt (K,) -> logits (K,)              [the l cross layers + fusion]
  temde_scorer.onnx s_q (1, NK), s_i (K, NK), s_tt (K,) -> logits (K,)
  sm_scorer.onnx / tv_scorer.onnx  the references, for timing against CP.

ONNX files are build artifacts (not committed); `export_all` rebuilds them from a
checkpoint and records its fingerprint in `manifest.json` beside them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn as nn

from crossprobe.models import backbones as bb
from crossprobe.models.model import SearchModel
from crossprobe.models.runtime import session  # noqa: F401  (export.session: the graphs this module writes, run)

OPSET = 17


class QueryGraph(nn.Module):
    def __init__(self, model: SearchModel):
        super().__init__()
        self.m = model

    def forward(self, input_ids, attention_mask):
        t = self.m.text(input_ids, attention_mask)
        p_t, w_bar = self.m.cp.encode_text(t.tokens, t.mask, t.states)
        return t.g, p_t, w_bar, self.m.temde.sketch_text(t.tokens, t.mask, t.states)


class ImageGraph(nn.Module):
    def __init__(self, model: SearchModel):
        super().__init__()
        self.m = model

    def forward(self, grid):
        v = self.m.image(grid)  # g_i bridged with the ImageNet labels when the checkpoint has a bridge
        p_v, b_bar = self.m.cp.encode_image(v.tokens, grid)
        return v.g, p_v, b_bar, self.m.temde.sketch_image(v.tokens, grid)


class CPScorer(nn.Module):
    def __init__(self, model: SearchModel):
        super().__init__()
        self.cp = model.cp

    def forward(self, p_t, w_bar, p_v, b_bar, s_tt):
        K = p_v.shape[0]
        s = self.cp.score(p_t.expand(K, -1, -1), w_bar.expand(K, -1), p_v, b_bar)
        return self.cp.fusion(s_tt, s)


class TemdeScorer(nn.Module):
    def __init__(self, model: SearchModel):
        super().__init__()
        self.temde = model.temde

    def forward(self, s_q, s_i, s_tt):
        return self.temde.fusion(s_tt, self.temde.score(s_q, s_i))


class JointScorer(nn.Module):
    """SM or TV: one embedded query (1, T, d) against K embedded images (K, 49, d)."""

    def __init__(self, module):
        super().__init__()
        self.mod = module

    def forward(self, t, t_mask, v, s_tt):
        K = v.shape[0]
        s = self.mod.score(t.expand(K, -1, -1), t_mask.expand(K, -1), v)
        return self.mod.fusion(s_tt, s)


def _export(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str], dynamic: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(module.eval(), args, str(tmp), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic, opset_version=OPSET, dynamo=False)
    os.replace(tmp, path)


def example_inputs(model: SearchModel, K: int = 7, T: int = 9) -> dict[str, tuple]:
    cp, te = model.cp.cfg, model.temde.cfg  # modules' own configs (a frontier variant may be swapped in)
    dc, nk = cp.d, te.N * te.K
    ids = torch.randint(1000, 2000, (2, T))
    ids[:, 0] = 101
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, T - 3 :] = 0
    return {
        "query_tower": (ids, mask),
        "image_tower": (torch.randn(2, bb.GRID * bb.GRID, bb.IMAGE_FEAT_DIM).abs(),),
        "cp_scorer": (torch.randn(1, cp.m, dc), torch.randn(1, dc), torch.randn(K, cp.n, dc), torch.randn(K, dc), torch.rand(K)),
        "temde_scorer": (torch.rand(1, nk), torch.rand(K, nk), torch.rand(K)),
        "sm_scorer": (torch.randn(1, T, model.sm.cfg.d), torch.ones(1, T, dtype=torch.bool), torch.randn(K, 49, model.sm.cfg.d), torch.rand(K)),
        "tv_scorer": (torch.randn(1, T, model.tv.cfg.d), torch.ones(1, T, dtype=torch.bool), torch.randn(K, 49, model.tv.cfg.d), torch.rand(K)),
    }


GRAPHS = {
    "query_tower": (QueryGraph, ["input_ids", "attention_mask"], ["g_q", "p_t", "w_bar", "s_q"],
                    {"input_ids": {0: "B", 1: "T"}, "attention_mask": {0: "B", 1: "T"}}),
    "image_tower": (ImageGraph, ["grid"], ["g_i", "p_v", "b_bar", "s_i"], {"grid": {0: "B"}}),
    "cp_scorer": (CPScorer, ["p_t", "w_bar", "p_v", "b_bar", "s_tt"], ["logits"],
                  {"p_v": {0: "K"}, "b_bar": {0: "K"}, "s_tt": {0: "K"}}),
    "temde_scorer": (TemdeScorer, ["s_q", "s_i", "s_tt"], ["logits"], {"s_i": {0: "K"}, "s_tt": {0: "K"}}),
    "sm_scorer": (lambda m: JointScorer(m.sm), ["t", "t_mask", "v", "s_tt"], ["logits"],
                  {"t": {1: "T"}, "t_mask": {1: "T"}, "v": {0: "K"}, "s_tt": {0: "K"}}),
    "tv_scorer": (lambda m: JointScorer(m.tv), ["t", "t_mask", "v", "s_tt"], ["logits"],
                  {"t": {1: "T"}, "t_mask": {1: "T"}, "v": {0: "K"}, "s_tt": {0: "K"}}),
}


def export_all(model: SearchModel, out_dir: Path, fingerprint: str, names=tuple(GRAPHS)) -> dict[str, Path]:
    model.eval()
    out_dir = Path(out_dir)
    ex = example_inputs(model)
    paths = {}
    for name in names:
        ctor, inputs, outputs, dynamic = GRAPHS[name]
        paths[name] = out_dir / f"{name}.onnx"
        _export(ctor(model), ex[name], paths[name], inputs, outputs, dynamic)
    manifest = {"fingerprint": fingerprint, "opset": OPSET, "graphs": sorted(p.name for p in paths.values())}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return paths


# The query tower's MatMuls after the MiniLM layers: small (cheap in fp32) and
# feeding g_q directly, so int8 rounding there costs accuracy for no speed.
QUERY_HEAD_PREFIXES = ("/text/proj", "/text/pool", "/text_in", "/text_probes", "/text_coder")


def quantize_query_tower(src: Path, dst: Path, keep_heads_fp32: bool = True) -> Path:
    """Dynamic int8 quantization of the query tower's MatMul weights, one scale per
    output channel (per-tensor scales moved g_q to cosine 0.969 and cost 1.1 R@1;
    docs/query_tower_quant.md has the measurements). Written to a temp file and
    renamed, so a reader never sees half a graph."""
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = Path(src), Path(dst)
    names = [n.name for n in onnx.load(str(src), load_external_data=False).graph.node if n.op_type == "MatMul"]
    exclude = [n for n in names if n.startswith(QUERY_HEAD_PREFIXES)] if keep_heads_fp32 else []
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".quant-", suffix=".onnx")
    os.close(fd)
    try:
        quantize_dynamic(str(src), tmp, weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"], nodes_to_exclude=exclude)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dst
