"""A job's committed batches (+ its base version) -> a complete version on disk, manifest.json last.

    encoded_rows    what the journal's committed batches hold: the ids and vectors this job encoded, its skips
    fresh_version   build, reindex: the version holds exactly the items this job encoded
    derive_version  add, delete, sync: the base's items less the deleted and the replaced ids (their Redis values
                    COPYed server-side, never re-encoded), plus the items this job encoded
    write_version   then, for every kind: the ANN index (FAISS index.faiss, or a Milvus collection), ids,
                    vectors.npy, the keyword index text/, report.json, and manifest.json: the version is complete.

A version without manifest.json is incomplete: readers and `index activate` refuse it, and a kill anywhere before
it leaves a version that the same command resumes (tests/indexer/jobs/test_kill_runs.py kills at each write).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from crossprobe.core import release
from crossprobe.core.atomic import durable_write, sync_tree  # fsynced: an index survives a power cut
from crossprobe.indexer.jobs import report
from crossprobe.indexer.jobs.run import JobContext, recorded_spec
from crossprobe.indexer.jobs.sources import Skip, image_roots
from crossprobe.storage import ann, faiss_io, keyword, layout
from crossprobe.storage.store import KeyLayout, Store
from crossprobe.storage.store import image_roots as store_roots


@dataclass
class Rows:
    """The items a job encoded, in item order."""

    ids: list[str]
    g: np.ndarray  # (M, d) float32 two-tower vectors
    skips: list[Skip]  # decode skips, in item order


@dataclass
class TextChanges:
    """How a derived version's keyword index differs from its base's: `inserted` ids written (again), `removed`
    ids taken out. None in their place: the keyword index is written from every item."""

    inserted: list[str]
    removed: set[str]


def encoded_rows(job: JobContext) -> Rows:
    rows, g, skips = job.build_journal.load(job.items, job.model_dims.d)
    return Rows([job.items[int(i)].id for i in rows], g, skips)


def fresh_version(job: JobContext, new: Rows, what: str, extra: dict | None = None) -> dict:
    """build, reindex: a version of the encoded items only. what: the source, for the error when none was indexed."""
    extra = extra or {}
    if not new.ids:
        report.write_report(
            job.vdir, job.kind, 0, job.reader_skips + new.skips, job.times, job.t0, job.encoded, job.reused, "-", extra
        )
        raise RuntimeError(f"no image of {what} could be indexed; see {job.vdir / 'report.json'}")
    return write_version(job, new.ids, new.g, new.skips, extra, None)


def derive_version(job: JobContext, deleted: list[str], counts: tuple[str, ...]) -> dict:
    """add, delete, sync: the base version's items less `deleted`, with the encoded ones added (an encoded id
    already there replaces it). counts: which of replaced / added / deleted / not_found the report carries."""
    store, name, base, version = job.store, job.name, job.base_version, job.version
    new = encoded_rows(job)
    base_ids, base_vecs = store.read_ids(name, base), store.read_vectors(name, base)
    gone = set(deleted) & set(base_ids)
    drop = set(new.ids) | gone  # a decoded item replaces its id; deleted ids go
    keep = [i for i, it in enumerate(base_ids) if it not in drop]
    with job.times.stage("copy_redis"):
        _copy_values(
            store,
            store.layout(name, base),
            store.layout(name, version, job.spec["key_buckets"]),
            [base_ids[i] for i in keep],
            job.settings.redis_batch,
            features=not job.layout.empty,
        )
    ids = [base_ids[i] for i in keep] + new.ids
    vectors = np.concatenate([base_vecs[keep], new.g]) if len(new.g) else base_vecs[keep]
    replaced = len(base_ids) - len(keep) - len(gone)
    have = {
        "replaced": replaced,
        "added": len(new.ids) - replaced,
        "deleted": len(gone),
        "not_found": sorted(set(deleted) - set(base_ids))[:1000],
    }
    return write_version(
        job, ids, vectors, new.skips, {k: have[k] for k in counts}, TextChanges(new.ids, set(new.ids) | gone)
    )


def _copy_values(store: Store, src: KeyLayout, dst: KeyLayout, ids: list[str], chunk: int, features: bool) -> None:
    """Server-side COPY of kept items' values (features unless the model has none: codec.Layout.empty; metadata)
    from version src to dst, pipelined (idempotent: REPLACE). Both layouts have the same tag per item
    (run.key_buckets), so on a cluster each COPY stays in one slot."""
    for i in range(0, len(ids), chunk):
        with store.r.pipeline(transaction=False) as p:
            for it in ids[i : i + chunk]:
                if features:
                    p.copy(src.feat(it), dst.feat(it), replace=True)
                p.copy(src.meta(it), dst.meta(it), replace=True)
            res = p.execute()
        if not all(res):
            raise RuntimeError(
                f"{src.name}/{src.version}: some Redis values of the base version are missing; "
                f"cannot derive {dst.version}"
            )


def write_version(
    job: JobContext, ids: list[str], vectors: np.ndarray, skips: list[Skip], extra: dict, text: TextChanges | None
) -> dict:
    """ids (N,) and vectors (N, d) of the new version -> its files, manifest.json last -> its report."""
    vectors = np.ascontiguousarray(vectors, np.float32)  # (N, d)
    writer, factory = _write_vectors(job, ids, vectors)
    words = _write_text(job, ids, text)
    if job.settings.ocr:
        extra["ocr_failed"] = words["ocr_failed"]  # in report.json's counts and the job's summary
    done = report.write_report(
        job.vdir,
        job.kind,
        len(ids),
        job.reader_skips + skips,
        job.times,
        job.t0,
        job.encoded,
        job.reused,
        factory,
        extra,
    )
    # the data files (FAISS index, vectors, ids, keyword index, report) and their folders on the disk before the
    # manifest that marks the version complete: after a power cut a version is complete with its data, or not at all
    with job.times.stage("sync"):
        sync_tree(job.vdir)
        durable_write(
            job.vdir / layout.MANIFEST, json.dumps(_manifest(job, len(ids), factory, writer, words, done), indent=2)
        )  # last: the version is now complete
    return done


def _write_vectors(job: JobContext, ids: list[str], vectors: np.ndarray):
    """The ANN index (FAISS by default, or a Milvus collection: storage/ann/), ids, vectors.npy."""
    store, name, version, vdir = job.store, job.name, job.version, job.vdir
    backend = ann.backend(job.settings)
    with job.times.stage(f"write_{backend.name}"):
        writer = backend.writer(name, version, job.model_dims.d, vdir)
        metas = (
            [json.loads(m) if m else None for m in store.metadata(name, version, ids)]
            if writer.wants_metadata
            else None
        )  # the filterable fields, stored beside the vectors
        writer.add(vectors, ids, metas)
        factory = writer.commit()
        faiss_io.write_ids(ids, vdir / layout.IDS)
        faiss_io.write_vectors(vectors, vdir / layout.VECTORS)
    return writer, factory


def _write_text(job: JobContext, ids: list[str], text: TextChanges | None) -> dict:
    """The keyword index (storage/keyword.py): derived from the base's (a copy, then `text`'s changes) when the
    base has one and the job takes no item out; else written from every item. A deleted item must leave the disk:
    tantivy only marks a deleted document, and its id and words stay in the segment files until a merge (the
    erase test in tests/indexer/jobs/test_erase.py looks for them), so a job that deletes rewrites the index."""
    store, name, version = job.store, job.name, job.version

    def metas(part: list[str]) -> list[dict | None]:
        return [json.loads(m) if m else None for m in store.metadata(name, version, part)]

    base_dir = store.version_dir(name, job.base) if job.base else None
    inserted, removed = (text.inserted, text.removed) if text is not None else ([], set())
    erases = text is not None and bool(removed - set(inserted))
    # text given: a derived version, which has a base
    based = text is not None and not erases and base_dir is not None and (base_dir / keyword.DIR).exists()
    with job.times.stage("write_text"):
        words = keyword.write(
            job.vdir,
            inserted if based else ids,
            metas,
            job.settings.redis_batch,
            base_dir if based else None,
            removed if based else (),
        )
    if erases:  # ocr_failed counts this job's items, as when derived, not every item the rewrite read
        words["ocr_failed"] = sum(bool(isinstance(m, dict) and m.get("text_error")) for m in metas(inserted))
    return words


def _manifest(job: JobContext, count: int, factory: str, writer, words: dict, done: dict) -> dict:
    d = job.model_dims
    return {
        "format": layout.FORMAT,  # the version folder's layout (storage/layout.py)
        "crossprobe": release.version(),  # the release that wrote it: named where a release cannot read it
        "name": job.name,
        "version": job.version,
        "kind": job.kind,
        "base_version": job.base,
        "fingerprint": job.fingerprint,
        # the model's spec (CROSSPROBE_MODEL's form) beside its fingerprint: what a service must run to serve this
        # version, said when one running another refuses it. Absent in versions from before it (or an in-memory model)
        **({"model_spec": spec} if (spec := recorded_spec(job)) else {}),
        "dims": d.manifest(),
        "count": count,
        "factory": factory,
        "metric": "inner_product",
        "ann": writer.manifest_entry(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "layout": job.layout.header(),
        "keys": job.store.layout(job.name, job.version, job.spec["key_buckets"]).manifest(
            job.store.active_key(job.name)
        ),
        "source": job.source,
        # the folders every file of this version lies under (resolved): the service opens an item's file only
        # inside them (storage.store.within_roots), whatever path Redis hands it
        "image_roots": image_roots(job.items, job.source or {}, store_roots(job.base_manifest)),
        "skipped": done["counts"]["skipped"],
        "text": {
            "dir": keyword.DIR,
            "items": words["indexed"],
            "fields": list(keyword.FIELDS),
            "ocr_failed": words["ocr_failed"],
        },  # items this job indexed whose OCR failed (metadata text_error)
        # delete reads no photo: the base's OCR setting stays the index's
        "ocr": bool(job.settings.ocr) if job.reads_photos else bool((job.base_manifest or {}).get("ocr")),
    }
