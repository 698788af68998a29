"""The inference seam (base.py): one interface through which the indexer, the service, the explainer and the
text gate reach a model, whatever its family and runtime; image decoding for it (decode.py) and the one
definition of the features it gives (layout.py). Implementations: crossprobe.py (a crossprobe checkpoint's
graphs over ONNX Runtime).
"""
from __future__ import annotations

from pathlib import Path

from crossprobe.models.inference.base import (Backend, ImageFeatures, QueryVectors, RerankerUnavailable,
                                              RuntimeOptions)
from crossprobe.models.inference.layout import FeatureDims, ItemDims

__all__ = ["Backend", "FeatureDims", "ImageFeatures", "ItemDims", "QueryVectors", "RerankerUnavailable",
           "RuntimeOptions", "load"]


def load(ckpt: Path | None, opts: RuntimeOptions, identity: tuple[str, FeatureDims] | None = None) -> Backend:
    """The model at `ckpt` (a crossprobe checkpoint directory; None: the committed one), parts loaded on first use.
    identity: its (fingerprint, dims) where the caller knows them (crossprobe.py CrossprobeBackend)."""
    from crossprobe.models.inference.crossprobe import CrossprobeBackend

    return CrossprobeBackend(Path(ckpt) if ckpt is not None else None, opts, identity)
