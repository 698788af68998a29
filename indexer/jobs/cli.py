"""`crossprobe index ...`: build | add | delete | reindex | watch | list | activate | gc.

Options left unset fall back to IndexerSettings (env REDIS_URL, CROSSPROBE_INDEX_*, CROSSPROBE_PUSHGATEWAY_*);
--ckpt falls back to CROSSPROBE_CKPT, the variable the service reads, so an index and the service that
serves it name the same checkpoint by default. Exit status: 0 done, 1 the job failed, 2 bad usage.
Heavy imports stay inside the commands so `crossprobe --help` stays instant.
"""
from __future__ import annotations

from pathlib import Path

import typer

index_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="offline indexer: images -> FAISS (g_I) + Redis (P_v, b_bar, s_I, metadata)")

_ROOT = typer.Option(None, help="index root directory (default: indexes/, env CROSSPROBE_INDEX_ROOT)")
_ENGINE = typer.Option(None, help="single | ray: who decodes and encodes (default single: this process; ray: Ray "
                       "Data with an actor pool of encoders, on RAY_ADDRESS or a local Ray; env CROSSPROBE_INDEX_ENGINE)")
_OCR = typer.Option(None, "--ocr/--no-ocr", help="read the words in each photo (OCR) into its searchable text; "
                    "it costs indexing about 15% of its speed (default: CROSSPROBE_INDEX_OCR; unset: as the "
                    "index was built, else off)")
_CKPT = typer.Option(None, envvar="CROSSPROBE_CKPT", show_envvar=True,
                     help="checkpoint directory (default: the committed one)")


def _settings(**overrides):
    from pydantic import ValidationError

    from crossprobe.indexer.jobs.settings import IndexerSettings

    try:
        return IndexerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:  # e.g. --engine spark: a usage error, not a traceback
        _fail("; ".join(f"{'.'.join(map(str, er['loc'])) or 'settings'}: {er['msg']}" for er in e.errors()), 2)


def _fail(e: Exception | str, code: int = 1) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(code)


def _job(kind: str, name: str, images: Path | None, manifest: Path | None, ckpt: Path | None, **opts) -> None:
    from redis.exceptions import RedisError

    from crossprobe.indexer.jobs import versions as b

    settings = _settings(**opts)
    try:
        res = getattr(b, kind)(name, images=images, manifest=manifest, settings=settings, ckpt=ckpt, log=typer.echo)
    except (ValueError, LookupError, RuntimeError, FileNotFoundError, RedisError) as e:  # Redis: says what to check
        _fail(e)
    typer.echo(res.summary())


@index_app.command("build")
def build_cmd(
    name: str = typer.Option(..., help="index name (letters, digits, _ . -)"),
    images: Path = typer.Option(None, help="folder of images, walked recursively"),
    manifest: Path = typer.Option(None, help='JSONL: {"id", "uri", "caption"?, "tags"?, any scalar field?} per line (fields are filterable)'),
    ckpt: Path = _CKPT,
    root: Path = _ROOT,
    workers: int = typer.Option(None, help="decode threads overlapping the encoder (1 or 2 on 2 cores)"),
    batch_size: int = typer.Option(None, help="images per batch (and per committed journal entry)"),
    quantization: str = typer.Option(None, help="float16 | int8 (Redis feature values)"),
    factory: str = typer.Option(None, help="force a faiss.index_factory string (default: by size)"),
    max_pixels: int = typer.Option(None, help="skip images that decode to more pixels (after JPEG draft scale; default 100e6)"),
    threads: int = typer.Option(None, help="ONNX Runtime threads"),
    head: str = typer.Option(None, help="onnx | torch runtime for the image-tower head"),
    throttle: float = typer.Option(None, help="seconds to sleep after each batch (share a busy machine)"),
    engine: str = _ENGINE,
    ocr: bool = _OCR,
):
    """Encode a folder or manifest into a new version and activate it (run again to resume after a kill)."""
    _job("build", name, images, manifest, ckpt, index_root=root, workers=workers, batch_size=batch_size,
         quantization=quantization, factory=factory, max_pixels=max_pixels, threads=threads, head=head,
         throttle_s=throttle, engine=engine, ocr=ocr)


@index_app.command("add")
def add_cmd(
    name: str = typer.Option(...),
    images: Path = typer.Option(None),
    manifest: Path = typer.Option(None),
    ckpt: Path = _CKPT,
    root: Path = _ROOT,
    workers: int = typer.Option(None),
    batch_size: int = typer.Option(None),
    factory: str = typer.Option(None),
    max_pixels: int = typer.Option(None),
    threads: int = typer.Option(None),
    throttle: float = typer.Option(None),
    engine: str = _ENGINE,
    ocr: bool = _OCR,
):
    """Add (or replace) items: a new version = active items + these, then one switch."""
    _job("add", name, images, manifest, ckpt, index_root=root, workers=workers, batch_size=batch_size, factory=factory,
         max_pixels=max_pixels, threads=threads, throttle_s=throttle, engine=engine, ocr=ocr)


@index_app.command("delete")
def delete_cmd(
    name: str = typer.Option(...),
    ids: list[str] = typer.Option(..., "--ids", help="item ids, comma separated and/or repeated"),
    root: Path = _ROOT,
    factory: str = typer.Option(None),
):
    """Remove items: a new version = active items minus these, then one switch."""
    from crossprobe.indexer.jobs import versions as b

    wanted = [i for chunk in ids for i in chunk.split(",") if i]
    try:
        res = b.delete(name, wanted, settings=_settings(index_root=root, factory=factory), log=typer.echo)
    except (ValueError, LookupError, RuntimeError) as e:
        _fail(e)
    typer.echo(res.summary())
    if res.extra.get("not_found"):
        typer.echo(f"not in the index: {', '.join(res.extra['not_found'][:20])}")


@index_app.command("reindex")
def reindex_cmd(
    names: list[str] = typer.Argument(None, help="indexes to re-encode", show_default=False),
    all_: bool = typer.Option(False, "--all", help="every index under the root that has an active version"),
    ckpt: Path = _CKPT,
    root: Path = _ROOT,
    max_lost: float = typer.Option(None, min=0, max=1, help="refuse to activate when more than this fraction of "
                                   "the items is lost (default 0.01, env CROSSPROBE_INDEX_REINDEX_MAX_LOST)"),
    quantization: str = typer.Option(None, help="float16 | int8 (default: the old version's layout)"),
    workers: int = typer.Option(None),
    batch_size: int = typer.Option(None),
    factory: str = typer.Option(None),
    max_pixels: int = typer.Option(None),
    threads: int = typer.Option(None),
    head: str = typer.Option(None),
    throttle: float = typer.Option(None),
    engine: str = _ENGINE,
    ocr: bool = _OCR,
):
    """Re-encode every item of an index from its recorded sources with the current checkpoint into a new
    version and activate it (how an index moves to a new model; run again to resume after a kill). The old
    version stays until `crossprobe index gc`."""
    from redis.exceptions import RedisError

    from crossprobe.indexer.jobs import versions as jobs
    from crossprobe.indexer.storage.redis_conn import connect
    from crossprobe.indexer.storage.store import Store, check_name

    settings = _settings(index_root=root, reindex_max_lost=max_lost, workers=workers, batch_size=batch_size, factory=factory,
                  max_pixels=max_pixels, threads=threads, head=head, throttle_s=throttle, engine=engine, ocr=ocr)
    if bool(names) == all_:
        _fail("give index names or --all (not both)", 2)
    if quantization not in (None, "float16", "int8"):
        _fail(f"--quantization {quantization!r}: float16 or int8", 2)
    try:
        store = Store(settings, connect(settings))
        served = [n for n in store.names() if store.active(n)]
    except RedisError as e:
        _fail(f"cannot read the indexes' active versions from Redis: {e}")
    if all_:
        names = served
        if not names:
            _fail(f"no index with an active version under {settings.index_root.resolve()}", 2)
    for n in names:  # every name checked before the first job starts: a typo fails at once, not after hours
        try:
            check_name(n)
        except ValueError as e:
            _fail(e, 2)
        if n not in served:
            _fail(f"no index {n!r} with an active version under {settings.index_root.resolve()} "
                  f"(indexes there: {', '.join(served) or 'none'})", 2)
    failed = []
    for n in names:
        try:
            res = jobs.reindex(n, settings=settings, ckpt=ckpt, quantization=quantization, log=typer.echo)
        except (ValueError, LookupError, RuntimeError, OSError, RedisError) as e:  # TooManyLost: a RuntimeError
            typer.echo(f"error: {e}", err=True)
            failed.append(n)
            continue
        typer.echo(res.summary())
    if failed:
        typer.echo(f"reindex failed for {', '.join(failed)} ({len(names) - len(failed)} of {len(names)} done)", err=True)
        raise typer.Exit(1)


@index_app.command("watch")
def watch_cmd(
    name: str = typer.Option(..., help="index name (built from --images first if it has no active version)"),
    images: Path = typer.Option(..., help="the folder to follow, walked recursively"),
    ckpt: Path = _CKPT,
    root: Path = _ROOT,
    settle: float = typer.Option(None, help="seconds a changed file must be left alone before it is read (default 1)"),
    poll: float = typer.Option(None, help="seconds between scans without file events (default 2)"),
    events: bool = typer.Option(None, "--events/--poll-only", help="wake on inotify events where they start "
                                "(default), or only scan every --poll seconds"),
    batch_max: int = typer.Option(None, help="changed files per version (default 500)"),
    metrics_port: int = typer.Option(None, help="port of the watcher's Prometheus /metrics (default 9109; 0: none)"),
    workers: int = typer.Option(None),
    batch_size: int = typer.Option(None),
    max_pixels: int = typer.Option(None),
    threads: int = typer.Option(None),
    ocr: bool = _OCR,
):
    """Keep NAME in step with a folder: new, changed, moved and deleted files reach the served index within
    seconds, each batch as one new version (readers see all of it or none). Runs until SIGTERM or Ctrl-C; a
    killed watcher started again finds what it had not applied."""
    import signal
    import threading

    from redis.exceptions import RedisError

    from crossprobe.indexer.jobs.watch import Watcher

    settings = _settings(index_root=root, watch_settle_s=settle, watch_poll_s=poll, watch_events=events,
                         watch_batch_max=batch_max, watch_metrics_port=metrics_port, workers=workers,
                         batch_size=batch_size, max_pixels=max_pixels, threads=threads, progress=False, ocr=ocr)
    stop = threading.Event()
    try:
        w = Watcher(name, images, settings, ckpt=ckpt, say=typer.echo)
        signal.signal(signal.SIGTERM, lambda *_: (stop.set(), w.wake.set()))  # finish the batch in hand, exit 0
        w.run(stop)
    except KeyboardInterrupt:
        raise typer.Exit(130)
    except (ValueError, LookupError, FileNotFoundError, RedisError) as e:
        _fail(e)


@index_app.command("list")
def list_cmd(name: str = typer.Argument(None), root: Path = _ROOT):
    """Versions of every index (or one): state, items, model fingerprint, factory, keyword index (words: names,
    captions, tags; words+ocr: and the text read in the photos; -: none, a version from before them)."""
    from crossprobe.indexer.storage.redis_conn import connect
    from crossprobe.indexer.storage.store import Store

    settings = _settings(index_root=root)
    store = Store(settings, connect(settings))
    for n in [name] if name else store.names():
        for v in store.versions(n):
            typer.echo(f"{n:<20} {v.version:<24} {v.state:<9} {v.count if v.count is not None else '-':>9} "
                       f"{v.fingerprint or '-':<17} {v.factory or '-':<14} {v.words or '-':<9} {v.created or ''}")


@index_app.command("activate")
def activate_cmd(name: str, version: str, root: Path = _ROOT):
    """Make VERSION the live one (one Redis SET); e.g. roll back to an earlier version."""
    from crossprobe.indexer.storage.redis_conn import connect
    from crossprobe.indexer.storage.store import Store

    settings = _settings(index_root=root)
    try:
        Store(settings, connect(settings)).activate(name, version)
    except (ValueError, RuntimeError) as e:
        _fail(e)
    typer.echo(f"{name}: active version is now {version}")


@index_app.command("gc")
def gc_cmd(name: str, root: Path = _ROOT):
    """Delete every inactive version of NAME (disk and Redis), except builds still running."""
    from crossprobe.indexer.storage.redis_conn import connect
    from crossprobe.indexer.storage.store import Store

    settings = _settings(index_root=root)
    removed = Store(settings, connect(settings)).gc(name)
    for v, n in removed:
        typer.echo(f"removed {name}/{v} ({n} Redis keys)")
    typer.echo(f"{len(removed)} version(s) removed")
