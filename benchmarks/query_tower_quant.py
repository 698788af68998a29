"""Query tower: speed AND quality of ONNX Runtime fp32 vs int8 dynamic quantization.

For each variant: median ms per query (tokenizer + one ORT run, one typical
caption, 2 threads, 300 runs) and the Flickr8k test text->image R@1/R@5/R@10 of
the two-tower stage when the 5,000 test captions go through that graph (the
1,000 test images' vectors come from the same checkpoint, fp32), plus how far
g_q moves (cosine to fp32). Variants:

  fp32            the exported graph (what `crossprobe eval` measures)
  int8            every MatMul weight int8 per tensor, activations quantized on the fly
  int8-perchannel the same with per-output-channel weight scales
  int8-bottom     only the frozen MiniLM bottom quantized (per channel); the
                  fine-tuned top layers, projection, pooling and probes stay fp32
  int8-layers     all six MiniLM layers quantized (per channel); the projection,
                  pooling, CP probes and T-EMDE coder stay fp32

Writes docs/research/query_tower_quant.md and docs/research/results/query_tower_quant.json.
Run: .venv/bin/python -m benchmarks.query_tower_quant   (CPU otherwise idle)
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic

from crossprobe.models import checkpoint
from crossprobe.models import export as ex
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import encode_images
from crossprobe.models.evaluation.report import machine
from crossprobe.models.evaluation.timing import median_ms
from crossprobe.core import inputs
from crossprobe.core.runtime import session
from crossprobe.models.training.data import CachedData

CAPTION = "a black dog is running through the grass with a ball in its mouth"


def latency_ms(sess, tok, n: int = 300) -> float:
    def once():
        ids, mask = inputs.tokenize(tok, [CAPTION])
        sess.run(None, {"input_ids": ids, "attention_mask": mask})

    return round(median_ms(once, n, warmup=20), 3)


def encode_all(sess, tok, captions: list[str], batch: int = 64) -> np.ndarray:
    out = []
    for s in range(0, len(captions), batch):
        ids, mask = inputs.tokenize(tok, captions[s : s + batch])
        out.append(sess.run(None, {"input_ids": ids, "attention_mask": mask})[0])
    return np.concatenate(out)


def main() -> None:
    torch.set_num_threads(2)
    model, meta = checkpoint.load(None)
    data = CachedData.build(Path("cache/flickr8k"), model.cfg.text.frozen_layers)
    img_rows = data.split_images("test")
    cap_rows = data.split_captions("test")
    col = {r: i for i, r in enumerate(img_rows)}
    gold = np.array([col[data.ds.caption_image[j]] for j in cap_rows])
    captions = [data.ds.captions[j] for j in cap_rows]
    g_img = encode_images(model, data.grids, img_rows).g.numpy()
    tok = inputs.load_tokenizer()
    tmp = Path(tempfile.mkdtemp())
    ex.export_all(model, tmp, meta["fingerprint"], names=("query_tower",))
    fp32 = tmp / "query_tower.onnx"
    names = [n.name for n in onnx.load(str(fp32)).graph.node if n.op_type == "MatMul"]
    not_bottom = [n for n in names if not n.startswith("/text/bottom/")]
    variants = {"fp32": fp32}
    for name, kw in {
        "int8": {},
        "int8-perchannel": {"per_channel": True},
        "int8-bottom": {"per_channel": True, "nodes_to_exclude": not_bottom},
    }.items():
        variants[name] = tmp / f"{name}.onnx"
        quantize_dynamic(str(fp32), str(variants[name]), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"], **kw)
    # what the service runs with CROSSPROBE_QUERY_PRECISION=int8
    variants["int8-layers"] = ex.quantize_query_tower(fp32, tmp / "int8-layers.onnx")
    ref = None
    rows = {}
    for name, path in variants.items():
        sess = session(path, threads=2)
        g = encode_all(sess, tok, captions)
        ref = g if ref is None else ref
        cos = (g * ref).sum(1) / np.linalg.norm(g, axis=1) / np.linalg.norm(ref, axis=1)
        r = M.summarize(M.t2i_ranks(g @ g_img.T, gold))
        rows[name] = {"ms_per_query": latency_ms(sess, tok), "t2i": {k: round(r[k], 2) for k in ("R@1", "R@5", "R@10")},
                      "cos_to_fp32_mean": round(float(cos.mean()), 4), "cos_to_fp32_min": round(float(cos.min()), 4),
                      "size_mb": round(path.stat().st_size / 2**20, 1)}
        print(name, rows[name], flush=True)
    out = {"rows": rows, "command": " ".join(["python -m benchmarks.query_tower_quant", *sys.argv[1:]]), "machine": machine(),
           "model_fingerprint": meta["fingerprint"],
           "notes": "ms: tokenizer + one ONNX Runtime run for one caption, 2 intra-op threads, median of 300. "
                    "R@k: Flickr8k test, 5,000 captions x 1,000 images, two-tower stage only."}
    docs = Path("docs/research")
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "query_tower_quant.json").write_text(json.dumps(out, indent=2))
    lines = ["# Query tower: fp32 vs int8 (ONNX Runtime dynamic quantization)", "",
             f"Command: `{out['command']}`  ", f"Machine: {out['machine']}  ", f"Checkpoint: `{meta['fingerprint']}`", "",
             out["notes"], "",
             "| variant | ms / query | TT t2i R@1 | R@5 | R@10 | cos(g_q, fp32) mean | min | MB |", "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        t = r["t2i"]
        lines.append(f"| {name} | {r['ms_per_query']} | {t['R@1']:.2f} | {t['R@5']:.2f} | {t['R@10']:.2f} | "
                     f"{r['cos_to_fp32_mean']} | {r['cos_to_fp32_min']} | {r['size_mb']} |")
    (docs / "query_tower_quant.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
