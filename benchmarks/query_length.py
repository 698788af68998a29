"""Queries at their own length (issue 54, item 2): an open_clip ViT-B/32 text tower (random weights of its real shape,
seed 0, tests/support/reference_models.py) exported twice through crossprobe's exporter: with the fixed 77-token
axis every earlier export had (today's padded graph), and with the free token axis a causal tower allows
(models/families/open_clip.py Text), each query then cut to its own tokens. Per graph: query encode time through
the served backend (ExportedBackend.encode_texts, one query at a time as the service runs them, tokenize included),
p50 / p99 over --queries Flickr8k test captions after 20 warm-up queries, ONNX Runtime at 1 and 2 threads, fp32
and int8; and the largest difference between the two graphs' unit-norm embeddings.

Runs in the export venv (open_clip needs torchvision: scripts/openclip-env.sh); nothing else may run meanwhile.

    artifacts/openclip-venv/bin/python -m benchmarks.query_length [--queries 200]
        -> docs/research/results/query_length.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import machine
from crossprobe.core.atomic import atomic_write

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "research" / "results" / "query_length.json"
WORK = REPO / "artifacts" / "query_length"


def export_both(work: Path) -> dict[str, str]:
    """-> {"padded": spec folder root, "own_length": ...}: the same weights exported with each text graph."""
    from crossprobe.models import families
    from crossprobe.models.families import open_clip as oc
    from tests.support import reference_models as rm

    ref_dir = work / "open_clip_base"
    ref = rm.Reference.load(ref_dir) if (ref_dir / rm.META).exists() else rm.build("open_clip", ref_dir, size="base")
    spec = f"open_clip:ViT-B-32/{ref.path / 'open_clip_model.safetensors'}"
    families.export(spec, work / "own_length")
    own = oc.Text.__init__

    def padded_init(self, model):  # today's graph: the tower run through encode_text at the full 77
        own(self, model)
        self.at_own_length = False

    oc.Text.__init__ = padded_init
    try:
        families.export(spec, work / "padded")
    finally:
        oc.Text.__init__ = own
    return {"spec": spec, "ref": str(ref.path)}


def captions(n: int) -> list[str]:
    from crossprobe.models.data.flickr8k import Flickr8k

    ds = Flickr8k.load()
    return [ds.captions[j] for j in ds.captions_of(ds.splits["test"])][:n]


def timed(backend, texts: list[str]) -> dict:
    for t in texts[:20]:
        backend.encode_texts([t])
    ms = []
    for t in texts:
        s = time.perf_counter()
        backend.encode_texts([t])
        ms.append((time.perf_counter() - s) * 1000)
    ms.sort()
    return {"p50_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--work", type=Path, default=WORK)
    args = ap.parse_args()
    from crossprobe.core import inference, int8

    made = export_both(args.work)
    texts = captions(args.queries)
    rows, emb = {}, {}
    for graph in ("padded", "own_length"):
        for threads in (1, 2):
            for precision in ("fp32", "int8"):
                b = inference.load(made["spec"], inference.RuntimeOptions(graphs=args.work / graph, threads=threads,
                                                                          query_precision=precision))
                try:
                    rows[f"{graph}/{precision}/{threads}_threads"] = timed(b, texts)
                except int8.Int8Refused as e:  # below the stated cosine on this host: refused, and recorded so
                    rows[f"{graph}/{precision}/{threads}_threads"] = {"refused": str(e)}
                    continue
                if threads == 1:
                    emb[(graph, precision)] = np.stack([b.encode_texts([t])[0].g_q for t in texts])
                    if precision == "int8":
                        rows[f"{graph}/int8/cosine_to_fp32_min"] = float(
                            (emb[(graph, "int8")] * emb[(graph, "fp32")]).sum(1).min())
    tokens = [int(b.tokenize([t])[1].sum()) for t in texts]
    doc = {"rows": rows,
           "fp32_max_abs_diff_own_length_vs_padded": float(np.abs(emb[("own_length", "fp32")]
                                                                  - emb[("padded", "fp32")]).max()),
           "query_tokens": {"median": statistics.median(tokens), "max": max(tokens), "context": 77},
           "ratio_p50_fp32_1_thread": round(rows["own_length/fp32/1_threads"]["p50_ms"]
                                            / rows["padded/fp32/1_threads"]["p50_ms"], 3),
           "ratio_p50_fp32_2_threads": round(rows["own_length/fp32/2_threads"]["p50_ms"]
                                             / rows["padded/fp32/2_threads"]["p50_ms"], 3),
           "model": "random-weight open_clip ViT-B-32 (its real text tower: 12 layers, width 512), seed 0",
           "queries": f"the first {len(texts)} Flickr8k test captions, one at a time",
           "command": f"artifacts/openclip-venv/bin/python -m benchmarks.query_length --queries {args.queries}",
           "machine": machine()}
    atomic_write(OUT, json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
