"""Is there a presence signal in the region labels? A first look for issue 34's absent-query goal.

    python -m research.calibration.presence [--ckpt DIR] [--out docs/research/results/presence.json]

The relevance curve sees one number per result (its score against its shortlist's mean) and cannot tell "no photo
shows a jellyfish" from "the jellyfish photo ranks fifth" (docs/research/calibration.md). Region labels say, per
photo, what the ImageNet head sees in each of its 49 cells; a query about something absent from the library should
find no cell whose label is near it. Per query, over the 1,080 photos of ood-dev (80 COCO + 1,000 Flickr8k dev):

  cell_max   the largest cosine between the query and any cell label of its two-tower top 100
  region_max the largest s_region (mean of the 3 best cells, the served term) over its top 100
  minus_vocabulary_gap  cell_max minus the query's largest cosine with any of the 1,000 classes: 0 when the
             class the query is nearest to labels some cell of its shortlist, below 0 when the library lacks it
  class_presence_top3   the head's probabilities instead of each cell's one label: for each of the query's 3
             nearest classes, the largest probability any cell of its top 100 gives it; the max over the 3
  class_presence_soft3  the same 3, weighted by softmax(20 x their cosines with the query)

Present queries: the f8k-dev and coco-mini-dev captions whose photo is in the two-tower top 10 (the calibration
rule's "found in the top 10"). Absent: calibration's 50 queries. For each feature, the cutoff that keeps 90% of the
present queries, and how many of the 50 absent queries fall below it (the goal: 40); and the ROC AUC. A measurement
only: nothing here changes the served relevance.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from crossprobe.core import inputs
from crossprobe.models import checkpoint
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import encode_images
from crossprobe.models.evaluation.report import machine
from crossprobe.models.region_labels import region_score

from research.bridge.sweep import dev_views, require_dev_sets
from crossprobe.models.training.calibrate import ABSENT
from research.region_labels.sweep import cell_probs

K = 100


def features(g_q: torch.Tensor, g_i: torch.Tensor, labels: torch.Tensor, class_sims, p_img: torch.Tensor) -> dict[str, np.ndarray]:
    """(Q, d) queries, (I, d) photos, (I, 49) cell labels, (I, 1000) each class's largest cell probability per photo
    -> per query {feature: value} over its two-tower top K."""
    S = (g_q @ g_i.T).numpy()
    cand = torch.from_numpy(M.topk(S, K))
    sim = class_sims(g_q)  # (Q, 1000)
    cells = torch.gather(sim, 1, labels[cand].reshape(len(g_q), -1)).reshape(len(g_q), K, 49)
    cell_max = cells.amax((1, 2))
    # short object phrases are near some class name whatever the library holds; long scene captions are near none:
    # the raw cosine measures the query's style. Against the query's best class in the whole vocabulary, a library
    # that lacks the concept leaves a gap (higher = more present, as the other features)
    near, classes = sim.topk(3, dim=1)  # (Q, 3) the query's nearest classes
    seen = torch.stack([p_img[cand[q]][:, classes[q]].amax(0) for q in range(len(g_q))])  # (Q, 3) best photo's prob
    return {"cell_max": cell_max.numpy(), "region_max": region_score(sim, labels[cand], 3).amax(1).numpy(),
            "minus_vocabulary_gap": (cell_max - sim.amax(1)).numpy(),
            "class_presence_top3": seen.amax(1).numpy(),
            "class_presence_soft3": (seen * torch.softmax(20 * near, 1)).sum(1).numpy()}, S


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a present query's feature > an absent one's), ties half."""
    return float(((pos[:, None] > neg[None]) + 0.5 * (pos[:, None] == neg[None])).mean())


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m research.calibration.presence")
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/presence.json"))
    args = ap.parse_args()
    require_dev_sets()
    t0 = time.time()
    model, meta = checkpoint.load(args.ckpt)
    model.eval()
    views = dev_views(model)
    grids = views.grids()
    g_i = encode_images(model, grids.half().numpy(), np.arange(len(grids))).g
    labels = model.bridge.cell_labels(grids)
    p_img = cell_probs(grids, 1.0).amax(1)  # (1080, 1000)
    present = []  # both caption sets over all 1,080 photos (the f8k-dev photos after the 80 COCO ones)
    for text, gold in ((views.q_dev, views.dev_gold + views.n_coco), (views.q_ood, views.ood.gold)):
        f, S = features(text, g_i, labels, model.bridge.class_sims, p_img)
        found = M.t2i_ranks(S, gold) < 10
        present.append({k: v[found] for k, v in f.items()})
    present = {k: np.concatenate([p[k] for p in present]) for k in present[0]}
    ids, mask = inputs.tokenize(inputs.load_tokenizer(), ABSENT)
    absent, _ = features(model.text(torch.from_numpy(ids), torch.from_numpy(mask)).g, g_i, labels, model.bridge.class_sims, p_img)
    out = {"checkpoint": meta["fingerprint"], "present_queries": int(len(present["cell_max"])), "absent_queries": len(ABSENT),
           "features": {}}
    for k in present:
        cut = float(np.quantile(present[k], 0.10))  # keeps 90% of the present queries
        out["features"][k] = {"cutoff_keeping_90pct_present": round(cut, 4), "absent_below": int((absent[k] < cut).sum()),
                              "auc_present_vs_absent": round(auc(present[k], absent[k]), 4),
                              "present_median": round(float(np.median(present[k])), 4),
                              "absent_median": round(float(np.median(absent[k])), 4)}
        print(k, out["features"][k], flush=True)
    out.update({"command": " ".join(["python -m research.calibration.presence", *sys.argv[1:]]), "machine": machine(),
                "seconds": round(time.time() - t0, 1)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
