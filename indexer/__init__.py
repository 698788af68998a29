"""Offline indexer: images -> FAISS (g_I) + Redis (P_v, b_bar, s_I, metadata), versioned.

    from crossprobe.indexer import build, add, delete, reindex, sync, open_index, IndexerSettings

The jobs are indexer/jobs/kinds.py (one function per kind), the read path storage/reader.py.

The batch jobs (indexer/jobs/) and, for their callers' convenience, the storage layer's reader and settings
(crossprobe.storage). Names are imported lazily: `crossprobe --help` should not pay for faiss and onnxruntime.
"""

from importlib import import_module

_EXPORTS = {
    "build": "crossprobe.indexer.jobs.kinds",
    "add": "crossprobe.indexer.jobs.kinds",
    "delete": "crossprobe.indexer.jobs.kinds",
    "reindex": "crossprobe.indexer.jobs.kinds",
    "sync": "crossprobe.indexer.jobs.kinds",
    "Result": "crossprobe.indexer.jobs.run",
    "TooManyLost": "crossprobe.indexer.jobs.report",
    "open_index": "crossprobe.storage.reader",
    "IndexReader": "crossprobe.storage.reader",
    "FingerprintMismatch": "crossprobe.storage.reader",
    "IndexerSettings": "crossprobe.indexer.jobs.settings",
    "StorageSettings": "crossprobe.storage.settings",
    "connect": "crossprobe.storage.redis_conn",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
