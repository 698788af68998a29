"""The five kinds of job, one function each: every one produces a new version of an index, then flips `active` once.

build    encode every item of a folder/manifest.
add      the active version's items (vectors from its vectors.npy, Redis values copied server-side with COPY) plus
         newly encoded items; an item whose id is already there is replaced when the new file decodes.
delete   the active version minus some ids (no encoding at all).
sync     add and delete in one version: a batch of `crossprobe index watch` (watch.py).
reindex  re-encode every item of the active version from the source it recorded (its metadata value: uri,
         caption, tags) with the current checkpoint: how an index moves to a new model, since the service
         refuses an index of another fingerprint. Items whose source vanished or went bad are skips, reported as
         a build reports them; more than IndexerSettings.reindex_max_lost of the old count lost and the new
         version is not activated.

Each function fills a JobContext with what its kind decides (the base, the model, the layout, the spec) and hands
it to the steps every kind shares (run.py), with its reader (where its items come from) and its finalize
(finalize.py: a version of the encoded items only, or one derived from the base). `from crossprobe.indexer import
build, add, delete, reindex, sync` imports these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from crossprobe.core.inference import FeatureDims
from crossprobe.indexer.jobs import finalize
from crossprobe.indexer.jobs.run import (
    JobContext,
    Result,
    check_lost,
    digest,
    encode_spec,
    execute,
    finish_activated,
    open_job,
    same_model_as_base,
    settle,
    use_checkpoint,
)
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.indexer.jobs.sources import Item, Skip, read_source, recorded_items
from crossprobe.storage.store import Store

Log = Callable[[str], None]


def build(
    name: str,
    images: Path | None = None,
    manifest: Path | None = None,
    settings: IndexerSettings | None = None,
    ckpt: Path | None = None,
    model=None,
    bert=None,
    log: Log = print,
) -> Result:
    """Encode a folder or a manifest into a new version of `name` and activate it."""
    job = open_job("build", name, settings, log, needs_base=False, ckpt=ckpt, model=model, bert=bert)
    use_checkpoint(job)
    job.quantization = job.settings.quantization
    job.spec = encode_spec(job, source=source_desc(images, manifest))
    settle(job)
    # an id the index already holds keeps its first "added" date through a rebuild
    return execute(
        job,
        lambda: _read(job, images, manifest, job.store.active(name)),
        lambda j: finalize.fresh_version(j, finalize.encoded_rows(j), j.spec["source"]),
    )


def add(
    name: str,
    images: Path | None = None,
    manifest: Path | None = None,
    settings: IndexerSettings | None = None,
    ckpt: Path | None = None,
    model=None,
    bert=None,
    log: Log = print,
) -> Result:
    """A new version = the active one plus the items of a folder or manifest (an id already there is replaced)."""
    job = _derived("add", name, settings, log, ckpt, model, bert)
    job.spec = encode_spec(job, source=source_desc(images, manifest))
    settle(job)
    if (done := finish_activated(job)) is not None:
        return done
    return execute(
        job,
        lambda: _read(job, images, manifest, job.base),
        lambda j: finalize.derive_version(j, [], ("replaced", "added")),
    )


def sync(
    name: str,
    images: Path,
    items: list[Item],
    ids: list[str],
    settings: IndexerSettings | None = None,
    ckpt: Path | None = None,
    model=None,
    bert=None,
    log: Log = print,
) -> Result:
    """One batch of `crossprobe index watch` (watch.py): a new version = the active one minus `ids` plus `items`
    (files of the folder `images`, new or changed: each replaces its id when it decodes), then one switch, so
    a reader sees the whole batch or none of it."""
    job = _derived("sync", name, settings, log, ckpt, model, bert)
    # the batch itself names the job: the same changes after a kill resume its journal
    job.spec = encode_spec(
        job, source=source_desc(images, None), changes_sha=digest([[it.id, it.uri] for it in items] + sorted(set(ids)))
    )
    settle(job)
    if (done := finish_activated(job)) is not None:
        return done

    def read() -> tuple[list[Item], list[Skip]]:
        keep_added_dates(job.store, name, job.base, items)
        return items, []

    return execute(job, read, lambda j: finalize.derive_version(j, ids, ("replaced", "added", "deleted")))


def delete(name: str, ids: list[str], settings: IndexerSettings | None = None, log: Log = print) -> Result:
    """A new version = the active one minus `ids` (nothing is encoded)."""
    job = open_job("delete", name, settings, log, needs_base=True)
    job.fingerprint, job.dims = job.based_on["fingerprint"], FeatureDims.from_manifest(job.based_on["dims"])
    job.quantization = job.based_on["layout"]["quantization"]
    job.copies_base, job.reads_photos = True, False
    job.spec = {
        "kind": "delete",
        "name": name,
        "base": job.base,
        "factory": job.settings.factory,
        "ids_sha": digest(sorted(set(ids))),
    }
    settle(job)
    if (done := finish_activated(job)) is not None:
        return done
    if not set(ids) & set(job.store.read_ids(name, job.base_version)):
        raise ValueError(f"none of the {len(ids)} ids is in {name}/{job.base}; nothing to delete")
    return execute(job, None, lambda j: finalize.derive_version(j, ids, ("deleted", "not_found")))


def reindex(
    name: str,
    settings: IndexerSettings | None = None,
    ckpt: Path | None = None,
    model=None,
    bert=None,
    quantization: str | None = None,
    log: Log = print,
) -> Result:
    """Re-encode the active version's items from their recorded sources with this checkpoint into a new
    version; activate it unless more than settings.reindex_max_lost of them were lost (TooManyLost).
    quantization: the feature layout of the new version (default: the old version's)."""
    job = open_job("reindex", name, settings, log, needs_base=True, ckpt=ckpt, model=model, bert=bert)
    use_checkpoint(job)  # another fingerprint than the base's is the point (or the same: a re-encode)
    job.quantization = quantization or job.based_on["layout"]["quantization"]
    job.spec = encode_spec(job)  # no source: the items are the base version's, which `base` names exactly
    settle(job)
    if (done := finish_activated(job)) is not None:
        return done

    def read() -> tuple[list[Item], list[Skip]]:
        base_ids = job.store.read_ids(name, job.base_version)
        return recorded_items(base_ids, job.store.metadata(name, job.base_version, base_ids))

    return execute(
        job,
        read,
        _finalize_reindex,
        check=check_lost,
        note=f" from version {job.base} (model {job.based_on['fingerprint']} -> {job.fingerprint})",
    )


def _derived(kind: str, name: str, settings, log: Log, ckpt, model, bert) -> JobContext:
    """add, sync: encode new items with the base's model into the base's layout, beside its copied values."""
    job = open_job(kind, name, settings, log, needs_base=True, ckpt=ckpt, model=model, bert=bert)
    use_checkpoint(job)
    same_model_as_base(job)
    job.quantization = job.based_on["layout"]["quantization"]  # add keeps the layout
    job.copies_base = True
    return job


def _finalize_reindex(job: JobContext) -> dict:
    new = finalize.encoded_rows(job)
    base_count = len(job.store.read_ids(job.name, job.base_version))
    # every item of the old version is either in the new one or reported as a skip, exactly once
    if len(new.ids) != base_count - len(job.reader_skips) - len(new.skips):
        raise RuntimeError(
            f"reindex of {job.name}: {len(new.ids)} items re-encoded + "
            f"{len(job.reader_skips) + len(new.skips)} skipped != {base_count} items in {job.base}; "
            f"the journal under {job.vdir} is inconsistent"
        )
    return finalize.fresh_version(
        job,
        new,
        f"version {job.base} of {job.name!r} ({job.base} stays active)",
        {"base_count": base_count, "lost": base_count - len(new.ids)},
    )


def source_desc(images: Path | None, manifest: Path | None) -> dict:
    if (images is None) == (manifest is None):
        raise ValueError("give exactly one of --images DIR or --manifest FILE.jsonl")
    if images:
        return {"images": str(Path(images).resolve())}
    assert manifest is not None  # exactly one of the two, checked above
    return {"manifest": str(Path(manifest).resolve())}


def _read(job: JobContext, images: Path | None, manifest: Path | None, dates_from: str | None):
    """build, add: the items of a folder or manifest; those already in version `dates_from` keep their dates."""
    items, reader_skips, _ = read_source(images, manifest, job.settings.follow_links)
    keep_added_dates(job.store, job.name, dates_from, items)
    return items, reader_skips


def keep_added_dates(store: Store, name: str, base: str | None, items: list[Item]) -> None:
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
