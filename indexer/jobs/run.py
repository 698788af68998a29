"""How a job runs: the JobContext each kind fills (kinds.py), and the steps every kind shares.

A job (build, add, delete, reindex, sync) writes ONE new version of an index beside the live one, then flips
`active` once. Never editing the live version in place is what keeps FAISS and Redis in agreement for every
reader: a reader sees the old version or the new one, whole. The steps, in the order a kind calls them:

    open_job          the index, its Store, and (add, delete, reindex, sync) the base: the active version it derives
    from
    use_checkpoint    the model's fingerprint and feature dims (same_model_as_base: add and sync refuse another model)
    encode_spec       the spec of a job that encodes photos; delete writes its own
    settle            what every spec still needs: the OCR setting (unset: as the base was built), the key layout
    finish_activated  the same command after a kill between its switch and its journal's removal: report it done
    execute           under the version's lock: find_resumable (or a new version), open_journal (created from the
                      kind's reader), encode, the kind's finalize (finalize.py), its check (reindex: the loss
                      check), activate, and the Result

Every job is resumable: its spec (kind, source, base version, fingerprint, layout...) names its journal
(journal.py), so running the same command again after a kill finds the unfinished version and continues it.
Build and reindex push their progress to a Pushgateway when one is configured (push.py). Encoding runs in this
process (the default) or on Ray Data (IndexerSettings.engine = "ray", ray_engine.py); either way every batch is
written through sink.BatchWriter, so both engines make the same version.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from crossprobe.core.inference import FeatureDims, ModelSpec, parse
from crossprobe.core.runtime import StageTimer
from crossprobe.indexer.jobs import local_engine, report
from crossprobe.indexer.jobs.encoder import identify
from crossprobe.indexer.jobs.journal import Journal
from crossprobe.indexer.jobs.overlap import progress
from crossprobe.indexer.jobs.push import JOB_NAMES, JobMetrics
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.indexer.jobs.sink import BatchWriter
from crossprobe.indexer.jobs.sources import Item, Skip
from crossprobe.storage import codec, layout
from crossprobe.storage.reader import FingerprintMismatch
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import KeyLayout, Store, check_name, new_version

# report.json counts a Result carries in `extra` (besides the base version)
CHANGE_KEYS = ("added", "replaced", "deleted", "not_found", "base_count", "lost", "ocr_failed")


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
        ocr = (
            f"\nOCR failed on {self.extra['ocr_failed']} items: indexed, their words not (metadata text_error)"
            if self.extra.get("ocr_failed")
            else ""
        )
        was = (
            (
                f"\nwas {self.extra['base']}: {self.extra['base_count']} items, {self.extra['lost']} lost "
                f"(old version kept until `crossprobe index gc {self.name}`)"
            )
            if self.kind == "reindex"
            else ""
        )
        return (
            f"{self.kind} {self.name}/{self.version}: {self.count} items active ({self.factory}); "
            f"encoded {self.encoded} in {self.seconds:.1f}s ({rate:.1f} img/s), "
            f"{self.reused_batches} batches reused from an interrupted run\n"
            f"skipped: {sk}   (details: {self.report}){was}{ocr}\nstages: {st}"
        )


@dataclass
class JobContext:
    """One run of a job: what every step needs to know. open_job makes it, the kind's function (kinds.py) fills
    in the model, the layout and the spec, execute the version and what the journal holds."""

    kind: str  # build | add | delete | reindex | sync
    name: str  # the index
    settings: IndexerSettings
    store: Store
    log: Callable[[str], None]
    t0: float  # perf_counter at the start, for elapsed times
    times: StageTimer
    # the version the job derives from: the active one (add, delete, reindex, sync), None for build
    base: str | None = None
    base_manifest: dict | None = None
    # the model: a spec (settings.model_spec, or a checkpoint directory given as ckpt), or an in-memory model (tests,
    # notebooks)
    model_spec: ModelSpec | None = None
    model: object = None
    bert: object = None
    fingerprint: str = ""
    dims: FeatureDims | None = None
    quantization: str = "float16"  # of the Redis feature values (codec.py)
    copies_base: bool = False  # add, delete, sync: the kept items' values are COPYed from the base, in its key layout
    reads_photos: bool = True  # delete reads none: no OCR in its spec, and the base's OCR setting stays the index's
    spec: dict = field(default_factory=dict)  # what makes a half-done run resumable: the same spec finds it again
    # filled by execute
    version: str = ""  # the version being written
    metrics: JobMetrics | None = None
    journal: Journal | None = None
    items: list[Item] = field(default_factory=list)  # frozen in the journal: batch b always means the same items
    reader_skips: list[Skip] = field(default_factory=list)
    encoded: int = 0  # items encoded by this run
    reused: int = 0  # batches an interrupted run had committed

    @property
    def vdir(self) -> Path:
        return self.store.version_dir(self.name, self.version)

    # the fields above that a step fills in, for the steps after it (an AssertionError: a step out of order)
    @property
    def base_version(self) -> str:
        """The base version (add, delete, reindex, sync: open_job with needs_base)."""
        assert self.base is not None, f"{self.kind}: no base version"
        return self.base

    @property
    def based_on(self) -> dict:
        """The base version's manifest (open_job with needs_base)."""
        assert self.base_manifest is not None, f"{self.kind}: no base version"
        return self.base_manifest

    @property
    def model_dims(self) -> FeatureDims:
        """The model's feature dims (use_checkpoint, or the base's: delete)."""
        assert self.dims is not None, f"{self.kind}: no model dims yet"
        return self.dims

    @property
    def build_journal(self) -> Journal:
        """The journal of the version being written (execute: open_journal)."""
        assert self.journal is not None, f"{self.kind}: no journal yet"
        return self.journal

    @property
    def layout(self) -> codec.Layout:
        return codec.Layout(self.quantization, self.model_dims.item)

    @property
    def source(self) -> dict | None:
        """Where the items came from, for the manifest: the spec's source, else (delete, reindex: the items are the
        base version's) the base version's, so that `index watch` follows a folder into the versions other jobs make."""
        return self.spec.get("source") or (self.base_manifest or {}).get("source")


# ---- before the version: the context, the model, the spec ----------------------------------------------------


def open_job(
    kind: str,
    name: str,
    settings: IndexerSettings | None,
    log: Callable[[str], None],
    *,
    needs_base: bool,
    ckpt: Path | None = None,
    model=None,
    bert=None,
) -> JobContext:
    check_name(name)
    t0 = time.perf_counter()
    settings = settings or IndexerSettings()
    store = Store(settings, connect(settings))
    spec = parse(str(ckpt)) if ckpt is not None else settings.model_spec  # a checkpoint given: the older argument
    job = JobContext(kind, name, settings, store, log, t0, StageTimer(), model_spec=spec, model=model, bert=bert)
    if needs_base:
        job.base = store.active(name)
        job.base_manifest = store.read_manifest(name, job.base) if job.base is not None else None
        if job.base_manifest is None:
            raise ValueError(f"index {name!r} has no active version here; run `crossprobe index build` first")
        layout.check_format(job.base_manifest)  # a later release's version: derived from by no older job
    return job


def use_checkpoint(job: JobContext) -> None:
    """The fingerprint and dims of the model this job encodes with (its spec, or the in-memory model)."""
    job.fingerprint, job.dims = identify(
        job.model_spec, job.model, job.settings.models, job.settings.download_timeout, say=job.log
    )


def recorded_spec(job: JobContext) -> str | None:
    """The model spec the new version records beside its fingerprint: the base's where the job keeps the index's
    model (add, delete, sync: the same fingerprint), else the spec the job encoded with; None for an in-memory
    model (its spec names no files)."""
    base_spec = (job.base_manifest or {}).get("model_spec")
    if job.copies_base and base_spec:
        return base_spec
    return str(job.model_spec) if job.model is None and job.model_spec is not None else None


def same_model_as_base(job: JobContext) -> None:
    """add and sync put new items beside the base's: both must come from one model."""
    was = job.based_on["fingerprint"]
    if was != job.fingerprint:
        built = job.based_on.get("model_spec")
        raise FingerprintMismatch(
            f"index {job.name!r} (version {job.base}) was built with model {built or 'a crossprobe checkpoint'} "
            f"({was}); this job's model {job.model_spec} is {job.fingerprint}. Move the index to this model first: "
            f"crossprobe index reindex {job.name} --model {job.model_spec}; then add (or run this job with --model "
            f"{built or '<the index model>'})."
        )


def digest(obj) -> str:
    """A short hash of a JSON-able value, for a spec: the same ids (delete) or changes (sync) find the same journal."""
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]


def encode_spec(job: JobContext, **more) -> dict:
    """The spec of a job that encodes photos (build, add, reindex, sync): whatever changes the encoded values."""
    s = job.settings
    return {
        "kind": job.kind,
        "name": job.name,
        "base": job.base,
        **more,
        "fingerprint": job.fingerprint,
        "quantization": job.quantization,
        "batch_size": s.batch_size,
        "max_pixels": s.max_pixels,
        "factory": s.factory,
    }


def settle(job: JobContext) -> None:
    """What every spec still needs after the kind's own part: the OCR setting and the key layout."""
    if job.settings.ocr is None:  # unset: as the base version was built (an index keeps its OCR through add / watch)
        base_ocr = bool(job.base_manifest and job.base_manifest.get("ocr"))
        job.settings = job.settings.model_copy(update={"ocr": base_ocr})
    if job.settings.ocr and job.reads_photos:  # a resumed job reads the rest of its photos as it read the first
        job.spec["ocr"] = {"gate_threshold": job.settings.ocr_gate_threshold}  # None: the trained gate
    job.spec["key_buckets"] = key_buckets(job)


def key_buckets(job: JobContext) -> int:
    """The key layout of the new version (store.py): build / reindex write every value afresh, in the current
    layout; add / delete / sync COPY the kept values server-side, so they keep their base's (on a cluster, COPY
    needs both keys in one slot: the same tag). In the spec, so a resumed job keeps the layout it began
    with, and a journal from before the tag (no key_buckets in its spec) is not resumed but started afresh."""
    store = job.store
    buckets = KeyLayout.of(store.prefix, job.based_on).buckets if job.copies_base else job.settings.key_buckets
    if store.cluster and not buckets:
        if not job.copies_base:
            raise ValueError(
                "CROSSPROBE_INDEX_KEY_BUCKETS=0 (untagged keys) cannot serve a shortlist in bounded "
                "round trips on a Redis Cluster; use >= 1 (default 64)"
            )
        raise ValueError(
            f"index {job.name!r} (version {job.base}) has untagged keys from before the cluster layout; "
            f"move it to the current layout first: crossprobe index reindex {job.name}"
        )
    return buckets


# ---- resuming ---------------------------------------------------------------------------------------------------


def find_resumable(job: JobContext) -> str | None:
    """The unfinished version whose journal has this job's spec (a run of the same command that was killed)."""
    d = job.store.root / job.name
    for p in sorted(d.glob("v*/build/spec.json"), reverse=True) if d.is_dir() else []:
        try:
            if json.loads(p.read_text()) == job.spec:
                return p.parent.parent.name
        except (OSError, ValueError):
            continue  # a journal being created: not ours
    return None


def finish_activated(job: JobContext) -> Result | None:
    """The job that made the ACTIVE version was killed after its one switch and before it removed its journal,
    and this is the same command again (the same spec but for `base`: the spec named the version before,
    which the switch replaced by this one) -> finish it: remove the journal and report the job done.

    Why: running the same command again is the documented resume after a kill, and the active version is the
    base a new add/delete/reindex derives from. Without this, a kill in that window made the rerun do the job a
    second time on top of its own result (add, reindex: another new version, reindex re-encoding everything)
    or fail (delete: "none of the ids is in <the new version>", exit 1), as the kill runs injected at
    after_activate in tests/indexer/jobs/test_kill_runs.py found. Build needs none of this: its spec names no
    base, so find_resumable finds the same version again and only re-activates it."""
    store, name, active = job.store, job.name, job.base
    if active is None:
        return None
    journal = Journal(store.version_dir(name, active))
    try:
        prev = journal.spec() if journal.exists else None
    except (OSError, ValueError):
        return None
    if not prev or prev.get("kind") != job.kind or prev != {**job.spec, "base": prev.get("base")}:
        return None
    vdir = store.version_dir(name, active)
    finished = json.loads((vdir / layout.REPORT).read_text())
    counts = finished["counts"]
    skipped = sum(counts["skipped"].values())
    with store.lock(name, active):
        reused = len(journal.committed())
        journal.remove()
    job.log(
        f"finishing {job.kind} of {name!r} as version {active}: it was activated (from version {prev['base']}) "
        f"by a run killed before it removed its journal"
    )
    if job.kind in JOB_NAMES:  # the gateway still shows the killed run as running: say it finished
        metrics = JobMetrics(job.settings, job.kind, name, say=job.log)
        metrics.start(counts["total"] + skipped, counts["total"] + skipped, skipped)
        metrics.finish(True)
    extra = {"base": prev["base"], **{k: v for k, v in counts.items() if k in CHANGE_KEYS}}
    return Result(
        name,
        active,
        job.kind,
        counts["total"],
        0,
        reused,
        counts["skipped"],
        {},
        time.perf_counter() - job.t0,
        finished["factory"],
        vdir / layout.REPORT,
        extra,
    )


# ---- the version: journal, encode, finalize, activate -----------------------------------------------------------

Reader = Callable[[], tuple[list[Item], list[Skip]]]


def execute(
    job: JobContext,
    read: Reader | None,
    finalize: Callable[[JobContext], dict],
    check: Callable[[JobContext, dict], None] | None = None,
    note: str = "",
) -> Result:
    """Write the new version under its lock and switch `active` to it: the steps every kind shares.
    read: the kind's item list (the reader stage), called once, when the journal is created; None: the job reads
    no items (delete). finalize: committed batches (+ base) -> the complete version, returning its report
    (finalize.py). check: may refuse the finished version before its activation (reindex's loss check)."""
    store = job.store
    with store.job_lock(job.name, f"crossprobe index {job.kind}"):
        return _execute(job, read, finalize, check, note)


def _execute(
    job: JobContext,
    read: Reader | None,
    finalize: Callable[[JobContext], dict],
    check: Callable[[JobContext, dict], None] | None,
    note: str,
) -> Result:
    store = job.store
    found = find_resumable(job)
    resumed = found is not None
    job.version = found or new_version()
    job.log(
        f"{'resuming' if resumed else 'starting'} {job.kind} of {job.name!r} as version {job.version} "
        f"({job.vdir}){note}"
    )
    job.metrics = JobMetrics(job.settings, job.kind, job.name, say=job.log) if job.kind in JOB_NAMES else None
    with store.lock(job.name, job.version):
        open_journal(job, read)
        ok = False
        try:
            finished = complete_version(job, finalize)
            if check is not None:
                check(job, finished)
            activate(job)
            ok = True
        finally:
            if job.metrics:
                job.metrics.finish(ok)
        job.build_journal.remove()
    return result(job, finished)


def open_journal(job: JobContext, read: Reader | None) -> None:
    """The journal of a resumed run, or a new one holding the items the kind's reader gives."""
    journal = Journal(job.vdir)
    if journal.exists:
        job.items, job.reader_skips = journal.items(), journal.reader_skips()
    else:
        job.store.r.sadd(job.store.versions_key(job.name), job.version)  # before any key is written: gc finds them
        if read is not None:
            with job.times.stage("reader"):
                job.items, job.reader_skips = read()
        journal.create(job.spec, job.items, job.reader_skips)
    job.journal = journal
    job.reused = len(journal.committed())


def complete_version(job: JobContext, finalize: Callable[[JobContext], dict]) -> dict:
    """Encode what the journal has not committed, then finalize -> the version's report. A run killed after its
    version was complete (manifest written) and before its activation only reads the report again."""
    if job.store.read_manifest(job.name, job.version) is None:
        if job.metrics:
            done, skipped = job.build_journal.progress(job.items, job.settings.batch_size)
            job.metrics.start(len(job.items), done, skipped + len(job.reader_skips))
        job.encoded = encode(job)
        return finalize(job)
    finished = json.loads((job.vdir / layout.REPORT).read_text())
    if job.metrics:
        job.metrics.start(len(job.items), len(job.items), sum(finished["counts"]["skipped"].values()))
    return finished


def encode(job: JobContext) -> int:
    """decode -> backbone -> head -> write_redis -> commit, for every batch not yet committed -> items encoded.
    settings.engine "ray" hands decode and encode to Ray Data (ray_engine.py); the writes are the same (sink.py: one
    pipeline per batch, on a cluster one round trip per master)."""
    settings, times, items, journal = job.settings, job.times, job.items, job.build_journal
    keys = job.store.layout(job.name, job.version, job.spec["key_buckets"])
    bs = settings.batch_size
    committed = journal.committed()
    todo = [b for b in range(math.ceil(len(items) / bs)) if b not in committed]
    if not todo:
        return 0
    done = sum(len(items[b * bs : (b + 1) * bs]) for b in committed)
    bar = progress(len(items), done, f"index {keys.name}", settings.progress)
    writer = BatchWriter(keys, items, journal, job.store, times, job.metrics, bar, settings.throttle_s)
    try:
        if settings.engine == "ray":
            from crossprobe.indexer.jobs import ray_engine

            ray_engine.encode(
                items, todo, job.layout, settings, times, job.model_spec, job.model, job.bert, writer.write, say=job.log
            )
        else:
            local_engine.encode(
                items, todo, job.layout, settings, times, job.model_spec, job.model, job.bert, writer.write
            )
    finally:
        bar.close()
    return writer.encoded


def check_lost(job: JobContext, finished: dict) -> None:
    """reindex: refuse to activate a version that lost more of the base's items than reindex_max_lost allows
    (report.TooManyLost); its journal goes, so a rerun (sources fixed) starts afresh, and `index activate`
    still accepts the version."""
    try:
        report.check_lost(
            job.name,
            job.version,
            job.base_version,
            finished["counts"],
            job.settings.reindex_max_lost,
            job.vdir / layout.REPORT,
        )
    except report.TooManyLost:
        job.build_journal.remove()
        raise


def activate(job: JobContext) -> None:
    """One SET of `active`. A job derived from a base switches only if the base is still active (an add built on
    an old version must not silently undo a change activated meanwhile); build switches whatever is active."""
    with job.times.stage("activate"):
        job.store.activate(job.name, job.version, expect=job.base, check_expect=job.base is not None)


def result(job: JobContext, finished: dict) -> Result:
    counts = finished["counts"]
    extra = {"base": job.base, **{k: v for k, v in counts.items() if k in CHANGE_KEYS}}
    if job.metrics and job.metrics.enabled:
        extra.update(pushes=job.metrics.pushes, push_failures=job.metrics.failures)
    return Result(
        job.name,
        job.version,
        job.kind,
        counts["total"],
        job.encoded,
        job.reused,
        counts["skipped"],
        job.times.seconds(),
        time.perf_counter() - job.t0,
        finished["factory"],
        job.vdir / layout.REPORT,
        extra,
    )
