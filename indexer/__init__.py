"""Offline indexer: images -> FAISS (g_I) + Redis (P_v, b_bar, s_I, metadata), versioned.

    from crossprobe.indexer import build, add, delete, reindex, sync, open_index, IndexerSettings

The jobs are indexer/jobs/kinds.py (one function per kind), the read path indexer/storage/reader.py.

Names are imported lazily: `crossprobe --help` imports indexer.cli, and should
not pay for faiss, onnxruntime and torch.
"""

from importlib import import_module

_EXPORTS = {
    "build": "jobs.kinds",
    "add": "jobs.kinds",
    "delete": "jobs.kinds",
    "reindex": "jobs.kinds",
    "sync": "jobs.kinds",
    "Result": "jobs.run",
    "TooManyLost": "jobs.report",
    "open_index": "storage.reader",
    "IndexReader": "storage.reader",
    "FingerprintMismatch": "storage.reader",
    "IndexerSettings": "jobs.settings",
    "StorageSettings": "storage.settings",
    "connect": "storage.redis_conn",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"crossprobe.indexer.{_EXPORTS[name]}"), name)
    raise AttributeError(name)
