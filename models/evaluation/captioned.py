"""Any model's retrieval on a captioned folder, through the inference seam: `crossprobe eval --data PATH --model SPEC`.

The model runs as it serves (Backend.preprocessor, encode_images, encode_texts, rerank: the service's own code
path, features at full precision), so the numbers are those of the model a spec names, whatever its family.

Definitions, the same as clip-benchmark's zero-shot retrieval and crossprobe's Flickr8k protocol (retrieval.py):
  text->image   each caption ranks every image of the split; a hit at k when its image is in the top k
  image->text   each image ranks every caption of the split; a hit at k when any of its captions is in the top k
R@1 / R@5 / R@10 in percent, median rank, MRR. A model with rerankers: each reorders the two-tower top K (default
100; every image when the split has fewer) in both directions, and below K the two-tower order stays, so the
shortlist's recall at K (reported) is the ceiling. Ties: metrics.py counts an item scoring exactly the gold's score
as ranked above it; clip-benchmark's torch.topk orders exact ties by position instead, so the report counts the
queries with an exact tie at their gold's score ("exact_ties"), the only ones where the two can disagree.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from tqdm import tqdm

from crossprobe.core.inference.base import Backend, ImageFeatures, QueryVectors
from crossprobe.core.inference.decode import DEFAULT_MAX_PIXELS, Unreadable, decode_file
from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.models.evaluation import metrics as M


def encode_images(
    backend: Backend, folder: CaptionedFolder, rows: list[int], batch: int = 32
) -> tuple[ImageFeatures | None, list[int], Counter[str]]:
    """The images of `rows` -> (their features, the rows that decoded, the others' reasons)."""
    prep, size = backend.preprocessor(), backend.image_size
    parts: list[ImageFeatures] = []
    kept: list[int] = []
    skipped: Counter[str] = Counter()
    for s in tqdm(range(0, len(rows), batch), desc="images", leave=False):
        pixels = []
        for r in rows[s : s + batch]:
            # decoded as the indexer decodes for this model (its reference's way: core/inference/decode.py)
            got = decode_file(str(folder.image_path(r)), DEFAULT_MAX_PIXELS, prep, size, backend.reduced_decoding)
            if isinstance(got, Unreadable):
                skipped[got.reason] += 1
            else:
                pixels.append(got[0])
                kept.append(r)
        if pixels:
            parts.append(backend.encode_images(np.stack(pixels)))

    def cat(name: str):
        return None if getattr(parts[0], name) is None else np.concatenate([getattr(p, name) for p in parts])

    feats = ImageFeatures(*(cat(n) for n in ("g", "p_v", "b_bar", "s_i", "labels"))) if parts else None
    return feats, kept, skipped


def encode_texts(backend: Backend, captions: list[str], batch: int = 64) -> list[QueryVectors]:
    return [
        q
        for s in tqdm(range(0, len(captions), batch), desc="captions", leave=False)
        for q in backend.encode_texts(captions[s : s + batch])
    ]


def candidates(feats: ImageFeatures, cols: np.ndarray) -> dict[str, np.ndarray]:
    """The item features of image columns `cols`, as the feature store gives a shortlist's to Backend.rerank."""
    out = {"p_v": feats.p_v[cols], "b_bar": feats.b_bar[cols], "s_i": feats.s_i[cols]}
    if feats.labels is not None:
        out["labels"] = feats.labels[cols]
    return out


def reranked_ranks(
    backend: Backend,
    kind: str,
    queries: list[QueryVectors],
    feats: ImageFeatures,
    scores: np.ndarray,
    gold: np.ndarray,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(C, I) two-tower scores -> (t2i ranks (C,), i2t ranks (I,)) after `kind` reorders each top k."""
    cand = M.topk(scores, k)  # (C, k) each caption's shortlist
    fused = np.stack(
        [
            backend.rerank(kind, q, candidates(feats, c), scores[j, c])
            for j, (q, c) in enumerate(zip(tqdm(queries, desc=kind, leave=False), cand))
        ]
    )
    t2i = M.t2i_ranks(M.apply_rerank(scores, cand, fused), gold)
    caps_of = M.topk(scores.T, k)  # (I, k) each image's caption shortlist
    fused_i2t = np.zeros(caps_of.shape)
    by_caption: dict[int, list[tuple[int, int]]] = {}
    for i, row in enumerate(caps_of):
        for slot, c in enumerate(row):
            by_caption.setdefault(int(c), []).append((i, slot))
    for c, where in by_caption.items():  # one scorer run per caption, over the images that shortlisted it
        imgs = np.array([i for i, _ in where])
        logits = backend.rerank(kind, queries[c], candidates(feats, imgs), scores[c, imgs])
        for (i, slot), v in zip(where, logits):
            fused_i2t[i, slot] = v
    i2t = M.i2t_ranks(M.apply_rerank(scores.T, caps_of, fused_i2t).T, gold)
    return t2i, i2t


def exact_ties(scores: np.ndarray, gold: np.ndarray) -> dict[str, int]:
    """Queries with another item at exactly the gold's score (text->image), images with a caption tied exactly with
    their best caption (image->text): where tie rules (ours, torch.topk's) can give different ranks."""
    g = scores[np.arange(len(scores)), gold][:, None]
    t2i = int(((scores == g).sum(1) > 1).sum())
    i2t = 0
    for i in range(scores.shape[1]):
        mine = scores[gold == i, i]
        if len(mine):
            i2t += int((scores[:, i] == mine.max()).sum() > 1)
    return {"t2i": t2i, "i2t": i2t}


def evaluate(backend: Backend, folder: CaptionedFolder, split: str, k: int = 100) -> dict:
    """The split's retrieval numbers (module docstring) for `backend`'s model."""
    img_rows, cap_rows = folder.rows(split)
    if not img_rows:
        raise ValueError(
            f"{folder.root}: no images in split {split!r} (captions per split: {folder.split_counts()}; "
            f"--split all takes every line)"
        )
    feats, kept, skipped = encode_images(backend, folder, img_rows)
    if feats is None:
        raise ValueError(f"{folder.root}: no image of split {split!r} could be read ({dict(skipped)})")
    col = {r: c for c, r in enumerate(kept)}
    caps = [j for j in cap_rows if folder.caption_image[j] in col]
    gold = np.array([col[folder.caption_image[j]] for j in caps])
    queries = encode_texts(backend, [folder.captions[j] for j in caps])
    scores = np.stack([q.g_q for q in queries]) @ feats.g.T  # (C, I) two-tower cosines
    k = min(k, scores.shape[1])
    out = {
        "images": len(kept),
        "captions": len(caps),
        "unreadable_images": dict(skipped),
        "captions_of_unreadable_images": len(cap_rows) - len(caps),
        "bad_lines": folder.bad_summary(),
        "TT": {"t2i": M.summarize(M.t2i_ranks(scores, gold)), "i2t": M.summarize(M.i2t_ranks(scores, gold))},
        "exact_ties": exact_ties(scores, gold),
    }
    if backend.rerankers:
        out[f"shortlist_recall@{k}"] = float(100 * (M.t2i_ranks(scores, gold) < k).mean())
    for kind in backend.rerankers:
        t2i, i2t = reranked_ranks(backend, kind, queries, feats, scores, gold, k)
        out[f"{kind.upper()}@{k}"] = {"t2i": M.summarize(t2i), "i2t": M.summarize(i2t)}
    return out
