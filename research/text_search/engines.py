"""SQLite FTS5 against tantivy for the embedded keyword index (issue 31, item 2): build time, size, query time,
and whether they agree, over 100K items.

    python -m research.text_search.engines   # nothing else may run: it times both
        -> docs/research/results/text_search.json "keyword_engines"

Items: 100,000 metadata values as the indexer writes them, each with a Flickr8k caption (the 40,455 captions
cycled) and a file name; one in twenty also with OCR-like text (a few sign words). Queries: 300 Flickr8k test
captions, parsed as the service parses them (storage/keyword.py parse: words ORed, stop words
dropped), the best 20 by BM25. tantivy is crossprobe's KeywordIndex (storage/keyword.py); FTS5 is the
same design on SQLite (fts5_index.py here: the word table plus a trigram table of the image text), which
crossprobe used first. One thread, one query at a time.
Agreement: the share of FTS5's top 20 that tantivy's top 20 also holds (both are BM25, with different
tokenisers and field handling).
"""
from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from crossprobe.storage import keyword
from crossprobe.models.data.flickr8k import Flickr8k
from crossprobe.models.evaluation.report import machine
from research.text_search import fts5_index
from research.text_search.textset import WORDS

OUT = Path("docs/research/results/text_search.json")
N = 100_000


def corpus(ds: Flickr8k) -> tuple[list[str], dict[str, dict]]:
    rng = random.Random(0)
    ids, metas = [], {}
    for i in range(N):
        item = f"item{i:06d}"
        m = {"uri": f"/photos/{ds.images[int(ds.caption_image[i % len(ds.captions)])]}",
             "caption": ds.captions[i % len(ds.captions)]}
        if i % 20 == 0:
            m["text"] = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
        ids.append(item)
        metas[item] = m
    return ids, metas


def fts5(ids: list[str], metas: dict, work: Path):
    (work / "fts5").mkdir()
    t = time.perf_counter()
    fts5_index.write(work / "fts5", ids, lambda part: [metas[i] for i in part])
    return fts5_index.KeywordIndex(work / "fts5" / fts5_index.FILE), time.perf_counter() - t


def tantivy_index(ids: list[str], metas: dict, work: Path):
    (work / "tantivy").mkdir()
    t = time.perf_counter()
    keyword.write(work / "tantivy", ids, lambda part: [metas[i] for i in part])
    return keyword.KeywordIndex(work / "tantivy" / keyword.DIR), time.perf_counter() - t


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def main() -> None:
    ds = Flickr8k.load()
    ids, metas = corpus(ds)
    test = set(ds.splits["test"])
    texts = [c for c, i in zip(ds.captions, ds.caption_image) if i in test][:300]
    queries = [keyword.parse(c) for c in texts]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fx, fts_s = fts5(ids, metas, work)
        tx, tan_s = tantivy_index(ids, metas, work)
        for q in queries[:20]:  # warm both
            fx.search(q, 20), tx.search(q, 20)
        ms = {"fts5": [], "tantivy": []}
        agree = []
        for q in queries:
            t = time.perf_counter()
            a = [i for i, _ in fx.search(q, 20)]
            ms["fts5"].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            b = [i for i, _ in tx.search(q, 20)]
            ms["tantivy"].append((time.perf_counter() - t) * 1000)
            if a:
                agree.append(len(set(a) & set(b)) / len(a))
        row = {
            "fts5": {"build_s": round(fts_s, 1), "bytes": size(work / "fts5" / fts5_index.FILE),
                     "p50_ms": round(float(np.percentile(ms["fts5"], 50)), 2),
                     "p99_ms": round(float(np.percentile(ms["fts5"], 99)), 2),
                     "note": "research/text_search/fts5_index.py: the word table and the trigram table of the image text"},
            "tantivy": {"build_s": round(tan_s, 1), "bytes": size(work / "tantivy" / keyword.DIR),
                        "note": "crossprobe's KeywordIndex (storage/keyword.py): fields, trigrams, boosts",
                        "p50_ms": round(float(np.percentile(ms["tantivy"], 50)), 2),
                        "p99_ms": round(float(np.percentile(ms["tantivy"], 99)), 2),
                        "version": __import__("importlib.metadata").metadata.version("tantivy")},
            "top20_agreement": round(float(np.mean(agree)), 3), "items": N, "queries": len(queries),
            "command": "python -m research.text_search.engines", "machine": machine(),
        }
    print(json.dumps(row, indent=1))
    result = json.loads(OUT.read_text()) if OUT.exists() else {}
    result["keyword_engines"] = row
    OUT.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
