"""The inference seam: what every model behind crossprobe offers, whatever family and runtime it comes from.

The indexer, the service, the explainer and the text gate reach models only through a Backend (the shape of
text-embeddings-inference's Backend and Immich's InferenceModel: load once, then predict):

    preprocess(image)        PIL image -> (3, S, S) float32        the model's own resize, crop and scaling
    image_grid(pixels)       (B, 3, S, S) -> ImageGrid               the frozen trunk: local features per
                                                                     region or patch, (B, P, W), and the pooled
                                                                     embedding where the trunk makes it
                                                                     ("backbone" stage)
    image_features(grid)     ImageGrid -> ImageFeatures              g, and the rerankers' item features
                                                                     ("head" stage)
    encode_texts(texts)      [str] -> [QueryVectors]                 g_q, and the rerankers' query features
    rerank(kind, q, feats, s_tt)  one query against K candidates -> (K,) fused logits

The two image steps are apart because the indexer times them apart and the text gate and the explainer read
the grid between them. Everything a backend holds is loaded lazily, each piece on first use (an indexer
never loads the query tower; a service not asked for query images never loads the image towers), or at
once with warm().
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from crossprobe.core.inference.layout import FeatureDims
from crossprobe.core.int8 import MIN_COSINE

T = TypeVar("T")


@dataclass(frozen=True)
class QueryVectors:
    """The query side of one text."""

    g_q: np.ndarray  # (d,) unit norm: the ANN query
    p_t: np.ndarray | None  # (m, dc) text probes (Cross-probe)
    w_bar: np.ndarray | None  # (dc,) mean text token (Cross-probe)
    s_q: np.ndarray | None  # (nk,) T-EMDE sketch
    q_cls: np.ndarray | None = None  # (1000,) cosines with the class table, with region labels


@dataclass
class ImageGrid:
    """What a model's frozen trunk gives for a batch of images."""

    cells: np.ndarray  # (B, P, W) float32: local features (EfficientNet's 7 x 7 cells, a ViT's patch tokens)
    pooled: np.ndarray | None = None  # (B, d) the trunk's own pooled embedding (CLIP families), not yet unit norm

    def __len__(self) -> int:
        return len(self.cells)


@dataclass
class ImageFeatures:
    """The image side of a batch (shapes: layout.py)."""

    g: np.ndarray  # (B, d) unit norm
    p_v: np.ndarray  # (B, n, dc)
    b_bar: np.ndarray  # (B, dc)
    s_i: np.ndarray  # (B, nk)
    labels: np.ndarray | None = None  # (B, cells) int64, with region labels


@dataclass(frozen=True)
class RuntimeOptions:
    """How a backend runs, not what it computes (a model's fingerprint never depends on these)."""

    graphs: Path | None = None  # where exported graphs live: <graphs>/<fingerprint>/*.onnx (+ shared ones at the top)
    threads: int | None = None  # ONNX Runtime intra-op threads per session (None: its default)
    spinning: bool | None = None  # idle workers spin (None: ONNX Runtime's default)
    shared_pool: bool = False  # one process-wide ONNX Runtime pool for every session (core/runtime.py)
    query_precision: str = "fp32"  # fp32 | int8: the query tower's graph
    query_language: str = "en"  # the queries' language, for models told it (core/inference/languages.py)
    int8_min_cosine: float = MIN_COSINE  # int8 queries refused below this cosine to fp32 on the probes (int8.py)
    # cpu | cuda | cuda:N | auto (cuda where ONNX Runtime has its CUDA provider, else cpu): inference.resolve_device
    device: str = "cpu"
    precision: str = "fp32"  # fp32 | fp16 | bf16: what the PyTorch (GPU) path computes in (torch_crossprobe.py)
    image_head: str = "onnx"  # onnx | torch (the PyTorch module, for checking the graph)
    # a model this machine lacks (a hub repo id, an open_clip tag) is downloaded first, each request bounded by this
    # many seconds (core/hub.py); None: never downloaded, the error says how to fetch it
    download_timeout_s: float | None = None
    say: Callable[[str], None] | None = None  # where fetching and exporting report their steps (None: logging)
    model: Any = None  # an in-memory model (tests): its graphs are exported from it when missing
    bert: Any = None  # an already loaded text backbone (tests): used only when graphs must be exported
    extra: dict = field(default_factory=dict)


class RerankerUnavailable(ValueError):
    """A reranker this model has no trained head for."""


class Backend(ABC):
    """One loaded model. Subclasses set fingerprint, dims, rerankers, calibration in __init__."""

    fingerprint: str  # 16 hex digits: written into every index built with this model
    dims: FeatureDims
    rerankers: tuple[str, ...]  # the trained rerankers ("cp", "temde"); () for a two-tower-only model
    calibration: object | None  # models.calibration.Calibration fitted for this model, or None
    opts: RuntimeOptions  # how it runs (set in __init__)
    query_precision: str = "fp32"
    int8_check: object | None = None  # models.int8.Int8Check once an int8 query graph passed its check
    image_size: int  # S: the side of the square pixels preprocess makes
    # whether the model's reference decodes photos reduced (JPEG draft, a HEIC's thumbnail) as crossprobe's own
    # load_image does; False for a model whose reference library decodes the full picture (every exported family):
    # its index then sees the reference's pixels (core/inference/decode.py; docs/research/decode.md)
    reduced_decoding: bool = False
    explains: bool = False  # explainer() makes per-region maps (known without loading them)

    def __init__(self) -> None:
        self._lock = threading.RLock()  # reentrant: a part may use another while it is made (int8 checks)
        self._parts: dict[str, object] = {}

    # ---- images ----------------------------------------------------------------------------------------
    @abstractmethod
    def preprocessor(self) -> Callable[..., np.ndarray]:
        """A picklable function (Ray's decode tasks get it): an opened PIL image -> (3, S, S) float32 as this
        model's trunk takes it (EXIF orientation, RGB, resize, crop, scaling)."""

    def preprocess(self, image) -> np.ndarray:
        return self.preprocessor()(image)

    def prepare(self) -> None:  # noqa: B027 - an optional hook: nothing to prepare by default
        """Fetch or export what the image parts need, without loading them (a driver before its workers start)."""

    @abstractmethod
    def image_grid(self, pixels: np.ndarray) -> ImageGrid:
        """(B, 3, S, S) float32 -> the trunk's local features (and pooled embedding)."""

    @abstractmethod
    def image_features(self, grid: ImageGrid) -> ImageFeatures:
        """The trunk's output -> g and the item features the rerankers read."""

    def encode_images(self, pixels: np.ndarray) -> ImageFeatures:
        return self.image_features(self.image_grid(np.ascontiguousarray(pixels, np.float32)))

    # ---- texts -----------------------------------------------------------------------------------------
    @abstractmethod
    def encode_texts(self, texts: list[str]) -> list[QueryVectors]:
        """A batch of queries -> their vectors (batching never changes a query's vectors)."""

    # ---- scoring ---------------------------------------------------------------------------------------
    @abstractmethod
    def rerank(self, kind: str, q: QueryVectors, feats: dict[str, np.ndarray], s_tt: np.ndarray) -> np.ndarray:
        """One query against its K candidates (feats: the feature store's decoded values) -> (K,) logits."""

    def require_reranker(self, kind: str) -> None:
        if kind not in self.rerankers:
            raise RerankerUnavailable(
                f"model {self.fingerprint} has no trained {kind!r} reranker "
                f"(it has: {', '.join(self.rerankers) or 'none'})"
            )

    # ---- optional parts --------------------------------------------------------------------------------
    def text_gate(self, threshold: float | None = None):
        """The OCR text gate that reads this model's grid (core/text_gate.py), or None: no gate fits it."""
        return None

    def explainer(self):
        """Per-region maps for a query over image grids (core/inference/explain.py), or None; a backend that
        makes them says so with `explains`."""
        return None

    @property
    def providers(self) -> list[str]:
        """The ONNX Runtime execution providers its sessions run on."""
        return []

    @property
    def graphs_root(self) -> Path:
        """RuntimeOptions.graphs, for a backend whose graphs live there (a crossprobe checkpoint, reranker heads)."""
        if self.opts.graphs is None:
            raise ValueError(
                f"{type(self).__name__} needs RuntimeOptions.graphs: the folder its graphs are exported to"
            )
        return Path(self.opts.graphs)

    def sessions(self) -> dict[str, Any]:
        """Its ONNX Runtime sessions loaded so far, by part name."""
        return {}

    def warm(self, *parts: str) -> None:  # noqa: B027 - an optional hook: parts load on first use by default
        """Load the named parts now (each backend names its own) instead of on first use."""

    # ---- lazy parts ------------------------------------------------------------------------------------
    def _part(self, name: str, make: Callable[[], T]) -> T:
        """The part `name`, made on first use (thread-safe: two first requests make it once)."""
        part = self._parts.get(name)
        if part is None:
            with self._lock:
                part = self._parts.get(name)
                if part is None:
                    part = self._parts[name] = make()
        return part  # type: ignore[return-value]

    def loaded(self, name: str) -> bool:
        return name in self._parts
