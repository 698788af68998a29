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

SETTINGS = [
    {"d": 128, "n": 15, "layers": 2},
    {"d": 128, "n": 8, "layers": 1},
    {"d": 64, "n": 8, "layers": 1},
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
        model.cp = CrossProbe(cfg)
        if done.exists():
            st = torch.load(done, weights_only=False)
            model.cp.load_state_dict(st["weights"])
            row = st["row"]
        else:
            seed_everything(seed)
            model.cp = CrossProbe(cfg)
            rep = train_reranker(model, "cp", train_banks, dev_banks, rcfg, run_dir / f"frontier_{name}.pt", seed, log)
            t = rerank_ms(model, methods=("cp",), ks=(100,), repeats=30)
            row = {"name": name, "config": dataclasses.asdict(cfg), "dev_R@1": rep["dev_score"], "best_epoch": rep["best_epoch"],
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
