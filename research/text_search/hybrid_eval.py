"""Vector, keyword and hybrid search through the API (issue 31, item 4), and the fusion's K, w and p chosen on dev.

    python -m research.text_search.hybrid_eval --split dev     # choose K, w (the grid below) -> "hybrid_dev"
    python -m research.text_search.hybrid_eval --split test    # report the served K, w       -> "hybrid_test"
        -> docs/research/results/text_search.json

Sets (every index built by `crossprobe index build` with OCR on, as a user with OCR would build it):
  text-<split>  textset.py's 200 photos with a sign, screen or paper and its 200 unchanged photos, among the
                rest of the split's 1,000 Flickr8k photos. Queries per photo with text:
                  quoted   the sign's last word (a made-up code where it has one), quoted: "K7-2291"
                  word     its first word, as typed: post
                  scene    the photo's own Flickr8k caption (the scene, no word of the sign)
                  both     the caption and the quoted word
                A result is right when it is a photo carrying that word (quoted, word: several photos may
                carry the same word; any of them is right) or the photo itself (scene, both). Each query also
                says whether OCR read its word in its photo at index time: R@1 over those queries is the
                search's own part, apart from what OCR missed.
  f8k-<split>   ordinary queries: the split's Flickr8k captions over its 1,000 photos (dev: the first 1,000)
  ood-dev       coco-mini-dev's 400 captions over its 80 photos among the 1,000 Flickr8k dev photos (dev only)

How K, w and p are chosen without one server per setting: the dev server runs hybrid with a weight no vector rank
outweighs, so its top 100 holds every keyword match (at most 20) and then the union's best by the reranker, each
with its reranker score (which gives its vector rank), BM25 score and coverage; fusing the two orders offline
with any (K, w, p) is exactly service/hybrid.py's fuse (an item past the first 100 cannot come first).
The rule: the largest text-dev R@1 (mean over the four kinds) among the settings whose f8k-dev and ood-dev R@1
stay within 0.3 of vector-only. --split test then runs a server with the chosen pair and reports every set in all three modes,
with paired bootstrap intervals against vector.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from crossprobe.indexer import build, open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.models.data.flickr8k import Flickr8k
from crossprobe.models.evaluation.metrics import paired_bootstrap
from crossprobe.models.evaluation.report import machine
from crossprobe.storage.keyword import KeywordQuery
from crossprobe.service import hybrid
from crossprobe.service.server import running, wait_ready
from crossprobe.service.settings import Settings
from crossprobe.models.training.calibrate import dev_sets
from research.text_search import textset

KS = (5, 10, 20, 60)
WS = (0.5, 1.0, 2.0, 4.0)
PS = (1.0, 2.0, 3.0)
KINDS = ("quoted", "word", "scene", "both")
OUT = Path("docs/research/results/text_search.json")


def text_set(ds: Flickr8k, split: str, workdir: Path) -> dict:
    """The text-in-image gallery's manifest and its queries: [(text, kind, {right ids})]."""
    out = workdir / f"textset-{split}"
    truth_file = out / "truth.json"
    truth = json.loads(truth_file.read_text()) if truth_file.exists() else textset.make(split, 200, out, 0)
    used = {n.split("_", 1)[1] for n in truth}
    rows = [{"id": n, "uri": str((out / "images" / n).resolve())} for n in truth]
    rows += [{"id": f"f8k/{ds.images[i]}", "uri": str(ds.image_path(i))} for i in ds.splits[split]
             if ds.images[i] not in used]
    manifest = workdir / f"text-{split}.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first_caption = {}
    for j, c in enumerate(ds.captions):
        first_caption.setdefault(ds.images[ds.caption_image[j]], c)
    signs = {n: " ".join(w) for n, w in truth.items() if w}
    queries = []
    for n, words in truth.items():
        if not words:
            continue
        last, first = words[-1], words[0]  # the last: the made-up code where the sign has one
        carry_last = {m for m, s in signs.items() if last in s.split()}
        carry_first = {m for m, s in signs.items() if first in s.split()}
        caption = first_caption[n.split("_", 1)[1]]
        queries += [(f'"{last}"', "quoted", carry_last, n, [last]), (first.lower(), "word", carry_first, n, [first]),
                    (caption, "scene", {n}, n, []), (f'{caption} "{last}"', "both", {n}, n, [last])]
    return {"manifest": manifest, "queries": queries, "images": len(rows)}


def ordinary(ds: Flickr8k, split: str, workdir: Path, limit: int | None) -> dict:
    items = [(f"f8k/{ds.images[i]}", ds.image_path(i)) for i in ds.splits[split]]
    manifest = workdir / f"f8k-{split}.jsonl"
    manifest.write_text("".join(json.dumps({"id": i, "uri": str(u)}) + "\n" for i, u in items))
    pairs = [(ds.captions[j], f"f8k/{ds.images[ds.caption_image[j]]}") for j in ds.captions_of(ds.splits[split])]
    return {"manifest": manifest, "queries": [(t, "caption", {g}, g, []) for t, g in pairs[:limit]], "images": len(items)}


def ask(client: httpx.Client, index: str, text: str, mode: str, k: int) -> dict:
    r = client.post("/v1/search", json={"query": text, "k": k, "mode": mode, "index": index})
    r.raise_for_status()
    return r.json()


def fused_top(res: list[dict], k: float, w: float, p: float) -> str | None:
    """service/hybrid.py's fuse, offline, over a dev answer (every keyword match first, then the rest of the
    union by the reranker): the first result under (K, w, p)."""
    if not res:
        return None
    ids = [h["id"] for h in res]
    final = np.asarray([h["score"] for h in res])
    matched = [h for h in res if h["scores"]["keyword"] is not None]
    kw = hybrid.KeywordOutcome(KeywordQuery(), [(h["id"], h["scores"]["keyword"]) for h in
                                                sorted(matched, key=lambda h: -h["scores"]["keyword"])],
                               {h["id"]: h["scores"]["keyword_coverage"] for h in matched})
    order, _ = hybrid.fuse(final, np.argsort(-final, kind="stable"), ids, kw, k, w, p)
    return ids[int(order[0])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=("dev", "test"), required=True)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/text_search"))
    ap.add_argument("--f8k-captions", type=int, default=None, help="first N ordinary captions (dev default 1000)")
    ap.add_argument("--text-only", action="store_true", help="the text-in-image set alone, served with the chosen "
                    "K, w, p (e.g. OCR without its gate: CROSSPROBE_INDEX_OCR_GATE_THRESHOLD=0, another --workdir)")
    ap.add_argument("--out-key", default=None, help="the key of text_search.json written (default hybrid_<split>)")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    ds = Flickr8k.load()
    limit = args.f8k_captions or (1000 if args.split == "dev" else None)
    sets = {f"text-{args.split}": text_set(ds, args.split, args.workdir)}
    if not args.text_only:
        sets[f"f8k-{args.split}"] = ordinary(ds, args.split, args.workdir, limit)
    if args.split == "dev" and not args.text_only:
        ood = dev_sets(args.workdir, None)["ood-dev"]
        sets["ood-dev"] = {"manifest": ood["manifest"], "images": ood["images"],
                           "queries": [(t, "caption", {g}, g, []) for t, g in ood["pairs"]]}
    root = args.workdir / "indexes"
    ixs = IndexerSettings(index_root=root, progress=False, ocr=True)
    for name, s in sets.items():
        if not (root / name).is_dir():
            t = time.perf_counter()
            res = build(name, manifest=s["manifest"], settings=ixs, log=lambda *_: None)
            print(f"built {name}: {res.count} items in {time.perf_counter() - t:.0f} s", flush=True)
    result = json.loads(OUT.read_text()) if OUT.exists() else {}
    chosen = {"K": 60.0, "w": 1.0, "p": 2.0, **result.get("hybrid_dev", {}).get("chosen", {})}
    # dev: every keyword match first (a weight no vector rank outweighs, coverage ignored), then the union's
    # rest by the reranker: k 100 then holds every match and every item that can come first under any (K, w, p)
    grid = args.split == "dev" and not args.text_only  # dev: the answers every (K, w, p) can be fused from
    weight, power = (1e6, 0.0) if grid else (chosen["w"], chosen["p"])
    settings = Settings(index_root=root, port=0, indexes=",".join(sets), access_log=False, log_level="warning",
                        hybrid_weight=weight, hybrid_k=chosen["K"], hybrid_coverage_power=power)
    per: dict = {}
    ocr_text = {}  # the words OCR read in each photo the queries come from: was the quoted word indexed at all?
    for name, s in sets.items():
        reader = open_index(name, None, IndexerSettings(index_root=root))
        srcs = sorted({q[3] for q in s["queries"] if q[4]})
        ocr_text[name] = {i: (m or {}).get("text", "") for i, m in zip(srcs, reader.metadata(srcs))} if srcs else {}
    with running(settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        wait_ready(client)
        for name, s in sets.items():
            rows = per[name] = []
            for text, kind, right, src, words in s["queries"]:
                read = ocr_text[name].get(src, "").upper().replace(" ", "")
                row = {"kind": kind, "right": sorted(right),
                       "indexed": all(w.upper().replace(" ", "") in read for w in words) if words else None}
                for mode in ("vector", "keyword", "hybrid"):
                    k = 100 if (mode == "hybrid" and grid) else 10
                    try:
                        res = ask(client, name, text, mode, k)["results"]
                    except httpx.HTTPStatusError as e:  # keyword mode, a caption of stop words only: 422
                        res = [] if e.response.status_code == 422 else None
                    row[mode] = [h["id"] for h in res]
                    if mode == "hybrid" and grid:
                        row["union"] = [{"id": h["id"], "score": h["score"],
                                         "scores": {k: h["scores"][k] for k in ("keyword", "keyword_coverage")}}
                                        for h in res]
                rows.append(row)
            print(f"{name}: {len(rows)} queries", flush=True)
    (args.workdir / f"rows-{args.split}.json").write_text(json.dumps(per))  # every query's answers, to re-read
    report = summarise(per, "dev" if grid else "test", chosen)
    key = args.out_key or f"hybrid_{args.split}"
    result[key] = report
    result[key].update(ocr_gate_threshold=ixs.ocr_gate_threshold, command="python -m research.text_search.hybrid_eval " + " ".join(sys.argv[1:]),
                                          machine=machine(), data={n: {"images": s["images"],
                                                                       "queries": len(s["queries"])}
                                                                   for n, s in sets.items()})
    OUT.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "grid"}, indent=1))


def _r1(rows: list[dict], pick) -> np.ndarray:
    return np.asarray([int(bool(top := pick(r)) and top in r["right"]) for r in rows])


def _golds(rows: list[dict]) -> np.ndarray:
    return np.unique([r["right"][0] if r["right"] else "" for r in rows], return_inverse=True)[1]


def summarise(per: dict, split: str, chosen: dict) -> dict:
    out: dict = {"sets": {}}
    if split == "dev":
        out.update(choose(per))
        chosen = out["chosen"]
    K, w, p = chosen["K"], chosen["w"], chosen["p"]
    for name, rows in per.items():
        entry = out["sets"][name] = {}
        for kind in sorted({r["kind"] for r in rows}):
            sub = [r for r in rows if r["kind"] == kind]
            hits = {m: _r1(sub, lambda r, m=m: (r[m] or [None])[0]) for m in ("vector", "keyword")}
            hits["hybrid"] = _r1(sub, (lambda r: fused_top(r["union"], K, w, p)) if split == "dev" else
                                 (lambda r: (r["hybrid"] or [None])[0]))
            r10 = {m: 100 * float(np.mean([bool(set(r[m][:10]) & set(r["right"])) for r in sub]))
                   for m in ("vector", "keyword") + (() if split == "dev" else ("hybrid",))}
            entry[kind] = {"queries": len(sub), **{f"R@1 {m}": round(100 * float(h.mean()), 2) for m, h in hits.items()},
                           **{f"R@10 {m}": round(v, 2) for m, v in r10.items()},
                           "hybrid - vector": paired_bootstrap(hits["hybrid"], hits["vector"], _golds(sub))}
            read = np.asarray([bool(r["indexed"]) for r in sub])
            if sub[0]["indexed"] is not None:  # the queries whose word OCR did read into the index: the search's
                entry[kind]["word_indexed"] = int(read.sum())  # own part, apart from what OCR missed
                entry[kind]["R@1 hybrid, word indexed"] = round(100 * float(hits["hybrid"][read].mean()), 2) if read.any() else None
                entry[kind]["R@1 keyword, word indexed"] = round(100 * float(hits["keyword"][read].mean()), 2) if read.any() else None
    return out


def choose(per: dict) -> dict:
    """R@1 of every (K, w, p) from the dev answers; the rule of the module's docstring picks one."""
    def r1(name: str, kind: str, pick) -> float:
        return 100 * float(_r1([r for r in per[name] if r["kind"] == kind], pick).mean())
    kinds = {name: sorted({r["kind"] for r in rows}) for name, rows in per.items()}
    grid = {f"K={k} w={w} p={p}": {n: {kd: r1(n, kd, lambda r: fused_top(r["union"], k, w, p)) for kd in kinds[n]}
                                   for n in per}
            for k in KS for w in WS for p in PS}
    vec = {n: {kd: r1(n, kd, lambda r: (r["vector"] or [None])[0]) for kd in kinds[n]} for n in per}
    text = next(n for n in per if n.startswith("text-"))
    ok = [c for c, v in grid.items() if all(v[n]["caption"] >= vec[n]["caption"] - 0.3 for n in per if n != text)]
    best = max(ok or grid, key=lambda c: float(np.mean(list(grid[c][text].values()))))
    k, w, p = best.replace("K=", "").replace("w=", "").replace("p=", "").split()
    rnd = lambda d: {n: {kd: round(x, 2) for kd, x in v.items()} for n, v in d.items()}  # noqa: E731
    return {"grid": {c: rnd(v) for c, v in grid.items()}, "vector": rnd(vec),
            "chosen": {"K": float(k), "w": float(w), "p": float(p), "pairs_within": ok,
                       "rule": "largest text-dev R@1 (mean of the four kinds) among the pairs keeping f8k-dev and "
                               "ood-dev R@1 within 0.3 of vector-only"}}


if __name__ == "__main__":
    main()
