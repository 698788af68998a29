"""Fit the relevance curves (core/calibration.py) on the two dev sets' served results: `crossprobe calibrate`.

Data: each caption of a dev set is a POST /v1/search (k = shortlist = 100) per rerank mode to a server over an
index of the set's photos, as a user's query would be; every returned result is a row (score, 1 if it is the
caption's own photo else 0). The curve maps score - shift x (the mean score of the query's shortlist): shift,
from SHIFTS, is chosen per mode by out-of-sample log loss over the top 10 rows (shift 0 is the plain score; a
larger one judges a result against what the same query gives every candidate).
  f8k-dev   the 5,000 Flickr8k dev captions over the 1,000 dev photos
  ood-dev   coco-mini-dev's 400 captions over its 80 photos among the 1,000 Flickr8k dev photos
The two sets weigh the same in the fit (out of domain is the product; Flickr8k dev has 12x the captions).
ECE is measured out of sample: the photos of each set are split in two halves by a fixed seed, the curve
fitted on one half's captions (both sets) scores the other's, and the other way round. The curve shipped is
fitted on all of it. Absent queries: 50 descriptions of things none of the 1,080 photos shows; for each cutoff,
how many of them return nothing and how many dev captions keep their own photo; and at the cutoff that keeps the
own photo of 90% of the captions that have it in their top 10 (both sets pooled, each weighing the same), how
many of the 50 return nothing.

This module is the data and the fit; the command (the command line: it builds the indexes and runs the server)
calls collect() over HTTP and analyse() on what came back. research/calibration/fit.py writes the write-up.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from crossprobe.core import calibration

MODES = ("none", "cp", "temde")
K = 100  # results per caption: the whole default shortlist, so its mean is the one the service computes
SHIFTS = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
)  # how much of the shortlist's mean score is taken off before the curve (chosen on dev)
CUTOFFS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
# 50 descriptions of things no photo of either dev set shows: the key word of each appears in none of Flickr8k's
# 40,000 captions and none of coco-mini-dev's 400 (checked with a word-boundary search over both caption files)
ABSENT = [
    "an x-ray of a broken arm",
    "a spreadsheet full of numbers",
    "a screenshot of computer code",
    "a microscope image of cells",
    "a bowl of ramen noodles",
    "a jellyfish in dark water",
    "a solar panel on a roof",
    "a pile of old coins",
    "a snail on a leaf",
    "a volcano erupting",
    "a yellow submarine under the sea",
    "a cactus in a clay pot",
    "an octopus on the sea floor",
    "a shop receipt on a table",
    "an open passport",
    "a barcode label",
    "a qr code poster",
    "a calculator on a desk",
    "a thermometer reading",
    "a doctor's stethoscope",
    "a syringe and a vial",
    "a brain scan",
    "an astronaut floating in space",
    "a satellite orbiting the earth",
    "a spiral galaxy",
    "a purple orchid",
    "a sliced pineapple",
    "a plate of broccoli",
    "a postage stamp",
    "an old typewriter",
    "an hourglass with sand",
    "a brass compass",
    "a wooden abacus",
    "a xylophone",
    "a starfish on the sand",
    "a hedgehog in the leaves",
    "a sloth hanging from a branch",
    "a koala in a eucalyptus tree",
    "a pink flamingo",
    "a peacock with its tail open",
    "a scorpion on a rock",
    "a hairy tarantula",
    "a head of cauliflower",
    "a purple eggplant",
    "an avocado cut in half",
    "a buttery croissant",
    "a plate of dumplings",
    "a fossil in a stone",
    "a tornado over a field",
    "an iceberg in the ocean",
]
assert len(ABSENT) == 50
FITTED_ON = "f8k-dev + ood-dev, each set weighted equally"


def dev_sets(workdir: Path, limit: int | None) -> dict:
    """The two dev sets -> {name: {"manifest": its index's manifest (written into workdir), "pairs": [(caption,
    gold id)] (the first `limit`), "images": photos}}."""
    from crossprobe.models.data.captioned import CaptionedFolder, coco_root
    from crossprobe.models.data.flickr8k import Flickr8k

    ds = Flickr8k.load()
    dev = ds.splits["dev"]
    f8k_items = [(f"f8k/{ds.images[i]}", ds.image_path(i)) for i in dev]
    f8k_pairs = [(ds.captions[j], f"f8k/{ds.images[ds.caption_image[j]]}") for j in ds.captions_of(dev)]
    coco = CaptionedFolder.load(coco_root())
    coco_items = [(f"coco/{n}", coco.image_path(i)) for i, n in enumerate(coco.images)]
    coco_pairs = [(c, f"coco/{coco.images[coco.caption_image[j]]}") for j, c in enumerate(coco.captions)]
    sets = {"f8k-dev": (f8k_items, f8k_pairs), "ood-dev": (coco_items + f8k_items, coco_pairs)}
    out = {}
    for name, (items, pairs) in sets.items():
        manifest = workdir / f"{name}.jsonl"
        manifest.write_text("".join(json.dumps({"id": i, "uri": str(u)}) + "\n" for i, u in items))
        out[name] = {"manifest": manifest, "pairs": pairs[:limit], "images": len(items)}
    return out


def index_name(set_name: str) -> str:
    return f"cal-{set_name}"


def collect(client, index: str, pairs: list, mode: str) -> dict:
    """Every caption's whole ranked shortlist (k = shortlist = 100) from a server (an httpx client on its URL)
    -> rows {"score", "label", "rank", "query"}."""
    rows: dict[str, list] = {"score": [], "label": [], "rank": [], "query": []}
    for q, (text, gold) in enumerate(pairs):
        r = client.post(
            "/v1/search", json={"query": text, "mode": "vector", "k": K, "rerank": mode, "shortlist": K, "index": index}
        )
        r.raise_for_status()
        for rank, hit in enumerate(r.json()["results"]):
            rows["score"].append(hit["score"])
            rows["label"].append(int(hit["id"] == gold))
            rows["rank"].append(rank)
            rows["query"].append(q)
    return {k: np.asarray(v) for k, v in rows.items()}


def collect_all(client, sets: dict, log=print) -> tuple[dict, dict]:
    """collect() for every mode and set, and the absent queries' shortlist scores over the larger index
    -> (data {mode: {set: rows}}, absent {mode: [[score] per query]})."""
    import time

    data: dict = {m: {} for m in MODES}
    absent: dict = {m: [] for m in MODES}
    t = time.perf_counter()
    for mode in MODES:
        for name, s in sets.items():
            data[mode][name] = collect(client, index_name(name), s["pairs"], mode)
            log(f"{mode} {name}: {len(s['pairs'])} captions, {time.perf_counter() - t:.0f}s")
        for q in ABSENT:  # over the larger index, the 1,080 photos: the whole shortlist's scores
            r = client.post(
                "/v1/search",
                json={
                    "query": q,
                    "mode": "vector",
                    "k": K,
                    "rerank": mode,
                    "shortlist": K,
                    "index": index_name("ood-dev"),
                },
            )
            r.raise_for_status()
            absent[mode].append([h["score"] for h in r.json()["results"]])
    return data, absent


def save_scores(path: Path, data: dict, absent: dict) -> None:
    from crossprobe.core.atomic import atomic_write

    atomic_write(
        path,
        json.dumps(
            {
                "data": {m: {n: {k: v.tolist() for k, v in d.items()} for n, d in data[m].items()} for m in MODES},
                "absent": absent,
            }
        ),
    )


def load_scores(path: Path) -> tuple[dict, dict]:
    raw = json.loads(path.read_text())
    data = {m: {n: {k: np.asarray(v) for k, v in d.items()} for n, d in raw["data"][m].items()} for m in MODES}
    return data, raw["absent"]


def centred(d: dict, shift: float) -> np.ndarray:
    """score - shift x the mean score of the query's shortlist (Calibration.relevance does the same at serving)."""
    n = d["query"].max() + 1
    mean = np.bincount(d["query"], d["score"], n) / np.maximum(np.bincount(d["query"], minlength=n), 1)
    return d["score"] - shift * mean[d["query"]]


def split_of(pairs: list, seed: int = 0) -> np.ndarray:
    """Per caption, fold 0 or 1 by its photo (a photo's captions stay together)."""
    golds = sorted({g for _, g in pairs})
    fold = dict(zip(golds, np.random.default_rng(seed).permutation(len(golds)) % 2))
    return np.asarray([fold[g] for _, g in pairs])


def weights(data: dict, sets: list[str], mask: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of several sets, each set weighing the same in total."""
    s, y, w = [], [], []
    for name in sets:
        m = mask[name]
        n = int(m.sum())
        s.append(data[name]["score"][m])
        y.append(data[name]["label"][m])
        w.append(np.full(n, 1.0 / max(n, 1)))
    return np.concatenate(s), np.concatenate(y), np.concatenate(w)


def logloss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def crossfit(d: dict, sets: dict, folds: dict, shift: float) -> dict:
    """Out-of-sample relevance of every row: fitted on one half of both sets' photos, applied to the other."""
    row_fold = {n: folds[n][d[n]["query"]] for n in sets}
    z = {n: centred(d[n], shift) for n in sets}
    pred = {n: np.zeros(len(z[n])) for n in sets}
    for held in (0, 1):
        zz = {n: {"score": z[n], "label": d[n]["label"]} for n in sets}
        curve = calibration.fit(*weights(zz, list(sets), {n: row_fold[n] != held for n in sets}))
        for n in sets:
            m = row_fold[n] == held
            pred[n][m] = curve(z[n][m])
    return pred


def analyse(data: dict, absent: dict, sets: dict) -> dict:
    """The shift, the curve and how well it is calibrated, per mode -> {"curves", "sets", "shift_sweep", "ece",
    "ece_top1", "ece_top100", "reliability", "absent", "positives_top10"}."""
    folds = {name: split_of(s["pairs"]) for name, s in sets.items()}
    out: dict = {
        "curves": {},
        "sets": {n: {"captions": len(s["pairs"]), "photos": s["images"]} for n, s in sets.items()},
        "shift_sweep": {},
        "ece": {},
        "ece_top1": {},
        "ece_top100": {},
        "reliability": {},
        "absent": {},
        "positives_top10": {},
    }
    for mode in MODES:
        d = data[mode]
        top10 = {n: d[n]["rank"] < 10 for n in sets}
        sweep = {}
        for shift in SHIFTS:  # chosen by out-of-sample log loss over the top 10 (both sets, equal weight)
            pred = crossfit(d, sets, folds, shift)
            sweep[shift] = {n: round(logloss(pred[n][top10[n]], d[n]["label"][top10[n]]), 5) for n in sets}
        shift = min(SHIFTS, key=lambda s: sum(sweep[s].values()))
        out["shift_sweep"][mode] = {str(s): v for s, v in sweep.items()}
        pred = crossfit(d, sets, folds, shift)
        out["ece"][mode] = {n: round(calibration.ece(pred[n][top10[n]], d[n]["label"][top10[n]]), 4) for n in sets}
        out["ece_top100"][mode] = {n: round(calibration.ece(pred[n], d[n]["label"]), 4) for n in sets}
        out["ece_top1"][mode] = {
            n: round(calibration.ece(pred[n][d[n]["rank"] == 0], d[n]["label"][d[n]["rank"] == 0]), 4) for n in sets
        }
        out["reliability"][mode] = {
            n: calibration.reliability(pred[n][top10[n]], d[n]["label"][top10[n]]) for n in sets
        }
        out["positives_top10"][mode] = {n: round(float(d[n]["label"][top10[n]].mean()), 4) for n in sets}
        zz = {n: {"score": centred(d[n], shift), "label": d[n]["label"]} for n in sets}
        curve = calibration.fit(
            *weights(zz, list(sets), {n: np.ones(len(d[n]["score"]), bool) for n in sets}), shift=shift
        )
        cal = calibration.Calibration({mode: curve}, {})
        out["curves"][mode] = cal.curves[mode].to_json()
        out["absent"][mode] = _cutoffs(cal, curve, mode, d, zz, top10, absent[mode], sets)
    return out


def _cutoffs(cal, curve, mode: str, d: dict, zz: dict, top10: dict, absent: list, sets: dict) -> dict:
    """What a relevance cutoff does: absent queries emptied against dev captions keeping their own photo."""
    top_abs = np.asarray([cal.relevance(mode, np.asarray(a)).max() for a in absent])
    gold = {}  # per caption: its own photo's relevance (0 when not in its top 10)
    for n in sets:
        g = np.zeros(len(sets[n]["pairs"]))
        pos = (d[n]["label"] == 1) & top10[n]
        g[d[n]["query"][pos]] = curve(zz[n]["score"][pos])
        gold[n] = g
    rows = {}
    for c in CUTOFFS:
        rows[str(c)] = {
            "absent_empty": int(np.sum(top_abs < c)),
            "gold_kept_%": {n: round(float(np.mean(gold[n] >= c)) * 100, 1) for n in sets},
        }
    # the cutoff that keeps the own photo of 90% of the captions that have it in their top 10: the 10th
    # percentile of those photos' relevance, both sets pooled with equal weight
    inside = {n: gold[n][gold[n] > 0] for n in sets}
    vals = np.concatenate([inside[n] for n in sets])
    w = np.concatenate([np.full(len(inside[n]), 1.0 / len(inside[n])) for n in sets])
    order = np.argsort(vals)
    cum = np.cumsum(w[order]) / w.sum()
    cut90 = float(vals[order][np.searchsorted(cum, 0.1)])
    at90 = {
        "cutoff": round(cut90, 4),
        "absent_empty": int(np.sum(top_abs < cut90)),
        "absent_queries": len(ABSENT),
        "gold_kept_of_top10_%": {n: round(float(np.mean(inside[n] >= cut90)) * 100, 1) for n in sets},
        "gold_kept_of_all_%": {n: round(float(np.mean(gold[n] >= cut90)) * 100, 1) for n in sets},
    }
    return {"top1_relevance": [round(float(v), 4) for v in top_abs], "by_cutoff": rows, "at_90pct_gold_kept": at90}


def served(out: dict) -> calibration.Calibration:
    """analyse()'s output (with its "meta") -> the calibration.json a checkpoint serves: the curves, with the ECE
    and the sets beside how they were fitted (as `crossprobe checkpoint set-calibration` stores them)."""
    curves = {m: calibration.Curve.from_json(c) for m, c in out["curves"].items()}
    return calibration.Calibration(curves, {k: out[k] for k in ("ece", "ece_top1", "sets") if k in out} | out["meta"])
