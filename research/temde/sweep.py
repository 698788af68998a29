"""T-EMDE's shape and budget on the two dev sets (never Flickr8k test): is the served sketch too small or too short-trained?

    python -m research.temde.sweep [--ckpt DIR] [--only NAME,...] [--out docs/research/results/temde_sweep.json]

The T-EMDE this sweep started from (4a5badc96f3d85d6's, `BEFORE`: N 20 partitions x K 8 centroids, 8 dims
each; 5 in-batch pretraining epochs, 3 listwise epochs, one caption per training image per epoch) had its best
dev epoch at its last one, so it may be short of training; its sketch is 160 numbers, far smaller than the
T-EMDE paper's. The sweep chose captions5, now the default (TrainConfig.captions_by_method).
Each variant here trains a fresh T-EMDE on the checkpoint's own (bridged) towers exactly as `crossprobe train`
does (train_reranker: pretraining, listwise epochs on mined shortlists, epoch and fusion weight chosen on
5,000 f8k dev captions), then is scored as `crossprobe eval` scores it, TEMDE@100 text->image R@1 on
  f8k-dev                5,000 Flickr8k dev captions x 1,000 dev images (in domain)
  coco-mini-dev+f8k-dev  400 COCO captions x (80 COCO + 1,000 Flickr8k dev images) (out of domain)
Rule (as the bridge's, docs/research/bridge.md): the highest sum of the two dev R@1s among the variants whose f8k-dev
R@1 is not below the checkpoint's own T-EMDE. Rows are appended to --out as each variant finishes
(rerun to resume; training states live under --run-dir).

--test-against OLD_CKPT (after the choice, never to make it): Flickr8k test TEMDE@100 of --ckpt and of OLD_CKPT
against TT, per caption, with 95% intervals from a paired bootstrap over the 1,000 test images (a caption's
five siblings move together) -> docs/research/results/temde_test.json.

--ensembles [--members NAME,...]: every combination of two or more of --ckpt's own T-EMDE ("served") and the
variants trained in --run-dir (or only the named ones), merged into one wider T-EMDE (their partitions side by
side: the score is the members' mean) with the fusion weight fit on f8k dev as training fits it, scored on the
two dev sets -> --out's "ensembles".

--compare SPEC,...: each T-EMDE against the first, caption by caption on both dev sets, with the paired bootstrap's
95% interval of the R@1 difference (resampling gold images) -> --out's "compare". A SPEC is "served", a variant
trained in --run-dir, a checkpoint directory with --ckpt's towers and bridge, or such names joined by "+" (merged,
fusion weight fit on f8k dev as training fits it).

--fusion-grid NAME,...: each named T-EMDE ("served" or a variant trained in --run-dir) at every fusion weight w of
training's grid (logit = s_tt + w * s_temde; training picks w on f8k dev alone) on the two dev sets -> --out's
"fusion_grid": does a variant that gains in domain keep the out-of-domain set at a smaller w?

--adopt NAME --out-ckpt DIR writes the checkpoint with variant NAME's trained T-EMDE (its config, weights,
fusion weight and training record from --run-dir) in place of the checkpoint's own: the other stages as they
were, a new fingerprint. `crossprobe checkpoint set-temde RUN_DIR/NAME.weights.pt --out DIR` writes the same
T-EMDE without this training record.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from crossprobe.models import checkpoint
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import ImageBank, PairScorer, encode_images, encode_texts
from crossprobe.models.evaluation.report import machine
from crossprobe.models.evaluation.retrieval import split_banks
from crossprobe.models.model import RERANKERS
from crossprobe.models.temde import Temde
from crossprobe.models.training.run import TrainConfig, reranker_config
from crossprobe.models.training.rerankers import FUSION_GRID, fit_merged_temde, set_fusion, train_reranker
from crossprobe.models.training.state import seed_everything

from research.bridge.sweep import dev_views, require_dev_sets

K = 100
# The recipe the sweep started from (4a5badc96f3d85d6's T-EMDE): every variant is this plus its changes, so a
# row means the same whatever TrainConfig's defaults have become since (captions5 was adopted from this sweep).
BEFORE = {"epochs": 3, "pretrain_epochs": 5, "captions_per_image": 1}
# name -> (TemdeConfig changes, RerankTrainConfig changes); "served" is the checkpoint's own T-EMDE, not retrained
VARIANTS = {
    "epochs6": ({}, {"epochs": 6}),
    "epochs10": ({}, {"epochs": 10}),
    # the larger sketches train about 3x slower per step (N32K16: 1.84 s vs 0.6 s, AMD EPYC 2 cores): 6 epochs of
    # them would take the default training run past its 90-minute budget, so they were stopped unmeasured (that was
    # the coder's old distance form; its matmul form is 2.1-2.8x faster: docs/research/results/temde_step.json)
    "N32K16": ({"N": 32, "K": 16}, {"epochs": 6}),
    "K16inner16": ({"K": 16, "inner": 16}, {"epochs": 6}),
    "N64K16": ({"N": 64, "K": 16}, {"epochs": 6}),
    "captions5": ({}, {"epochs": 3, "captions_per_image": 5}),
    "pretrain10": ({}, {"epochs": 6, "pretrain_epochs": 10}),
    # on 6587ce5b (captions5 served), after the coder's matmul form made steps 2.1-2.8x faster: larger sketches
    # in captions5's recipe (--out docs/research/results/temde_sketch_sweep.json)
    "c5_N32K16": ({"N": 32, "K": 16}, {"epochs": 3, "captions_per_image": 5}),
    "c5_N64K16": ({"N": 64, "K": 16}, {"epochs": 3, "captions_per_image": 5}),
    # captions5 with every caption ranking all 32 x 16 candidates of its step (RerankTrainConfig.pool_negatives)
    "c5_pool": ({}, {"epochs": 3, "captions_per_image": 5, "pool_negatives": True}),
    # captions5 again with another training seed: how much of the served T-EMDE's dev scores is its draw
    "c5_seed1": ({}, {"epochs": 3, "captions_per_image": 5, "seed": 1}),
    # two more draws of the recipe: the seed spread of captions5, and members for a seed ensemble (--ensembles)
    "c5_seed2": ({}, {"epochs": 3, "captions_per_image": 5, "seed": 2}),
    "c5_seed3": ({}, {"epochs": 3, "captions_per_image": 5, "seed": 3}),
    # captions5 plus distillation of the checkpoint's CP (its residual over the two-tower logit) into T-EMDE's own
    # score, KL weight 1 at temperature 1 (RerankTrainConfig.distill_from), seeds 0 and 1
    "c5_kd_cp": ({}, {"epochs": 3, "captions_per_image": 5, "distill_from": "cp", "distill_weight": 1.0}),
    "c5_kd_cp_seed1": ({}, {"epochs": 3, "captions_per_image": 5, "distill_from": "cp", "distill_weight": 1.0, "seed": 1}),
    # af8bbd6b's T-EMDE members as crossprobe train trained them (runs/<run>/temde.m<i>.done.pt's weights saved as
    # <run-dir>/c5_member<i>.weights.pt): captions5 with seeds 0, 1, 2, the controls of the c5_kd_cp draws
    "c5_member0": ({}, {"epochs": 3, "captions_per_image": 5, "seed": 0}),
    "c5_member1": ({}, {"epochs": 3, "captions_per_image": 5, "seed": 1}),
    "c5_member2": ({}, {"epochs": 3, "captions_per_image": 5, "seed": 2}),
}


class DevSets:
    """The two dev sets' banks and two-tower shortlists, built once from the checkpoint's towers."""

    def __init__(self, model):
        views = dev_views(model)
        self.data = views.data
        grids = views.grids()  # (1080, 49, 1280): 80 COCO, then the 1,000 f8k dev images
        images = encode_images(model, grids.half().numpy(), np.arange(len(grids)))
        n = views.n_coco
        f8k = ImageBank(images.tokens[n:], images.g[n:], images.grids[n:])
        ood = views.ood
        self.sets = {
            "f8k-dev": (encode_texts(model, views.data.states, views.data.masks, views.data.split_captions("dev")), f8k, views.dev_gold),
            "coco-mini-dev+f8k-dev": (encode_texts(model, ood.states, ood.masks, np.arange(len(ood.states))), images, ood.gold),
        }
        self.shortlists = {}
        for name, (text, imgs, gold) in self.sets.items():
            S = (text.g @ imgs.g.T).numpy()
            self.shortlists[name] = (S, M.topk(S, K))

    @torch.inference_mode()
    def hits(self, model) -> dict[str, np.ndarray]:
        """Dev set -> (C,) whether TEMDE@100 puts each caption's image first."""
        out = {}
        for name, (text, imgs, gold) in self.sets.items():
            S, cand = self.shortlists[name]
            fused = PairScorer(model, "temde", text, imgs, region=False).fused(torch.arange(len(S)), torch.from_numpy(cand)).numpy()
            out[name] = M.t2i_ranks(M.apply_rerank(S, cand, fused), gold) < 1
        return out

    def score(self, model) -> dict:
        return {name: round(100 * float(h.mean()), 2) for name, h in self.hits(model).items()}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m research.temde.sweep")
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    ap.add_argument("--run-dir", type=Path, default=Path("runs/temde_sweep"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/temde_sweep.json"))
    ap.add_argument("--adopt", default="", help="variant whose trained T-EMDE goes into --out-ckpt")
    ap.add_argument("--out-ckpt", type=Path, default=None)
    ap.add_argument("--test-against", type=Path, default=None, help="checkpoint whose T-EMDE the test report compares")
    ap.add_argument("--ensembles", action="store_true", help="score merged members (module docstring)")
    ap.add_argument("--members", default="", help="with --ensembles: only these T-EMDEs (comma-separated; default all)")
    ap.add_argument("--compare", default="", help="comma-separated T-EMDEs (a+b: merged) against the first, paired")
    ap.add_argument("--fusion-grid", default="", help="comma-separated T-EMDEs scored at every fusion weight")
    args = ap.parse_args()
    model, meta = checkpoint.load(args.ckpt)
    if args.fusion_grid:
        require_dev_sets()
        fusion_grid(model, args.fusion_grid.split(","), args.run_dir, args.out, args.ckpt)
        return
    if args.compare:
        require_dev_sets()
        compare(model, meta, args.ckpt, args.compare.split(","), args.run_dir, args.out)
        return
    if args.ensembles:
        require_dev_sets()
        ensembles(model, meta, args.ckpt, args.run_dir, args.out, [m for m in args.members.split(",") if m])
        return
    if args.test_against:
        require_dev_sets()
        test_report(model, meta, args.test_against, Path("docs/research/results/temde_test.json"))
        return
    if args.adopt:
        if args.out_ckpt is None:
            sys.exit("--adopt needs --out-ckpt DIR")
        adopt(model, meta, args.adopt, args.run_dir, args.out, args.out_ckpt)
        return
    require_dev_sets()
    served_cfg = model.cfg.temde
    dev = DevSets(model)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    if doc.get("checkpoint") != meta["fingerprint"]:
        doc = {"checkpoint": meta["fingerprint"], "rows": {}}
    rows = doc["rows"]
    if "served" not in rows:
        rows["served"] = {"temde": dataclasses.asdict(served_cfg), **dev.score(model)}
    print("served", rows["served"], flush=True)
    names = [n for n in (args.only.split(",") if args.only else VARIANTS) if n]
    train_banks = dev_banks = None
    for name in names:
        if name in rows:
            continue
        if train_banks is None:  # the rerankers' inputs exactly as `crossprobe train` builds them
            train_banks, dev_banks = split_banks(model, dev.data, "train"), split_banks(model, dev.data, "dev")
        t_changes, r_changes = VARIANTS[name]
        # a variant changes one T-EMDE of the recipe: a merged checkpoint's member shape, not its merged N
        member_n = meta.get("training", {}).get("temde", {}).get("member_N", served_cfg.N)
        cfg = dataclasses.replace(served_cfg, **{"N": member_n, **t_changes})
        seed = r_changes.get("seed", 0)  # the training seed (initialisation, sampling), not a RerankTrainConfig field
        rcfg = dataclasses.replace(reranker_config(TrainConfig(), "temde"),
                                   **{k: v for k, v in {**BEFORE, **r_changes}.items() if k != "seed"})
        seed_everything(seed)
        model.temde = Temde(cfg)
        args.run_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        report = train_reranker(model, "temde", train_banks, dev_banks, rcfg, args.run_dir / f"{name}.pt", seed, log=lambda *a: None)
        train_s = time.time() - t0
        row = {"temde": dataclasses.asdict(cfg), "seed": seed,
               "rerank": {k: v for k, v in dataclasses.asdict(rcfg).items() if k in r_changes},
               "best_epoch": report["best_epoch"], "fusion_w": report["fusion_w"], "selection_R@1@50": round(report["dev_score"], 2),
               "train_s": round(train_s, 1), **dev.score(model)}
        torch.save(model.temde.state_dict(), args.run_dir / f"{name}.weights.pt")
        rows[name] = row
        print(name, row, flush=True)
        _write(args.out, doc)
    floor = rows["served"]["f8k-dev"]
    ok = {n: r for n, r in rows.items() if r["f8k-dev"] >= floor}
    doc["chosen"] = max(ok, key=lambda n: (ok[n]["f8k-dev"] + ok[n]["coco-mini-dev+f8k-dev"], n == "served"))
    doc["rule"] = "highest f8k-dev + coco-mini-dev+f8k-dev TEMDE@100 R@1 among variants with f8k-dev >= the served T-EMDE's"
    doc["machine"] = machine()
    doc["command"] = ("python -m research.temde.sweep" + (f" --ckpt {args.ckpt}" if args.ckpt else "")
                      + (f" --only {args.only}" if args.only else "") + f" --run-dir {args.run_dir} --out {args.out}")
    _write(args.out, doc)
    print("chosen", doc["chosen"], rows[doc["chosen"]])


def _first_stage(state: dict) -> dict:
    """Towers and bridge: what the banks and the shortlists come from (everything but the rerankers)."""
    return {k: v for k, v in state.items() if k.split(".")[0] not in RERANKERS}


def trained(model, name: str, run_dir: Path) -> Temde:
    """The checkpoint's own T-EMDE ("served"), another checkpoint's (`name` a checkpoint directory whose towers are
    --ckpt's), or variant `name`'s best epoch from run_dir; fusion weight set."""
    if name == "served":
        return model.temde
    if Path(name).is_dir():
        other, meta = checkpoint.load(Path(name))
        mine, theirs = (_first_stage(m.trained_state_dict()) for m in (model, other))
        if mine.keys() != theirs.keys() or not all(torch.equal(mine[k], theirs[k]) for k in mine):
            sys.exit(f"{name} ({meta['fingerprint']}) has other towers or bridge: its T-EMDE would rank other shortlists")
        return other.temde.eval()
    weights = torch.load(run_dir / f"{name}.weights.pt")
    N, K, inner = weights["centroids"].shape  # the variant's own shape, whatever --ckpt's T-EMDE is (e.g. a merge)
    t = Temde(dataclasses.replace(model.cfg.temde, **{**VARIANTS[name][0], "N": N, "K": K, "inner": inner}))
    t.load_state_dict(weights)
    return t.eval()


@torch.inference_mode()
def fusion_grid(model, names: list[str], run_dir: Path, out: Path, ckpt: Path | None) -> None:
    dev = DevSets(model)
    rows = {}
    for name in names:
        model.temde = trained(model, name, run_dir)
        chosen = float(model.temde.fusion.beta / model.temde.fusion.alpha) if float(model.temde.fusion.alpha) else math.inf
        rows[name] = {"training_w": chosen, "by_w": {}}
        for w in FUSION_GRID:
            set_fusion(model.temde.fusion, w)
            rows[name]["by_w"][str(w)] = dev.score(model)
            print(name, w, rows[name]["by_w"][str(w)], flush=True)
    doc = json.loads(out.read_text())
    doc["fusion_grid"] = {"rows": rows, "command": f"python -m research.temde.sweep --fusion-grid {','.join(names)}"
                          + (f" --ckpt {ckpt}" if ckpt else "") + f" --run-dir {run_dir} --out {out}"}
    _write(out, doc)


def fit_merged(model, members: list[Temde], dev_banks) -> tuple[float, float]:
    """model.temde = the members merged, its fusion weight fit as `crossprobe train` fits a merged T-EMDE's."""
    return fit_merged_temde(model, members, dev_banks, reranker_config(TrainConfig(), "temde"))


def compare(model, meta: dict, ckpt: Path | None, specs: list[str], run_dir: Path, out: Path) -> None:
    """Each spec ("served", a variant, or members joined by "+", merged) against the first, caption by caption on
    both dev sets: R@1 and the paired bootstrap's 95% interval of the difference (over the gold images: 1,000 f8k
    dev images, 80 COCO photos) -> --out's "compare". How far apart must two T-EMDEs be before 400 captions can
    tell them apart?"""
    dev = DevSets(model)
    dev_banks = split_banks(model, dev.data, "dev")
    pool = {name: trained(model, name, run_dir) for name in dict.fromkeys(n for spec in specs for n in spec.split("+"))}
    hits, rows = {}, {}
    for spec in specs:
        names = spec.split("+")
        if len(names) == 1:
            model.temde = pool[names[0]]
            f = model.temde.fusion
            w = float(f.beta / f.alpha) if float(f.alpha) else math.inf  # alpha 0: ranked by T-EMDE alone
        else:
            w, _ = fit_merged(model, [pool[n] for n in names], dev_banks)
        hits[spec] = dev.hits(model)
        rows[spec] = {"N": model.temde.cfg.N, "fusion_w": w,
                      **{name: round(100 * float(h.mean()), 2) for name, h in hits[spec].items()}}
        if spec != specs[0]:
            rows[spec]["vs " + specs[0]] = {name: M.paired_bootstrap(h, hits[specs[0]][name], dev.sets[name][2])
                                            for name, h in hits[spec].items()}
        print(spec, json.dumps(rows[spec]), flush=True)
    doc = json.loads(out.read_text()) if out.exists() else {"checkpoint": meta["fingerprint"]}
    doc["compare"] = {"rows": rows, "machine": machine(),
                      "command": "python -m research.temde.sweep --compare " + ",".join(specs)
                      + (f" --ckpt {ckpt}" if ckpt else "") + f" --run-dir {run_dir} --out {out}"}
    _write(out, doc)


def ensembles(model, meta: dict, ckpt: Path | None, run_dir: Path, out: Path, only: list[str]) -> None:
    doc = json.loads(out.read_text())
    names = only or ["served"] + sorted(f.name.removesuffix(".weights.pt") for f in run_dir.glob("*.weights.pt"))
    members = {name: trained(model, name, run_dir) for name in names}
    dev = DevSets(model)
    dev_banks = split_banks(model, dev.data, "dev")
    rows = {}
    for r in range(2, len(members) + 1):
        for combo in itertools.combinations(members, r):
            w, sel = fit_merged(model, [members[c] for c in combo], dev_banks)
            rows["+".join(combo)] = {"N": model.temde.cfg.N, "fusion_w": w, "selection_R@1@50": round(sel, 2), **dev.score(model)}
            print("+".join(combo), rows["+".join(combo)], flush=True)
    doc["ensembles"] = {"served": meta["fingerprint"], "rows": rows,
                        "command": "python -m research.temde.sweep --ensembles" + (f" --ckpt {ckpt}" if ckpt else "")
                        + (f" --members {','.join(only)}" if only else "") + f" --run-dir {run_dir} --out {out}"}
    _write(out, doc)


@torch.inference_mode()
def test_report(model, meta: dict, old_ckpt: Path, out: Path, resamples: int = 10_000) -> None:
    """TT, this checkpoint's and old_ckpt's TEMDE@100 on Flickr8k test (same towers: only T-EMDE may differ)."""
    old, old_meta = checkpoint.load(old_ckpt)
    data = dev_views(model).data
    text, images, gold = split_banks(model, data, "test")
    S = (text.g @ images.g.T).numpy()
    cand = M.topk(S, K)
    hits = {"TT": M.t2i_ranks(S, gold) < 1}
    for name, m in ((meta["fingerprint"], model), (old_meta["fingerprint"], old)):
        fused = PairScorer(m, "temde", text, images, region=False).fused(torch.arange(len(S)), torch.from_numpy(cand)).numpy()
        hits[name] = M.t2i_ranks(M.apply_rerank(S, cand, fused), gold) < 1

    def diff(a: str, b: str) -> dict:
        return M.paired_bootstrap(hits[a], hits[b], gold, resamples)

    new, prev = meta["fingerprint"], old_meta["fingerprint"]
    doc = {"R@1": {k: round(100 * float(v.mean()), 2) for k, v in hits.items()},
           f"TEMDE@100 {new} - TT": diff(new, "TT"), f"TEMDE@100 {prev} - TT": diff(prev, "TT"),
           f"TEMDE@100 {new} - {prev}": diff(new, prev),
           "captions": int(len(gold)), "resamples": resamples,
           "note": "measured after the T-EMDE variant was chosen on the dev sets; reported, never used to choose",
           "machine": machine(), "command": f"python -m research.temde.sweep --test-against {old_ckpt}"}
    _write(out, doc)
    print(json.dumps(doc, indent=1))


def adopt(model, meta: dict, name: str, run_dir: Path, sweep: Path, dest: Path) -> None:
    """Variant `name`'s trained T-EMDE in place of the checkpoint's own, with its training record (history, best
    epoch, fusion weight, recipe, wall time), written as `crossprobe checkpoint set-temde` writes it."""
    from crossprobe.models.training.adopt import set_temde

    row = json.loads(sweep.read_text())["rows"][name]
    state = torch.load(run_dir / f"{name}.pt", weights_only=False)  # train_reranker's resumable state: history, best
    pre = torch.load(run_dir / f"{name}.pretrained.pt", weights_only=False)["history"]
    best = state["best"]
    report = {"best_epoch": best["epoch"], "dev_score": best["score"], "history": state["history"], "pretrain": pre,
              "fusion_w": best["fusion_w"], "fusion_dev_t2i_R@1@50": best["score"], "fusion_queries": 5000,
              "from": f"research/temde/sweep.py variant {name} on {meta['fingerprint']}'s towers"}
    weights = trained(model, name, run_dir).state_dict()  # best epoch, fusion weight set, the variant's own shape
    fp = set_temde(model, meta, dest, weights, report, recipe={**BEFORE, **VARIANTS[name][1]}, train_s=row["train_s"])
    print(f"saved {dest} fingerprint {fp} (T-EMDE {name}: {row})")

def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)


if __name__ == "__main__":
    main()
