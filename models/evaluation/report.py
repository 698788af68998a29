"""`crossprobe eval`: the full Flickr8k test protocol, written to docs/research/.

Rows: TT; CP@K, TEMDE@K for K in ks; CP@all (every caption x every image, no
shortlist); SM@K and TV@K. The shortlist's own recall@K is reported as the
ceiling of any reranker at K. SM and TV cost 10-100x more per pair than CP, so
their text->image rows use one caption per test image (1,000 queries; TT and CP
on the same subset are reported beside them); image->text uses all captions.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import PairScorer
from crossprobe.models.evaluation.retrieval import (
    both_directions,
    full_matrix,
    reranked,
    shortlist_recall,
    split_banks,
    tt_scores,
)
from crossprobe.models.evaluation.timing import rerank_ms

KEYS = ("R@1", "R@5", "R@10", "MRR", "medr")


def machine() -> str:
    import os

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, no GPU, {platform.system()} {platform.machine()}, "
        f"torch {torch.__version__}"
    )


def evaluate(
    model,
    data,
    split: str = "test",
    ks=(20, 50, 100),
    methods=("cp", "temde", "sm", "tv"),
    cp_all: bool = True,
    timing: bool = True,
    log=print,
) -> dict:
    t0 = time.time()
    text, images, gold = split_banks(model, data, split)
    S = tt_scores(text, images)
    res: dict = {"t2i": {}, "i2t": {}, "rsum": {}, "shortlist_recall_t2i": {}, "seconds": {}}

    def put(name, r):
        for d in ("t2i", "i2t"):
            if d in r:
                res[d][name] = {k: round(r[d][k], 2 if k != "MRR" else 4) for k in KEYS}
        if "rsum" in r:
            res["rsum"][name] = round(r["rsum"], 2)

    put("TT", both_directions(S, gold))
    for k in ks:
        res["shortlist_recall_t2i"][str(k)] = round(shortlist_recall(S, gold, k), 2)
    subset = np.unique(gold, return_index=True)[1]  # first caption of each test image
    put("TT (1k-caption subset)", {"t2i": M.summarize(M.t2i_ranks(S[subset], gold[subset]))})
    kmax = max(ks)
    for method in methods:
        t = time.time()
        scorer = PairScorer(model, method, text, images)
        joint = method in ("sm", "tv")
        out = reranked(scorer, S, gold, kmax, list(ks), query_rows=subset if joint else None)
        for k, r in out.items():
            put(f"{method.upper()}@{k}", r)
        if method == "cp":  # same subset as the references, for a like-for-like row
            sub = reranked(scorer, S, gold, kmax, [kmax], query_rows=subset, i2t=False)
            put(f"CP@{kmax} (1k-caption subset)", sub[kmax])
        if method == "cp" and cp_all:
            F = full_matrix(scorer, len(S), S.shape[1])
            put("CP@all", both_directions(F, gold))
        res["seconds"][method] = round(time.time() - t, 1)
        log(f"eval {method}: {res['seconds'][method]} s")
    if timing:
        res["rerank_ms_per_query"] = rerank_ms(model, methods)
    res["seconds"]["total"] = round(time.time() - t0, 1)
    return res


def to_json(res: dict, command: str, fingerprint: str) -> dict:
    """What write() stores as DOCS/results/flickr8k.json: METHOD names TT, CP@K, CP@all, TEMDE@K, SM@K, TV@K."""
    out = {
        "t2i": dict(res["t2i"]),
        "i2t": dict(res["i2t"]),
        "rsum": res["rsum"],
        "shortlist_recall_t2i": res["shortlist_recall_t2i"],
        "command": command,
        "machine": machine(),
        "model_fingerprint": fingerprint,
        "notes": [
            "Recalls in percent; MRR in 0..1; medr 1-based. Ties count against the gold item.",
            "A reranker at K reorders the two-tower top K; below K the two-tower order is kept. "
            "shortlist_recall_t2i[K] is the ceiling of any reranker at K.",
            "SM@K and TV@K text->image use the first caption of each test image (1,000 queries); "
            "compare with the '(1k-caption subset)' rows. Their image->text rows use all 5,000 captions.",
        ],
    }
    if "rerank_ms_per_query" in res:
        t = res["rerank_ms_per_query"]
        out["rerank_ms_per_query"] = {m.upper(): v for m, v in t["onnxruntime"].items()}
        out["rerank_ms_per_query_pytorch"] = {m.upper(): v for m, v in t["pytorch"].items()}
    return out


def markdown(j: dict) -> str:
    lines = [
        "# Flickr8k test results (1,000 images x 5,000 captions)",
        "",
        f"Command: `{j['command']}`  ",
        f"Machine: {j['machine']}  ",
        f"Checkpoint fingerprint: `{j['model_fingerprint']}`",
        "",
    ]
    lines += [f"- {n}" for n in j["notes"]] + [""]
    lines += [
        "Shortlist (two-tower) text->image recall at K, the ceiling of a reranker at K: "
        + ", ".join(f"K={k}: {v}%" for k, v in j["shortlist_recall_t2i"].items()),
        "",
    ]
    for d, title in (("t2i", "Text -> image"), ("i2t", "Image -> text")):
        lines += [f"## {title}", "", "| method | R@1 | R@5 | R@10 | MRR | medr |", "|---|---|---|---|---|---|"]
        for name, r in j[d].items():
            lines.append(
                f"| {name} | {r['R@1']:.2f} | {r['R@5']:.2f} | {r['R@10']:.2f} | {r['MRR']:.4f} | {r['medr']:g} |"
            )
        lines.append("")
    if "rerank_ms_per_query" in j:
        lines += [
            "## Rerank milliseconds per query (one query, K cached candidates, 2 threads, median)",
            "",
            "| method | ONNX Runtime K=100 | ONNX Runtime K=1000 | PyTorch K=100 | PyTorch K=1000 |",
            "|---|---|---|---|---|",
        ]
        for m, v in j["rerank_ms_per_query"].items():
            p = j["rerank_ms_per_query_pytorch"][m]
            lines.append(f"| {m} | {v['100']} | {v['1000']} | {p['100']} | {p['1000']} |")
        lines.append("")
    return "\n".join(lines)


def write(res: dict, docs: Path, command: str, fingerprint: str) -> dict:
    j = to_json(res, command, fingerprint)
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "flickr8k.json").write_text(json.dumps(j, indent=2))
    (docs / "flickr8k.md").write_text(markdown(j))
    return j
