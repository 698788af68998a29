"""Grow an index to N items for capacity tests and benchmarks: real items plus generated neighbours.

Each generated item is a real item's vector plus Gaussian noise (sigma 0.3 / sqrt(d), renormalised: a near
neighbour of its source, as a near-duplicate photo would be) and a copy of the source's Redis values (features
and metadata) under its own id, written as one complete version through the store's own layout (FAISS factory
chosen by size as the indexer does, ids, vectors.npy, manifest last) and activated with the one SET. Used by
benchmarks/harness.py (the 100K-item latency index), benchmarks/filter_latency.py, benchmarks/scale_bench.py and the
filter tests (a 1%-selective filter over 100K items).

ann_backend="milvus": the version's vectors go into a Milvus collection instead of index.faiss (the backend's own
writer, storage/ann/milvus_backend.py, fed chunk by chunk with each item's metadata, selectivity tags
included, so Milvus filters on them), as the indexer's jobs write a Milvus version (benchmarks/scale_bench.py
--milvus-server).

Selectivity tags: every item (real or generated) gets "sel-1.0"; a seeded random 10% also "sel-0.1"; a 1%
subset of those also "sel-0.01": filters with known selectivity (1%, 10%, 100%) over the same index.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import numpy as np

from crossprobe.storage import faiss_io, keyword
from crossprobe.storage.reader import open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.store import new_version
from crossprobe.core.atomic import durable_write as atomic_write

SELECTIVITY = (0.01, 0.1, 1.0)


def selectivity_tags(total: int, seed: int) -> list[list[str]]:
    """Per row: the "sel-<fraction>" tags it carries (exactly round(fraction x total) rows each, nested)."""
    order = np.random.default_rng(seed + 1).permutation(total)
    rank = np.empty(total, np.int64)
    rank[order] = np.arange(total)
    cut = {f: int(round(f * total)) for f in SELECTIVITY}
    return [[f"sel-{f}" for f in SELECTIVITY if r < cut[f]] for r in rank]


def grow(ixs: IndexerSettings, base: str, name: str, total: int, seed: int = 0, factory: str | None = None,
         log=print, ann_backend: str = "faiss") -> str:
    """Write and activate index `name`: `base`'s active version's items plus total - len(base) generated ones.
    -> the new version. Redis values are copied with GET + SET (works on any Redis). ann_backend: "faiss"
    (index.faiss, `factory`) or "milvus" (a collection in ixs' Milvus, ixs.milvus_index)."""
    src_ix = open_index(base, None, ixs)
    st = src_ix.store
    src = st.read_vectors(base, src_ix.version)
    n_real, d = src.shape
    if total < n_real:
        raise ValueError(f"total {total} < the {n_real} items of {base}")
    rng = np.random.default_rng(seed)
    pick = np.arange(total - n_real) % n_real
    noise = rng.standard_normal((total - n_real, d)).astype(np.float32) * (0.3 / np.sqrt(d))
    gen = src[pick] + noise
    gen /= np.linalg.norm(gen, axis=1, keepdims=True)
    vectors = np.ascontiguousarray(np.concatenate([src, gen]), np.float32)
    base_ids = list(src_ix.ids)
    ids = base_ids + [f"gen/{i:07d}_{base_ids[j]}" for i, j in enumerate(pick)]
    tags = selectivity_tags(total, seed)
    version = new_version()
    vdir = st.version_dir(name, version)
    vdir.mkdir(parents=True, exist_ok=True)
    st.r.sadd(st.versions_key(name), version)
    keys, src_keys = st.layout(name, version, st.settings.key_buckets), src_ix.keys  # the new version: current layout
    writer, insert_s = None, 0.0
    if ann_backend == "milvus":
        from crossprobe.storage import ann

        writer = ann.backend(ixs.model_copy(update={"ann_backend": "milvus"})).writer(name, version, d, vdir)
    chunk = 2000
    for i in range(0, total, chunk):  # each item's values under its own id, the source's copied
        rows = ids[i:i + chunk]
        srcs = [r if k + i < n_real else base_ids[pick[k + i - n_real]] for k, r in enumerate(rows)]
        feats = st.mget([src_keys.feat(s) for s in srcs])
        metas = st.mget([src_keys.meta(s) for s in srcs])
        chunk_metas = []
        with st.r.pipeline(transaction=False) as p:
            for k, (r, f, m) in enumerate(zip(rows, feats, metas)):
                meta = json.loads(m)
                meta["id"] = r
                meta["tags"] = list(meta.get("tags") or []) + tags[i + k]
                p.set(keys.feat(r), f)
                p.set(keys.meta(r), json.dumps(meta))
                chunk_metas.append(meta)
            p.execute()
        if writer is not None:
            t = time.perf_counter()
            writer.add(vectors[i:i + chunk], rows, chunk_metas)
            insert_s += time.perf_counter() - t
    if writer is not None:
        t = time.perf_counter()
        factory = writer.commit()
        index_s = time.perf_counter() - t
        ann_entry = writer.manifest_entry()
        log(f"{name}: Milvus {factory} over {total} vectors (insert {insert_s:.1f}s, flush + index + load "
            f"{index_s:.1f}s) in {insert_s + index_s:.1f}s")
    else:
        factory = factory or faiss_io.choose_factory(total, d, ixs)
        t = time.perf_counter()
        faiss_io.write_index(faiss_io.build_faiss(vectors, factory), vdir / "index.faiss")
        ann_entry = {"backend": "faiss"}
        log(f"{name}: FAISS {factory} over {total} vectors in {time.perf_counter() - t:.1f}s")
    faiss_io.write_ids(ids, vdir / "ids")
    faiss_io.write_vectors(vectors, vdir / "vectors.npy")
    t = time.perf_counter()  # the keyword index, from the values just written (storage/keyword.py)
    text = keyword.write(vdir, ids, lambda part: [json.loads(v) for v in st.mget([keys.meta(i) for i in part])], chunk)
    log(f"{name}: keyword index over {text['indexed']} items in {time.perf_counter() - t:.1f}s")
    m = dict(src_ix.manifest)
    m.update(name=name, version=version, kind="synthetic", base=base, base_version=src_ix.version, count=total,
             factory=factory, created=datetime.now(timezone.utc).isoformat(timespec="seconds"), skipped={},
             source={"synthetic": f"{base}/{src_ix.version} + {total - n_real} noisy copies, seed {seed}"},
             selectivity_tags=[f"sel-{f}" for f in SELECTIVITY], ann=ann_entry,
             keys=keys.manifest(st.active_key(name)),
             text={"dir": keyword.DIR, "items": text["indexed"], "fields": list(keyword.FIELDS)})
    atomic_write(vdir / "manifest.json", json.dumps(m, indent=2))  # last: a version without it is incomplete
    st.activate(name, version)
    return version
