"""The Cross-probe latency/accuracy frontier, and the choice of the default.

Several CP settings (probe width d, vision probes n, cross layers l) are trained
with the same budget and seed on the same frozen towers. Each gets its dev
text->image R@1 (top-50 reranked) and its ONNX Runtime rerank time for 100
candidates on this machine. The default is the most accurate setting within
the latency budget whose dev R@1 is within `tolerance` points of the best;
if none fits the budget, the fastest within tolerance. Test-set numbers for
every setting are produced separately by benchmarks/cp_frontier.py, so the
choice never looks at the test split.
"""
from __future__ import annotations

import copy
import dataclasses

import torch

from crossprobe.evaluation.timing import rerank_ms
from crossprobe.models.cross_probe import CrossProbe, CrossProbeConfig
from crossprobe.training.rerankers import RerankTrainConfig, train_reranker
from crossprobe.training.state import atomic_save, seed_everything

# d128-n15-l2 left the list with the in-batch pretraining recipe: it scores 64 x 64 pairs per step
# at 3.9 s/step on 2 cores (~30 min of pretraining alone), and it had measured 15.0 ms per 100
# candidates, over the 10 ms budget, in the frontier before (docs/rerank_experiments.md).
SETTINGS = [
    {"d": 128, "n": 8, "layers": 1},
    {"d": 64, "n": 8, "layers": 1},
    {"d": 64, "n": 15, "layers": 1},
    {"d": 64, "n": 15, "layers": 2},
]


def name_of(s: dict) -> str:
    return f"d{s['d']}-n{s['n']}-l{s['layers']}"


def choose(rows: list[dict], budget_ms: float, tolerance: float) -> dict:
    best = max(r["dev_R@1"] for r in rows)
    close = [r for r in rows if r["dev_R@1"] >= best - tolerance]
    fits = [r for r in close if r["ort_ms_100"] <= budget_ms]
    if fits:
        return max(fits, key=lambda r: (r["dev_R@1"], -r["ort_ms_100"]))
    return min(close, key=lambda r: r["ort_ms_100"])


def run_frontier(model, train_banks, dev_banks, rcfg: RerankTrainConfig, run_dir, seed: int, log=print,
                 settings=SETTINGS, budget_ms: float = 10.0, tolerance: float = 1.0) -> dict:
    """Train every setting (resumable per setting), time it, choose; leaves the
    chosen CP module in model.cp and returns the frontier rows."""
    base = model.cfg.cp
    rows, modules = [], {}
    for s in settings:
        name = name_of(s)
        done = run_dir / f"frontier_{name}.done.pt"
        cfg = dataclasses.replace(base, **s)
        seed_everything(seed)  # same initialisation for every setting, trained or reloaded
        model.cp = CrossProbe(cfg)
        if done.exists():
            st = torch.load(done, weights_only=False)
            model.cp.load_state_dict(st["weights"])
            row = st["row"]
        else:
            rep = train_reranker(model, "cp", train_banks, dev_banks, rcfg, run_dir / f"frontier_{name}.pt", seed, log)
            t = rerank_ms(model, methods=("cp",), ks=(100,), repeats=30)
            row = {"name": name, "config": dataclasses.asdict(cfg), "dev_R@1": rep["dev_score"], "best_epoch": rep["best_epoch"],
                   "fusion_w": rep.get("fusion_w"),
                   "ort_ms_100": t["onnxruntime"]["cp"]["100"], "torch_ms_100": t["pytorch"]["cp"]["100"]}
            atomic_save({"weights": model.cp.state_dict(), "row": row}, done)
        log(f"frontier {row}")
        rows.append(row)
        modules[name] = copy.deepcopy(model.cp)
    chosen = choose(rows, budget_ms, tolerance)
    model.cp = modules[chosen["name"]]
    model.cfg.cp = CrossProbeConfig(**chosen["config"])
    return {"rows": rows, "chosen": chosen["name"], "budget_ms": budget_ms, "tolerance_R@1": tolerance,
            "selection": "dev text->image R@1 after reranking the top 50 (1,000 dev captions)"}


def write_doc(frontier: dict, docs, machine: str, fingerprint: str) -> None:
    """docs/frontier.md + docs/results/frontier.json from the frontier recorded by `crossprobe train`
    (dev numbers and timings measured during training, in the checkpoint's config.json)."""
    import json
    from pathlib import Path

    docs = Path(docs)
    (docs / "results").mkdir(parents=True, exist_ok=True)
    out = {**frontier, "machine": machine, "model_fingerprint": fingerprint,
           "command": "crossprobe train (frontier stage); written by crossprobe eval"}
    (docs / "results" / "frontier.json").write_text(json.dumps(out, indent=2))
    lines = [
        "# Cross-probe latency / accuracy frontier (selection on the dev split)", "",
        f"Command: `{out['command']}`  ", f"Machine: {machine}  ", f"Checkpoint: `{fingerprint}`", "",
        "Every setting trained with the same recipe, budget and seed on the same frozen towers: the CP recipe of "
        "`crossprobe train` as the checkpoint's config.json records it (training.train_config; docs/rerank_experiments.md). "
        "dev R@1: text->image R@1 of the first caption of each of the 1,000 dev images after "
        "reranking the two-tower top 50 (at the best epoch's fusion). Rerank time: one query against 100 cached candidates, 2 threads, median of 30, "
        "measured right after each setting trained. Rule: most accurate within "
        f"{frontier['budget_ms']} ms and within {frontier['tolerance_R@1']} R@1 of the best.", "",
        "| setting (d, n, l; m=5) | dev R@1 | ONNX Runtime ms (K=100) | PyTorch ms (K=100) | chosen |", "|---|---|---|---|---|",
    ]
    for r in frontier["rows"]:
        lines.append(f"| {r['name']} | {r['dev_R@1']:.1f} | {r['ort_ms_100']} | {r['torch_ms_100']} | "
                     f"{'yes' if r['name'] == frontier['chosen'] else ''} |")
    lines += ["", "Test-split numbers of the chosen setting are in docs/flickr8k.md (CP@K rows). "
              "`make bench` re-measures every setting on the test split (docs/frontier_test.md).", ""]
    (docs / "frontier.md").write_text("\n".join(lines))
