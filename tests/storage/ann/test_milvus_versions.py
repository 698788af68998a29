"""The indexer's jobs with CROSSPROBE_ANN_BACKEND=milvus (on milvus-lite and on a Milvus server: conftest.py): a
collection per version, the same versioned activation through Redis' `active` key, reindex into a new collection,
and gc dropping the collections of old versions (and of versions the store no longer knows)."""
from __future__ import annotations

import json

import numpy as np

from crossprobe.indexer import add, build, delete, open_index, reindex
from crossprobe.storage.ann import milvus_backend
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images


def _collections(s) -> set[str]:
    return set(milvus_backend.client(s).list_collections())


def test_build_add_delete_activate_gc_with_milvus(settings, milvus_settings, gallery, ckpt, bert, tmp_path):
    quiet = dict(log=lambda *_: None)
    s = settings.model_copy(update={k: getattr(milvus_settings, k) for k in ("ann_backend", "milvus_uri")})
    name = "mil.v-1"  # characters Milvus refuses in a collection name: mapped, with a hash of the exact name
    v1 = build(name, images=gallery, settings=s, ckpt=ckpt, bert=bert, **quiet)
    st = Store(s, open_index(name, None, s).store.r)
    m1 = st.read_manifest(name, v1.version)
    coll1 = milvus_backend.collection_name(s.index_key_prefix, name, v1.version)
    assert m1["ann"] == {"backend": "milvus", "collection": coll1, "index": {"type": "FLAT", "params": {}, "count": 12},
                         "schema": milvus_backend.SCHEMA}
    assert v1.factory == m1["factory"] == "milvus:FLAT" and "write_milvus" in v1.stages_s
    assert not (st.version_dir(name, v1.version) / "index.faiss").exists() and coll1 in _collections(s)

    r1 = open_index(name, None, s)
    assert r1.ann.backend == "milvus" and r1.index is None and len(r1) == 12
    vecs = np.load(st.version_dir(name, v1.version) / "vectors.npy")
    ids, scores = r1.search(vecs[:3], 3)
    assert [i[0] for i in ids] == r1.ids[:3]  # each stored vector finds its own item first
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)

    new = make_images(tmp_path / "new", 3, seed=5, prefix="new")
    man = tmp_path / "new.jsonl"
    man.write_text("".join(json.dumps({"id": f"n/{p.name}", "uri": str(p), "tags": ["fresh"]}) + "\n" for p in new))
    v2 = add(name, manifest=man, settings=s, ckpt=ckpt, bert=bert, **quiet)
    assert st.active(name) == v2.version and v2.count == 15
    r2 = open_index(name, None, s)
    coll2 = r2.manifest["ann"]["collection"]
    assert coll2 != coll1 and {coll1, coll2} <= _collections(s)
    assert r1.search(vecs[:1], 20)[0][0].__len__() == 12  # the pinned old version still answers from its own collection

    from pydantic import TypeAdapter

    from crossprobe.storage.filter_model import FilterNode

    node = TypeAdapter(FilterNode).validate_python({"field": "tags", "eq": "fresh"})
    f = r2.ann.search_filtered(vecs[0], 10, r2.ann.prepare_filter(node, [], lambda: None), r2.vectors_at, 100)
    assert sorted(r2.ids[r] for r in f.rows) == sorted(f"n/{p.name}" for p in new) and f.matching == 3

    v3 = delete(name, [r2.ids[0]], settings=s, **quiet)
    assert st.active(name) == v3.version and open_index(name, None, s).ann.count() == 14

    # reindex: every item re-encoded from its recorded source into a new version, with a collection of its own
    v4 = reindex(name, settings=s, ckpt=ckpt, bert=bert, **quiet)
    r4 = open_index(name, None, s)
    assert st.active(name) == v4.version == r4.version and r4.ann.count() == len(r4) == 14
    assert sorted(r4.ids) == sorted(open_index(name, None, s, version=v3.version).ids)
    f = r4.ann.search_filtered(vecs[0], 10, r4.ann.prepare_filter(node, [], lambda: None), r4.vectors_at, 100)
    assert sorted(r4.ids[r] for r in f.rows) == sorted(f"n/{p.name}" for p in new)  # the tags came along

    # a collection of a version the store forgot (dropped from Redis and disk while Milvus was unreachable)
    orphan = "v20200101T000000000000"
    w = milvus_backend.MilvusBackend(s).writer(name, orphan, vecs.shape[1], tmp_path)
    w.add(vecs[:2], ["a", "b"])
    w.commit()
    coll4 = open_index(name, None, s).manifest["ann"]["collection"]
    assert milvus_backend.collection_name(s.index_key_prefix, name, orphan) in _collections(s)

    removed = st.gc(name)
    assert sorted(v for v, _ in removed) == sorted([v1.version, v2.version, v3.version])
    left = {c for c in _collections(s) if c.startswith("crossprobe_mil_v_1_")}
    assert left == {coll4}, left
    assert milvus_backend.MilvusBackend(s).stored_versions(name) == [v4.version]
    assert len(open_index(name, None, s)) == 14

    # `crossprobe index drop`: every collection of the index goes, an orphan's too, with its keys and folder
    w = milvus_backend.MilvusBackend(s).writer(name, orphan, vecs.shape[1], tmp_path)
    w.add(vecs[:2], ["a", "b"])
    w.commit()
    dropped, _ = st.drop_index(name)
    assert [v for v, _ in dropped] == [v4.version]
    assert not {c for c in _collections(s) if c.startswith("crossprobe_mil_v_1_")}
    assert not list(st.r.scan_iter(match=f"{st.prefix}:{name}:*")) and not (s.index_root / name).exists()


def test_a_faiss_version_never_starts_milvus(settings, gallery, ckpt, bert, monkeypatch):
    """The default path: FAISS versions, gc and drop never import pymilvus or connect anywhere."""
    def refuse(*a, **k):
        raise AssertionError("the FAISS path reached Milvus")

    monkeypatch.setattr(milvus_backend, "client", refuse)
    v1 = build("plain", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
    r = open_index("plain", None, settings)
    assert r.manifest["ann"] == {"backend": "faiss"} and r.ann.backend == "faiss" and r.index.ntotal == 12
    build("plain", images=gallery, settings=settings.model_copy(update={"factory": "HNSW32"}), ckpt=ckpt,
          bert=bert, log=lambda *_: None)
    assert [v for v, _ in Store(settings, r.store.r).gc("plain")] == [v1.version]
    assert len(Store(settings, r.store.r).drop_index("plain")[0]) == 1
