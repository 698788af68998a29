"""Online search service: FastAPI + uvicorn over the indexer's FAISS + Redis versions.

    router   app.py, routes/, deps.py        routes, validation, errors (errors.py), metrics (metrics.py)
    queue    batcher.py                      admission (429) and micro-batching of the query tower
    backend  pipeline/, registry.py          the timed stages (the model behind crossprobe.core.inference), index
    versions

    from crossprobe.service import create_app, Settings

Names are imported lazily so `crossprobe --help` does not import FastAPI, FAISS or ONNX Runtime.
"""

from importlib import import_module

_EXPORTS = {"create_app": "app", "Settings": "settings", "serve": "server", "running": "server"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"crossprobe.service.{_EXPORTS[name]}"), name)
    raise AttributeError(name)
