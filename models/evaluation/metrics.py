"""Retrieval metrics on a caption x image score matrix.

Ranks are 0-based and pessimistic on ties: an item tied with the correct one
counts as ranked above it, so a constant scorer gets the worst rank, never the best.
"""

from __future__ import annotations

import numpy as np

TOP_BOOST = 1e6  # reranked candidates are lifted above every first-stage score


def t2i_ranks(scores: np.ndarray, caption_image: np.ndarray) -> np.ndarray:
    """(C, I) scores, (C,) gold image column -> (C,) rank of the gold image."""
    gold = scores[np.arange(len(scores)), caption_image][:, None]
    return (scores >= gold).sum(1) - 1


def i2t_ranks(scores: np.ndarray, caption_image: np.ndarray) -> np.ndarray:
    """(C, I) scores -> (I,) best rank among each image's captions when the image
    ranks all C captions."""
    s = scores.T  # (I, C)
    I = s.shape[0]  # noqa: E741 - the papers' notation: I images
    best = np.full(I, np.iinfo(np.int64).max)
    for c, i in enumerate(caption_image):
        r = int((s[i] >= s[i, c]).sum() - 1)
        best[i] = min(best[i], r)
    return best


def summarize(ranks: np.ndarray) -> dict[str, float]:
    """R@1/5/10 in percent, median rank (1-based), MRR (0..1)."""
    ranks = np.asarray(ranks)
    return {
        "R@1": float(100 * (ranks < 1).mean()),
        "R@5": float(100 * (ranks < 5).mean()),
        "R@10": float(100 * (ranks < 10).mean()),
        "medr": float(np.median(ranks + 1)),
        "MRR": float((1.0 / (ranks + 1)).mean()),
    }


def rsum(t2i: dict, i2t: dict) -> float:
    return sum(d[k] for d in (t2i, i2t) for k in ("R@1", "R@5", "R@10"))


def topk(scores: np.ndarray, k: int) -> np.ndarray:
    """(R, N) -> (R, k) column indices of each row's k best, best first."""
    k = min(k, scores.shape[1])
    idx = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, idx, 1), axis=1, kind="stable")
    return np.take_along_axis(idx, order, 1)


def apply_rerank(scores: np.ndarray, cand: np.ndarray, rerank_scores: np.ndarray) -> np.ndarray:
    """Reorder each row's shortlist `cand` (R, K) by `rerank_scores` (R, K); every
    item below the shortlist keeps its first-stage order beneath it."""
    out = scores.astype(np.float64, copy=True)
    np.put_along_axis(out, cand, TOP_BOOST + rerank_scores.astype(np.float64), 1)
    return out


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, caption_image: np.ndarray, resamples: int = 10_000, seed: int = 0
) -> dict:
    """(C,) per-caption hits of two rankers on the same captions -> their R@1 difference a - b in points, with a
    95% interval from a paired bootstrap over the gold images (a caption's siblings move together: they share an
    image, so resampling captions one by one would understate the spread). Per-image sums suffice, so each
    resample is one gather over the images, not over the captions."""
    d = a.astype(float) - b.astype(float)
    n_img = int(caption_image.max()) + 1
    imgs = np.unique(caption_image)  # only images that have captions (a gallery may hold distractors)
    caps = np.bincount(caption_image, minlength=n_img)[imgs]
    per_image = np.bincount(caption_image, weights=d, minlength=n_img)[imgs]
    pick = np.random.default_rng(seed).integers(0, len(imgs), (resamples, len(imgs)))
    boot = 100 * per_image[pick].sum(1) / caps[pick].sum(1)
    return {
        "diff": round(100 * d.mean(), 2),
        "ci95": [round(float(x), 2) for x in np.percentile(boot, [2.5, 97.5])],
        "p_boot_le_0": round(float((boot <= 0).mean()), 4),
        "discordant_captions": int((d != 0).sum()),
        "net_captions": int(d.sum()),
    }
