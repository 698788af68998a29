"""Label-bridge settings on the two dev sets (never Flickr8k test): beta, T, temperature, class texts.

    python -m research.bridge.sweep [--ckpt DIR] [--out docs/research/results/bridge_sweep.json]

Two-tower text->image R@1 of a checkpoint's towers with the fixed (ConSE) bridge on
  f8k-dev                5,000 Flickr8k dev captions x 1,000 dev images (in domain)
  coco-mini-dev+f8k-dev  400 COCO captions x (80 COCO + 1,000 Flickr8k dev images) (out of domain)
Rule (docs/research/bridge.md): the highest sum of the two dev R@1s among the settings whose f8k-dev R@1 is not
below the bridge-off towers' (no in-domain loss). The first rule written, the highest coco-mini-dev+f8k-dev
R@1 alone under the same constraint, is reported beside it: it ignores in-domain gains and picked the
grid's edge (beta 1.0, f8k-dev +0.4) over a setting 0.5 lower out of domain (inside the 400 captions'
+-2 points of noise) and +1.2 higher in domain.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from crossprobe.models import checkpoint
from crossprobe.models.data.captioned import CaptionedFolder, coco_root
from crossprobe.models.data.flickr8k import available
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import ImageBank, TextBank, encode_images, encode_texts
from crossprobe.models.evaluation.ood import OodFeatures
from crossprobe.models.evaluation.report import machine
from crossprobe.models.bridge import BridgeConfig, LabelBridge
from crossprobe.models.training.data import CachedData

TEXTS = {  # name -> (templates, lemmas)
    "plain": (["{}"], 1),
    "photo": (["a photo of a {}."], 1),
    "plain+photo": (["{}", "a photo of a {}."], 1),
    "plain-3lemmas": (["{}"], 3),
}
BETAS = (0.0, 0.1, 0.25, 0.4, 0.5, 0.75, 1.0)
TOPS = (1, 5, 20, 100)
TEMPS = (0.5, 1.0, 2.0)


def r1(g_q: torch.Tensor, g_i: torch.Tensor, gold: np.ndarray) -> float:
    return round(M.summarize(M.t2i_ranks((g_q @ g_i.T).numpy(), gold))["R@1"], 2)


@dataclass
class DevViews:
    """The two dev sets the bridge is chosen on (never Flickr8k test), shared with research/bridge/variants.py,
    research/region_labels and research/temde.
    Candidate images in one order: the 80 COCO photos, then the 1,000 Flickr8k dev images."""
    data: CachedData
    dev: list  # Flickr8k dev image rows
    ood: OodFeatures
    t_dev: TextBank  # the 5,000 dev captions through the text tower
    t_ood: TextBank  # the 400 COCO captions
    dev_gold: np.ndarray  # dev caption -> column among the dev images

    @property
    def n_coco(self) -> int:
        return len(self.ood.grids)

    @property
    def q_dev(self) -> torch.Tensor:
        return self.t_dev.g  # (5000, d)

    @property
    def q_ood(self) -> torch.Tensor:
        return self.t_ood.g  # (400, d)

    def sets(self, images: ImageBank) -> dict:
        """The 1,080 photos' bank in the order above -> {dev set: (text bank, image bank, gold columns, the set's
        first column among the 1,080)}: f8k-dev ranks the 1,000 Flickr8k dev photos, coco-mini-dev+f8k-dev all."""
        n = self.n_coco
        f8k = ImageBank(images.tokens[n:], images.g[n:], images.grids[n:], None if images.labels is None else images.labels[n:])
        return {"f8k-dev": (self.t_dev, f8k, self.dev_gold, n), "coco-mini-dev+f8k-dev": (self.t_ood, images, self.ood.gold, 0)}

    def grids(self) -> torch.Tensor:
        return torch.cat([torch.from_numpy(self.ood.grids), torch.from_numpy(self.ood.distractors)]).float()  # (1080, 49, 1280)

    def scores(self, g: torch.Tensor) -> dict:
        """(1080, d) g_I in the order above -> two-tower R@1 on f8k-dev, coco+f8k-dev and coco alone."""
        n = self.n_coco
        return {"f8k-dev": r1(self.q_dev, g[n:], self.dev_gold), "coco-mini-dev+f8k-dev": r1(self.q_ood, g, self.ood.gold),
                "coco-mini-dev": r1(self.q_ood, g[:n], self.ood.gold)}


def dev_views(model) -> DevViews:
    L = model.cfg.text.frozen_layers
    data = CachedData.build(Path("cache/flickr8k"), L)
    dev = data.split_images("dev")
    col = {r: i for i, r in enumerate(dev)}
    dev_caps = data.split_captions("dev")
    ood = OodFeatures(CaptionedFolder.load(coco_root()), Path("cache/coco-mini-dev"), L, data.grids[dev])
    return DevViews(data, dev, ood, encode_texts(model, data.states, data.masks, dev_caps),
                    encode_texts(model, ood.states, ood.masks, np.arange(len(ood.states))),
                    np.array([col[data.ds.caption_image[j]] for j in dev_caps]))


def require_dev_sets() -> None:
    """Exit 2 with a clear message when the shared dev data is absent (benchmarks skip, never fail silently)."""
    if not available() or not CaptionedFolder.available(coco_root()):
        print("Flickr8k or coco-mini-dev not found (FLICKR8K_DIR / COCO_MINI_DEV_DIR); skipped.", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(2)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m research.bridge.sweep")
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/bridge_sweep.json"))
    args = ap.parse_args()
    require_dev_sets()
    t0 = time.time()
    model, meta = checkpoint.load(args.ckpt)
    # towers only (bridge off): g_q of both caption sets, g_I and grids of both image sets
    model.bridge = LabelBridge(BridgeConfig.off(), model.cfg.vision.d)
    views = dev_views(model)
    grids = views.grids()
    g_img = encode_images(model, grids.half().numpy(), np.arange(len(grids))).g  # (1080, d): 80 COCO, then f8k dev

    rows = []
    emb = {}
    for text_name, (templates, lemmas) in TEXTS.items():
        b = LabelBridge(BridgeConfig(beta=1.0, templates=templates, lemmas=lemmas), model.cfg.vision.d)
        b.set_class_embeddings(model.text)
        emb[text_name] = b.class_emb.clone()
    for text_name, beta, top, temp in itertools.product(TEXTS, BETAS, TOPS, TEMPS):
        if beta == 0 and (text_name, top, temp) != ("plain", 5, 1.0):
            continue  # bridge off: one row
        cfg = BridgeConfig(beta=max(beta, 1e-9), top_t=top, temperature=temp, templates=TEXTS[text_name][0], lemmas=TEXTS[text_name][1])
        b = LabelBridge(cfg, model.cfg.vision.d)
        b.class_emb.copy_(emb[text_name])
        g = b(grids, g_img) if beta > 0 else g_img
        rows.append({"texts": text_name, "beta": beta, "top_t": top, "temperature": temp, **views.scores(g)})
    off = rows[0]
    ok = [r for r in rows if r["f8k-dev"] >= off["f8k-dev"]]
    ood_only = max(ok, key=lambda r: (r["coco-mini-dev+f8k-dev"], r["f8k-dev"]))
    best = max(ok, key=lambda r: (r["coco-mini-dev+f8k-dev"] + r["f8k-dev"], r["coco-mini-dev+f8k-dev"]))
    out = {"checkpoint": meta["fingerprint"], "bridge_off": off, "chosen": best, "ood_only_rule_choice": ood_only,
           "rule": "max f8k-dev + coco-mini-dev+f8k-dev TT R@1 subject to f8k-dev TT R@1 >= bridge off",
           "rows": rows, "command": " ".join(["python -m research.bridge.sweep", *sys.argv[1:]]), "machine": machine(),
           "seconds": round(time.time() - t0, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    top10 = sorted(rows, key=lambda r: -r["coco-mini-dev+f8k-dev"])[:10]
    print("off:", off)
    print("chosen:", best)
    print("ood-only rule:", ood_only)
    for r in top10:
        print(r)
    print(f"-> {args.out} ({out['seconds']} s)")


if __name__ == "__main__":
    main()
