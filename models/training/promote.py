"""`crossprobe promote OPTION`: a tower option that beat the default in the ablation becomes a
checkpoint of its own; an option is saved as a separate checkpoint only when it wins.

The ablation trains an option's towers only. A checkpoint the service can load also needs the
rerankers it runs, so this trains CP (the default's frontier-chosen shape, no new frontier) and
T-EMDE (both in the default's config) on the option's towers with the default reranker recipe and seed, saves
models/checkpoints/<option>/, measures TT / CP@100 / TEMDE@100 on Flickr8k test and writes
the model card from those numbers. SM and TV are timing references the service never runs:
they are not trained here, and the card says so.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from crossprobe.models import checkpoint
from crossprobe.models.cross_probe import CrossProbe
from crossprobe.models.evaluation.encode import PairScorer
from crossprobe.models.evaluation.report import machine
from crossprobe.models.evaluation.retrieval import both_directions, reranked, shortlist_recall, split_banks, tt_scores
from crossprobe.models.model import ModelConfig
from crossprobe.models.research.ablation import AblationConfig, Runner, _dirname, _round
from crossprobe.models.training.run import train

SERVICE_RERANKERS = ("cp", "temde")


def promote(option: str, cfg: AblationConfig, out: Path | None = None, log=print) -> Path:
    runner = Runner(cfg, log)
    row_path = cfg.run_dir / _dirname(option) / "result.json"
    if not row_path.exists():
        raise FileNotFoundError(f"{option}: no ablation row at {row_path}; run `crossprobe ablate` first")
    row = json.loads(row_path.read_text())
    if row.get("stage") != "towers":
        raise ValueError(
            f"{option} is a reranker option: its weights swap one reranker of the default, not a checkpoint"
        )
    base = json.loads((cfg.run_dir / "default" / "result.json").read_text())  # written before any option row
    if row["t2i"]["R@1"] <= base["t2i"]["R@1"]:
        raise ValueError(f"{option} does not beat the default (t2i R@1 {row['t2i']['R@1']} vs {base['t2i']['R@1']})")

    out = Path(out or checkpoint.DEFAULT_CHECKPOINT.parent / option)
    run = cfg.run_dir / _dirname(option)
    mc = ModelConfig.from_dict(checkpoint.read_config(run / "checkpoint")["model"])
    # the served rerankers as the default has them: CP in the shape its frontier chose, and both reading the
    # inputs the default's recipe uses (the option's run recorded the reranker configs of the day it trained)
    default_mc = ModelConfig.from_dict(checkpoint.read_config(cfg.base)["model"])
    mc.cp, mc.temde = default_mc.cp, default_mc.temde
    opt = cfg.options[option]
    tc = dataclasses.replace(cfg.template.towers, epochs=runner.tower_epochs)
    opt.apply(mc, tc)  # the option's recipe (recorded in the checkpoint; its towers are already trained with it)
    t0 = time.time()
    # the run dir holds towers.done.pt: train() reuses the towers and trains only the service's rerankers
    tcfg = dataclasses.replace(
        cfg.template,
        seed=cfg.seed,
        threads=cfg.threads,
        cache_dir=cfg.cache_dir,
        run_dir=run,
        out=out,
        model=mc,
        towers=tc,
        methods=SERVICE_RERANKERS,
    )
    fp = train(tcfg, log=log, data=runner.data(mc.text.frozen_layers))
    model, _ = checkpoint.load(out)
    K = cfg.k
    assert isinstance(model.cp, CrossProbe)
    text, images, gold = split_banks(model, runner.data(mc.text.frozen_layers), "test")
    S = tt_scores(text, images)
    results: dict[str, Any] = {
        "t2i": {},
        "i2t": {},
        "command": cfg.command,
        "machine": machine(),
        "shortlist_recall_t2i": {str(K): round(shortlist_recall(S, gold, K), 2)},
    }
    r = both_directions(S, gold)
    results["t2i"]["TT"], results["i2t"]["TT"] = _round(r["t2i"]), _round(r["i2t"])
    for method in SERVICE_RERANKERS:
        r = reranked(PairScorer(model, method, text, images), S, gold, K, [K])[K]
        name = f"{method.upper()}@{K}"
        results["t2i"][name], results["i2t"][name] = _round(r["t2i"]), _round(r["i2t"])
    results["seconds"] = round(time.time() - t0, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    write_option_card(out, option, cfg)
    log(
        f"promoted {option}: {out} fingerprint {fp}; test t2i R@1 "
        + ", ".join(f"{k} {v['R@1']}" for k, v in results["t2i"].items())
    )
    return out


def write_option_card(out: Path, option: str, cfg: AblationConfig) -> Path:
    """MODEL_CARD.md of a promoted option, from its config.json, results.json and ablation rows."""
    from crossprobe.models.model_card import write_card

    row = json.loads((cfg.run_dir / _dirname(option) / "result.json").read_text())
    base = json.loads((cfg.run_dir / "default" / "result.json").read_text())
    results = json.loads((out / "results.json").read_text())
    return write_card(
        out,
        results,
        title=f"crossprobe checkpoint: {option} (seed option that beat the default)",
        how=(
            f"Towers: `crossprobe ablate` row `{option}` ({cfg.options[option].what}; {row['budget']}), which beat the "
            f"committed default on Flickr8k test text->image R@1 {row['t2i']['R@1']} vs {base['t2i']['R@1']} "
            f"(image->text {row['i2t']['R@1']} vs {base['i2t']['R@1']}; docs/research/ablation.md). Rerankers: "
            f"`crossprobe promote {option}` trained CP (the default's shape) and T-EMDE on these towers with "
            "the default reranker recipe and seed. The SM and TV references are NOT trained in this checkpoint "
            "(the service never runs them; use the default checkpoint to evaluate them)."
        ),
    )
