"""Issue 2 experiment: one reranker recipe on the committed towers, then a sweep of the fusion weight.

    .venv/bin/python -m research.rerank.recipe DEV_STACK METHOD EPOCHS PRETRAIN_EPOCHS STANDALONE [INPUTS]

DEV_STACK: fraction of dev images added to training (models/training/stacking.py); METHOD cp | temde;
EPOCHS: listwise epochs on mined negatives; PRETRAIN_EPOCHS: in-batch contrastive epochs first
(RerankTrainConfig.pretrain_epochs); STANDALONE 1: train on the reranker's own score and fit the fusion weight on the
selection split (RerankTrainConfig.standalone); INPUTS: tower | backbone (| both, CP only)
(CrossProbeConfig.inputs / TemdeConfig.inputs, default tower). The module is re-initialised with seed SEED (environment,
default 0: the default seed), which also orders the training data; everything else is the
default reranker budget. Prints the learning curve, then R@1 (t2i, K=100) on the dev selection split and
on test for logit = s_tt + w * s_rerank over a grid of w (w=1000 ~ the reranker alone), the dev-best w,
and test R@1 at that w. Results of the runs made so far: docs/research/rerank_experiments.md.
"""
import copy
import os
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from crossprobe.models import checkpoint
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import PairScorer
from crossprobe.models.evaluation.retrieval import split_banks, tt_scores
from crossprobe.models.cross_probe import CrossProbe
from crossprobe.models.temde import Temde
from crossprobe.models.training.data import CachedData
from crossprobe.models.training.rerankers import train_reranker
from crossprobe.models.training.run import TrainConfig, reranker_config
from crossprobe.models.training.stacking import stacked
from crossprobe.models.training.state import seed_everything

WEIGHTS = (0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 1e3)


def sweep(model, method: str, banks, extra: tuple = ()) -> dict:
    """R@1 of s_tt + w * s_rerank on the top 100, for each w of WEIGHTS + extra (the module's own fusion divided out)."""
    text, images, gold = banks
    S = tt_scores(text, images)
    cand = M.topk(S, 100)
    stt = np.take_along_axis(S, cand, 1)
    own = copy.deepcopy(model)  # the reranker's own score: fusion alpha = 0, beta = 1
    with torch.no_grad():
        getattr(own, method).fusion.alpha.zero_()
        getattr(own, method).fusion.beta.fill_(1.0)
    srr = PairScorer(own, method, text, images).fused(torch.arange(len(S)), torch.from_numpy(cand)).numpy()
    return {w: round(M.summarize(M.t2i_ranks(M.apply_rerank(S, cand, stt + w * srr), gold))["R@1"], 2) for w in (*WEIGHTS, *extra)}


def main() -> None:
    frac, method, epochs, pre, alone = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    inputs = sys.argv[6] if len(sys.argv) > 6 else "tower"
    torch.set_num_threads(int(os.environ.get("THREADS", 2)))
    base, _ = checkpoint.load(None)
    data = CachedData.build(Path("cache/flickr8k"), base.cfg.text.frozen_layers)
    tr, dv = stacked(split_banks(base, data, "train"), split_banks(base, data, "dev"), frac)
    te = split_banks(base, data, "test")
    model = copy.deepcopy(base)
    seed = int(os.environ.get("SEED", 0))
    seed_everything(seed)
    setattr(model, method, CrossProbe(dataclasses.replace(model.cfg.cp, inputs=inputs)) if method == "cp" else Temde(dataclasses.replace(model.cfg.temde, inputs=inputs)))
    mod = getattr(model, method)
    rcfg = dataclasses.replace(reranker_config(TrainConfig(), method), epochs=epochs, pretrain_epochs=pre, standalone=bool(alone))
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        rep = train_reranker(model, method, tr, dv, rcfg, Path(d) / "s.pt", seed)
    print("trained", rep["best_epoch"], rep["history"], rep["pretrain"], round(time.time() - t0), flush=True)
    model.eval()
    trained_w = round(float(mod.fusion.beta) / max(1e-6, float(mod.fusion.alpha)), 3)  # the w a checkpoint would carry
    d, t = sweep(model, method, dv), sweep(model, method, te, (trained_w,))
    best = max(d, key=d.get)
    print("dev", d)
    print("test", t)
    print("RESULT", method, inputs, "seed", seed, frac, epochs, pre, alone, "as trained w", trained_w, "test R@1 there", t[trained_w],
          "dev-best w", best, "test R@1", t[best], "TT", t[0], flush=True)


if __name__ == "__main__":
    main()
