"""The PyTorch path of crossprobe's model (models/torch_backend.py), the one the GPU machines run: on
the CPU here it must give what the ONNX graphs give (fp32: 1e-4), and on a CUDA device the same (run where one is)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from crossprobe.core import inference
from crossprobe.core.inference import RuntimeOptions
from crossprobe.models.torch_backend import TorchCrossprobeBackend
from tests.service.conftest import artifacts, svc_ckpt  # noqa: F401 (fixtures)

TEXTS = ["a dog runs on the beach", "two people on bikes", "a red car parked in the snow"]


def _pair(svc_ckpt, artifacts, bert, device="cpu", precision="fp32"):
    onnx = inference.load(svc_ckpt, RuntimeOptions(graphs=artifacts, threads=1))
    torch_path = TorchCrossprobeBackend(svc_ckpt, RuntimeOptions(graphs=artifacts, threads=1, bert=bert, device=device,
                                                                 precision=precision))
    return onnx, torch_path


def _compare(onnx, tpath, atol):
    px = np.random.default_rng(0).normal(size=(4, 3, 224, 224)).astype(np.float32)
    a, b = onnx.encode_images(px), tpath.encode_images(px)
    for f in ("g", "p_v", "b_bar", "s_i"):
        np.testing.assert_allclose(getattr(b, f), getattr(a, f), atol=atol, err_msg=f)
    np.testing.assert_array_equal(b.labels, a.labels)
    qa, qb = onnx.encode_texts(TEXTS), tpath.encode_texts(TEXTS)
    for x, y in zip(qa, qb):
        np.testing.assert_allclose(y.g_q, x.g_q, atol=atol)
        np.testing.assert_allclose(y.p_t, x.p_t, atol=atol)
        np.testing.assert_allclose(y.s_q, x.s_q, atol=atol)
    stored = {"p_v": a.p_v, "b_bar": a.b_bar, "s_i": a.s_i, "labels": a.labels}
    for kind in ("cp", "temde"):
        s_tt = a.g @ qa[0].g_q
        np.testing.assert_allclose(tpath.rerank(kind, qa[0], stored, s_tt), onnx.rerank(kind, qa[0], stored, s_tt),
                                   atol=atol * 10, err_msg=kind)  # logits are scaled cosines


def test_the_pytorch_path_gives_what_the_graphs_give(svc_ckpt, artifacts, bert):
    onnx, tpath = _pair(svc_ckpt, artifacts, bert)
    assert tpath.fingerprint == onnx.fingerprint and tpath.dims == onnx.dims
    _compare(onnx, tpath, 1e-4)
    assert tpath.providers == ["torch:cpu"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precisions_run_through_autocast(svc_ckpt, artifacts, bert, precision):
    """fp16 / bf16 by autocast on any device (here the CPU): the label bridge's fp32 logits used to meet half
    weights and fail; the outputs come back float32, near the graphs' (half precision's error, not a bug's)."""
    onnx, tpath = _pair(svc_ckpt, artifacts, bert, precision=precision)
    px = np.random.default_rng(0).normal(size=(2, 3, 224, 224)).astype(np.float32)
    a, b = onnx.encode_images(px), tpath.encode_images(px)
    assert b.g.dtype == np.float32 and np.isfinite(b.p_v).all()
    np.testing.assert_allclose(b.g, a.g, atol=5e-2)
    q = tpath.encode_texts(TEXTS[:1])[0]
    np.testing.assert_allclose(q.g_q, onnx.encode_texts(TEXTS[:1])[0].g_q, atol=5e-2)
    stored = {"p_v": a.p_v, "b_bar": a.b_bar, "s_i": a.s_i, "labels": a.labels}
    for kind in ("cp", "temde"):
        assert np.isfinite(tpath.rerank(kind, q, stored, a.g @ q.g_q)).all()


def test_cuda_asked_for_without_cuda_says_so(svc_ckpt, artifacts, bert):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        inference.load(svc_ckpt, RuntimeOptions(graphs=artifacts, device="cuda"))


def test_auto_is_the_cpu_without_onnxruntime_gpu(svc_ckpt, artifacts):
    from crossprobe.core.inference import resolve_device
    from crossprobe.core.runtime import onnxruntime_has_cuda

    assert resolve_device("auto") == ("cuda" if onnxruntime_has_cuda() else "cpu")
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match="cpu, cuda, cuda:N or auto"):
        resolve_device("gpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine (the GPU check runs it)")
@pytest.mark.parametrize("precision, atol", [("fp32", 1e-4), ("fp16", 1e-3), ("bf16", 1e-2)])
def test_on_a_cuda_device(svc_ckpt, artifacts, bert, precision, atol):
    onnx, tpath = _pair(svc_ckpt, artifacts, bert, "cuda", precision)
    _compare(onnx, tpath, atol)
