"""The ANN stage on a GPU: how a FAISS version is searched when the settings ask for one (StorageSettings.device
cuda or cuda:N; auto where ONNX Runtime has its CUDA provider). FaissBackend.open asks open_on_device.

    faiss-gpu installed (faiss.get_num_gpus() > 0)
        Flat, IVF*   the version's index.faiss copied to the GPU (faiss.index_cpu_to_gpu): the same search as on
                     the CPU, run there. Filtered searches stay on the CPU copy: FAISS's GPU indexes take no
                     IDSelector.
        HNSW         FAISS has no GPU HNSW (index_cpu_to_gpu refuses it): as below. So does any index it refuses
                     (an IVF-PQ code size its GPU kernels lack).
    no faiss-gpu (the GPU machines this project is lent: torch with CUDA), or an index faiss-gpu cannot hold
        exact search on the GPU: the version's vectors.npy held in GPU memory, one matrix product and a top-k on
        the device per batch of queries (TorchExactIndex); a filter is the same row mask the CPU path makes,
        applied on the device (exact). Whatever factory the version was built with, this finds what exact search
        finds: an HNSW or IVF-PQ version searched here ranks better than on the CPU, never worse. Vectors are kept
        in fp32, or in fp16 where StorageSettings.device_precision is fp16 or bf16 (unit vectors need no bf16
        range, and fp16 keeps 3 more mantissa bits): half the memory; scores then differ from fp32 by ~1e-3 and
        near-ties may swap. Only when the vectors fit in half the GPU memory free when the version opens (a
        version swap holds two at once); else FAISS on the CPU.
    no GPU to use (torch missing or without CUDA): FAISS on the CPU, with a warning. The model's own loading is what
        refuses a GPU asked for and not there (core/inference): the ANN stage alone falls back.

torch is imported only here, and only when a GPU is asked for: the CPU path never imports it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import faiss
import numpy as np

from crossprobe.storage import layout
from crossprobe.storage.ann.base import AnnIndex, Filtered
from crossprobe.storage.ann.faiss_backend import FaissIndex, row_mask

if TYPE_CHECKING:  # for annotations only: the CPU path never imports torch
    import torch

log = logging.getLogger("crossprobe.indexer")

# the share of the GPU memory free at open that one version's vectors may take: a version swap loads the new version
# beside the old one, and the model, the scorers' activations and the allocator's slack need the rest
GPU_MEMORY_SHARE = 0.5
UPLOAD_ROWS = 262_144  # vectors.npy reaches the GPU this many rows at a time (no whole fp32 copy on the host)


def wanted_device(settings) -> str | None:
    """The GPU the settings ask for ("cuda", "cuda:1"), or None for the CPU."""
    from crossprobe.core.inference import resolve_device

    device = resolve_device(getattr(settings, "device", "cpu"))
    return device if device.startswith("cuda") else None


def open_on_device(
    device: str, vdir: Path, precision: str, cpu: Callable[[], FaissIndex], budget_bytes: int | None = None
) -> AnnIndex:
    """A version's ANN index searched on `device` (the module's docstring says which search), or cpu() where the
    GPU cannot take it. budget_bytes: the most its vectors may take on the device (None: GPU_MEMORY_SHARE of the
    free memory; tests pass one, and "cpu" as the device to run the same torch code here)."""
    held = None
    if device.startswith("cuda") and faiss_gpus() > 0:
        held = cpu()
        if not hasattr(held.index, "hnsw"):
            try:
                return FaissGpuIndex(held, device)
            except RuntimeError as e:  # e.g. an IVF-PQ code size FAISS's GPU kernels lack
                log.warning(
                    "%s: FAISS cannot copy %s to the GPU (%s); exact search on the GPU instead",
                    vdir,
                    held.describe(),
                    e,
                )
    path = Path(vdir) / layout.VECTORS
    why = torch_unusable(device) or (None if path.exists() else "the version has no vectors.npy")
    if why is None:
        vectors = np.load(path, mmap_mode="r")
        need = vectors.shape[0] * vectors.shape[1] * (4 if precision == "fp32" else 2)
        budget = device_budget(device) if budget_bytes is None else budget_bytes
        if budget is None or need <= budget:
            return TorchExactIndex(vectors, device, precision)
        why = f"its vectors take {need / 2**20:.1f} MiB, over the {budget / 2**20:.1f} MiB this GPU can give them"
    log.warning("%s: ANN search on the CPU (FAISS), not on %s: %s", vdir, device, why)
    return held if held is not None else cpu()


def faiss_gpus() -> int:
    """GPUs FAISS can use: 0 with faiss-cpu (whose get_num_gpus says 0)."""
    return int(getattr(faiss, "get_num_gpus", lambda: 0)())


def torch_unusable(device: str) -> str | None:
    """Why torch cannot run the exact search on `device`, or None when it can."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if device.startswith("cuda") and not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    return None


def device_budget(device: str) -> int | None:
    """GPU_MEMORY_SHARE of the memory free on a CUDA device now; None (no bound) for the CPU."""
    import torch

    if not device.startswith("cuda"):
        return None
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free * GPU_MEMORY_SHARE)


class TorchExactIndex(AnnIndex):
    """A version's vectors in device memory; exact inner-product search by one matrix product and a top-k."""

    backend = "faiss"  # the version is a FAISS version (its manifest, its files): only the search runs elsewhere
    index = None  # no faiss.Index is held (reader.index is None for it)

    def __init__(self, vectors: np.ndarray, device: str, precision: str = "fp32"):
        import torch

        self._torch = torch
        self.device = torch.device(device)
        self.dtype = torch.float32 if precision == "fp32" else torch.float16
        n, self.d = vectors.shape
        v = torch.empty((n, self.d), dtype=self.dtype, device=self.device)  # (N, d)
        for i in range(0, n, UPLOAD_ROWS):
            part = np.array(vectors[i : i + UPLOAD_ROWS], np.float32)  # a writable copy: torch takes no read-only array
            v[i : i + len(part)] = torch.from_numpy(part).to(self.device, self.dtype)
        self.v: torch.Tensor | None = v  # None once closed

    def _vectors(self) -> torch.Tensor:
        assert self.v is not None, "searched after close()"
        return self.v

    def count(self) -> int:
        return int(self._vectors().shape[0])

    def _scores(self, q: np.ndarray):
        """(B, d) queries -> (B, N) inner products on the device, in the vectors' precision."""
        t = self._torch.from_numpy(np.array(np.atleast_2d(q), np.float32))
        return t.to(self.device, self.dtype) @ self._vectors().T

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """As FAISS answers: (B, k) scores and rows, best first; rows past the end -1 with score -inf."""
        n = self.count()
        with self._torch.inference_mode():
            vals, top = self._torch.topk(self._scores(q), min(k, n), dim=1)
            scores, rows = vals.float().cpu().numpy(), top.cpu().numpy().astype(np.int64)
        if k > n:
            pad = k - n
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
        return scores, rows

    def prepare_filter(self, node, exclude_rows: list[int], columns: Callable[[], Any]) -> np.ndarray:
        return row_mask(node, exclude_rows, columns)

    def search_filtered(
        self,
        q: np.ndarray,
        k: int,
        prepared: np.ndarray,
        vectors_at: Callable[[np.ndarray], np.ndarray],
        exact_max: int,
    ) -> Filtered:
        """Every matching row scored on the device (the rest set to -inf before the top-k): exact, whatever
        exact_max says (that bound is for a scan on the CPU)."""
        matching = int(prepared.sum())
        if matching == 0:
            return Filtered(np.zeros(0, np.int64), np.zeros(0, np.float32), 0, True, "none-match")
        torch = self._torch
        with torch.inference_mode():
            keep = torch.from_numpy(np.array(prepared, bool)).to(self.device)
            s = self._scores(np.asarray(q).reshape(1, -1))[0].masked_fill(~keep, float("-inf"))
            vals, rows = torch.topk(s, min(k, matching))
            return Filtered(
                rows.cpu().numpy().astype(np.int64), vals.float().cpu().numpy(), matching, True, "exact-scan"
            )

    def describe(self) -> str:
        return f"exact:{self.device}:{'fp32' if self.dtype == self._torch.float32 else 'fp16'}"

    def close(self) -> None:
        self.v = None  # the device memory goes back to torch's allocator with the tensor


class FaissGpuIndex(FaissIndex):
    """A Flat or IVF version's index copied to the GPU by faiss-gpu (same results as on the CPU, run there).
    FAISS's GPU resources are not thread-safe, so searches take turns on it (a search is ~ms); filtered searches
    run on the CPU copy, whose bitmap FAISS's GPU indexes cannot take."""

    def __init__(self, cpu: FaissIndex, device: str):
        self.cpu = cpu
        self.res = faiss.StandardGpuResources()
        gpu = int(device.partition(":")[2] or 0)
        super().__init__(faiss.index_cpu_to_gpu(self.res, gpu, cpu.index), nprobe=getattr(cpu.index, "nprobe", 16))
        self._lock = threading.Lock()

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            return super().search(q, k)

    def search_filtered(
        self,
        q: np.ndarray,
        k: int,
        prepared: np.ndarray,
        vectors_at: Callable[[np.ndarray], np.ndarray],
        exact_max: int,
    ) -> Filtered:
        return self.cpu.search_filtered(q, k, prepared, vectors_at, exact_max)

    def describe(self) -> str:
        return f"faiss-gpu:{type(self.cpu.index).__name__}"
