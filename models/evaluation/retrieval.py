"""The evaluation protocol on a Flickr8k split (1,000 images x 5 captions).

Text->image: each caption ranks the split's images. Image->text: each image
ranks the split's captions; its rank is the best of its 5 captions. A reranker
at K reorders the first stage's top K; everything below K keeps its two-tower
order, so the first stage's recall@K is the ceiling of any reranker at K.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import ImageBank, PairScorer, TextBank, encode_images, encode_texts


def split_banks(model, data, split: str) -> tuple[TextBank, ImageBank, np.ndarray]:
    """Encode a split -> text bank, image bank, (C,) gold image column per caption."""
    img_rows = data.split_images(split)
    cap_rows = data.split_captions(split)
    col = {r: i for i, r in enumerate(img_rows)}
    gold = np.array([col[data.ds.caption_image[j]] for j in cap_rows])
    text = encode_texts(model, data.states, data.masks, cap_rows)
    images = encode_images(model, data.grids, img_rows)
    return text, images, gold


def tt_scores(text: TextBank, images: ImageBank) -> np.ndarray:
    return (text.g @ images.g.T).numpy()


def both_directions(scores: np.ndarray, gold: np.ndarray) -> dict:
    t2i = M.summarize(M.t2i_ranks(scores, gold))
    i2t = M.summarize(M.i2t_ranks(scores, gold))
    return {"t2i": t2i, "i2t": i2t, "rsum": M.rsum(t2i, i2t)}


@torch.inference_mode()
def evaluate_tt(model, data, split: str) -> dict:
    text, images, gold = split_banks(model, data, split)
    return both_directions(tt_scores(text, images), gold)


def shortlist_recall(scores: np.ndarray, gold: np.ndarray, k: int) -> float:
    """Percent of captions whose gold image is in the first stage's top k (the reranker ceiling)."""
    return float(100 * (M.t2i_ranks(scores, gold) < k).mean())


def reranked(
    scorer: PairScorer,
    scores: np.ndarray,
    gold: np.ndarray,
    k_max: int,
    ks: list[int],
    query_rows: np.ndarray | None = None,
    i2t: bool = True,
) -> dict[int, dict]:
    """Rerank each caption's top k_max images once (and, with i2t, each image's top
    k_max captions); results at smaller K reuse the same pair scores within the top K.

    query_rows restricts text->image to a subset of captions (for the costly references)."""
    rows = np.arange(len(scores)) if query_rows is None else np.asarray(query_rows)
    s = scores[rows]
    cand = M.topk(s, k_max)  # (R, k_max) image columns
    fused = scorer.fused(torch.from_numpy(rows), torch.from_numpy(cand)).numpy()
    fused_i2t: np.ndarray | None = None
    caps_of: np.ndarray | None = None
    if i2t:  # each image's top k_max captions, scored by the same pair scorer
        caps_of = M.topk(scores.T, k_max)  # (I, k_max) caption rows
        img_cols = np.repeat(np.arange(scores.shape[1])[:, None], k_max, 1)
        pair = scorer.fused(torch.from_numpy(caps_of.reshape(-1)), torch.from_numpy(img_cols.reshape(-1, 1)))
        fused_i2t = pair.numpy().reshape(caps_of.shape)
    out = {}
    for k in ks:
        res: dict[str, Any] = {
            "t2i": M.summarize(M.t2i_ranks(M.apply_rerank(s, cand[:, :k], fused[:, :k]), gold[rows]))
        }
        if caps_of is not None and fused_i2t is not None:  # both set exactly when i2t
            st = M.apply_rerank(scores.T, caps_of[:, :k], fused_i2t[:, :k]).T
            res["i2t"] = M.summarize(M.i2t_ranks(st, gold))
            res["rsum"] = M.rsum(res["t2i"], res["i2t"])
        out[k] = res
    return out


def full_matrix(scorer: PairScorer, n_captions: int, n_images: int, chunk: int = 50) -> np.ndarray:
    """Fused reranker logits for every caption x image pair (the reranker alone, no shortlist)."""
    out = np.empty((n_captions, n_images), dtype=np.float32)
    cols = torch.arange(n_images)
    for s in range(0, n_captions, chunk):
        rows = torch.arange(s, min(n_captions, s + chunk))
        out[rows.numpy()] = scorer.fused(rows, cols.expand(len(rows), -1)).numpy()
    return out
