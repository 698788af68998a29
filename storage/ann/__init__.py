"""The ANN stage behind a backend interface (base.py): FAISS in process (default) or Milvus.

    backend(settings)              the backend that builds new versions (Settings.ann_backend)
    backend_for(settings, manifest) the backend that holds an existing version (its manifest's "ann" entry;
                                   versions from before this interface are FAISS)
Milvus is imported, and connected to, only when a version or the settings ask for it: the default FAISS
path never starts or reaches a Milvus.
"""

from __future__ import annotations

from crossprobe.storage.ann.base import AnnBackend, AnnIndex, AnnUnavailable, AnnWriter, Filtered

__all__ = [
    "AnnBackend",
    "AnnIndex",
    "AnnUnavailable",
    "AnnWriter",
    "Filtered",
    "backend",
    "backend_for",
    "drop_version",
    "gc_orphans",
]


def _make(kind: str, settings) -> AnnBackend:
    if kind == "faiss":
        from crossprobe.storage.ann.faiss_backend import FaissBackend

        return FaissBackend(settings)
    if kind == "milvus":
        from crossprobe.storage.ann.milvus_backend import MilvusBackend

        return MilvusBackend(settings)
    raise ValueError(f"unknown ANN backend {kind!r} (faiss | milvus)")


def backend(settings) -> AnnBackend:
    return _make(settings.ann_backend, settings)


def backend_for(settings, manifest: dict | None) -> AnnBackend:
    return _make(((manifest or {}).get("ann") or {}).get("backend", "faiss"), settings)


def drop_version(settings, name: str, version: str, manifest: dict | None) -> None:
    """Drop a version's index outside its directory (a Milvus collection) when the version or the settings
    use Milvus; FAISS's index.faiss goes with the directory. Called by Store.drop before it removes the
    directory (and the manifest that names the collection)."""
    if settings.ann_backend == "milvus" or backend_for(settings, manifest).name == "milvus":
        _make("milvus", settings).drop(name, version)


def gc_orphans(settings, name: str, keep: set[str]) -> list[str]:
    """Milvus collections of `name` whose version is not in `keep` (e.g. the store forgot it: a version
    dropped while Milvus was down) -> dropped; only when the settings use Milvus."""
    if settings.ann_backend != "milvus":
        return []
    b = _make("milvus", settings)
    gone = [v for v in b.stored_versions(name) if v not in keep]
    for v in gone:
        b.drop(name, v)
    return gone
