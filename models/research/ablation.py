"""`crossprobe ablate`: every seed option as a trained, measured variant beside the default.

Two kinds of option, each compared with the baseline trained the same way:

  tower options (SEAM multi-hop pooling, SEAM's fast query tower, the order-
    embedding loss, T-EMDE pooling) change stage 1. Each is trained from scratch
    with the default's seed and tower budget (16 epochs, best epoch on dev: ~21
    min each on 2 cores) against the committed default, which was trained that
    way. `tower_epochs=N` gives a quicker, shorter budget instead: the rows are
    then "<option>@<N>ep" against "default@<N>ep", the default config trained on
    that same short budget. Metric: TT on Flickr8k test; time: the query tower
    per query (tokenizer + ONNX Runtime, 2 threads).
  reranker options (ZoDIAC attention in CP and in TV, ACE-RPE in TV with and
    without its anchor loss and in SM) change stage 2 only. Each is trained on the
    committed checkpoint's towers with exactly the default reranker budget and
    seed (training/run.py reranker_config) against the committed CP, SM or TV.
    Metric: CP@100 / SM@100 / TV@100 on test (SM and TV text->image on the first
    caption of each image, as in docs/research/flickr8k.md); time: rerank of 100
    candidates per query.

Every option's result is kept in <run_dir>/<option>/result.json, so the command
resumes where it stopped and re-running it only rebuilds the docs. An option's
weights stay under runs/: none is promoted to a committed checkpoint unless it
wins (the table says which win).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from crossprobe.core import inputs, runtime
from crossprobe.core.atomic import atomic_write
from crossprobe.models import checkpoint
from crossprobe.models import export as ex
from crossprobe.models.cross_probe import CrossProbe
from crossprobe.models.evaluation.encode import PairScorer
from crossprobe.models.evaluation.report import KEYS, machine
from crossprobe.models.evaluation.retrieval import both_directions, reranked, split_banks, tt_scores
from crossprobe.models.evaluation.timing import median_ms, rerank_ms, scorer_inputs, scorer_module
from crossprobe.models.model import ModelConfig
from crossprobe.models.research.single_stream import SingleStream
from crossprobe.models.research.split_merge import SplitMerge
from crossprobe.models.training.data import CachedData
from crossprobe.models.training.rerankers import train_reranker
from crossprobe.models.training.run import TrainConfig, reranker_config, train
from crossprobe.models.training.state import atomic_save, seed_everything
from crossprobe.models.training.towers import TowerTrainConfig


@dataclass(frozen=True)
class Option:
    stage: str  # "towers" | "cp" | "sm" | "tv"
    what: str
    apply: Callable[[ModelConfig, TowerTrainConfig], None]


def _set(**changes):
    """-> apply(model_cfg, tower_cfg) setting dotted fields, e.g. text__pool_hops=4, tv__ace__enabled=True."""

    def apply(mc: ModelConfig, tc: TowerTrainConfig) -> None:
        for key, value in changes.items():
            first, *path, attr = key.split("__")
            obj = tc if first == "train" else getattr(mc, first)
            for name in path:
                obj = getattr(obj, name)
            setattr(obj, attr, value)

    return apply


OPTIONS: dict[str, Option] = {
    "seam-4hop": Option(
        "towers", "SEAM: 4-hop self-attentive pooling of the text tower, Frobenius penalty 0.1", _set(text__pool_hops=4)
    ),
    "seam-fast": Option(
        "towers",
        "SEAM fast query tower: MiniLM word embeddings + 4-hop pooling, no transformer layer",
        _set(text__layers=0, text__finetune_layers=0, text__pool_hops=4),
    ),
    "order-loss": Option(
        "towers",
        "SEAM order-embedding hinge (order-violation penalty as -similarity) added to the loss",
        _set(train__loss="infonce+vsepp+order"),
    ),
    "temde-pool": Option(
        "towers",
        "T-EMDE sketch pooling (16 x 16 centroids) in both towers instead of self-attentive pooling",
        _set(text__pool="temde", vision__pool="temde"),
    ),
    "zodiac-cp": Option("cp", "ZoDIAC attention in the CP cross layers", _set(cp__attention="zodiac")),
    "ace-rpe-tv": Option(
        "tv",
        "ACE-RPE relative positions in TV (4 groups = heads, shrink 0.2, max distance 8)",
        _set(tv__ace__enabled=True),
    ),
    "ace-rpe-tv+anchor": Option(
        "tv", "ACE-RPE in TV plus the anchor loss (weight 0.5)", _set(tv__ace__enabled=True, tv__ace__anchor_loss=0.5)
    ),
    "zodiac-tv": Option("tv", "ZoDIAC attention in every TV layer", _set(tv__attention="zodiac")),
    "ace-rpe-sm": Option(
        "sm",
        "ACE-RPE relative positions in SM's joint layers (4 groups = heads, shrink 0.2, max distance 8; no [CLS])",
        _set(sm__ace__enabled=True),
    ),
}
RERANKERS = {"cp": CrossProbe, "sm": SplitMerge, "tv": SingleStream}
JOINT = ("sm", "tv")  # all tokens x all regions: evaluated on one caption per image, timed in PyTorch


@dataclass
class AblationConfig:
    tower_epochs: int | None = None  # None: the default's own tower budget (template.towers.epochs)
    seed: int = 0
    threads: int = 2
    cache_dir: Path = Path("cache/flickr8k")
    run_dir: Path = Path("runs/ablation")
    base: Path = checkpoint.DEFAULT_CHECKPOINT  # the committed default (reranker options train on its towers)
    docs: Path = Path("docs/research")
    only: tuple[str, ...] = ()  # a subset of OPTIONS (the baselines always run)
    template: TrainConfig = field(default_factory=TrainConfig)  # model, tower and reranker recipes of the default
    k: int = 100  # shortlist reranked by the reranker options
    command: str = "crossprobe ablate"
    options: dict = field(default_factory=lambda: dict(OPTIONS))


def _dirname(row: str) -> str:
    """Row name -> its folder under run_dir ("default CP@100" -> "default_CP_at_100")."""
    return row.replace(" ", "_").replace("@", "_at_")


def _round(r: dict) -> dict:
    return {k: round(r[k], 2 if k != "MRR" else 4) for k in KEYS}


def query_ms(model, repeats: int = 200, threads: int = 2) -> float:
    """Tokenizer + ONNX Runtime query tower for one typical caption, median ms."""
    tok = inputs.load_tokenizer()
    with tempfile.TemporaryDirectory() as d:
        ex.export_all(model, Path(d), "ablation", names=("query_tower",))
        sess = runtime.session(Path(d) / "query_tower.onnx", threads)

        def once():
            ids, mask = inputs.tokenize(tok, ["a black dog is running through the grass with a ball in its mouth"])
            sess.run(None, {"input_ids": ids, "attention_mask": mask})

        return round(median_ms(once, repeats, warmup=10), 3)


@torch.inference_mode()
def rerank_ms_torch(model, method: str, K: int = 100, repeats: int = 40) -> float:
    """PyTorch rerank of K cached candidates for one query (ACE-RPE's graph search is not exported).
    10 warm-up runs: a freshly loaded model's first few runs are far slower than its steady state."""
    mod, args = scorer_module(model, method), scorer_inputs(model, method, K)
    return round(median_ms(lambda: mod(*args), repeats, warmup=10), 3)


class Runner:
    def __init__(self, cfg: AblationConfig, log=print):
        self.cfg, self.log = cfg, log
        self._data: dict[int, CachedData] = {}
        self._base = None
        self._banks: dict[str, tuple] = {}

    @property
    def tower_epochs(self) -> int:
        return self.cfg.tower_epochs or self.cfg.template.towers.epochs

    @property
    def short_budget(self) -> bool:
        """Tower options on fewer epochs than the default had: they need a baseline trained the same way."""
        return self.tower_epochs != self.cfg.template.towers.epochs

    def row_name(self, option: str) -> str:
        """Tower options on a short budget carry it in their name ("seam-4hop@5ep"); others are the option."""
        short = self.short_budget and (option == "default" or self.cfg.options[option].stage == "towers")
        return f"{option}@{self.tower_epochs}ep" if short else option

    def data(self, frozen_layers: int) -> CachedData:
        if frozen_layers not in self._data:
            self._data = {frozen_layers: CachedData.build(self.cfg.cache_dir, frozen_layers)}  # one in RAM at a time
        return self._data[frozen_layers]

    def base(self):
        if self._base is None:
            self._base, meta = checkpoint.load(self.cfg.base)
            self._base_fp = meta["fingerprint"]
        return self._base

    # --- tower options --------------------------------------------------------------
    def towers_row(self, name: str, opt: Option | None) -> dict:
        c = self.cfg
        mc = copy.deepcopy(c.template.model)
        tc = dataclasses.replace(c.template.towers, epochs=self.tower_epochs)
        if opt is not None:
            opt.apply(mc, tc)
        run = c.run_dir / _dirname(name)
        tcfg = TrainConfig(
            seed=c.seed,
            threads=c.threads,
            cache_dir=c.cache_dir,
            run_dir=run,
            out=run / "checkpoint",
            model=mc,
            towers=tc,
            methods=(),
        )
        t0 = time.time()
        fp = train(tcfg, log=self.log, data=self.data(mc.text.frozen_layers))  # one cache load for training and eval
        model, _ = checkpoint.load(run / "checkpoint")
        res = self.tt_eval(model)
        return {
            **res,
            "method": "TT",
            "stage": "towers",
            "fingerprint": fp,
            "train_s": round(time.time() - t0, 1),
            "budget": f"towers {self.tower_epochs} epochs (best epoch on dev), seed {c.seed}",
            **self.timing(name, "towers", model),
        }

    def tt_eval(self, model) -> dict:
        data = self.data(model.cfg.text.frozen_layers)
        text, images, gold = split_banks(model, data, "test")
        r = both_directions(tt_scores(text, images), gold)
        return {"t2i": _round(r["t2i"]), "i2t": _round(r["i2t"])}

    # --- reranker options -----------------------------------------------------------
    def reranker_model(self, name: str, method: str, opt: Option | None, train_if_missing: bool = True):
        """The committed model with `method` replaced by the option's variant, trained (or reloaded)
        with the default reranker budget and seed. opt None: the committed model itself."""
        c = self.cfg
        model = copy.deepcopy(self.base())
        if opt is not None:
            mc = copy.deepcopy(model.cfg)
            opt.apply(mc, TowerTrainConfig())
            sub = getattr(mc, method)
            seed_everything(c.seed)  # same initialisation as the default's training
            setattr(model, method, RERANKERS[method](sub))
            setattr(model.cfg, method, sub)
            done = c.run_dir / _dirname(name) / f"{method}.done.pt"
            if done.exists():
                getattr(model, method).load_state_dict(torch.load(done, weights_only=False)["weights"])
            elif not train_if_missing:
                raise FileNotFoundError(done)
            else:
                train_banks, dev_banks = self.banks("train"), self.banks("dev")
                rcfg = reranker_config(dataclasses.replace(c.template, seed=c.seed), method)
                rep = train_reranker(
                    model,
                    method,
                    train_banks,
                    dev_banks,
                    rcfg,
                    c.run_dir / _dirname(name) / f"{method}.pt",
                    c.seed,
                    self.log,
                )
                atomic_save({"weights": getattr(model, method).state_dict(), "report": rep}, done)
        return model.eval()

    def reranker_row(self, name: str, method: str, opt: Option | None) -> dict:
        c = self.cfg
        t0 = time.time()
        model = self.reranker_model(name, method, opt)
        text, images, gold = self.banks("test")
        S = tt_scores(text, images)
        subset = np.unique(gold, return_index=True)[1] if method in JOINT else None
        k = min(c.k, S.shape[1])
        r = reranked(PairScorer(model, method, text, images), S, gold, k, [k], query_rows=subset)[k]
        row = {
            "t2i": _round(r["t2i"]),
            "i2t": _round(r["i2t"]),
            "method": f"{method.upper()}@{c.k}",
            "stage": method,
            "train_s": round(time.time() - t0, 1),
            "budget": f"committed towers; {method} trained with the default reranker budget, seed {c.seed}",
        }
        if method in JOINT:
            row["t2i_note"] = "text->image on the first caption of each test image (1,000 queries)"
        return {**row, **self.timing(name, method, model)}

    def timing(self, name: str, stage: str, model=None) -> dict:
        """ms_per_query of a row: the query tower for tower rows, the rerank of K candidates otherwise.
        With model None the row's model is rebuilt from what the run stored (`crossprobe ablate --retime`)."""
        c = self.cfg
        if stage == "towers":
            if model is None:
                model = (
                    self.base() if name == "default" else checkpoint.load(c.run_dir / _dirname(name) / "checkpoint")[0]
                )
            return {"ms_per_query": query_ms(model), "ms_kind": "query tower (tokenizer + ONNX Runtime), 1 query"}
        if model is None:
            model = self.reranker_model(name, stage, c.options.get(name), train_if_missing=False)
        if stage in JOINT:  # ACE-RPE's graph search is not exported: every SM / TV row is timed in PyTorch
            return {
                "ms_per_query": rerank_ms_torch(model, stage, c.k),
                "ms_kind": f"rerank {c.k} candidates, PyTorch, 2 threads",
            }
        with tempfile.TemporaryDirectory() as d:
            t = rerank_ms(model, methods=(stage,), ks=(c.k,), repeats=30, onnx_dir=Path(d))
        return {
            "ms_per_query": t["onnxruntime"][stage][str(c.k)],
            "ms_kind": f"rerank {c.k} candidates, ONNX Runtime, 2 threads",
        }

    def banks(self, split: str):
        """The committed towers' outputs on a split, computed once: reranker options only swap the reranker."""
        if split not in self._banks:
            model = self.base()
            self._banks[split] = split_banks(model, self.data(model.cfg.text.frozen_layers), split)
        return self._banks[split]

    # --- all rows -------------------------------------------------------------------
    def plan(self) -> list[tuple[str, Callable[[], dict]]]:
        """(row name, how to make the row) in order: baselines first, then the chosen options."""
        c = self.cfg
        names = [n for n in c.options if not c.only or n in c.only]
        base_tt = self.row_name("default")  # "default" (the committed one) unless the budget is short
        plan: list[tuple[str, Callable[[], dict]]] = [("default", lambda: self.default_row())]
        if self.short_budget:
            plan.append((base_tt, lambda: self.towers_row(base_tt, None)))
        stages = {c.options[n].stage for n in names}
        # named functions, not lambdas with bound defaults: mypy cannot infer those against Callable[[], dict]
        for m in RERANKERS:
            if m in stages:

                def default_reranker(m: str = m) -> dict:
                    return self.reranker_row(f"default {m.upper()}@{c.k}", m, None)

                plan.append((f"default {m.upper()}@{c.k}", default_reranker))
        for n in names:
            opt, row = c.options[n], self.row_name(n)
            if opt.stage == "towers":

                def towers(row: str = row, opt: Option = opt) -> dict:
                    return {**self.towers_row(row, opt), "baseline": base_tt, "what": opt.what}

                plan.append((row, towers))
            else:

                def reranker(n: str = n, opt: Option = opt) -> dict:
                    return {
                        **self.reranker_row(n, opt.stage, opt),
                        "what": opt.what,
                        "baseline": f"default {opt.stage.upper()}@{c.k}",
                    }

                plan.append((row, reranker))
        return plan

    def run(self, retime: bool = False) -> dict:
        """Train and measure every row not stored yet; retime=True re-measures the ms of stored rows
        (timings taken while other work shared the 2 cores are not worth keeping)."""
        c = self.cfg
        torch.set_num_threads(c.threads)
        rows = {}
        for name, fn in self.plan():
            path = c.run_dir / _dirname(name) / "result.json"
            if path.exists():
                rows[name] = json.loads(path.read_text())
                if not retime:
                    continue
                self.log(f"ablation: re-timing {name}")
                rows[name].update(self.timing(name, rows[name]["stage"]))
            else:
                self.log(f"ablation: {name}")
                rows[name] = fn()
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(rows[name], indent=2))
            self.log(
                f"ablation {name}: t2i R@1 {rows[name]['t2i']['R@1']} i2t R@1 {rows[name]['i2t']['R@1']} "
                f"ms {rows[name]['ms_per_query']}"
            )
        for row in rows.values():
            if "baseline" in row and row["baseline"] in rows:
                b = rows[row["baseline"]]
                row["delta_t2i_R@1"] = round(row["t2i"]["R@1"] - b["t2i"]["R@1"], 2)
                row["delta_i2t_R@1"] = round(row["i2t"]["R@1"] - b["i2t"]["R@1"], 2)
        out = {
            **rows,
            "command": c.command,
            "machine": machine(),
            "tower_epochs": self.tower_epochs,
            "tower_budget": "short" if self.short_budget else "the default's",
            "not_run": [n for n in c.options if self.row_name(n) not in rows],
        }
        write_docs(out, c.docs)
        return out

    def default_row(self) -> dict:
        model = self.base()
        return {
            **self.tt_eval(model),
            "method": "TT",
            "stage": "towers",
            "fingerprint": self._base_fp,
            "budget": "the committed checkpoint (towers 16 epochs, best epoch on dev)",
            **self.timing("default", "towers", model),
        }


def tower_budget_line(out: dict) -> str:
    ep = out["tower_epochs"]
    how = (
        (
            "with the default's budget and seed (%d epochs, best epoch on dev), against the committed default, which "
            "was "
            "trained the same way" % ep
        )
        if out.get("tower_budget") != "short"
        else (f"for a short {ep}-epoch budget, against `default@{ep}ep`, the default config on that same budget")
    )
    return (
        f"- tower options: towers trained from scratch {how}; metric TT; time = query tower per query "
        "(tokenizer + ONNX Runtime, 2 threads)."
    )


def earlier_runs(docs: Path) -> list[str]:
    """Earlier ablation runs kept as docs/research/results/ablation_<label>.json (e.g. a short tower budget): their
    rows."""
    lines = []
    for f in sorted((docs / "results").glob("ablation_*.json")):
        r = json.loads(f.read_text())
        rows = {k: v for k, v in r.items() if isinstance(v, dict) and "t2i" in v and v.get("stage") == "towers"}
        lines += [
            "",
            f"Tower rows of an earlier run ({tower_budget_line(r)[2:]} File: results/{f.name}, "
            f"command `{r['command']}`):",
            "",
            "| row | t2i R@1 | Δ | i2t R@1 | Δ | ms/query | baseline |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {n} | {v['t2i']['R@1']:.2f} | {v.get('delta_t2i_R@1', '')} | {v['i2t']['R@1']:.2f} | "
            f"{v.get('delta_i2t_R@1', '')} | {v['ms_per_query']} | {v.get('baseline', '')} |"
            for n, v in rows.items()
        ]
    return lines


def write_docs(out: dict, docs: Path) -> None:
    docs = Path(docs)
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "ablation.json").write_text(json.dumps(out, indent=2))
    rows = {k: v for k, v in out.items() if isinstance(v, dict) and "t2i" in v}
    lines = [
        "# Ablation: the seed options against the default (Flickr8k test, 1,000 images x 5,000 captions)",
        "",
        f"Command: `{out['command']}`  ",
        f"Machine: {out['machine']}  ",
        "Baseline checkpoint (towers of every reranker row, row `default`): "
        f"`{out.get('default', {}).get('fingerprint')}`",
        "",
        "Every row was measured before the label bridge (docs/research/bridge.md): the options were trained and "
        "scored on "
        "un-bridged two-tower vectors; none has been re-measured with the bridge on.",
        "",
        "Each option row is compared with its `baseline` row, trained the same way with the same seed:",
        tower_budget_line(out),
        "- reranker options: trained on the committed checkpoint's towers with the default reranker budget and seed, "
        "against the committed CP / SM / TV; metric CP@100 / SM@100 / TV@100 (the top 100 of the two-tower shortlist "
        "reranked, the rest in two-tower order); SM and TV text->image use the first caption of each test image "
        "(1,000 queries), as in "
        "docs/research/flickr8k.md; time = rerank of 100 cached candidates for one query.",
        "",
        "| option | metric | t2i R@1 | R@5 | R@10 | MRR | i2t R@1 | R@5 | R@10 | MRR | ms/query | Δ t2i R@1 | Δ i2t "
        "R@1 | baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        t, i = r["t2i"], r["i2t"]
        lines.append(
            f"| {name} | {r['method']} | {t['R@1']:.2f} | {t['R@5']:.2f} | {t['R@10']:.2f} | {t['MRR']:.4f} | "
            f"{i['R@1']:.2f} | {i['R@5']:.2f} | {i['R@10']:.2f} | {i['MRR']:.4f} | {r['ms_per_query']} | "
            f"{r.get('delta_t2i_R@1', '')} | {r.get('delta_i2t_R@1', '')} | {r.get('baseline', '')} |"
        )
    if out.get("not_run"):
        lines += [
            "",
            "Not measured in this run (implemented and tested; `crossprobe ablate` without `--only` trains and adds "
            "them): " + ", ".join(out["not_run"]) + ".",
        ]
    lines += earlier_runs(docs)
    lines += ["", "## What each option is", ""]
    for name, r in rows.items():
        what = (
            f"{r['what']}. Budget: {r['budget']}" if r.get("what") else r["budget"]
        )  # baselines: the budget says it all
        lines.append(f"- **{name}**: {what}. Time measured: {r['ms_kind']}.")
    lines.append("")
    (docs / "ablation.md").write_text("\n".join(lines))
