"""Encode stage: pixels -> frozen backbone (ONNX Runtime) -> image-tower head.

The head runs in ONNX Runtime by default (IndexerSettings.head = "onnx"): it is
faster than PyTorch eager (docs/research/indexer.md), and a build whose head
graph is already exported for this fingerprint never builds the PyTorch model
(no MiniLM load: a resumed build starts in about a second). head = "torch"
remains for checking.

Graphs live in <model_dir>, written by models/export.py: image_backbone.onnx
(one for all checkpoints) and <fingerprint>/image_tower.onnx.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crossprobe.models import DEFAULT_CHECKPOINT, read_config
from crossprobe.indexer.jobs.settings import IndexerSettings


@dataclass(frozen=True)
class Dims:
    d: int  # two-tower width (g_I)
    n: int  # vision probes
    dc: int  # probe width
    nk: int  # sketch size N*K
    cells: int = 0  # region labels per image (49) when the model has them (models/region_labels.py)


@dataclass
class Encoded:
    g: np.ndarray  # (B, d) unit norm
    p_v: np.ndarray  # (B, n, dc)
    b_bar: np.ndarray  # (B, dc)
    s_i: np.ndarray  # (B, nk)
    labels: np.ndarray | None = None  # (B, 49) int64 the head's class per grid cell, with region labels


def model_dims(model_cfg: dict) -> Dims:
    from crossprobe.models.model import ModelConfig

    c = ModelConfig.from_dict(model_cfg)
    return Dims(c.vision.d, c.cp.n, c.cp.d, c.temde.N * c.temde.K, 49 if c.region.enabled else 0)


class Encoder:
    """Callable pieces of the encode stage; `backbone` and `head` are timed as separate stages."""

    def __init__(self, settings: IndexerSettings, ckpt: Path | None = None, model=None, bert=None,
                 identity: tuple[str, Dims] | None = None):
        """identity: (fingerprint, dims) when the caller already knows them (the Ray engine's actors, which
        get no in-memory model to fingerprint: prepare() exported the head graph for them)."""
        from crossprobe.models.data.features import image_backbone_session
        from crossprobe.models.export import ensure_graphs
        from crossprobe.models.runtime import session

        self.fingerprint, self.dims = identity or identify(ckpt, model, settings.models)
        self.settings = settings
        models = settings.models
        models.mkdir(parents=True, exist_ok=True)
        # with OCR on, an OCR thread shares the cores: ONNX Runtime's spinning workers would take them from it
        # while they wait (measured: docs/research/text_search.md, "Indexing with OCR on")
        spin = False if settings.ocr else None
        self._backbone = image_backbone_session(models, threads=settings.threads, spinning=spin)
        self._torch = None
        self._head = None
        head_path = models / self.fingerprint / "image_tower.onnx"
        if settings.head == "onnx" and head_path.exists():
            pass  # exported before for this exact fingerprint: no PyTorch model needed
        else:
            if model is None:
                from crossprobe.models import checkpoint  # torch: only when no head graph is exported

                model, _ = checkpoint.load(ckpt, bert)
            if settings.head == "torch":
                from crossprobe.models.graphs import ImageGraph

                self._torch = ImageGraph(model).eval()
            else:
                ensure_graphs(models, ["image_tower"], model=model, fingerprint=self.fingerprint)
        if self._torch is None:
            self._head = session(head_path, threads=settings.threads, spinning=spin)

    def backbone(self, pixels: np.ndarray) -> np.ndarray:
        """(B, 3, 224, 224) float32 -> (B, 49, 1280) float32."""
        return self._backbone.run(None, {"pixels": pixels})[0]

    def head(self, grid: np.ndarray) -> Encoded:
        """(B, 49, 1280) -> g (B, d), p_v (B, n, dc), b_bar (B, dc), s_i (B, nk) [, labels (B, 49)]."""
        if self._head is not None:
            out = self._head.run(None, {"grid": grid})
        else:
            import torch

            with torch.inference_mode():
                out = [o.numpy() for o in self._torch(torch.from_numpy(grid))]
        g, p_v, b_bar, s_i, *labels = out
        return Encoded(np.ascontiguousarray(g, np.float32), p_v, b_bar, s_i, labels[0] if labels else None)


def prepare(settings: IndexerSettings, ckpt: Path | None = None, model=None, bert=None) -> tuple[str, Dims]:
    """Export what an Encoder needs (the backbone graph, this fingerprint's head graph) without building any
    session -> (fingerprint, dims). The Ray engine calls it once in the driver, so its actors only load
    graphs: N actors never export the same file at once, nor each load the PyTorch model."""
    from crossprobe.models.export import ensure_backbone, ensure_graphs

    fingerprint, dims = identify(ckpt, model, settings.models)
    ensure_backbone(settings.models)
    if settings.head == "onnx":
        ensure_graphs(settings.models, ["image_tower"], ckpt, model=model, bert=bert, fingerprint=fingerprint)
    return fingerprint, dims


def identify(ckpt: Path | None = None, model=None, graphs: Path | None = None) -> tuple[str, Dims]:
    """(fingerprint, dims) from the checkpoint's config.json (cheap), or of an in-memory model. graphs: the model
    folder (<model_dir>); where this fingerprint's head graph is exported there, the dims are read off the graph,
    so that nothing imports torch (the container image has none: docs/deployment.md)."""
    if model is not None:  # tests, notebooks: the fingerprint checkpoint.save would record
        return _fingerprint_of(model), model_dims(model.cfg.to_dict())
    path = Path(ckpt or DEFAULT_CHECKPOINT)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (train one with `crossprobe train`, or pass --ckpt)")
    meta = read_config(path)
    head = Path(graphs) / meta["fingerprint"] / "image_tower.onnx" if graphs else None
    if head is not None and head.exists():
        return meta["fingerprint"], graph_dims(head)
    return meta["fingerprint"], model_dims(meta["model"])


def graph_dims(head: Path) -> Dims:
    """The dims of an exported head graph: one run on a zero grid (the graph's shapes are partly symbolic), once
    per file: a job asks for them when it plans the version and again when its Encoder starts."""
    st = Path(head).stat()
    return _graph_dims(str(head), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _graph_dims(head: str, _mtime_ns: int, _size: int) -> Dims:
    from crossprobe.models import inputs
    from crossprobe.models.runtime import session

    grid = np.zeros((1, inputs.GRID * inputs.GRID, inputs.IMAGE_FEAT_DIM), np.float32)
    g, p_v, _, s_i, *labels = session(head, threads=1).run(None, {"grid": grid})
    return Dims(g.shape[1], p_v.shape[1], p_v.shape[2], s_i.shape[1], labels[0].shape[1] if labels else 0)


def _fingerprint_of(model) -> str:
    """The fingerprint checkpoint.save would record for this in-memory model."""
    from crossprobe.models import checkpoint

    tensors = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in model.trained_state_dict().items()}
    return checkpoint.fingerprint(tensors, model.cfg.to_dict())
