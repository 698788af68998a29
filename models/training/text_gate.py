"""Fit the text gate (core/text_gate.py): `crossprobe fit-text-gate` -> models/checkpoints/text_gate/.

A logistic regression over each cell of the backbone's 7 x 7 grid, on Flickr8k train photos only:
- the generated signs (text_gate_sets.make_signs, which says where each sign is): a cell covered >= MIN_COVER is
  positive, an uncovered one negative, every cell of a photo left as it is negative;
- the real writing full OCR (rapidocr, the ocr extra) reads in `real` other train photos, and the lines of the
  generated documents and screens (text_gate_sets.make_documents): a cell a line crosses by >= LINE_COVER is
  positive (a line is thin: it covers a cell less than a whole sign does);
- cells covered less than that but not at all are left out. Features standardised, L2, classes balanced, L-BFGS.
The threshold is chosen on dev: the probe passes as many of the dev split's photos without a sign as rapidocr's
detector at 480 px (the gate it replaced) passes, so OCR reads as many photos as before; or a given pass rate.
Everything is cached under the work folder (sets, OCR, grids), so a rerun takes seconds and gives the same bytes.
research/text_search/feature_gate.py measures the gate it gives (recall on dev and test, documents, the curve).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crossprobe.core import inputs
from crossprobe.core.text_gate import TextGate, TextGateConfig

MIN_COVER = 0.3
LINE_COVER = 0.1  # a line of text is thin: a cell it crosses is covered less than by a whole sign
G = inputs.GRID


@dataclass
class GateFitConfig:
    workdir: Path = Path("artifacts/text-gate")  # generated sets, OCR and grid caches
    signs: int = 500  # train photos given a sign (and as many left as they are)
    dev_signs: int = 200  # the same on dev, where the threshold is chosen
    documents: int = 400  # generated train documents and screens (0: none)
    real: int = 2000  # train photos whose real writing full OCR reads (0: none)
    l2: float = 0.1
    pass_pct: float | None = None  # None: the detector gate's pass rate on dev
    seed: int = 0


def cell_cover(box: list[float]) -> np.ndarray:
    """[x, y, w, h, W, H] -> (49,) the share of each grid cell the box covers (the grid is the squashed photo)."""
    x, y, w, h, W, H = box
    cover = np.zeros((G, G))
    for r in range(G):
        for c in range(G):
            x0, x1 = c * W / G, (c + 1) * W / G
            y0, y1 = r * H / G, (r + 1) * H / G
            ix = max(0.0, min(x1, x + w) - max(x0, x))
            iy = max(0.0, min(y1, y + h) - max(y0, y))
            cover[r, c] = ix * iy / ((x1 - x0) * (y1 - y0))
    return cover.reshape(-1)


def lines_cover(path: Path, boxes: list[list[float]]) -> np.ndarray:
    """A picture's text lines [x0, y0, x1, y1] -> (49,) each cell's largest share covered by one of them."""
    from PIL import Image

    W, H = Image.open(path).size
    cover = np.zeros(G * G)
    for x0, y0, x1, y1 in boxes:
        cover = np.maximum(cover, cell_cover([x0, y0, x1 - x0, y1 - y0, W, H]))
    return cover


def sign_set(folder: Path) -> tuple[list[str], list[Path], np.ndarray, np.ndarray]:
    """A make_signs folder -> (names, paths, has a sign (n,), (n, 49) cover), in name order."""
    truth = json.loads((folder / "truth.json").read_text())
    boxes = json.loads((folder / "boxes.json").read_text())
    names = sorted(truth)
    cover = np.stack([cell_cover(boxes[n]) if n in boxes else np.zeros(G * G) for n in names])
    return names, [folder / "images" / n for n in names], np.asarray([bool(truth[n]) for n in names]), cover


def document_set(folder: Path) -> tuple[list[Path], np.ndarray]:
    """A make_documents folder -> (paths, (n, 49) cover of their lines)."""
    boxes = json.loads((folder / "boxes.json").read_text())
    paths = [folder / "images" / n for n in sorted(boxes)]
    return paths, np.stack([lines_cover(p, boxes[p.name]) for p in paths])


def grids(paths: list[Path], cache: Path) -> np.ndarray:
    """(n, 49, 1280) float32 backbone grids, cached in `cache` (.npy, resumable)."""
    from crossprobe.models.data.features import cache_images

    cache.parent.mkdir(parents=True, exist_ok=True)
    return np.asarray(cache_images(paths, cache, desc=cache.stem), np.float32)


_ENGINE = None
_DETECTOR = None


def _ocr(path: str) -> list[tuple[list, str]]:
    """Full OCR (no gate, rapidocr's defaults) of one photo -> (quad, text) of each line read with score >= 0.5."""
    global _ENGINE
    if _ENGINE is None:
        from rapidocr_onnxruntime import RapidOCR

        _ENGINE = RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1)
    from PIL import Image

    result, _ = _ENGINE(np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB"))[:, :, ::-1]))
    return [(quad, text) for quad, text, score in result or [] if float(score) >= 0.5 and text.strip()]


def ocr_boxes(path: str) -> list[list[float]]:
    """-> [x0, y0, x1, y1] of each line of 2+ characters full OCR reads."""
    return [[*np.min(q, 0).tolist(), *np.max(q, 0).tolist()] for q, text in _ocr(path) if len(text.strip()) >= 2]


def ocr_text(path: str) -> str:
    """-> the words full OCR reads in the photo."""
    return " ".join(text for _, text in _ocr(path))


def detector_passes(path: str) -> bool:
    """The gate the indexer ran before this one: rapidocr's detector alone at a longer side of 480 px."""
    global _DETECTOR
    if _DETECTOR is None:
        from rapidocr_onnxruntime import RapidOCR

        _DETECTOR = RapidOCR(
            intra_op_num_threads=1, inter_op_num_threads=1, det_limit_side_len=480, det_limit_type="max"
        )
    from PIL import Image

    boxes, _ = _DETECTOR(
        np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB"))[:, :, ::-1]),
        use_det=True,
        use_cls=False,
        use_rec=False,
    )
    return bool(boxes)


def cached(path: Path, keys: list[str], fn) -> dict:
    """{key: fn(key)} for every key, the ones not in the JSON cache at `path` computed on two processes."""
    from multiprocessing import Pool

    from crossprobe.core.atomic import atomic_write

    have = json.loads(path.read_text()) if path.exists() else {}
    todo = [k for k in keys if k not in have]
    if todo:
        with Pool(2) as pool:
            have.update(zip(todo, pool.map(fn, todo, chunksize=8)))
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(have))
    return have


def real_writing(n: int, exclude: set[str], cache: Path) -> tuple[list[Path], np.ndarray]:
    """n Flickr8k train photos outside `exclude`, read by full OCR (cached in `cache`): the real writing in them
    (shirts, shop signs, banners) as cell cover of the lines OCR read -> (paths, (n, 49) cover)."""
    from crossprobe.models.data.flickr8k import Flickr8k

    ds = Flickr8k.load()
    paths = [ds.image_path(r) for r in ds.splits["train"] if ds.images[r] not in exclude][:n]
    boxes = cached(cache, [str(p) for p in paths], ocr_boxes)
    return paths, np.stack([lines_cover(p, boxes[str(p)]) for p in paths])


def training_cells(feats: np.ndarray, cover: np.ndarray, positive: float) -> tuple[np.ndarray, np.ndarray]:
    """(n, 49, 1280) grids, (n, 49) cover -> the cells to train on and their labels."""
    x, c = feats.reshape(-1, inputs.IMAGE_FEAT_DIM), cover.reshape(-1)
    keep = (c >= positive) | (c == 0)
    return x[keep], c[keep] >= positive


def fit_probe(x: np.ndarray, y: np.ndarray, l2: float) -> dict:
    """Logistic regression on standardised features, classes balanced, L-BFGS -> {"mu", "sd", "w", "b"}."""
    import torch

    mu, sd = x.mean(0), x.std(0) + 1e-6
    xt = torch.from_numpy((x - mu) / sd)
    yt = torch.from_numpy(y.astype(np.float32))
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    pos = float(y.mean())
    weight = torch.where(yt > 0, 0.5 / pos, 0.5 / (1 - pos))  # balanced classes: positives are ~3% of cells
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        z = xt @ w + b
        loss = (weight * torch.nn.functional.binary_cross_entropy_with_logits(z, yt, reduction="none")).mean()
        loss = loss + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return {"mu": mu, "sd": sd, "w": w.detach().numpy(), "b": float(b.detach())}


def train_probe(
    signs: Path, documents: Path | None, real: int, l2: float, cache: Path, log=print
) -> tuple[TextGate, dict]:
    """The probe on a train sign set, its photos' real writing (real photos; 0: none) and a document set (None:
    none) -> (the gate at threshold 0.5, {"train_cells", "train_positive_cells"})."""
    names, paths, _, cover = sign_set(signs)
    parts = [(grids(paths, cache / "signs-train.npy"), cover, MIN_COVER)]
    if real:
        rpaths, rcover = real_writing(real, {n.split("_", 1)[1] for n in names}, cache / f"real-train-{real}.json")
        parts.append((grids(rpaths, cache / f"real-train-{real}.npy"), rcover, LINE_COVER))
        log(f"real writing: {int((rcover.max(1) > 0).sum())} of {real} train photos")
    if documents is not None:
        dpaths, dcover = document_set(documents)
        parts.append((grids(dpaths, cache / "documents-train.npy"), dcover, LINE_COVER))
    x, y = map(np.concatenate, zip(*(training_cells(f, c, m) for f, c, m in parts)))
    probe = fit_probe(x, y, l2)
    gate = TextGate.from_standardised(probe["w"], probe["b"], probe["mu"], probe["sd"], TextGateConfig(0.5))
    return gate, {"train_cells": int(len(y)), "train_positive_cells": int(y.sum())}


def threshold_at(scores: np.ndarray, pass_rate: float) -> float:
    """The threshold at which this share (0 to 1) of the photos' scores passes."""
    return float(np.quantile(scores, 1 - pass_rate))


def dev_photos(signs: Path) -> tuple[list[Path], np.ndarray]:
    """The dev split as the threshold sees it: a dev sign set's photos and the rest of the split's photos, in id
    order (the sign set's names, f8k/<name> for the others) -> (paths, (n,) without a sign)."""
    from crossprobe.models.data.flickr8k import Flickr8k

    ds = Flickr8k.load()
    names, spaths, has_sign, _ = sign_set(signs)
    used = {n.split("_", 1)[1] for n in names}
    rows = {n: (p, not s) for n, p, s in zip(names, spaths, has_sign)}
    rows.update({f"f8k/{ds.images[i]}": (ds.image_path(i), True) for i in ds.splits["dev"] if ds.images[i] not in used})
    ids = sorted(rows)
    return [rows[i][0] for i in ids], np.asarray([rows[i][1] for i in ids])


def choose_threshold(
    gate: TextGate, paths: list[Path], plain: np.ndarray, cache: Path, pass_pct: float | None
) -> tuple[float, dict]:
    """The dev photos without a sign -> (threshold, how it was chosen): the probe passes as many of them as the
    detector gate (pass_pct None), or pass_pct % of them."""
    score = gate.cells(grids(paths, cache / "dev.npy")).max(1)[plain]
    det = cached(cache / "detector-dev.json", [str(p) for p in paths], detector_passes)
    detector = np.asarray([det[str(p)] for p in paths])[plain]
    rate = detector.mean() if pass_pct is None else pass_pct / 100
    t = threshold_at(score, rate)
    rule = (
        "the probe passes as many of the dev split's photos without a sign as the detector gate"
        if pass_pct is None
        else f"the probe passes {pass_pct:g}% of the dev split's photos without a sign"
    )
    return t, {
        "threshold_rule": rule,
        "dev": {
            "photos_without_sign": int(plain.sum()),
            "pass_%": round(100 * float((score >= round(t, 4)).mean()), 1),
            "detector_pass_%": round(100 * float(detector.mean()), 1),
        },
    }


def fit_text_gate(cfg: GateFitConfig, out: Path, command: str, log=print) -> TextGate:
    """Make the sets (once), train the probe, choose its threshold, save the gate into `out`."""
    from crossprobe.models.training.text_gate_sets import make_documents, make_signs

    w = Path(cfg.workdir)
    sets = {"signs-train": (make_signs, "train", cfg.signs), "signs-dev": (make_signs, "dev", cfg.dev_signs)}
    if cfg.documents:
        sets["documents-train"] = (make_documents, "train", cfg.documents)
    for name, (make, split, n) in sets.items():
        if not (w / name / "boxes.json").exists():  # written last: a set without it is made again
            log(f"making {name} ({n})")
            make(split, n, w / name, cfg.seed)
    gate, info = train_probe(
        w / "signs-train", w / "documents-train" if cfg.documents else None, cfg.real, cfg.l2, w / "cache", log
    )
    paths, plain = dev_photos(w / "signs-dev")
    t, chosen = choose_threshold(gate, paths, plain, w / "cache", cfg.pass_pct)
    served = TextGate(gate.w, gate.b, TextGateConfig(round(t, 4)))
    served.save(
        out,
        {
            "trained_by": command,
            "on": f"Flickr8k train photos: {cfg.signs} with a generated sign and "
            f"{cfg.signs} left as they are, the real writing full OCR reads in {cfg.real} other train photos, "
            f"and {cfg.documents} generated documents and screens",
            "l2": cfg.l2,
            **info,
            **chosen,
        },
    )
    log(f"{out}: threshold {served.cfg.threshold} ({chosen['threshold_rule']}); dev {chosen['dev']}")
    return served
