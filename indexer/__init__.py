"""Offline indexer: images -> FAISS (g_I) + Redis (P_v, b_bar, s_I, metadata), versioned.

    from crossprobe.indexer import build, add, delete, reindex, open_index, Settings

Names are imported lazily: `crossprobe --help` imports indexer.cli, and should
not pay for faiss, onnxruntime and torch.
"""
from importlib import import_module

_EXPORTS = {
    "build": "jobs", "add": "jobs", "delete": "jobs", "reindex": "jobs", "Result": "jobs", "TooManyLost": "jobs",
    "open_index": "reader", "IndexReader": "reader", "FingerprintMismatch": "reader",
    "Settings": "redis_conn", "connect": "redis_conn",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"crossprobe.indexer.{_EXPORTS[name]}"), name)
    raise AttributeError(name)
