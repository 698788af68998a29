import numpy as np
import pytest

from crossprobe.storage import codec
from crossprobe.storage.faiss_io import build_faiss, choose_factory
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.core.inference.layout import ItemDims


def _feats(B=5, n=4, dc=32, nk=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(B, n, dc)).astype(np.float32), rng.normal(size=(B, dc)).astype(np.float32), \
        rng.random((B, nk)).astype(np.float32)


@pytest.mark.parametrize("quant,itemsize,tol", [("float16", 2 * (4 * 32 + 32 + 16), 2e-3), ("int8", 6 * 4 + 4 * 32 + 32 + 16, 1 / 127)])
def test_codec_roundtrip_and_header(quant, itemsize, tol):
    lay = codec.Layout(quant, ItemDims(4, 32, 16))
    p_v, b_bar, s_i = _feats()
    vals = codec.encode(lay, p_v, b_bar, s_i)
    assert all(len(v) == itemsize for v in vals) and lay.itemsize == itemsize
    assert codec.Layout.from_header(lay.header()) == lay
    out = codec.decode(lay, vals[::-1])  # any order, any subset: one MGET's worth
    for name, x in (("p_v", p_v), ("b_bar", b_bar), ("s_i", s_i)):
        ref = x[::-1]
        scale = np.abs(ref).max(-1, keepdims=True)  # per-vector scale bounds the error
        assert out[name].shape == ref.shape and out[name].dtype == np.float32
        assert (np.abs(out[name] - ref) <= tol * scale + 1e-6).all(), name
    with pytest.raises(ValueError, match="bytes"):
        codec.decode(lay, [vals[0][:-1]])


@pytest.mark.parametrize("quant", ["float16", "int8"])
def test_region_labels_ride_along_exactly(quant):
    """Format 2 adds 49 class ids (uint16, 98 bytes) after the float fields; format 1 headers still decode."""
    plain, lay = codec.Layout(quant, ItemDims(4, 32, 16)), codec.Layout(quant, ItemDims(4, 32, 16, cells=49))
    assert lay.itemsize == plain.itemsize + 98
    p_v, b_bar, s_i = _feats()
    labels = np.random.default_rng(3).integers(0, 1000, (5, 49))
    out = codec.decode(lay, codec.encode(lay, p_v, b_bar, s_i, labels))
    assert out["labels"].dtype == np.int64 and np.array_equal(out["labels"], labels)
    assert np.array_equal(codec.decode(plain, codec.encode(plain, p_v, b_bar, s_i))["s_i"],
                          codec.decode(lay, codec.encode(lay, p_v, b_bar, s_i, labels))["s_i"])
    h = lay.header()
    assert h["format"] == 2 and h["cells"] == 49 and codec.Layout.from_header(h) == lay
    assert plain.header()["format"] == 1 and "cells" not in plain.header()  # what indexes built before hold
    assert codec.Layout.from_header(plain.header()) == plain
    with pytest.raises(ValueError, match="labels"):
        codec.encode(lay, p_v, b_bar, s_i)  # a region layout needs its labels
    with pytest.raises(ValueError, match="labels"):
        codec.encode(lay, p_v, b_bar, s_i, labels[:, :10])
    with pytest.raises(ValueError, match="labels"):
        codec.encode(plain, p_v, b_bar, s_i, labels)
    with pytest.raises(ValueError, match="format"):
        codec.Layout.from_header({**h, "format": 3})


@pytest.mark.parametrize("quant", ["float16", "int8"])
def test_a_two_tower_model_has_no_bytes_to_store(quant):
    """ItemDims(0, 0, 0, 0) (a family model without reranker heads): a layout of no field and 0 bytes in both
    quantizations (int8's scales would be 8 bytes of nothing), so the jobs store no feature value; decoding gives K
    empty arrays of the shapes a reader expects, whatever it is handed."""
    lay = codec.Layout(quant, ItemDims(0, 0, 0, 0))
    assert lay.empty and lay.itemsize == 0 and lay.header()["fields"] == []
    assert codec.Layout.from_header(lay.header()) == lay
    vals = codec.encode(lay, np.zeros((3, 0, 0)), np.zeros((3, 0)), np.zeros((3, 0)))
    assert vals == [b"", b"", b""]
    out = codec.decode(lay, [None] * 4)
    assert {k: v.shape for k, v in out.items()} == {"p_v": (4, 0, 0), "b_bar": (4, 0), "s_i": (4, 0)}
    assert not codec.Layout(quant, ItemDims(1, 1, 0, 0)).empty


def test_factory_by_size_and_forced():
    s = IndexerSettings(flat_max=100, hnsw_max=1000)
    assert choose_factory(99, 64, s) == "Flat"
    assert choose_factory(100, 64, s) == "HNSW32"
    f = choose_factory(5000, 256, s)
    assert f.startswith("IVF") and f.endswith(",PQ32")
    assert choose_factory(10, 64, IndexerSettings(factory="IVF2,Flat")) == "IVF2,Flat"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for factory in ("Flat", "HNSW32", "IVF4,PQ4x4"):
        index = build_faiss(x, factory)
        if hasattr(index, "nprobe"):
            index.nprobe = 4
        _, rows = index.search(x[:20], 1)
        hit = (rows[:, 0] == np.arange(20)).mean()
        assert hit >= (1.0 if factory != "IVF4,PQ4x4" else 0.5), factory
