"""Build, add, delete, reindex and sync: each produces a new version, then flips `active` once.

build    encode every item of a folder/manifest.
add      the active version's items (vectors from its vectors.npy, Redis values
         copied server-side with COPY) plus newly encoded items; an item whose id
         is already there is replaced when the new file decodes.
delete   the active version minus some ids (no encoding at all).
sync     add and delete in one version: a batch of `crossprobe index watch` (watch.py).
reindex  re-encode every item of the active version from the source it recorded
         (its metadata value: uri, caption, tags) with the current checkpoint: how
         an index moves to a new model, since the service refuses an index of
         another fingerprint. Items whose source vanished or went bad are skips,
         reported as a build reports them; more than IndexerSettings.reindex_max_lost of
         the old count lost and the new version is not activated.
Never editing the live version in place is what keeps FAISS and Redis in
agreement for every reader: a reader sees the old version or the new one, whole.

Build, add and reindex decode and encode in this process (the default) or on
Ray Data (IndexerSettings.engine = "ray", ray_engine.py); either way every batch is
written through sink.BatchWriter, so both engines make the same version.

All four are resumable: the spec of a job (kind, source, base version,
fingerprint, layout...) names its journal, so running the same command after a
kill finds the unfinished version and continues it (journal.py). Build and
reindex push their progress to a Pushgateway when one is configured (push.py).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from crossprobe.indexer.storage import ann, codec, faiss_io, keyword
from crossprobe.indexer.jobs import local_engine, report
from crossprobe.indexer.jobs.encoder import identify
from crossprobe.models.inference import FeatureDims
from crossprobe.indexer.jobs.journal import Journal
from crossprobe.indexer.jobs.overlap import progress
from crossprobe.models.runtime import StageTimer
from crossprobe.indexer.jobs.push import JOB_NAMES, JobMetrics
from crossprobe.indexer.storage.reader import FingerprintMismatch
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.indexer.storage.redis_conn import connect
from crossprobe.indexer.jobs.sink import BatchWriter
from crossprobe.indexer.jobs.sources import Item, Skip, read_source, recorded_items
from crossprobe.indexer.storage.store import KeyLayout, Store, atomic_write, check_name, new_version


@dataclass
class Result:
    name: str
    version: str
    kind: str
    count: int  # items in the new version
    encoded: int  # items encoded by this run (not counting batches reused from the journal)
    reused_batches: int
    skipped: dict[str, int]
    stages_s: dict[str, float]
    seconds: float
    factory: str
    report: Path
    extra: dict = field(default_factory=dict)

    def summary(self) -> str:
        sk = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        st = ", ".join(f"{k} {v:.2f}s" for k, v in self.stages_s.items())
        rate = self.encoded / self.seconds if self.seconds else 0.0
        ocr = (f"\nOCR failed on {self.extra['ocr_failed']} items: indexed, their words not (metadata text_error)"
               if self.extra.get("ocr_failed") else "")
        was = (f"\nwas {self.extra['base']}: {self.extra['base_count']} items, {self.extra['lost']} lost "
               f"(old version kept until `crossprobe index gc {self.name}`)") if self.kind == "reindex" else ""
        return (f"{self.kind} {self.name}/{self.version}: {self.count} items active ({self.factory}); "
                f"encoded {self.encoded} in {self.seconds:.1f}s ({rate:.1f} img/s), "
                f"{self.reused_batches} batches reused from an interrupted run\n"
                f"skipped: {sk}   (details: {self.report}){was}{ocr}\nstages: {st}")


def build(name: str, images: Path | None = None, manifest: Path | None = None, settings: IndexerSettings | None = None,
          ckpt: Path | None = None, model=None, bert=None, log: Callable[[str], None] = print) -> Result:
    return _run("build", name, settings or IndexerSettings(), images=images, manifest=manifest, ckpt=ckpt, model=model,
                bert=bert, log=log)


def add(name: str, images: Path | None = None, manifest: Path | None = None, settings: IndexerSettings | None = None,
        ckpt: Path | None = None, model=None, bert=None, log: Callable[[str], None] = print) -> Result:
    return _run("add", name, settings or IndexerSettings(), images=images, manifest=manifest, ckpt=ckpt, model=model,
                bert=bert, log=log)


def sync(name: str, images: Path, items: list[Item], ids: list[str], settings: IndexerSettings | None = None,
         ckpt: Path | None = None, model=None, bert=None, log: Callable[[str], None] = print) -> Result:
    """One batch of `crossprobe index watch` (watch.py): a new version = the active one minus `ids` plus `items`
    (files of the folder `images`, new or changed: each replaces its id when it decodes), then one switch, so
    a reader sees the whole batch or none of it."""
    return _run("sync", name, settings or IndexerSettings(), images=images, items=items, ids=ids, ckpt=ckpt,
                model=model, bert=bert, log=log)


def delete(name: str, ids: list[str], settings: IndexerSettings | None = None, log: Callable[[str], None] = print) -> Result:
    return _run("delete", name, settings or IndexerSettings(), ids=ids, log=log)


def reindex(name: str, settings: IndexerSettings | None = None, ckpt: Path | None = None, model=None, bert=None,
            quantization: str | None = None, log: Callable[[str], None] = print) -> Result:
    """Re-encode the active version's items from their recorded sources with this checkpoint into a new
    version; activate it unless more than settings.reindex_max_lost of them were lost (TooManyLost).
    quantization: the feature layout of the new version (default: the old version's)."""
    return _run("reindex", name, settings or IndexerSettings(), ckpt=ckpt, model=model, bert=bert,
                quantization=quantization, log=log)


_CHANGE_KEYS = ("added", "replaced", "deleted", "not_found", "base_count", "lost", "ocr_failed")




def _source_desc(images: Path | None, manifest: Path | None) -> dict:
    if (images is None) == (manifest is None):
        raise ValueError("give exactly one of --images DIR or --manifest FILE.jsonl")
    return {"images": str(Path(images).resolve())} if images else {"manifest": str(Path(manifest).resolve())}


def _key_buckets(kind: str, store: Store, name: str, base_manifest: dict | None, settings: IndexerSettings) -> int:
    """The key layout of the new version (store.py): build / reindex write every value afresh, in the current
    layout; add / delete COPY the kept values server-side, so they keep their base's (on a cluster, COPY
    needs both keys in one slot: the same tag). In the spec, so a resumed job keeps the layout it began
    with, and a journal from before the tag (no key_buckets in its spec) is not resumed but started afresh."""
    buckets = settings.key_buckets if kind in ("build", "reindex") else KeyLayout.of(store.prefix, base_manifest).buckets
    if store.cluster and not buckets:
        if kind in ("build", "reindex"):
            raise ValueError("CROSSPROBE_INDEX_KEY_BUCKETS=0 (untagged keys) cannot serve a shortlist in bounded "
                             "round trips on a Redis Cluster; use >= 1 (default 64)")
        raise ValueError(f"index {name!r} (version {base_manifest['version']}) has untagged keys from before the "
                         f"cluster layout; move it to the current layout first: crossprobe index reindex {name}")
    return buckets


def _find_resumable(store: Store, name: str, spec: dict) -> str | None:
    d = store.root / name
    for p in sorted(d.glob("v*/build/spec.json"), reverse=True) if d.is_dir() else []:
        try:
            if json.loads(p.read_text()) == spec:
                return p.parent.parent.name
        except (OSError, ValueError):
            continue  # a journal being created: not ours
    return None


@dataclass
class Job:
    """One run of build / add / delete / reindex: what every stage of it needs to know."""
    kind: str  # build | add | delete | reindex
    name: str  # the index
    version: str  # the version being written
    base: str | None  # the active version it starts from (add / delete / reindex)
    settings: IndexerSettings
    store: Store
    spec: dict  # what makes a half-done run resumable: the same spec finds it again
    layout: codec.Layout  # of the Redis values
    dims: FeatureDims
    fingerprint: str
    times: StageTimer
    t0: float  # perf_counter at the start, for elapsed times
    ckpt: Path | None = None
    model: object = None
    bert: object = None
    metrics: JobMetrics | None = None
    log: Callable[[str], None] = print
    # where the items came from, for the manifest: the spec's source, else (delete, reindex: the items are the base
    # version's) the base version's, so that `index watch` follows a folder into the versions other jobs make
    source: dict | None = None

    @property
    def vdir(self) -> Path:
        return self.store.version_dir(self.name, self.version)


def _run(kind: str, name: str, settings: IndexerSettings, images=None, manifest=None, ids=None, ckpt=None, model=None, bert=None,
         quantization=None, items=None, log=print) -> Result:
    check_name(name)
    t0 = time.perf_counter()
    times = StageTimer()
    r = connect(settings)
    store = Store(settings, r)
    base = base_manifest = None
    if kind in ("add", "delete", "reindex", "sync"):
        base = store.active(name)
        if base is None or (base_manifest := store.read_manifest(name, base)) is None:
            raise ValueError(f"index {name!r} has no active version here; run `crossprobe index build` first")
    if kind == "delete":
        fingerprint, dims = base_manifest["fingerprint"], FeatureDims.from_manifest(base_manifest["dims"])
        quant = base_manifest["layout"]["quantization"]
        spec = {"kind": kind, "name": name, "base": base, "factory": settings.factory,
                "ids_sha": hashlib.sha256(json.dumps(sorted(set(ids))).encode()).hexdigest()[:16]}
    elif kind == "reindex":  # another fingerprint than the base's is the point (or the same: a re-encode)
        fingerprint, dims = identify(ckpt, model, settings.models)
        quant = quantization or base_manifest["layout"]["quantization"]
        # no source in the spec: the items are the base version's, which `base` names exactly
        spec = {"kind": kind, "name": name, "base": base, "fingerprint": fingerprint, "quantization": quant,
                "batch_size": settings.batch_size, "max_pixels": settings.max_pixels, "factory": settings.factory}
    else:
        fingerprint, dims = identify(ckpt, model, settings.models)
        if base_manifest and base_manifest["fingerprint"] != fingerprint:
            raise FingerprintMismatch(
                f"index {name!r} (version {base}) was built with model {base_manifest['fingerprint']}; this checkpoint "
                f"is {fingerprint}. Move the index to this checkpoint first: crossprobe index reindex {name} "
                f"--ckpt <this checkpoint>; then add.")
        quant = base_manifest["layout"]["quantization"] if base_manifest else settings.quantization  # add keeps the layout
        spec = {"kind": kind, "name": name, "base": base, "source": _source_desc(images, manifest),
                "fingerprint": fingerprint, "quantization": quant, "batch_size": settings.batch_size,
                "max_pixels": settings.max_pixels, "factory": settings.factory}
        if kind == "sync":  # the batch itself names the job: the same changes after a kill resume its journal
            spec["changes_sha"] = hashlib.sha256(json.dumps([[it.id, it.uri] for it in items] + sorted(set(ids)))
                                                 .encode()).hexdigest()[:16]
    if settings.ocr is None:  # unset: as the base version was built (an index keeps its OCR through add / watch)
        settings = settings.model_copy(update={"ocr": bool(base_manifest and base_manifest.get("ocr"))})
    if settings.ocr and kind != "delete":  # a resumed job reads the rest of its photos as it read the first
        spec["ocr"] = {"gate_threshold": settings.ocr_gate_threshold}  # None: the trained gate
    spec["key_buckets"] = _key_buckets(kind, store, name, base_manifest, settings)
    if base is not None and (done := _finish_activated(store, name, base, spec, kind, t0, settings, log)) is not None:
        return done
    if kind == "delete" and not set(ids or ()) & set(store.read_ids(name, base)):
        raise ValueError(f"none of the {len(ids or ())} ids is in {name}/{base}; nothing to delete")
    layout = codec.Layout(quant, dims.item)
    version = _find_resumable(store, name, spec)
    resumed = version is not None
    version = version or new_version()
    vdir = store.version_dir(name, version)
    log(f"{'resuming' if resumed else 'starting'} {kind} of {name!r} as version {version} ({vdir})"
        + (f" from version {base} (model {base_manifest['fingerprint']} -> {fingerprint})" if kind == "reindex" else ""))
    metrics = JobMetrics(settings, kind, name, say=log) if kind in JOB_NAMES else None
    with store.lock(name, version):
        journal = Journal(vdir)
        if journal.exists:
            items, reader_skips = journal.items(), journal.reader_skips()
        else:
            r.sadd(store.versions_key(name), version)  # before any key is written: gc can always find them
            if kind == "delete":
                items, reader_skips = [], []
            else:
                with times.stage("reader"):
                    if kind == "reindex":
                        base_ids = store.read_ids(name, base)
                        items, reader_skips = recorded_items(base_ids, store.metadata(name, base, base_ids))
                    elif kind == "sync":
                        reader_skips = []
                        _keep_added(store, name, base, items)
                    else:
                        items, reader_skips, _ = read_source(images, manifest)
                        _keep_added(store, name, base if kind == "add" else store.active(name), items)
            journal.create(spec, items, reader_skips)
        reused = len(journal.committed())
        encoded = 0
        ok = False
        try:
            if store.read_manifest(name, version) is None:  # else: killed after finishing, before activation
                if metrics:
                    done, skipped = journal.progress(items, settings.batch_size)
                    metrics.start(len(items), done, skipped + len(reader_skips))
                job = Job(kind, name, version, base, settings, store, spec, layout, dims, fingerprint, times, t0,
                          ckpt, model, bert, metrics, log,
                          spec.get("source") or (base_manifest or {}).get("source"))
                encoded = _encode(job, items, journal)
                finished = _finalize(job, items, reader_skips, ids, journal, encoded, reused)
            else:
                finished = json.loads((vdir / "report.json").read_text())
                if metrics:
                    metrics.start(len(items), len(items), sum(finished["counts"]["skipped"].values()))
            if kind == "reindex":
                try:
                    report.check_lost(name, version, base, finished["counts"], settings.reindex_max_lost, vdir / "report.json")
                except report.TooManyLost:
                    journal.remove()  # a rerun starts afresh (sources fixed); `index activate` accepts this one
                    raise
            with times.stage("activate"):
                store.activate(name, version, expect=base, check_expect=kind != "build")
            ok = True
        finally:
            if metrics:
                metrics.finish(ok)
        journal.remove()
    extra = {"base": base, **{k: v for k, v in finished["counts"].items() if k in _CHANGE_KEYS}}
    if metrics and metrics.enabled:
        extra.update(pushes=metrics.pushes, push_failures=metrics.failures)
    return Result(name, version, kind, finished["counts"]["total"], encoded, reused,
                  finished["counts"]["skipped"], times.seconds(), time.perf_counter() - t0,
                  finished["factory"], vdir / "report.json", extra)


def _finish_activated(store: Store, name: str, active: str, spec: dict, kind: str, t0: float, settings: IndexerSettings,
                      log: Callable[[str], None]) -> Result | None:
    """The job that made the ACTIVE version was killed after its one switch and before it removed its journal,
    and this is the same command again (the same spec but for `base`: the spec named the version before,
    which the switch replaced by this one) -> finish it: remove the journal and report the job done.

    Why: running the same command again is the documented resume after a kill, and the active version is the
    base a new add/delete/reindex derives from. Without this, a kill in that window made the rerun do the job a
    second time on top of its own result (add, reindex: another new version, reindex re-encoding everything)
    or fail (delete: "none of the ids is in <the new version>", exit 1), as the kill runs injected at
    after_activate in tests/indexer/jobs/test_kill_runs.py found. Build needs none of this: its spec names no
    base, so _find_resumable finds the same version again and only re-activates it."""
    journal = Journal(store.version_dir(name, active))
    try:
        prev = journal.spec() if journal.exists else None
    except (OSError, ValueError):
        return None
    if not prev or prev.get("kind") != kind or prev != {**spec, "base": prev.get("base")}:
        return None
    vdir = store.version_dir(name, active)
    finished = json.loads((vdir / "report.json").read_text())
    skipped = sum(finished["counts"]["skipped"].values())
    with store.lock(name, active):
        reused = len(journal.committed())
        journal.remove()
    log(f"finishing {kind} of {name!r} as version {active}: it was activated (from version {prev['base']}) by a run "
        f"killed before it removed its journal")
    if kind in JOB_NAMES:  # the gateway still shows the killed run as running: say it finished
        metrics = JobMetrics(settings, kind, name, say=log)
        metrics.start(finished["counts"]["total"] + skipped, finished["counts"]["total"] + skipped, skipped)
        metrics.finish(True)
    extra = {"base": prev["base"], **{k: v for k, v in finished["counts"].items() if k in _CHANGE_KEYS}}
    return Result(name, active, kind, finished["counts"]["total"], 0, reused, finished["counts"]["skipped"], {},
                  time.perf_counter() - t0, finished["factory"], vdir / "report.json", extra)




def _keep_added(store: Store, name: str, base: str | None, items: list[Item]) -> None:
    """An id already in the index's active version keeps the date it was first added (its metadata's "added"),
    through a rebuild of the index or an add that replaces its file; read before the job's journal freezes the
    items, so a resumed job writes the same dates. An unreadable old value: the new item's own time."""
    if base is None or not items:
        return
    try:
        old = set(store.read_ids(name, base))
    except (OSError, ValueError):
        return
    again = [it for it in items if it.id in old and it.added is None]
    for it, raw in zip(again, store.metadata(name, base, [it.id for it in again]) if again else []):
        try:
            added = json.loads(raw).get("added") if raw is not None else None
        except (ValueError, AttributeError):
            added = None
        if isinstance(added, str):
            it.added = added


def _encode(job: Job, items: list[Item], journal: Journal) -> int:
    """decode -> backbone -> head -> write_redis -> commit, for every batch not yet committed.
    settings.engine "ray" hands decode and encode to Ray Data (ray_engine.py); the writes are the same (sink.py: one
    pipeline per batch, on a cluster one round trip per master)."""
    settings, times = job.settings, job.times
    keys = job.store.layout(job.name, job.version, job.spec["key_buckets"])
    bs = settings.batch_size
    committed = journal.committed()
    todo = [b for b in range(math.ceil(len(items) / bs)) if b not in committed]
    if not todo:
        return 0
    done = sum(len(items[b * bs:(b + 1) * bs]) for b in committed)
    bar = progress(len(items), done, f"index {keys.name}", settings.progress)
    writer = BatchWriter(keys, items, journal, job.store, times, job.metrics, bar, settings.throttle_s)
    try:
        if settings.engine == "ray":
            from crossprobe.indexer.jobs import ray_engine

            ray_engine.encode(items, todo, job.layout, settings, times, job.ckpt, job.model, job.bert, writer.write,
                              say=job.log)
        else:
            local_engine.encode(items, todo, job.layout, settings, times, job.ckpt, job.model, job.bert, writer.write)
    finally:
        bar.close()
    return writer.encoded


def _copy_values(store: Store, src: KeyLayout, dst: KeyLayout, ids: list[str], chunk: int) -> None:
    """Server-side COPY of kept items' two values from version src to dst, pipelined (idempotent: REPLACE).
    Both layouts have the same tag per item (_key_buckets), so on a cluster each COPY stays in one slot."""
    for i in range(0, len(ids), chunk):
        with store.r.pipeline(transaction=False) as p:
            for it in ids[i:i + chunk]:
                p.copy(src.feat(it), dst.feat(it), replace=True)
                p.copy(src.meta(it), dst.meta(it), replace=True)
            res = p.execute()
        if not all(res):
            raise RuntimeError(f"{src.name}/{src.version}: some Redis values of the base version are missing; "
                               f"cannot derive {dst.version}")


def _finalize(job: Job, items: list[Item], reader_skips: list[Skip], del_ids: list[str] | None, journal: Journal,
              encoded: int, reused: int) -> dict:
    """Committed batches (+ base version) -> index.faiss, ids, vectors.npy, report.json, manifest.json (last)."""
    kind, name, version, base, store, dims, spec = job.kind, job.name, job.version, job.base, job.store, job.dims, job.spec
    times, t0 = job.times, job.t0
    vdir = job.vdir
    rows, g, skips = journal.load(items, dims.d)
    new_ids = [items[int(i)].id for i in rows]
    extra: dict = {}
    if kind in ("build", "reindex"):
        ids, vectors = new_ids, g
        if kind == "reindex":
            base_count = len(store.read_ids(name, base))
            # every item of the old version is either in the new one or reported as a skip, exactly once
            if len(ids) != base_count - len(reader_skips) - len(skips):
                raise RuntimeError(f"reindex of {name}: {len(ids)} items re-encoded + {len(reader_skips) + len(skips)} "
                                   f"skipped != {base_count} items in {base}; the journal under {vdir} is inconsistent")
            extra = {"base_count": base_count, "lost": base_count - len(ids)}
        if not ids:
            report.write_report(vdir, kind, 0, reader_skips + skips, times, t0, encoded, reused, "-", extra)
            what = spec["source"] if kind == "build" else f"version {base} of {name!r} ({base} stays active)"
            raise RuntimeError(f"no image of {what} could be indexed; see {vdir / 'report.json'}")
    else:
        base_ids, base_vecs = store.read_ids(name, base), store.read_vectors(name, base)
        drop = set(new_ids) | set(del_ids or ())  # add, sync: a decoded item replaces its id; delete, sync: ids go
        keep = [i for i, it in enumerate(base_ids) if it not in drop]
        with times.stage("copy_redis"):
            _copy_values(store, store.layout(name, base), store.layout(name, version, spec["key_buckets"]),
                         [base_ids[i] for i in keep], job.settings.redis_batch)
        ids = [base_ids[i] for i in keep] + new_ids
        vectors = np.concatenate([base_vecs[keep], g]) if len(g) else base_vecs[keep]
        gone = set(del_ids or ()) & set(base_ids)
        replaced = len(base_ids) - len(keep) - len(gone)
        extra = ({"replaced": replaced, "added": len(new_ids) - replaced} if kind == "add" else
                 {"deleted": len(gone), "not_found": sorted(set(del_ids) - set(base_ids))[:1000]} if kind == "delete" else
                 {"replaced": replaced, "added": len(new_ids) - replaced, "deleted": len(gone)})
    vectors = np.ascontiguousarray(vectors, np.float32)  # (N, d)
    backend = ann.backend(job.settings)  # FAISS (index.faiss here) by default, or a Milvus collection (indexer/storage/ann/)
    with times.stage(f"write_{backend.name}"):
        writer = backend.writer(name, version, dims.d, vdir)
        metas = [json.loads(m) if m else None for m in store.metadata(name, version, ids)] \
            if writer.wants_metadata else None  # the filterable fields, stored beside the vectors
        writer.add(vectors, ids, metas)
        factory = writer.commit()
        faiss_io.write_ids(ids, vdir / "ids")
        faiss_io.write_vectors(vectors, vdir / "vectors.npy")
    with times.stage("write_text"):  # the keyword index (storage/keyword.py): derived from the base's when it has one
        based = kind not in ("build", "reindex") and (store.version_dir(name, base) / keyword.DIR).exists()
        text = keyword.write(vdir, new_ids if based else ids,
                             lambda part: [json.loads(m) if m else None for m in store.metadata(name, version, part)],
                             job.settings.redis_batch, store.version_dir(name, base) if based else None,
                             (set(new_ids) | set(del_ids or ())) if based else ())
        if job.settings.ocr:
            extra["ocr_failed"] = text["ocr_failed"]  # in report.json's counts and the job's summary
    done = report.write_report(vdir, kind, len(ids), reader_skips + skips, times, t0, encoded, reused, factory, extra)
    manifest = {
        "name": name, "version": version, "kind": kind, "base_version": base, "fingerprint": job.fingerprint,
        "dims": dims.manifest(),
        "count": len(ids), "factory": factory, "metric": "inner_product", "ann": writer.manifest_entry(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "layout": job.layout.header(),
        "keys": store.layout(name, version, spec["key_buckets"]).manifest(store.active_key(name)),
        "source": job.source, "skipped": done["counts"]["skipped"],
        "text": {"dir": keyword.DIR, "items": text["indexed"], "fields": list(keyword.FIELDS),
                 "ocr_failed": text["ocr_failed"]},  # items this job indexed whose OCR failed (metadata text_error)
        # delete reads no photo: the base's OCR setting stays the index's
        "ocr": bool(job.settings.ocr) if kind != "delete" else bool((store.read_manifest(name, base) or {}).get("ocr")),
    }
    atomic_write(vdir / "manifest.json", json.dumps(manifest, indent=2))  # last: the version is now complete
    return done
