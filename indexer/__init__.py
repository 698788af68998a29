"""Offline indexer: images -> FAISS (g_I) + Redis (P_v, b_bar, s_I, metadata), versioned.

    from crossprobe.indexer import build, add, delete, reindex, open_index, IndexerSettings

Names are imported lazily: `crossprobe --help` imports indexer.cli, and should
not pay for faiss, onnxruntime and torch.
"""
from importlib import import_module

_EXPORTS = {
    "build": "jobs.versions", "add": "jobs.versions", "delete": "jobs.versions", "reindex": "jobs.versions",
    "Result": "jobs.versions", "TooManyLost": "jobs.report",
    "open_index": "storage.reader", "IndexReader": "storage.reader", "FingerprintMismatch": "storage.reader",
    "IndexerSettings": "jobs.settings", "StorageSettings": "storage.settings", "connect": "storage.redis_conn",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"crossprobe.indexer.{_EXPORTS[name]}"), name)
    raise AttributeError(name)
