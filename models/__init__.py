"""The torch part of crossprobe: towers, rerankers, the label bridge, training, evaluation and ONNX export (the
`torch` extra). What serving and indexing run lives in crossprobe.core, which never imports this package."""

from crossprobe.core import DEFAULT_CHECKPOINT, SERVED_RERANK, read_config

__all__ = ["DEFAULT_CHECKPOINT", "SERVED_RERANK", "read_config"]
