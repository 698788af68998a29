"""The ANN stage on a GPU (storage/ann/gpu.py). Its exact search runs the same torch code on any device, so
here it runs on the CPU against FAISS Flat (the same rows and scores); which search a version gets on a GPU machine
(faiss-gpu, exact on the GPU, FAISS on the CPU when the vectors do not fit or there is no GPU) is checked with the
memory budget given, and with faiss-gpu stood in for. The CUDA tests run where there is a CUDA device (the GPU
check) and skip elsewhere."""
from __future__ import annotations

import logging
import subprocess
import sys

import faiss
import numpy as np
import pytest
import torch
from pydantic import TypeAdapter

from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage import faiss_io
from crossprobe.storage.ann import gpu
from crossprobe.storage.ann.faiss_backend import FaissBackend, FaissIndex
from crossprobe.storage.filter_columns import Columns
from crossprobe.storage.filter_model import FilterNode

N, D, K = 3000, 32, 10
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine (the GPU check runs it)")


def _vectors(n: int, d: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n, d))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    """A FAISS version's files (index.faiss Flat + vectors.npy) -> (its dir, vectors, queries)."""
    vdir = tmp_path_factory.mktemp("v1")
    v = _vectors(N, D)
    faiss_io.write_index(faiss_io.build_faiss(v, "Flat"), vdir / "index.faiss")
    faiss_io.write_vectors(v, vdir / "vectors.npy")
    return vdir, v, _vectors(8, D, seed=1)


def _flat(vdir) -> FaissIndex:
    return FaissIndex(faiss.read_index(str(vdir / "index.faiss")))


def test_exact_search_gives_faiss_flat_rows_and_scores(version):
    vdir, v, q = version
    ix = gpu.TorchExactIndex(np.load(vdir / "vectors.npy", mmap_mode="r"), "cpu", "fp32")
    assert ix.count() == N and ix.d == D and ix.describe() == "exact:cpu:fp32" and ix.index is None
    for k in (1, K, 100):
        s, r = ix.search(q, k)
        fs, fr = _flat(vdir).search(q, k)
        assert r.dtype == np.int64 and s.dtype == np.float32 and r.shape == (len(q), k)
        assert np.array_equal(r, fr), k
        np.testing.assert_allclose(s, fs, atol=1e-5)


def test_more_asked_than_held_pads_as_faiss_does(version):
    vdir, v, q = version
    ix = gpu.TorchExactIndex(v[:5], "cpu")
    s, r = ix.search(q[:2], 8)
    assert r.shape == (2, 8) and (r[:, 5:] == -1).all() and np.isneginf(s[:, 5:]).all()
    assert np.array_equal(r[:, :5], np.argsort(-(q[:2] @ v[:5].T), axis=1))


def test_fp16_keeps_the_ranking_within_its_precision(version):
    vdir, v, q = version
    s, r = gpu.TorchExactIndex(v, "cpu", "fp16").search(q, 50)
    fs, fr = _flat(vdir).search(q, 50)
    np.testing.assert_allclose(s, fs, atol=2e-3)  # half precision: ~1e-3 on unit vectors
    overlap = np.mean([len(set(a) & set(b)) / 50 for a, b in zip(r, fr)])
    assert overlap >= 0.95, overlap  # only near-ties at the cut may swap


FILTERS = [{"field": "tags", "in": ["red"]}, {"field": "width", "gte": 300}, {"field": "tags", "eq": "none-such"}]


@pytest.mark.parametrize("flt", FILTERS, ids=["tag", "width", "none"])
def test_filtered_search_is_the_cpu_paths_exact_answer(version, flt):
    vdir, v, q = version
    rng = np.random.default_rng(3)
    metas = [{"tags": ["red"] if rng.random() < 0.05 else [], "width": int(rng.integers(0, 400))} for _ in range(N)]
    node, cols = TypeAdapter(FilterNode).validate_python(flt), Columns(metas)
    ix, flat = gpu.TorchExactIndex(v, "cpu"), _flat(vdir)
    mask = ix.prepare_filter(node, [int(np.argmax(v @ q[0]))], lambda: cols)
    assert np.array_equal(mask, flat.prepare_filter(node, [int(np.argmax(v @ q[0]))], lambda: cols))
    got = ix.search_filtered(q[0], K, mask, lambda rows: v[rows], exact_max=0)
    want = flat.search_filtered(q[0], K, mask, lambda rows: v[rows], exact_max=0)
    assert (got.matching, got.exact) == (want.matching, True)
    assert got.how == ("none-match" if want.matching == 0 else "exact-scan")
    assert np.array_equal(got.rows, want.rows)
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-5)


def test_vectors_over_the_budget_stay_on_the_cpu(version, caplog):
    vdir, v, q = version
    with caplog.at_level(logging.WARNING, "crossprobe.indexer"):
        ix = gpu.open_on_device("cpu", vdir, "fp32", lambda: _flat(vdir), budget_bytes=N * D * 4 - 1)
    assert isinstance(ix, FaissIndex) and "MiB, over the 0.4 MiB this GPU can give them" in caplog.text
    assert isinstance(gpu.open_on_device("cpu", vdir, "fp16", lambda: _flat(vdir), budget_bytes=N * D * 2),
                      gpu.TorchExactIndex)


def test_the_cpu_path_is_unchanged(version, tmp_path):
    vdir, v, q = version
    s = IndexerSettings(index_root=tmp_path, device="cpu", progress=False)
    ix = FaissBackend(s).open("x", "v1", {}, vdir)
    assert type(ix) is FaissIndex and ix.describe().startswith("faiss:IndexFlat")
    assert gpu.wanted_device(s) is None


def test_the_cpu_path_never_imports_torch(version):
    """A torch-free installation (the container image) searches as before: torch only where a GPU is asked for."""
    code = ("import sys; from crossprobe.storage.settings import StorageSettings; "
            "from crossprobe.storage.ann.faiss_backend import FaissBackend; "
            f"ix = FaissBackend(StorageSettings(device='cpu')).open('x', 'v1', {{}}, __import__('pathlib').Path({str(version[0])!r})); "
            "assert ix.count() == %d; print('torch' in sys.modules)" % N)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_asked_for_without_cuda_searches_on_the_cpu_and_says_why(version, tmp_path, caplog):
    vdir, v, q = version
    with caplog.at_level(logging.WARNING, "crossprobe.indexer"):
        ix = FaissBackend(IndexerSettings(index_root=tmp_path, device="cuda", progress=False)).open("x", "v1", {}, vdir)
    assert type(ix) is FaissIndex and "sees no CUDA device" in caplog.text


def test_with_faiss_gpu_flat_goes_to_faiss_on_the_gpu_and_hnsw_does_not(version, tmp_path, monkeypatch):
    """faiss-gpu is stood in for (faiss-cpu here): its index_cpu_to_gpu hands the CPU index back, so the test sees
    which versions are copied to the GPU, and that filtered searches stay on the CPU copy."""
    vdir, v, q = version
    copied = []
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", lambda res, dev, ix: copied.append((dev, ix)) or ix, raising=False)
    ix = gpu.open_on_device("cuda:1", vdir, "fp32", lambda: _flat(vdir))
    assert isinstance(ix, gpu.FaissGpuIndex) and copied[0][0] == 1 and ix.describe().startswith("faiss-gpu:IndexFlat")
    assert np.array_equal(ix.search(q, K)[1], _flat(vdir).search(q, K)[1])
    mask = np.zeros(N, bool)
    mask[::7] = True
    assert ix.search_filtered(q[0], K, mask, lambda r: v[r], 0).how == "faiss-idselector"  # the CPU copy's bitmap
    hdir = tmp_path / "hnsw"
    hdir.mkdir()
    faiss_io.write_index(faiss_io.build_faiss(v, "HNSW32"), hdir / "index.faiss")
    faiss_io.write_vectors(v, hdir / "vectors.npy")
    hnsw = gpu.open_on_device("cuda:1", hdir, "fp32", lambda: FaissIndex(faiss.read_index(str(hdir / "index.faiss"))))
    assert len(copied) == 1  # never handed to index_cpu_to_gpu
    assert isinstance(hnsw, gpu.TorchExactIndex if torch.cuda.is_available() else FaissIndex)


@CUDA
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_on_a_cuda_device(version, tmp_path, precision):
    vdir, v, q = version
    s = IndexerSettings(index_root=tmp_path, device="cuda", device_precision=precision, progress=False)
    ix = FaissBackend(s).open("x", "v1", {}, vdir)
    assert isinstance(ix, gpu.TorchExactIndex) and ix.describe().startswith("exact:cuda")
    sc, r = ix.search(q, 50)
    fs, fr = _flat(vdir).search(q, 50)
    if precision == "fp32":
        assert np.array_equal(r, fr)
        np.testing.assert_allclose(sc, fs, atol=1e-5)
    else:
        np.testing.assert_allclose(sc, fs, atol=2e-3)
        assert np.mean([len(set(a) & set(b)) / 50 for a, b in zip(r, fr)]) >= 0.95
    mask = np.zeros(N, bool)
    mask[::7] = True
    got = ix.search_filtered(q[0], K, mask, lambda rows: v[rows], 0)
    want = _flat(vdir).search_filtered(q[0], K, mask, lambda rows: v[rows], 0)
    assert got.matching == want.matching and len(set(got.rows) & set(want.rows)) >= K - 1
