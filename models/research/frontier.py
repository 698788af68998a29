"""`crossprobe frontier`: the Cross-probe latency/accuracy frontier, and the choice of the default.

Several CP settings (probe width d, vision probes n, cross layers l) are trained
with the default CP recipe, budget and seed on the frozen towers of a checkpoint
(the committed one by default). Each gets its dev text->image R@1 (top-50
reranked) and its ONNX Runtime rerank time for 100 candidates on this machine.
The default is the most accurate setting within the latency budget whose dev R@1
is within `tolerance` points of the best; if none fits the budget, the fastest
within tolerance. Test-set numbers for every setting are produced separately by
benchmarks/cp_frontier.py, so the choice never looks at the test split.

The frontier is a model-selection run of its own, not a stage of `crossprobe
train`: its four settings take about 50 min on 2 cores, which would put the
default training run over its 90 min budget. Its choice is meant to be pinned
in ModelConfig.cp (CrossProbeConfig's defaults, models/cross_probe.py;
docs/research/frontier.md says when it is not), and `crossprobe train` trains
that one shape, initialised as the frontier initialises it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from crossprobe.models.evaluation.timing import rerank_ms
from crossprobe.models.training.rerankers import RerankTrainConfig, fresh_cp, train_reranker
from crossprobe.models.training.state import atomic_save

if TYPE_CHECKING:
    from crossprobe.models.training.stacking import Banks

# not d128-n15-l2: its in-batch pretraining (64 x 64 pairs per step) alone takes about 30 min on 2 cores,
# and it reranks 100 candidates in more than the 10 ms budget
SETTINGS = [
    {"d": 128, "n": 8, "layers": 1},
    {"d": 64, "n": 8, "layers": 1},
    {"d": 64, "n": 15, "layers": 1},
    {"d": 64, "n": 15, "layers": 2},
]
SHAPE = ("d", "n", "layers")  # the fields a setting sets


def name_of(setting: dict) -> str:
    return f"d{setting['d']}-n{setting['n']}-l{setting['layers']}"


def choose(rows: list[dict], budget_ms: float, tolerance: float) -> dict:
    best = max(r["dev_R@1"] for r in rows)
    close = [r for r in rows if r["dev_R@1"] >= best - tolerance]
    fits = [r for r in close if r["ort_ms_100"] <= budget_ms]
    if fits:
        return max(fits, key=lambda r: (r["dev_R@1"], -r["ort_ms_100"]))
    return min(close, key=lambda r: r["ort_ms_100"])


def recipe_budget(rcfg: RerankTrainConfig) -> dict:
    """The part of the CP recipe a finished setting must share with the others to be compared."""
    return {"pretrain_epochs": rcfg.pretrain_epochs, "epochs": rcfg.epochs}


def finished_row(run_dir, name: str, budget: dict) -> dict | None:
    """The row of a setting finished under `budget` (run_dir/frontier_<name>.done.pt), else None."""
    done = Path(run_dir) / f"frontier_{name}.done.pt"
    row = torch.load(done, weights_only=False)["row"] if done.exists() else None
    return row if row is not None and row.get("budget") == budget else None


def run_frontier(
    model,
    banks: Callable[[], tuple[Banks, Banks]],
    rcfg: RerankTrainConfig,
    run_dir,
    seed: int,
    log=print,
    settings=SETTINGS,
    budget_ms: float = 10.0,
    tolerance: float = 1.0,
) -> dict:
    """Train every setting (resumable per setting: run_dir/frontier_<name>.done.pt), time it, choose.
    banks() -> (train banks, dev banks), called only if some setting still needs training.
    model.cp is left as it was."""
    base, keep = model.cfg.cp, model.cp
    budget = recipe_budget(rcfg)
    rows: list[dict] = []
    got: tuple[Banks, Banks] | None = None
    for setting in settings:
        name = name_of(setting)
        done = Path(run_dir) / f"frontier_{name}.done.pt"
        cfg = dataclasses.replace(base, **setting)
        row = finished_row(run_dir, name, budget)
        if row is None and done.exists():
            # a setting finished under another recipe (the CP budget changed since): its weights and states
            # would be compared with settings trained differently, so it trains again from scratch
            old = torch.load(done, weights_only=False)["row"].get("budget", "an unrecorded budget")
            log(f"frontier {name}: trained with {old}, the recipe is now {budget}: retraining")
            for f in (done, Path(run_dir) / f"frontier_{name}.pt", Path(run_dir) / f"frontier_{name}.pretrained.pt"):
                f.unlink(missing_ok=True)
        if row is None:
            got = got or banks()
            t0 = time.time()
            model.cp = fresh_cp(cfg, seed)
            rep = train_reranker(model, "cp", *got, rcfg, Path(run_dir) / f"frontier_{name}.pt", seed, log)
            train_s = round(time.time() - t0, 1)
            t = rerank_ms(model, methods=("cp",), ks=(100,), repeats=30)
            row = {
                "name": name,
                "config": dataclasses.asdict(cfg),
                "dev_R@1": rep["dev_score"],
                "best_epoch": rep["best_epoch"],
                "fusion_w": rep.get("fusion_w"),
                "train_s": train_s,
                "budget": budget,
                "ort_ms_100": t["onnxruntime"]["cp"]["100"],
                "torch_ms_100": t["pytorch"]["cp"]["100"],
            }
            atomic_save({"weights": model.cp.state_dict(), "row": row}, done)
        log(f"frontier {row}")
        rows.append(row)
    model.cp = keep
    chosen = choose(rows, budget_ms, tolerance)
    caps = "all 5,000 dev captions" if rcfg.standalone else f"the first caption of {rcfg.dev_queries:,} dev images"
    return {
        "rows": rows,
        "chosen": chosen["name"],
        "budget_ms": budget_ms,
        "tolerance_R@1": tolerance,
        "selection": f"dev text->image R@1 after reranking the top {rcfg.dev_k} ({caps}, "
        "at the fusion weight fit there)",
    }


def write_doc(
    frontier: dict,
    docs,
    machine: str,
    fingerprint: str,
    default_cp: dict,
    command: str,
    current_budget: dict | None = None,
) -> None:
    """docs/research/frontier.md + docs/research/results/frontier.json (dev numbers and timings measured when each
    setting trained).
    default_cp: ModelConfig().cp as a dict, to say whether the pinned default is the frontier's choice;
    current_budget: recipe_budget of today's CP recipe, to say when the rows were trained under another."""
    docs = Path(docs)
    (docs / "results").mkdir(parents=True, exist_ok=True)
    pinned = name_of(default_cp)
    out = {
        **frontier,
        "default_in_model_config": pinned,
        "machine": machine,
        "towers_of_checkpoint": fingerprint,
        "command": command,
    }
    (docs / "results" / "frontier.json").write_text(json.dumps(out, indent=2))
    lines = [
        "# Cross-probe latency / accuracy frontier (selection on the dev split)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine}  ",
        f"Towers: checkpoint `{fingerprint}`",
        "",
        "Every setting trained with the same recipe, budget and seed on the same frozen towers: the CP recipe of "
        '`crossprobe train` (`reranker_config(TrainConfig(), "cp")`; docs/research/rerank_experiments.md). '
        f"dev R@1: {frontier['selection']}, at the best epoch. Rerank time: one query against 100 cached candidates, "
        "2 threads, median of 30, measured right after each setting trained. Train s: wall time of the setting's "
        "training "
        "(in-batch pretraining, listwise epochs, dev fits). Rule: most accurate within "
        f"{frontier['budget_ms']} ms and within {frontier['tolerance_R@1']} R@1 of the best.",
        "",
        *_budget_lines(frontier["rows"], current_budget),
        "| setting (d, n, l; m=5) | dev R@1 | ONNX Runtime ms (K=100) | PyTorch ms (K=100) | train s | chosen |",
        "|---|---|---|---|---|---|",
    ]
    for r in frontier["rows"]:
        lines.append(
            f"| {r['name']} | {r['dev_R@1']:.1f} | {r['ort_ms_100']} | {r['torch_ms_100']} | {r.get('train_s', '-')} | "
            f"{'yes' if r['name'] == frontier['chosen'] else ''} |"
        )
    if pinned == frontier["chosen"]:
        agree = f"The default CP shape pinned in `ModelConfig.cp`, `{pinned}`, is the chosen setting"
    else:
        row = next((r for r in frontier["rows"] if r["name"] == pinned), None)
        agree = (
            f"The default CP shape pinned in `ModelConfig.cp`, `{pinned}`, is NOT the chosen setting "
            f"`{frontier['chosen']}`"
            + (
                f" (dev R@1 {row['dev_R@1']:.1f} vs {max(r['dev_R@1'] for r in frontier['rows']):.1f}, "
                f"{row['ort_ms_100']} ms)"
                if row
                else ""
            )
            + ": re-pin it to follow this frontier"
        )
    lines += [
        "",
        agree + "; `crossprobe train` trains the pinned shape alone, with the same recipe and initialisation. "
        "Test-split numbers of the default are in docs/research/flickr8k.md (CP@K rows); `make bench` re-measures "
        "every "
        "setting on the test split (docs/research/frontier_test.md).",
        "",
    ]
    (docs / "frontier.md").write_text("\n".join(lines))


def _budget_lines(rows: list[dict], current: dict | None) -> list[str]:
    budgets = {json.dumps(r.get("budget"), sort_keys=True) for r in rows}
    if len(budgets) != 1 or rows[0].get("budget") is None:
        return ["Budget: not recorded for every setting (trained before budgets were recorded).", ""]
    b = rows[0]["budget"]
    out = [f"Budget per setting: {b['pretrain_epochs']} in-batch pretraining + {b['epochs']} listwise epochs."]
    if current is not None and current != b:
        out.append(
            f"**The CP recipe of `crossprobe train` is now {current['pretrain_epochs']} + {current['epochs']} epochs: "
            "these rows compare the shapes under the older budget; `crossprobe frontier` retrains them under the new "
            "one.**"
        )
    return [" ".join(out), ""]


def frontier(ckpt, docs, command: str, tcfg=None, log=print, settings=SETTINGS) -> dict:
    """`crossprobe frontier`: every setting on the towers of `ckpt` (None: the committed checkpoint).
    tcfg: the TrainConfig whose CP recipe, seed, run_dir, cache_dir and default CP shape (model.cp) apply
    (None: the defaults of `crossprobe train`)."""
    from crossprobe.models import checkpoint
    from crossprobe.models.evaluation.report import machine
    from crossprobe.models.evaluation.retrieval import split_banks
    from crossprobe.models.training.data import CachedData
    from crossprobe.models.training.run import TrainConfig, reranker_config
    from crossprobe.models.training.stacking import stacked

    tcfg = tcfg or TrainConfig()
    torch.set_num_threads(tcfg.threads)
    model, meta = checkpoint.load(ckpt)
    # the CP the default recipe trains (inputs, heads, ...), varied in its shape; the checkpoint's own may differ
    default_cp = dataclasses.replace(tcfg.model.cp, d_in=model.cfg.cp.d_in)
    model.cfg.cp = default_cp

    def banks():
        data = CachedData.build(Path(tcfg.cache_dir), model.cfg.text.frozen_layers)
        tr, dv = split_banks(model, data, "train"), split_banks(model, data, "dev")
        return stacked(tr, dv, tcfg.rerank.dev_stack)  # as `crossprobe train` builds them

    Path(tcfg.run_dir).mkdir(parents=True, exist_ok=True)
    rcfg = reranker_config(tcfg, "cp")
    res = run_frontier(model, banks, rcfg, tcfg.run_dir, tcfg.seed, log, settings)
    write_doc(
        res,
        docs,
        machine(),
        meta["fingerprint"],
        {k: getattr(default_cp, k) for k in SHAPE},
        command,
        recipe_budget(rcfg),
    )
    return res
