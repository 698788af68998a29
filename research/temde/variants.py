"""Four more ways to a stronger T-EMDE, measured on the two dev sets (never Flickr8k test):

    python -m research.temde.variants mirror                      # training-free, the checkpoint's T-EMDE
    python -m research.temde.variants final-states [--seed 0]     # one fresh T-EMDE (captions5's recipe)
    python -m research.temde.variants mlp-coder [--seed 0] [--hidden 256]
    python -m research.temde.variants region-inputs [--seed 0]
    python -m research.temde.variants plain [--seed 0]            # the control: a member of the default as is
    python -m research.temde.variants compare [--seed 0]          # each trained row against plain, paired

  mirror        the image sketch summed over the 49 grid cells of the photo *and* of its mirror image (a second
                Lite0 run per image at index time), the served fusion weight and every weight of training's grid.
  final-states  the text coder reads MiniLM's own pretrained last layers' states (layers 5-6 run over the cached
                layer-4 states, frozen) instead of the layer-4 states: the sentence-embedding layers of
                all-MiniLM-L6-v2, where the layer-4 states are an intermediate.
  mlp-coder     each coder's Linear becomes Linear(d_feat, hidden) -> GELU -> Linear(hidden, N*inner): a nonlinear
                map from two unrelated feature spaces (MiniLM states, Lite0 regions) into the shared centroids.
  region-inputs the label bridge per grid cell as coder input (issue 14's "region-level labels as extra inputs"):
                each cell's Lite0 region (1280) and its label vector (256: the frozen head's class probabilities of
                that cell, the top T classes' table rows E_c summed as the bridge sums them for the whole image);
                each MiniLM state (384) and the query's g_q (256, the space E lives in). The sketch then sees
                open-vocabulary semantics per region, not only as one term in the two-tower score.

Trained variants train one T-EMDE of the default's member shape (N 20, K 8, inner 8) exactly as a member of the
default is trained (captions5: 5 in-batch pretraining epochs, 3 listwise epochs over every caption, epoch and
fusion weight on the 5,000 f8k dev captions), so each row is comparable with `plain`, the default's member of the
same seed trained on the same host (draws of one seed differ between CPUs: docs/research/bridge.md).
Scores: TEMDE@100 text->image R@1 as `crossprobe eval` computes it (research.temde.sweep.DevSets). Rows are added to --out.
`compare` reloads the trained rows' weights from --run-dir and puts each against `plain` caption by caption, with the
paired bootstrap's 95% interval of the R@1 difference over the gold images (metrics.paired_bootstrap).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from crossprobe.models import backbones as bb
from crossprobe.core import inputs
from crossprobe.models import checkpoint
from crossprobe.models.data.captioned import CaptionedFolder, coco_root
from crossprobe.models.data.features import image_backbone_session
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.report import machine
from crossprobe.models.evaluation.retrieval import split_banks
from crossprobe.models.temde import Temde
from crossprobe.models.training.rerankers import FUSION_GRID, train_reranker
from crossprobe.models.training.run import TrainConfig, reranker_config
from crossprobe.models.training.state import seed_everything

from research.bridge.sweep import require_dev_sets
from research.bridge.variants import pixels_of
from research.temde.sweep import BEFORE, DevSets, _write


@torch.inference_mode()
def mirror(model, dev: DevSets) -> dict:
    """Dev R@1 by fusion weight for the image sketch over the photo's cells, its mirror's, and both summed."""
    folder, data = CaptionedFolder.load(coco_root()), dev.data
    everything = dev.sets["coco-mini-dev+f8k-dev"][1]  # 80 COCO photos, then the 1,000 f8k dev images
    n = len(everything.g) - len(data.split_images("dev"))
    paths = [folder.image_path(i) for i in range(n)] + [data.ds.image_path(r) for r in data.split_images("dev")]
    sess = image_backbone_session(Path("cache/flickr8k"))
    mirrored = torch.cat([torch.from_numpy(sess.run(None, {"pixels": pixels_of(paths[s: s + 32], inputs.IMAGE_SIZE, True)})[0])
                          for s in range(0, len(paths), 32)])
    tm = model.temde

    def raw(grids):  # (B, 49, 1280) -> (B, N, K) assignments summed over the cells
        return torch.cat([Temde.raw_sketch(tm.image_coder(grids[s: s + 128].float())) for s in range(0, len(grids), 128)])

    r_photo, r_mirror = raw(everything.grids), raw(mirrored)
    sketches = {"photo (served)": Temde.normalize(r_photo), "photo + mirror": Temde.normalize(r_photo + r_mirror),
                "mirror only": Temde.normalize(r_mirror)}
    rows = {}
    for name, (text, _, gold) in dev.sets.items():
        S, cand = dev.shortlists[name]
        s_q = torch.cat([tm.sketch_text(None, text.mask[s: s + 512], text.states[s: s + 512].float())
                         for s in range(0, len(text.g), 512)])
        s_tt = np.take_along_axis(S, cand, 1)
        offset = n if name == "f8k-dev" else 0  # f8k-dev ranks the dev images alone
        for kind, s_i in sketches.items():
            s = ((s_q[:, None, :] * s_i[offset:][torch.from_numpy(cand)]).sum(-1) / tm.cfg.N).numpy()
            for w in (w for w in FUSION_GRID if not math.isinf(w)):
                r1 = M.summarize(M.t2i_ranks(M.apply_rerank(S, cand, s_tt + w * s), gold))["R@1"]
                rows.setdefault(kind, {}).setdefault(str(w), {})[name] = round(r1, 2)
    served_w = float(tm.fusion.beta / tm.fusion.alpha)
    return {"served_w": served_w, "at_served_w": {k: v[str(served_w)] for k, v in rows.items()}, "by_w": rows,
            "backbone_runs_per_image": {"photo (served)": 1, "photo + mirror": 2, "mirror only": 1}}


@torch.inference_mode()
def lift_to_final(bank, bert, first: int, last: int) -> None:
    """bank.states (layer-`first` MiniLM states) -> the pretrained layers first..last-1 run over them (frozen,
    eval mode: no dropout), in place; the towers' own g_q (already in the bank) are untouched."""
    out = []
    for s in range(0, len(bank.states), 512):
        h = bank.states[s: s + 512].float()
        bias = bb.bert_attention_bias(bank.mask[s: s + 512].long(), h.dtype)
        for layer in bert.encoder.layer[first:last]:
            h = bb.bert_layer(layer, h, bias)
        out.append(h.half())
    bank.states = torch.cat(out)


def mlp_temde(cfg, hidden: int) -> Temde:
    t = Temde(cfg)
    for coder in (t.text_coder, t.image_coder):
        d_feat = coder.lin.in_features
        coder.lin = nn.Sequential(nn.Linear(d_feat, hidden), nn.GELU(), nn.Linear(hidden, cfg.N * cfg.inner))
    return t


@torch.inference_mode()
def cell_label_vectors(bridge, grids: torch.Tensor, batch: int = 128) -> torch.Tensor:
    """(B, 49, 1280) grids -> (B, 49, d) the bridge's label vector of each cell: the frozen head over the cell
    (as bridge.cell_labels takes it) at the bridge's temperature, then bridge.label_vector."""
    out = []
    for s in range(0, len(grids), batch):
        p = ((grids[s: s + batch].float() @ bridge.head_w.t() + bridge.head_b) / bridge.cfg.temperature).softmax(-1)
        out.append(bridge.label_vector(p).half())
    return torch.cat(out)


def add_region_inputs(model, text, images) -> None:
    """Banks in place: image grids (N, 49, 1280) -> (N, 49, 1280 + d) with each cell's label vector; text states
    (N, T, 384) -> (N, T, 384 + d) with the query's g_q on every token."""
    images.grids = torch.cat([images.grids, cell_label_vectors(model.bridge, images.grids)], -1)
    g = text.g.half()[:, None, :].expand(-1, text.states.shape[1], -1)
    text.states = torch.cat([text.states, g], -1)


def region_temde(cfg, d: int) -> Temde:
    t = Temde(cfg)
    t.text_coder.lin = nn.Linear(inputs.TEXT_FEAT_DIM + d, cfg.N * cfg.inner)
    t.image_coder.lin = nn.Linear(inputs.IMAGE_FEAT_DIM + d, cfg.N * cfg.inner)
    return t


def new_temde(model, meta, kind: str, hidden: int) -> Temde:
    """A fresh T-EMDE of the default's member shape, with the variant's coders."""
    cfg = dataclasses.replace(model.cfg.temde, N=meta.get("training", {}).get("temde", {}).get("member_N", 20))
    if kind == "mlp-coder":
        return mlp_temde(cfg, hidden)
    if kind == "region-inputs":
        return region_temde(cfg, model.cfg.vision.d)
    return Temde(cfg)


def prepare_inputs(model, kind: str, banks) -> None:
    """(text, images, gold) banks in place -> what the variant's coders read (nothing to do for plain / mlp-coder)."""
    if kind == "final-states":
        bert = bb.load_minilm()
        for text, _, _ in banks:
            lift_to_final(text, bert, model.cfg.text.frozen_layers, model.cfg.text.layers)
    elif kind == "region-inputs":
        for text, images, _ in banks:
            add_region_inputs(model, text, images)


def trained_variant(model, meta, dev: DevSets, kind: str, seed: int, hidden: int, run_dir: Path) -> dict:
    train_banks, dev_banks = split_banks(model, dev.data, "train"), split_banks(model, dev.data, "dev")
    prepare_inputs(model, kind, [*dev.sets.values(), train_banks, dev_banks])
    rcfg = dataclasses.replace(reranker_config(TrainConfig(), "temde"), **{**BEFORE, "epochs": 3, "captions_per_image": 5})
    seed_everything(seed)
    model.temde = new_temde(model, meta, kind, hidden)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    report = train_reranker(model, "temde", train_banks, dev_banks, rcfg, run_dir / f"{kind}.s{seed}.pt", seed, log=print)
    torch.save(model.temde.state_dict(), run_dir / f"{kind}.s{seed}.weights.pt")
    return {"seed": seed, **({"hidden": hidden} if kind == "mlp-coder" else {}), "best_epoch": report["best_epoch"],
            "fusion_w": report["fusion_w"], "train_s": round(time.time() - t0, 1), **dev.score(model)}


def compare(model, meta, dev: DevSets, seed: int, hidden: int, run_dir: Path) -> dict:
    """Each trained variant of `seed` found in run_dir against `plain`, caption by caption on both dev sets."""
    kinds = [k for k in ("plain", "final-states", "mlp-coder", "region-inputs") if (run_dir / f"{k}.s{seed}.weights.pt").exists()]
    if "plain" not in kinds:
        sys.exit(f"no control: run `python -m research.temde.variants plain --seed {seed}` first")
    hits = {}
    for kind in kinds:
        model.temde = new_temde(model, meta, kind, hidden)
        model.temde.load_state_dict(torch.load(run_dir / f"{kind}.s{seed}.weights.pt"))
        model.temde.eval()
        saved = {n: (s[0].states, s[1].grids) for n, s in dev.sets.items()}  # this variant's inputs, then back
        prepare_inputs(model, kind, dev.sets.values())
        hits[kind] = dev.hits(model)
        for name, (states, grids) in saved.items():
            dev.sets[name][0].states, dev.sets[name][1].grids = states, grids
    rows = {}
    for kind, h in hits.items():
        rows[kind] = {name: round(100 * float(x.mean()), 2) for name, x in h.items()}
        if kind != "plain":
            rows[kind]["vs plain"] = {name: M.paired_bootstrap(x, hits["plain"][name], dev.sets[name][2]) for name, x in h.items()}
    return {"seed": seed, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m research.temde.variants")
    ap.add_argument("kind", choices=["mirror", "final-states", "mlp-coder", "region-inputs", "plain", "compare"])
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--run-dir", type=Path, default=Path("runs/temde_variants"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/temde_variants.json"))
    args = ap.parse_args()
    require_dev_sets()
    model, meta = checkpoint.load(args.ckpt)
    dev = DevSets(model)
    t0 = time.time()
    if args.kind == "mirror":
        row, key = mirror(model, dev), "mirror"
    elif args.kind == "compare":
        row, key = compare(model, meta, dev, args.seed, args.hidden, args.run_dir), f"compare.s{args.seed}"
    else:
        row = trained_variant(model, meta, dev, args.kind, args.seed, args.hidden, args.run_dir)
        key = f"{args.kind}.s{args.seed}" + (f".h{args.hidden}" if args.kind == "mlp-coder" else "")
    row.update(command=" ".join(["python -m research.temde.variants", *sys.argv[1:]]), machine=machine(),
               seconds=round(time.time() - t0, 1))
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc.update(checkpoint=meta["fingerprint"], rule="TEMDE@100 text->image R@1 on f8k-dev / coco-mini-dev+f8k-dev")
    doc.setdefault("rows", {})[key] = row
    _write(args.out, doc)
    print(key, json.dumps({k: v for k, v in row.items() if k != "by_w"}), flush=True)


if __name__ == "__main__":
    main()
