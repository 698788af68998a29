"""ONNX Runtime sessions: the one place the project creates them (no torch import here,
so the service starts without loading PyTorch).

Thread pools. By default every session owns an intra-op pool. A process that runs
several graphs one after another on few cores (the service: query tower, then the
CP scorer, per request) should share ONE pool instead: with a pool per session
and spinning workers, the pool that just finished keeps spinning on the cores the
next graph needs. Measured on 2 cores, int8 query tower then CP over 100
candidates, per query (docs/research/ort_threading.md): own pools + spinning 4.0 + 9.4 ms,
own pools without spinning 4.6 + 5.6 ms, one shared pool 3.5 + 5.0 ms.
ONNX Runtime allows the shared pool to be made once per process and then
requires every later session to use it, so `share_thread_pool` is process-wide
and `session` follows it.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

log = logging.getLogger("crossprobe.core.runtime")

_lock = threading.Lock()
_shared_threads: int | None = None  # set once the process-wide pool exists


def share_thread_pool(threads: int) -> int:
    """Create the process-wide intra-op pool with `threads` threads (once per process; later calls
    keep the first size and return it). Sessions created afterwards all run on it."""
    global _shared_threads
    import onnxruntime as ort

    with _lock:
        if _shared_threads is None:
            ort.set_global_thread_pool_sizes(threads, 1)
            _shared_threads = threads
        elif _shared_threads != threads:
            log.warning("ONNX Runtime's shared pool already has %d threads; %d requested", _shared_threads, threads)
        return _shared_threads


def shared_pool_threads() -> int | None:
    return _shared_threads


def session(path: Path, threads: int | None = None, spinning: bool | None = None, device: str = "cpu"):
    """ONNX Runtime session on the CPU, or with device "cuda[:N]" on ONNX Runtime's CUDA provider (onnxruntime-gpu;
    the CPU provider stays behind it for the operators CUDA lacks).

    threads / spinning apply to a session's own pool; under the shared pool (share_thread_pool)
    they are the pool's (its workers spin: ONNX Runtime's default, not settable from Python)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if _shared_threads is not None:
        opts.use_per_session_threads = False
    else:
        if threads:
            opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        if spinning is not None:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    providers: list = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(f"device {device}: this ONNX Runtime has no CUDA provider (install onnxruntime-gpu)")
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(device.partition(":")[2] or 0)}))
    return ort.InferenceSession(str(path), opts, providers=providers)


class StageTimer:
    """Wall time per named stage, summed when a stage runs more than once; thread-safe.

    The indexer's jobs (decode / backbone / head / write ... over a whole build) and the service's
    request path (encode / ann / fetch / rerank ... of one search) both time their stages with it."""

    def __init__(self) -> None:
        self._s: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._s[name] = self._s.get(name, 0.0) + seconds

    def seconds(self) -> dict[str, float]:
        with self._lock:
            return {k: round(v, 4) for k, v in self._s.items()}

    def ms(self) -> dict[str, float]:
        with self._lock:
            return {k: v * 1000 for k, v in self._s.items()}


def onnxruntime_has_cuda() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()
