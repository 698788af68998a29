"""The on-disk layout of an index version: the one module that names its files and says what each holds.

    <index root>/<name>/<version>/
        ids            JSON list: FAISS row -> item id (the rows of vectors.npy, in the same order)
        vectors.npy    float32 (N, d) unit vectors g_I: exact search, reindexing, the GPU search, a new backend
        index.faiss    the FAISS index over them (CROSSPROBE_ANN_BACKEND=faiss; Milvus keeps its own collection)
        text/          the version's keyword index (tantivy: storage/keyword.py), when it has one
        report.json    the job's counts: indexed, skipped (with the reasons), lost
        manifest.json  written last, after every other file is synced: its presence marks the version complete
                       (model fingerprint and spec, dims, count, factory, Redis key layout, FORMAT)

FORMAT: the layout's version, written into every manifest; a manifest without one is format 1 (every version
written before the field existed has this layout). Redis holds each item's features and metadata under keys the
manifest's "keys" names (store.py's KeyLayout).
"""

from __future__ import annotations

FORMAT = 1
IDS = "ids"
VECTORS = "vectors.npy"
FAISS_INDEX = "index.faiss"
KEYWORDS = "text"
REPORT = "report.json"
MANIFEST = "manifest.json"
