"""The two ANN backends on the same vectors, through the interface (storage/ann/), against the real engines:
FAISS in process and Milvus, both milvus-lite (the embedded engine pymilvus starts for a .db file; `make test`) and
a Milvus 2.3.5 standalone server (`make test-milvus`): conftest.py's milvus_settings runs this module once per engine.

- Milvus FLAT (exact) returns the ids, order and scores of FAISS Flat.
- HNSW on both: recall@10 against exact search (printed; both must be high).
- A writer's add / delete / count; deleted rows never come back.
- Metadata filters: Milvus's expression (milvus_filter.py) selects exactly the rows the FAISS path's bitmap
  (storage/filter_columns.py Columns) selects, on awkward values too (quotes, backslashes, newlines, unicode, missing
  fields, mixed-case formats), and the filtered searches agree.
"""
from __future__ import annotations

import faiss
import numpy as np
import pytest
from pydantic import TypeAdapter

from crossprobe.storage.ann import milvus_backend, milvus_filter
from crossprobe.storage.ann.faiss_backend import FaissIndex, FaissWriter
from crossprobe.storage.ann.milvus_backend import MilvusBackend
from crossprobe.storage.filter_columns import Columns
from crossprobe.storage.filter_model import Condition, FilterNode

N, D, K = 2000, 32, 10
CAPTIONS = ['he said "hi"', "it's", "back\\slash", "new\nline", "tab\there", "ünïcødé 日本", "", "plain"]
FORMATS = ["JPEG", "png", "Jpeg", "webp", None]


def _vectors(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Clustered unit vectors (neighbourhoods like real embeddings have, so HNSW has something to miss)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((40, d))
    v = centers[rng.integers(0, 40, n)] + 0.6 * rng.standard_normal((n, d))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def _metas(n: int, seed: int = 1) -> list[dict | None]:
    rng = np.random.default_rng(seed)
    out: list[dict | None] = []
    for i in range(n):
        if i % 97 == 0:
            out.append(None)  # no metadata value at all
            continue
        m: dict = {"id": f"i{i}", "tags": [t for t in ("red", "blue", 'qu"ote', "7") if rng.random() < 0.3]}
        if (f := FORMATS[i % len(FORMATS)]) is not None:
            m["format"] = f
        if i % 3:
            m["caption"] = CAPTIONS[i % len(CAPTIONS)]
        if i % 5:
            m["width"], m["height"] = int(rng.integers(40, 400)), int(rng.integers(40, 400))
        out.append(m)
    return out


@pytest.fixture(scope="module")
def data():
    v = _vectors(N, D)
    ids = [f"i{i}" for i in range(N)]
    rng = np.random.default_rng(2)
    q = v[rng.choice(N, 50, replace=False)] + 0.3 * rng.standard_normal((50, D)).astype(np.float32) / np.sqrt(D)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    return v, ids, _metas(N), q


def _milvus(milvus_settings, data, version: str, index: str, **over):
    v, ids, metas, _ = data
    s = milvus_settings.model_copy(update={"milvus_index": index, **over})
    b = MilvusBackend(s)
    w = b.writer("t", version, D, s.index_root)
    w.add(v, ids, metas)
    w.commit()
    return b, b.open("t", version, {"dims": {"g": D}, "ann": w.manifest_entry()}, s.index_root)


@pytest.fixture(scope="module")
def flat_pair(milvus_settings, data):
    v = data[0]
    exact = faiss.IndexFlatIP(D)
    exact.add(v)
    return FaissIndex(exact), _milvus(milvus_settings, data, "v20260101T000000000001", "FLAT")[1]


def test_milvus_flat_returns_the_ids_order_and_scores_of_faiss_flat(flat_pair, data):
    fa, mv = flat_pair
    q = data[3]
    fs, fr = fa.search(q, K)
    ms, mr = mv.search(q, K)
    assert mv.count() == fa.count() == N
    assert np.array_equal(fr, mr)
    np.testing.assert_allclose(fs, ms, atol=1e-5)
    # k past the end: both pad the same way
    fs, fr = fa.search(q[:2], N + 5)
    ms, mr = mv.search(q[:2], N + 5)
    assert (fr[:, N:] == -1).all() and (mr[:, N:] == -1).all() and np.array_equal(fr[:, :N], mr[:, :N])


def _recall(rows: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(r) & set(t)) / len(t) for r, t in zip(rows, truth)]))


def test_hnsw_recall_against_exact_on_both(milvus_settings, data, flat_pair):
    v, _, _, q = data
    _, truth = flat_pair[0].search(q, K)
    hnsw = faiss.index_factory(D, "HNSW32", faiss.METRIC_INNER_PRODUCT)
    hnsw.add(v)
    fr = FaissIndex(hnsw).search(q, K)[1]
    _, mv = _milvus(milvus_settings, data, "v20260101T000000000002", "HNSW")
    mr = mv.search(q, K)[1]
    rf, rm = _recall(fr, truth), _recall(mr, truth)
    print(f"\nrecall@{K} vs exact, {N} x {D}: FAISS HNSW32 {rf:.3f}, Milvus HNSW(M=32,efC=40) {rm:.3f}")
    assert mv.index_type == "HNSW" and mv.describe().startswith("milvus:HNSW")
    assert rf >= 0.9 and rm >= 0.9


def test_writer_add_delete_count(milvus_settings, data, tmp_path):
    v, ids, metas, q = data
    b = MilvusBackend(milvus_settings.model_copy(update={"milvus_index": "FLAT"}))
    w = b.writer("t", "v20260101T000000000003", D, tmp_path)
    w.add(v[:300], ids[:300], metas[:300])
    w.add(v[300:400], ids[300:400], metas[300:400])
    assert w.count() == 400
    gone = ids[:10] + ["no-such-id"]
    assert w.delete(gone) == 10 and w.count() == 390
    w.commit()
    ix = b.open("t", "v20260101T000000000003", {"dims": {"g": D}, "ann": w.manifest_entry()}, tmp_path)
    rows = ix.search(v[:10], 5)[1]
    assert ix.count() == 390 and not set(rows.ravel()) & set(range(10)) and rows.min() >= 10
    assert (ix.search(v[150:151], 1)[1] == 150).all()  # rows stay the add order
    fw = FaissWriter(type("B", (), {"settings": milvus_settings})(), D, tmp_path)  # FAISS: the same contract
    fw.add(v[:400], ids[:400])
    assert fw.delete(gone) == 10 and fw.count() == 390 and fw.commit() == "Flat"
    assert faiss.read_index(str(tmp_path / "index.faiss")).ntotal == 390


FILTERS = [
    {"field": "tags", "eq": "red"},
    {"field": "tags", "in": ["blue", 'qu"ote']},
    {"field": "tags", "eq": "7"},
    {"field": "format", "eq": "jpeg"},
    {"field": "format", "in": ["PNG", "webp"]},
    {"field": "caption", "eq": 'he said "hi"'},
    {"field": "caption", "in": ["back\\slash", "new\nline", "ünïcødé 日本"]},
    {"field": "caption", "eq": ""},
    {"field": "caption", "eq": "tab\there"},
    {"field": "width", "gte": 100, "lt": 200.5},
    {"field": "height", "eq": 120},
    {"field": "width", "in": [41, 42, 43, 399]},
    {"and": [{"field": "width", "gt": 150}, {"or": [{"field": "format", "eq": "JPEG"}, {"field": "tags", "eq": "red"}]}]},
    {"or": [{"field": "caption", "eq": "it's"}, {"and": [{"field": "height", "lte": 80}, {"field": "tags", "in": ["blue"]}]}]},
    {"field": "tags", "eq": "no-such-tag"},
]


@pytest.mark.parametrize("flt", FILTERS, ids=[str(i) for i in range(len(FILTERS))])
def test_filters_match_the_faiss_path(flat_pair, data, flt):
    v, _, metas, q = data
    fa, mv = flat_pair
    node = TypeAdapter(FilterNode).validate_python(flt)
    cols = Columns(metas)
    mask = fa.prepare_filter(node, [5, 6], lambda: cols)
    expr = mv.prepare_filter(node, [5, 6], lambda: pytest.fail("Milvus must not read the metadata columns"))
    assert isinstance(expr, str) and "row not in [5, 6]" in expr
    got = {r["row"] for r in mv.c.query(mv.collection, filter=expr, output_fields=["row"], limit=N)}
    assert got == set(np.flatnonzero(mask).tolist()), (expr, len(got), int(mask.sum()))
    f = fa.search_filtered(q[0], K, mask, lambda rows: v[rows], 1000)
    m = mv.search_filtered(q[0], K, expr, lambda rows: v[rows], 1000)
    assert (f.matching, f.exact) == (m.matching, m.exact) and m.how in ("milvus-expr", "none-match")
    assert np.array_equal(f.rows, m.rows)
    np.testing.assert_allclose(f.scores, m.scores, atol=1e-5)


def test_literals_and_numbers_are_milvus_syntax():
    assert milvus_filter.literal('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    assert milvus_filter.number(3) == "3.0" and milvus_filter.number(2.5) == "2.5"
    with pytest.raises(ValueError):  # the API refuses a non-finite number before any backend sees it (422)
        TypeAdapter(FilterNode).validate_python({"field": "width", "in": [float("nan")]})
    # and the expression builder still matches nothing for one, should a caller build a tree by hand
    node = Condition.model_construct(field="width", eq=None, in_=[float("nan")], gt=None, gte=None, lt=None, lte=None)
    assert milvus_filter.expression(node) == milvus_filter.NOTHING


def test_missing_values_are_flags_and_0_1_0_collections_keep_their_null_filters():
    """Schema 2 (every collection written now): a condition on a field an item may lack also asks its has_<field>
    flag (Milvus 2.3 has no nullable fields); a 0.1.0 collection (its manifest names no schema) has nullable fields
    and keeps the filters it was written for."""
    node = TypeAdapter(FilterNode).validate_python(
        {"and": [{"field": "width", "gte": 100}, {"field": "format", "in": ["JPEG"]}, {"field": "tags", "eq": "a"}]})
    assert milvus_filter.expression(node) == ('((has_width == true and (width >= 100.0)) and '
                                              '(has_format == true and format in ["jpeg"]) and ARRAY_CONTAINS(tags, "a"))')
    assert milvus_filter.expression(node, flags=False) == '((width >= 100.0) and format in ["jpeg"] and ARRAY_CONTAINS(tags, "a"))'
    nan = Condition.model_construct(field="width", eq=None, in_=[float("nan")], gt=None, gte=None, lt=None, lte=None)
    assert milvus_filter.expression(nan) == milvus_filter.NOTHING
    assert milvus_backend._scalars(None) == {"tags": [], "format": "", "has_format": False, "caption": "",
                                             "has_caption": False, "width": 0.0, "has_width": False, "height": 0.0,
                                             "has_height": False}
    assert milvus_backend._scalars({"format": "PNG", "width": 3, "height": float("inf"), "caption": ""}) == {
        "tags": [], "format": "png", "has_format": True, "caption": "", "has_caption": True, "width": 3.0,
        "has_width": True, "height": 0.0, "has_height": False}


def test_open_reads_the_schema_from_the_manifest(flat_pair, milvus_settings):
    _, mv = flat_pair
    b = MilvusBackend(milvus_settings)
    old = b.open("t", "v20260101T000000000001", {"dims": {"g": D}, "ann": {"backend": "milvus", "collection": mv.collection,
                                                                         "index": {"type": "FLAT"}}}, milvus_settings.index_root)
    assert old.schema == 1 and mv.schema == milvus_backend.SCHEMA == 2
    node = TypeAdapter(FilterNode).validate_python({"field": "height", "eq": 120})
    assert old.prepare_filter(node, [], lambda: None) == "height == 120.0"
    assert mv.prepare_filter(node, [], lambda: None) == "(has_height == true and height == 120.0)"
