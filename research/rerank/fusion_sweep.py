"""Issue 2 diagnostic: what re-weighting the fusion could give the COMMITTED CP and T-EMDE.

    .venv/bin/python -m research.rerank.fusion_sweep

Sweeps w in logit = s_tt + w * s_rerank (the module's learned alpha/beta divided out; w = beta/alpha as
trained, w=1000 ~ the reranker alone) on the dev and test splits, K=100, text->image R@1.
Results: docs/research/rerank_experiments.md."""
from pathlib import Path

import numpy as np
import torch

from crossprobe.models import checkpoint
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import PairScorer
from crossprobe.models.evaluation.retrieval import split_banks, tt_scores
from crossprobe.models.training.data import CachedData


def main() -> None:
    torch.set_num_threads(2)
    model, meta = checkpoint.load(None)
    data = CachedData.build(Path("cache/flickr8k"), model.cfg.text.frozen_layers)
    for split in ("dev", "test"):
        text, images, gold = split_banks(model, data, split)
        S = tt_scores(text, images)
        cand = M.topk(S, 100)
        stt = np.take_along_axis(S, cand, 1)
        for method in ("cp", "temde"):
            sc = PairScorer(model, method, text, images)
            fused = sc.fused(torch.arange(len(S)), torch.from_numpy(cand)).numpy()
            f = getattr(model, method).fusion
            a, b = float(f.alpha), float(f.beta)
            srr = (fused - a * stt) / b
            res = {}
            for w in (0, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 1e3):
                sel = stt + w * srr
                res[w] = round(M.summarize(M.t2i_ranks(M.apply_rerank(S, cand, sel), gold))["R@1"], 2)
            print(split, method, f"alpha {a:.2f} beta {b:.2f} (w={b/a:.2f})", res, flush=True)


if __name__ == "__main__":
    main()
