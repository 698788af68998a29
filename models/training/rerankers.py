"""Stage 2: train a reranker (cp | temde | sm | tv) for the shortlist it will see.

The towers are frozen (their outputs are what the index caches). Hard negatives
come from the two-tower ranking of the training split: each query's candidates
are its positive plus `negatives` images drawn from its top `mine_k` (the
positive excluded), and the loss is listwise cross-entropy over the fused logit
alpha * s_tt + beta * s_rerank. Model selection: dev text->image R@1 at K = dev_k.

`standalone` trains the reranker's own score instead (alpha held at 0) and
chooses the epoch and the fusion weight together on the selection split (`fit_fusion`): on training
captions the towers' score is near-perfect (they fit that split), so a fused
logit learned there mostly learns to defer to it; dev shows the honest mix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from crossprobe.models.cross_probe import CrossProbe, CrossProbeConfig
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import ImageBank, PairScorer, TextBank
from crossprobe.models.evaluation.retrieval import reranked
from crossprobe.models.losses import listwise
from crossprobe.models.temde import merge
from crossprobe.models.training.state import EpochState, atomic_save, seed_everything
from crossprobe.models.training.towers import cosine_schedule

ANCHOR_SCALE = 20.0  # alignment is a mean cosine in [-1, 1]; scaled like a contrastive logit


def fresh_cp(cfg: CrossProbeConfig, seed: int) -> CrossProbe:
    """A CP module initialised from `seed` alone: the frontier and `crossprobe train` build it the
    same way, so the default's CP starts where the frontier's chosen setting started."""
    seed_everything(seed)
    return CrossProbe(cfg)


@dataclass
class RerankTrainConfig:
    epochs: int = 4
    queries: int = 32  # captions per step
    negatives: int = 15
    mine_k: int = 64
    lr: float = 3e-4
    weight_decay: float = 0.02
    captions_per_image: int = 1  # captions drawn per training image per epoch
    dev_k: int = 50
    dev_queries: int = 1000  # dev captions used for selection (first caption of each image)
    dev_stack: float = 0.0  # fraction of dev images whose captions join training (stacking.py); selection on the rest
    pretrain_epochs: int = 0  # in-batch contrastive epochs on the reranker's own score first (ALBEF's ITC before ITM)
    pretrain_batch: int = 64  # captions (of distinct images) per pretraining step: batch^2 pairs scored
    standalone: bool = False  # train the reranker's own score; the fusion weight is fit on the selection split
    # selection captions of a standalone reranker (epoch and fusion weight; all 5 per dev image): t2i R@1 on
    # 1,000 captions moves by ~1.3 points by chance, enough to pick the wrong epoch
    # (docs/research/rerank_experiments.md §5)
    fusion_queries: int = 5000
    # listwise over the whole batch's candidates (pooled_logits): each caption ranks its image against all
    # queries x (1 + negatives) candidates of the step, not only its own 1 + negatives. Free for T-EMDE (a dot
    # product per pair once each side is sketched); a joint scorer (CP) would pay per pair
    pool_negatives: bool = False
    # knowledge distillation from another trained reranker of the same model (e.g. "cp" into T-EMDE): besides the
    # listwise loss, KL(teacher || student) over each caption's candidates, the teacher's residual logit over the
    # two-tower score (its fused logit minus alpha * s_tt) against the student's own, both at temperature distill_tau
    distill_from: str = ""
    distill_weight: float = 0.0
    distill_tau: float = 1.0


# Candidate weights w of the reranker in logit = s_tt + w * s_rerank (fit_fusion); inf = the reranker alone.
FUSION_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, math.inf)


def captions_by_image(gold: np.ndarray) -> dict[int, list[int]]:
    """(C,) gold image column per caption -> image column -> its caption rows."""
    out: dict[int, list[int]] = {}
    for c, i in enumerate(gold):
        out.setdefault(int(i), []).append(c)
    return out


def mine(text: TextBank, images: ImageBank, gold_cols: np.ndarray, k: int) -> np.ndarray:
    """(C,) gold image columns -> (C, k) hardest non-gold image columns by two-tower score."""
    out = np.empty((len(gold_cols), k), dtype=np.int64)
    for s in range(0, len(gold_cols), 2048):
        sc = (text.g[s : s + 2048] @ images.g.T).numpy()
        sc[np.arange(len(sc)), gold_cols[s : s + 2048]] = -np.inf
        out[s : s + 2048] = M.topk(sc, k)
    return out


def train_reranker(
    model,
    method: str,
    train: tuple[TextBank, ImageBank, np.ndarray],
    dev: tuple[TextBank, ImageBank, np.ndarray],
    cfg: RerankTrainConfig,
    state_path,
    seed: int,
    log=print,
) -> dict:
    """Trains getattr(model, method); the towers and other rerankers stay frozen."""
    text, images, gold = train
    if cfg.pool_negatives and method != "temde":
        raise ValueError(
            f"pool_negatives is for T-EMDE (a dot product per pair); {method} would score every pair jointly"
        )
    module, params = _trainable(model, method, cfg)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    cap_by_img = captions_by_image(gold)
    steps = math.ceil(len(cap_by_img) * cfg.captions_per_image / cfg.queries)
    sched = cosine_schedule(opt, cfg.epochs * steps, min(50, steps))
    hard = mine(text, images, gold, cfg.mine_k)
    pre = pretrain_inbatch(
        model, method, train, cfg, state_path.with_name(state_path.stem + ".pretrained.pt"), seed, log
    )
    state = EpochState(state_path, "module")
    start, best, history = state.resume(module.load_state_dict, opt, sched, {"score": -1.0}, method, log)
    # the region term (region_labels.py) sits inside the training logit when the model has a weight for this
    # reranker: it learns what the cells' labels do not already say, instead of being summed with them afterwards
    loss_of = _StepLoss(model, method, cfg, text, images, gold)
    for epoch in range(start, cfg.epochs):
        rng = np.random.default_rng(seed + 1000 + epoch)
        module.train()
        queries = np.array(
            [c for caps in cap_by_img.values() for c in rng.choice(caps, cfg.captions_per_image, replace=False)]
        )
        rng.shuffle(queries)
        total = 0.0
        for s in tqdm(
            range(0, len(queries), cfg.queries), desc=f"{method} epoch {epoch + 1}/{cfg.epochs}", leave=False
        ):
            q = queries[s : s + cfg.queries]
            neg = np.stack([rng.choice(hard[c], cfg.negatives, replace=False) for c in q])
            total += _step(loss_of(q, np.concatenate([gold[q][:, None], neg], 1)), params, opt, sched)  # positive first
        module.eval()
        rec = {"epoch": epoch + 1, "loss": total / steps, **_select(model, method, dev, cfg)}
        history.append(rec)
        log(f"{method} {rec}")
        if rec[f"dev_t2i_R@1@{cfg.dev_k}"] > best["score"]:
            best = {
                "score": rec[f"dev_t2i_R@1@{cfg.dev_k}"],
                "epoch": epoch + 1,
                "weights": {k: v.clone() for k, v in module.state_dict().items()},
                "fusion_w": rec.get("fusion_w"),
            }
        state.save(module.state_dict(), opt, sched, epoch + 1, best, history)
    fusion = _keep_best(model, method, best, dev, cfg, log)
    return {"best_epoch": best["epoch"], "dev_score": best["score"], "history": history, "pretrain": pre, **fusion}


def _trainable(model, method: str, cfg: RerankTrainConfig):
    """Freeze everything but the reranker -> (its module, the parameters its optimiser steps)."""
    module = getattr(model, method)
    for p in model.parameters():
        p.requires_grad_(False)
    for p in module.parameters():
        p.requires_grad_(True)
    if cfg.standalone:  # alpha stays 0 (and out of the optimiser) until fit_fusion sets the mix
        with torch.no_grad():
            module.fusion.alpha.zero_()
    return module, [p for n, p in module.named_parameters() if not (cfg.standalone and n == "fusion.alpha")]


class _StepLoss:
    """The training loss of one step: (Q,) caption rows, (Q, C) candidate image columns (positive first) -> loss.
    Listwise over each caption's candidates (or over the whole step's, pool_negatives), plus distillation from a
    teacher reranker and ACE-RPE's anchor loss where configured."""

    def __init__(self, model, method: str, cfg: RerankTrainConfig, text, images, gold: np.ndarray):
        self.module, self.cfg, self.gold = getattr(model, method), cfg, gold
        self.scorer = PairScorer(model, method, text, images, precompute=False)
        self.teacher = _teacher(model, method, cfg, text, images)
        self.anchor_w = self.module.cfg.ace.anchor_loss if getattr(self.module, "ace", None) is not None else 0.0

    def __call__(self, q: np.ndarray, cand: np.ndarray) -> torch.Tensor:
        cfg, module, scorer = self.cfg, self.module, self.scorer
        if cfg.pool_negatives:
            logits, target = pooled_logits(scorer, module, q, cand, self.gold)
            loss = F.cross_entropy(logits, target)
        else:
            logits = scorer.fused(torch.from_numpy(q), torch.from_numpy(cand), grad=True)
            loss = listwise(logits)
            if (
                self.teacher is not None
            ):  # residuals over the two-tower logit on both sides (alpha is 0 when standalone)
                own = logits - module.fusion.alpha * scorer.tt(torch.from_numpy(q), torch.from_numpy(cand))
                loss = loss + cfg.distill_weight * distill_loss(own, self.teacher, q, cand, cfg.distill_tau)
        if self.anchor_w:  # ACE-RPE's anchor loss: the alignment should rank the positive first too
            assert module.alignment is not None and module.alignment.shape == logits.shape
            loss = loss + self.anchor_w * listwise(ANCHOR_SCALE * module.alignment)
        return loss


def _select(model, method: str, dev, cfg: RerankTrainConfig) -> dict:
    """An epoch's selection score on dev (and, standalone, the fusion weight chosen with it)."""
    if cfg.standalone:  # epoch and mix chosen together on fusion_queries dev captions
        w, score = fit_fusion(model, method, dev, cfg, queries=cfg.fusion_queries)
        return {"fusion_w": w, f"dev_t2i_R@1@{cfg.dev_k}": score}
    return {f"dev_t2i_R@1@{cfg.dev_k}": dev_score(model, method, dev, cfg)}


def _keep_best(model, method: str, best: dict, dev, cfg: RerankTrainConfig, log) -> dict:
    """The best epoch's weights (and, standalone, its fusion weight) back into the model; every parameter trainable
    again -> the fusion facts for the report."""
    module = getattr(model, method)
    module.load_state_dict(best["weights"])
    fusion = {}
    if cfg.standalone:
        w = best["fusion_w"]
        set_fusion(module.fusion, w)
        fusion = {
            "fusion_w": w,
            f"fusion_dev_t2i_R@1@{cfg.dev_k}": best["score"],
            "fusion_queries": int(min(len(dev[2]), cfg.fusion_queries)),
        }
        log(f"{method} fusion {fusion}")
    for p in model.parameters():
        p.requires_grad_(True)
    return fusion


def _teacher(model, method: str, cfg: RerankTrainConfig, text, images) -> PairScorer | None:
    """The distillation teacher's scorer over the training banks (its per-caption and per-image parts once)."""
    if not (cfg.distill_from and cfg.distill_weight > 0):
        return None
    if cfg.distill_from == method:
        raise ValueError(f"{method} cannot distill from itself")
    getattr(model, cfg.distill_from).eval()  # the teacher as it serves: no dropout
    with torch.inference_mode():
        return PairScorer(model, cfg.distill_from, text, images, region=False)


def distill_loss(
    student: torch.Tensor, teacher: PairScorer, q: np.ndarray, cand: np.ndarray, tau: float
) -> torch.Tensor:
    """(Q, C) the student's residual logits over the two-tower score -> KL(teacher || student) over each row's
    candidates, the teacher's residual as the target (tau^2-scaled, as Hinton et al.)."""
    qt, ct = torch.from_numpy(q), torch.from_numpy(cand)
    with torch.inference_mode():
        fused = teacher.fused(qt, ct)
        resid = fused - float(getattr(teacher.model, teacher.method).fusion.alpha) * teacher.tt(qt, ct)
    target = F.softmax(resid.clone() / tau, -1)
    return tau * tau * F.kl_div(F.log_softmax(student / tau, -1), target, reduction="batchmean")


def pooled_logits(scorer: PairScorer, module, q: np.ndarray, cand: np.ndarray, gold: np.ndarray):
    """(Q,) caption rows, (Q, C) image columns (each row's positive first) -> ((Q, Q*C) fused logits, (Q,) target):
    every caption against every candidate of the step. A column showing the caption's own image other than its
    positive (a sibling caption's positive, or another query's hard negative) is masked out: it is not a negative."""
    Q, C = cand.shape
    flat = cand.reshape(-1)
    qp = scorer.query_parts(torch.from_numpy(q))
    ip = tuple(x[None].expand(Q, *x.shape) for x in scorer.item_parts(torch.from_numpy(flat)))  # once per column
    s_tt = scorer.text.g[torch.from_numpy(q)] @ scorer.images.g[torch.from_numpy(flat)].T  # (Q, Q*C)
    logits = module.rerank(*qp, *ip, s_tt)
    target = torch.arange(Q) * C  # row i's positive is column i*C
    own = torch.from_numpy(flat[None, :] == gold[q][:, None])
    own[torch.arange(Q), target] = False
    return logits.masked_fill(own, float("-inf")), target


def pretrain_inbatch(model, method: str, train, cfg: RerankTrainConfig, done_path, seed: int, log=print) -> list[dict]:
    """Teach the reranker to rank on its own before it learns a residual over the two-tower score.

    Trained only on mined shortlists, with the two-tower score in its logit, a reranker
    gets almost no signal on a training split the towers already fit, and alone it ranks
    almost nothing first (docs/research/rerank_experiments.md §1). Here each step scores every caption
    against every image of a batch of `pretrain_batch` distinct images (batch^2 pairs)
    with the reranker's own score and a symmetric InfoNCE, as the towers are trained.
    Cached in done_path once finished (the main stage then resumes on its own)."""
    module = getattr(model, method)
    if cfg.pretrain_epochs <= 0:
        return []
    if done_path.exists():
        st = torch.load(done_path, weights_only=False)
        module.load_state_dict(st["module"])
        return st["history"]
    text, images, gold = train
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    cap_by_img = captions_by_image(gold)
    imgs = np.array(sorted(cap_by_img))
    steps = len(imgs) // cfg.pretrain_batch
    sched = cosine_schedule(opt, cfg.pretrain_epochs * steps, min(50, steps))
    scorer = PairScorer(model, method, text, images, precompute=False, region=False)
    target = torch.arange(cfg.pretrain_batch)
    history = []
    for epoch in range(cfg.pretrain_epochs):
        rng = np.random.default_rng(seed + 2000 + epoch)
        order = rng.permutation(imgs)
        module.train()
        total = 0.0
        for s in tqdm(
            range(steps), desc=f"{method} in-batch pretraining {epoch + 1}/{cfg.pretrain_epochs}", leave=False
        ):
            batch = order[s * cfg.pretrain_batch : (s + 1) * cfg.pretrain_batch]
            q = torch.from_numpy(np.array([rng.choice(cap_by_img[int(i)]) for i in batch]))
            B = len(batch)
            # per-caption and per-image parts once each, then every caption x every image of the batch
            qp = scorer.query_parts(q)
            ip = tuple(x[None].expand(B, *x.shape) for x in scorer.item_parts(torch.from_numpy(batch)))
            logits = module.rerank(*qp, *ip, torch.zeros(B, B))  # (B, B): the reranker's own score x beta
            loss = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))
            total += _step(loss, params, opt, sched)
        history.append({"epoch": epoch + 1, "loss": total / max(1, steps)})
        log(f"{method} pretrain {history[-1]}")
    module.eval()
    atomic_save({"module": module.state_dict(), "history": history}, done_path)
    return history


def _step(loss: torch.Tensor, params, opt, sched) -> float:
    """One optimiser step (gradients clipped at norm 2) -> the loss value."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 2.0)
    opt.step()
    sched.step()
    return loss.item()


def _selection_rows(gold: np.ndarray, cfg: RerankTrainConfig) -> np.ndarray:
    """Dev queries used for selection: the first caption of each image, or every caption of a
    small selection split (dev stacking), at most dev_queries."""
    first = np.unique(gold, return_index=True)[1]
    if len(first) < cfg.dev_queries:
        first = np.arange(min(len(gold), cfg.dev_queries))
    return first[: cfg.dev_queries]


@torch.inference_mode()
def fit_fusion(model, method: str, dev, cfg: RerankTrainConfig, queries: int | None = None) -> tuple[float, float]:
    """For a reranker trained standalone (its fusion alpha = 0): the weight w in
    logit = s_tt + w * s_rerank that maximises selection-split t2i R@1 at K = dev_k
    -> (w, that R@1). Queries: the selection rows of dev_score, or the first `queries`
    captions of the split. Ties go to the smaller w (the cheaper claim)."""
    text, images, gold = dev
    rows = _selection_rows(gold, cfg) if queries is None else np.arange(min(len(gold), queries))
    S = (text.g[rows] @ images.g.T).numpy()
    cand = M.topk(S, cfg.dev_k)
    stt = np.take_along_axis(S, cand, 1)
    f = getattr(model, method).fusion
    qt, ct = torch.from_numpy(rows), torch.from_numpy(cand)
    fused = PairScorer(model, method, text, images, region=False).fused(qt, ct).numpy()
    s = (fused - float(f.alpha) * stt) / float(f.beta)  # the reranker's own score
    region = 0.0  # the region term at its weight, in units of s_tt (it was in the training logit: it stays in)
    if model.cfg.region.weight(method) > 0:
        region = (PairScorer(model, method, text, images).fused(qt, ct).numpy() - fused) / 20.0
    alone = s * float(f.beta) / 20.0  # w = inf keeps the trained beta (set_fusion): its logit over 20, as region's
    r1 = {
        w: M.summarize(
            M.t2i_ranks(M.apply_rerank(S, cand, (alone if math.isinf(w) else stt + w * s) + region), gold[rows])
        )["R@1"]
        for w in FUSION_GRID
    }
    w = max(FUSION_GRID, key=lambda x: (r1[x], -x))
    return w, r1[w]


def fit_merged_temde(model, members, dev, cfg: RerankTrainConfig) -> tuple[float, float]:
    """model.temde = the trained T-EMDE members merged (temde.merge: the score is their mean), its fusion weight fit
    on cfg.fusion_queries dev captions as a standalone reranker's is -> (w, that R@1)."""
    model.temde = merge(members)
    set_fusion(model.temde.fusion, 1.0)  # fit_fusion reads the merged module's own score through any fusion
    w, r1 = fit_fusion(model, "temde", dev, cfg, queries=cfg.fusion_queries)
    set_fusion(model.temde.fusion, w)
    return w, r1


def set_fusion(fusion, w: float) -> None:
    """logit = s_tt + w * s_rerank, kept at the two-tower logit scale (alpha = 20)."""
    with torch.no_grad():
        if math.isinf(w):
            fusion.alpha.zero_()
        else:
            fusion.alpha.fill_(20.0)
            fusion.beta.fill_(20.0 * w)


@torch.inference_mode()
def dev_score(model, method: str, dev, cfg: RerankTrainConfig) -> float:
    """Dev text->image R@1 after reranking the top dev_k (first caption per image)."""
    text, images, gold = dev
    scores = (text.g @ images.g.T).numpy()
    first = _selection_rows(gold, cfg)
    scorer = PairScorer(model, method, text, images)
    return reranked(scorer, scores, gold, cfg.dev_k, [cfg.dev_k], query_rows=first)[cfg.dev_k]["t2i"]["R@1"]
