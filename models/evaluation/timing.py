"""Rerank latency per query on this machine: one query against K cached
candidates, PyTorch eager and ONNX Runtime, median of repeated runs.

What is timed is what the service pays per query in the rerank stage: the
per-pair layers and the fusion. Per-image parts are cached by the index (CP:
P_v, b_bar; T-EMDE: s_I; SM / TV: the embedded region tokens) and per-query
parts are the query tower's outputs, so neither is in the timing.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from crossprobe.core import runtime
from crossprobe.models import export as ex
from crossprobe.models import graphs
from crossprobe.models.model import SearchModel


def median_ms(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1000)
    return statistics.median(ts)


def scorer_inputs(model: SearchModel, method: str, K: int, T: int = 14) -> tuple:
    """Realistically shaped inputs for one query and K candidates (T = a typical caption length)."""
    c = getattr(model, method).cfg  # the module's own config (frontier variants swap modules)
    if method == "cp":
        return (
            torch.randn(1, c.m, c.d),
            torch.randn(1, c.d),
            torch.randn(K, c.n, c.d),
            torch.randn(K, c.d),
            torch.rand(K),
        ) + graphs.region_inputs(model, method, K)
    if method == "temde":
        nk = c.N * c.K
        return (torch.rand(1, nk), torch.rand(K, nk), torch.rand(K)) + graphs.region_inputs(model, method, K)
    d = c.d
    return (torch.randn(1, T, d), torch.ones(1, T, dtype=torch.bool), torch.randn(K, 49, d), torch.rand(K))


def scorer_module(model: SearchModel, method: str) -> torch.nn.Module:
    return graphs.GRAPHS[f"{method}_scorer"][0](model).eval()


@torch.inference_mode()
def rerank_ms(
    model: SearchModel,
    methods=("cp", "temde", "sm", "tv"),
    ks=(100, 1000),
    threads: int = 2,
    repeats: int = 20,
    onnx_dir: Path | None = None,
) -> dict:
    """-> {"pytorch": {method: {K: ms}}, "onnxruntime": {...}} on `threads` threads."""
    torch.set_num_threads(threads)
    tmp = None
    if onnx_dir is None:
        tmp = tempfile.TemporaryDirectory()
        onnx_dir = Path(tmp.name)
    out: dict = {"pytorch": {}, "onnxruntime": {}}
    for method in methods:
        mod = scorer_module(model, method)
        name = f"{method}_scorer"
        path = Path(onnx_dir) / f"{name}.onnx"
        if not path.exists():
            ex.export_all(model, Path(onnx_dir), "timing", names=(name,))
        sess = runtime.session(path, threads)
        in_names = [i.name for i in sess.get_inputs()]
        out["pytorch"][method], out["onnxruntime"][method] = {}, {}
        for K in ks:
            args = scorer_inputs(model, method, K)
            # the references cost seconds at K=1000: fewer repeats there
            reps = repeats if (method in ("cp", "temde") or K <= 100) else max(3, repeats // 5)
            out["pytorch"][method][str(K)] = round(median_ms(lambda: mod(*args), reps), 3)  # noqa: B023 - called at once
            feed = {n: a.numpy() for n, a in zip(in_names, args)}
            out["onnxruntime"][method][str(K)] = round(median_ms(lambda: sess.run(None, feed), reps), 3)  # noqa: B023 - called at once
    if tmp:
        tmp.cleanup()
    return out


def parity(model: SearchModel, name: str, onnx_path: Path, args: tuple) -> float:
    """Max |ONNX Runtime - PyTorch| over all outputs of one exported graph."""
    mod = graphs.GRAPHS[name][0](model).eval()
    with torch.inference_mode():
        ref = mod(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    sess = runtime.session(onnx_path, 1)
    got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
    # integer outputs (region labels: argmax per cell) must match exactly: the fraction that differ
    return max(
        float((r.numpy() != g).mean()) if not r.is_floating_point() else float(np.abs(r.numpy() - g).max())
        for r, g in zip(ref, got)
    )
