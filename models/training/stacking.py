"""Reranker training on realistic shortlists ("dev stacking").

The towers fit their training split closely (docs/research/rerank_experiments.md
§1), so the two-tower shortlist of a training caption is far easier
than a test caption's: its positive is nearly always first, and a reranker
trained there learns to defer to the two-tower score (the fused weights stay
at their initial values). Captions of images the towers never saw have test-
like shortlists. With `dev_stack` > 0 the first `dev_stack` fraction of the dev
images (with all their captions) joins the reranker's training queries, and
model selection uses the remaining dev images only: the test split stays
untouched, as in any stacked second-stage learner.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from crossprobe.models.evaluation.encode import ImageBank, TextBank

Banks = tuple[TextBank, ImageBank, np.ndarray]


def subset(banks: Banks, image_cols) -> Banks:
    """Keep the images `image_cols` (in that order) and the captions whose gold image is among them."""
    text, images, gold = banks
    image_cols = np.asarray(image_cols)
    remap = np.full(len(images.g), -1)
    remap[image_cols] = np.arange(len(image_cols))
    caps = torch.from_numpy(np.nonzero(remap[gold] >= 0)[0])
    T = int(text.mask[caps].sum(1).max())
    cols = torch.from_numpy(image_cols)
    return (
        TextBank(text.tokens[caps][:, :T], text.mask[caps][:, :T], text.g[caps], text.states[caps][:, :T]),
        ImageBank(images.tokens[cols], images.g[cols], images.grids[cols]),
        remap[gold[caps.numpy()]],
    )


def _pad_tokens(x: torch.Tensor, T: int) -> torch.Tensor:
    """Pad dim 1 (tokens) of (N, t, ...) with zeros / False to T."""
    pad = [0, 0] * (x.dim() - 2) + [0, T - x.shape[1]]
    return F.pad(x, pad)


def concat(a: Banks, b: Banks) -> Banks:
    """Captions and images of both; b's gold columns shifted past a's images."""
    (ta, ia, ga), (tb, ib, gb) = a, b
    T = max(ta.mask.shape[1], tb.mask.shape[1])
    text = TextBank(
        torch.cat([_pad_tokens(ta.tokens, T), _pad_tokens(tb.tokens, T)]),
        torch.cat([_pad_tokens(ta.mask, T), _pad_tokens(tb.mask, T)]),
        torch.cat([ta.g, tb.g]),
        torch.cat([_pad_tokens(ta.states, T), _pad_tokens(tb.states, T)]),
    )
    images = ImageBank(torch.cat([ia.tokens, ib.tokens]), torch.cat([ia.g, ib.g]), torch.cat([ia.grids, ib.grids]))
    return text, images, np.concatenate([ga, gb + len(ia.g)])


def stacked(train: Banks, dev: Banks, fraction: float) -> tuple[Banks, Banks]:
    """-> (train + the first `fraction` of dev's images, the rest of dev for selection)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"dev_stack must be in [0, 1): {fraction}")
    if fraction == 0.0:
        return train, dev
    n = len(dev[1].g)
    cut = int(round(fraction * n))
    return concat(train, subset(dev, np.arange(cut))), subset(dev, np.arange(cut, n))
