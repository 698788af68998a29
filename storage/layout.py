"""The on-disk layout of an index version: the one module that names its files and says what each holds.

    <index root>/<name>/<version>/
        ids            JSON list: FAISS row -> item id (the rows of vectors.npy, in the same order)
        vectors.npy    float32 (N, d) unit vectors g_I: exact search, reindexing, the GPU search, a new backend
        index.faiss    the FAISS index over them (CROSSPROBE_ANN_BACKEND=faiss; Milvus keeps its own collection)
        text/          the version's keyword index (tantivy: storage/keyword.py), when it has one
        report.json    the job's counts: indexed, skipped (with the reasons), lost
        manifest.json  written last, after every other file is synced: its presence marks the version complete
                       (model fingerprint and spec, dims, count, factory, Redis key layout, FORMAT)

FORMAT: the layout's version, written into every manifest beside "crossprobe", the release that wrote it; a manifest
without one is format 1 (crossprobe 0.1.0 wrote no field, and its versions have this layout). Redis holds each
item's features and metadata under keys the manifest's "keys" names (store.py's KeyLayout).

The rule across releases: a release reads every format up to its own FORMAT (fields added since, such as text/ or
"image_roots", are optional to readers), and refuses a later one naming the release that wrote it: such a version
keeps serving from the release that built it, or from an upgraded one. A release that changes the layout in a way
older readers would misread bumps FORMAT (and says so in CHANGELOG.md).
"""

from __future__ import annotations

FORMAT = 1
IDS = "ids"
VECTORS = "vectors.npy"
FAISS_INDEX = "index.faiss"
KEYWORDS = "text"
REPORT = "report.json"
MANIFEST = "manifest.json"


class UnsupportedFormat(ValueError):
    """A version written in a layout this release cannot read (by a later crossprobe)."""


def format_of(manifest: dict) -> int:
    return int(manifest.get("format", 1))


def check_format(manifest: dict) -> None:
    """Refuse a version this release cannot read, saying which release wrote it and what to do."""
    try:
        fmt = format_of(manifest)
    except (TypeError, ValueError):
        fmt = -1
    if 1 <= fmt <= FORMAT:
        return
    from crossprobe.core.release import version

    name, ver = manifest.get("name"), manifest.get("version")
    writer = f"crossprobe {manifest['crossprobe']}" if manifest.get("crossprobe") else "another crossprobe"
    raise UnsupportedFormat(
        f"index {name!r} version {ver} is in storage format {manifest.get('format')!r}, written by {writer}; "
        f"crossprobe {version()} reads formats 1 to {FORMAT}. Serve it with the release that built it or a later "
        f"one (pip install --upgrade crossprobe), or activate a version this release wrote: crossprobe index list "
        f"{name} shows them"
    )
