"""`crossprobe index ...`: build | add | delete | reindex | watch | list | activate | gc | drop.

Options left unset fall back to IndexerSettings (env REDIS_URL, CROSSPROBE_INDEX_*, CROSSPROBE_PUSHGATEWAY_*);
--model falls back to CROSSPROBE_MODEL (and --ckpt, its older form for a crossprobe checkpoint, to CROSSPROBE_CKPT),
the variables the service reads, so an index and the service that serves it name the same model by default.
Exit status: 0 done, 1 the job failed, 2 bad usage.
Heavy imports stay inside the commands so `crossprobe --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

index_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="offline indexer: images -> FAISS (g_I) + Redis (P_v, b_bar, s_I, metadata)",
)

# ---- options several commands take, each declared once ---------------------------------------------------------

Root = Annotated[
    Optional[Path], typer.Option(help="index root directory (default: indexes/, env CROSSPROBE_INDEX_ROOT)")
]
Name = Annotated[str, typer.Option(help="index name (letters, digits, _ . -)")]
Images = Annotated[Optional[Path], typer.Option(help="folder of images, walked recursively")]
Manifest = Annotated[
    Optional[Path],
    typer.Option(help='JSONL: {"id", "uri", "caption"?, "tags"?, any scalar field?} per line (fields are filterable)'),
]

# The encode options: how build, add, reindex and watch decode and encode photos. encode_settings() turns them into
# IndexerSettings fields; a command lists the ones that apply to it.
Model = Annotated[
    Optional[str],
    typer.Option(
        help="the model, a spec: crossprobe:<checkpoint dir>, open_clip:<arch>/<weights>, hf:<repo or dir>, "
        "immich:<folder> (default: CROSSPROBE_MODEL, else the committed checkpoint; docs/models.md). reindex --model "
        "moves an index to another model"
    ),
]
Ckpt = Annotated[
    Optional[Path],
    typer.Option(
        help="a crossprobe checkpoint directory: the older form of --model crossprobe:<dir> (default: CROSSPROBE_CKPT)"
    ),
]
Workers = Annotated[Optional[int], typer.Option(help="decode threads overlapping the encoder (1 or 2 on 2 cores)")]
BatchSize = Annotated[Optional[int], typer.Option(help="images per batch (and per committed journal entry)")]
MaxPixels = Annotated[
    Optional[int], typer.Option(help="skip images that decode to more pixels (after JPEG draft scale; default 100e6)")
]
Threads = Annotated[Optional[int], typer.Option(help="ONNX Runtime threads")]
Head = Annotated[Optional[str], typer.Option(help="onnx | torch runtime for the image-tower head")]
Throttle = Annotated[Optional[float], typer.Option(help="seconds to sleep after each batch (share a busy machine)")]
Engine = Annotated[
    Optional[str],
    typer.Option(
        help="single | ray: who decodes and encodes (default single: this process; ray: Ray Data with an actor pool of "
        "encoders, on RAY_ADDRESS or a local Ray; env CROSSPROBE_INDEX_ENGINE)"
    ),
]
Ocr = Annotated[
    Optional[bool],
    typer.Option(
        "--ocr/--no-ocr",
        help="read the words in each photo (OCR) into its searchable text; it costs indexing about 15% "
        "of its speed (default: CROSSPROBE_INDEX_OCR; unset: as the index was built, else off)",
    ),
]
Factory = Annotated[Optional[str], typer.Option(help="force a faiss.index_factory string (default: by size)")]
Quantization = Annotated[Optional[str], typer.Option(help="float16 | int8 (Redis feature values)")]


def encode_settings(
    workers: int | None = None,
    batch_size: int | None = None,
    max_pixels: int | None = None,
    threads: int | None = None,
    head: str | None = None,
    throttle: float | None = None,
    engine: str | None = None,
    ocr: bool | None = None,
    factory: str | None = None,
    quantization: str | None = None,
    model: str | None = None,
    ckpt: Path | None = None,
) -> dict:
    """The encode options -> IndexerSettings fields (_settings drops the unset ones: the environment decides)."""
    return {
        "workers": workers,
        "batch_size": batch_size,
        "max_pixels": max_pixels,
        "threads": threads,
        "head": head,
        "throttle_s": throttle,
        "engine": engine,
        "ocr": ocr,
        "factory": factory,
        "quantization": quantization,
        "model": model,
        "ckpt": ckpt,
    }


def _settings(**overrides):
    from pydantic import ValidationError

    from crossprobe.indexer.jobs.settings import IndexerSettings

    given = {k: v for k, v in overrides.items() if v is not None}
    if "model" in given or "ckpt" in given:  # a flag names the model: the environment's model variables do not
        given = {"model": None, "ckpt": None, **given}
    try:
        return IndexerSettings(**given)
    except ValidationError as e:  # e.g. --engine spark: a usage error, not a traceback
        _fail("; ".join(f"{'.'.join(map(str, er['loc'])) or 'settings'}: {er['msg']}" for er in e.errors()), 2)


def _fail(e: Exception | str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(code)


def _job(kind: str, name: str, images: Path | None, manifest: Path | None, settings) -> None:
    from redis.exceptions import RedisError

    from crossprobe.indexer.jobs import kinds

    try:
        res = getattr(kinds, kind)(name, images=images, manifest=manifest, settings=settings, log=typer.echo)
    except (ValueError, LookupError, RuntimeError, FileNotFoundError, RedisError) as e:  # Redis: says what to check
        _fail(e)
    typer.echo(res.summary())


@index_app.command("build")
def build_cmd(
    name: Name,
    images: Images = None,
    manifest: Manifest = None,
    model: Model = None,
    ckpt: Ckpt = None,
    root: Root = None,
    workers: Workers = None,
    batch_size: BatchSize = None,
    quantization: Quantization = None,
    factory: Factory = None,
    max_pixels: MaxPixels = None,
    threads: Threads = None,
    head: Head = None,
    throttle: Throttle = None,
    engine: Engine = None,
    ocr: Ocr = None,
):
    """Encode a folder or manifest into a new version and activate it (run again to resume after a kill)."""
    enc = encode_settings(
        workers=workers,
        batch_size=batch_size,
        quantization=quantization,
        factory=factory,
        max_pixels=max_pixels,
        threads=threads,
        head=head,
        throttle=throttle,
        engine=engine,
        ocr=ocr,
        model=model,
        ckpt=ckpt,
    )
    _job("build", name, images, manifest, _settings(index_root=root, **enc))


@index_app.command("add")
def add_cmd(
    name: Name,
    images: Images = None,
    manifest: Manifest = None,
    model: Model = None,
    ckpt: Ckpt = None,
    root: Root = None,
    workers: Workers = None,
    batch_size: BatchSize = None,
    factory: Factory = None,
    max_pixels: MaxPixels = None,
    threads: Threads = None,
    throttle: Throttle = None,
    engine: Engine = None,
    ocr: Ocr = None,
):
    """Add (or replace) items: a new version = active items + these, then one switch (with the index's model)."""
    enc = encode_settings(
        workers=workers,
        batch_size=batch_size,
        factory=factory,
        max_pixels=max_pixels,
        threads=threads,
        throttle=throttle,
        engine=engine,
        ocr=ocr,
        model=model,
        ckpt=ckpt,
    )
    _job("add", name, images, manifest, _settings(index_root=root, **enc))


@index_app.command("delete")
def delete_cmd(
    name: Name,
    ids: Annotated[Optional[list[str]], typer.Option("--ids", help="item ids, comma separated and/or repeated")] = None,
    ids_from: Annotated[
        Optional[typer.FileBinaryRead],
        typer.Option(
            metavar="FILE",
            help="a file of item ids, one per line, each exactly as written (commas and spaces included; "
            "UTF-8; '-': standard input)",
        ),
    ] = None,
    null: Annotated[
        bool,
        typer.Option(
            "--null",
            "-0",
            help="ids in --ids-from end with a NUL byte instead of a "
            "newline (find -print0): for ids that hold a newline",
        ),
    ] = False,
    root: Root = None,
    factory: Factory = None,
):
    """Remove items: a new version = active items minus these, then one switch. Their values stay in the older
    versions until `crossprobe index gc NAME` (docs/indexing.md: erasing a photo)."""
    from crossprobe.indexer.jobs import kinds

    if not ids and ids_from is None:
        _fail("give the ids: --ids a,b or --ids-from FILE ('-': standard input)", 2)
    wanted = [i for chunk in ids or [] for i in chunk.split(",") if i]
    if ids_from is not None:
        wanted += _read_ids(ids_from.read(), null, getattr(ids_from, "name", "-"))
    try:
        res = kinds.delete(
            name, list(dict.fromkeys(wanted)), settings=_settings(index_root=root, factory=factory), log=typer.echo
        )
    except (ValueError, LookupError, RuntimeError) as e:
        _fail(e)
    typer.echo(res.summary())
    if res.extra.get("not_found"):
        typer.echo(f"not in the index: {', '.join(map(repr, res.extra['not_found'][:20]))}")


def _read_ids(data: bytes, null: bool, source: str) -> list[str]:
    """A file of ids -> the ids: one per line (a trailing CR dropped: a file written on Windows), or NUL-ended
    with --null. Every other character belongs to its id; empty entries are skipped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(f"--ids-from {source}: not UTF-8 (byte {e.start}): ids are UTF-8 text", 2)
    entries = text.split("\0") if null else [line.removesuffix("\r") for line in text.split("\n")]
    out = [i for i in entries if i]
    if not out:
        _fail(f"--ids-from {source}: no ids in it", 2)
    return out


@index_app.command("reindex")
def reindex_cmd(
    names: Annotated[Optional[list[str]], typer.Argument(help="indexes to re-encode", show_default=False)] = None,
    all_: Annotated[bool, typer.Option("--all", help="every index under the root that has an active version")] = False,
    model: Model = None,
    ckpt: Ckpt = None,
    root: Root = None,
    max_lost: Annotated[
        Optional[float],
        typer.Option(
            min=0,
            max=1,
            help="refuse to activate when more than this fraction of the items is lost (default 0.01, "
            "env CROSSPROBE_INDEX_REINDEX_MAX_LOST)",
        ),
    ] = None,
    quantization: Annotated[
        Optional[str], typer.Option(help="float16 | int8 (default: the old version's layout)")
    ] = None,
    workers: Workers = None,
    batch_size: BatchSize = None,
    factory: Factory = None,
    max_pixels: MaxPixels = None,
    threads: Threads = None,
    head: Head = None,
    throttle: Throttle = None,
    engine: Engine = None,
    ocr: Ocr = None,
):
    """Re-encode every item of an index from its recorded sources with the model (--model, CROSSPROBE_MODEL) into a
    new version and activate it: how an index moves to another model while the old version keeps serving (run again
    to resume after a kill). The old version stays until `crossprobe index gc`."""
    # quantization is the job's (the new version's layout), not a setting: unset keeps the old version's
    enc = encode_settings(
        workers=workers,
        batch_size=batch_size,
        factory=factory,
        max_pixels=max_pixels,
        threads=threads,
        head=head,
        throttle=throttle,
        engine=engine,
        ocr=ocr,
        model=model,
        ckpt=ckpt,
    )
    settings = _settings(index_root=root, reindex_max_lost=max_lost, **enc)
    if bool(names) == all_:
        _fail("give index names or --all (not both)", 2)
    if quantization not in (None, "float16", "int8"):
        _fail(f"--quantization {quantization!r}: float16 or int8", 2)
    names = _served(settings, names, all_)
    _reindex_each(names, settings, quantization)


def _served(settings, names: list[str] | None, all_: bool) -> list[str]:
    """The indexes a reindex runs on, every one checked before the first job starts: a typo fails at once, not
    after hours."""
    from redis.exceptions import RedisError

    from crossprobe.storage.redis_conn import connect
    from crossprobe.storage.store import Store, check_name

    try:
        store = Store(settings, connect(settings))
        served = [n for n in store.names() if store.active(n)]
    except RedisError as e:
        _fail(f"cannot read the indexes' active versions from Redis: {e}")
    if all_:
        names = served
        if not names:
            _fail(f"no index with an active version under {settings.index_root.resolve()}", 2)
    assert names is not None  # given when not --all (reindex checked)
    for n in names:
        try:
            check_name(n)
        except ValueError as e:
            _fail(e, 2)
        if n not in served:
            _fail(
                f"no index {n!r} with an active version under {settings.index_root.resolve()} "
                f"(indexes there: {', '.join(served) or 'none'})",
                2,
            )
    return names


def _reindex_each(names: list[str], settings, quantization: str | None) -> None:
    from redis.exceptions import RedisError

    from crossprobe.indexer.jobs import kinds

    failed = []
    for n in names:
        try:
            res = kinds.reindex(n, settings=settings, quantization=quantization, log=typer.echo)
        except (ValueError, LookupError, RuntimeError, OSError, RedisError) as e:  # TooManyLost: a RuntimeError
            typer.echo(f"error: {e}", err=True)
            failed.append(n)
            continue
        typer.echo(res.summary())
    if failed:
        typer.echo(
            f"reindex failed for {', '.join(failed)} ({len(names) - len(failed)} of {len(names)} done)", err=True
        )
        raise typer.Exit(1)


@index_app.command("watch")
def watch_cmd(
    name: Annotated[str, typer.Option(help="index name (built from --images first if it has no active version)")],
    images: Annotated[Path, typer.Option(help="the folder to follow, walked recursively")],
    model: Model = None,
    ckpt: Ckpt = None,
    root: Root = None,
    settle: Annotated[
        Optional[float], typer.Option(help="seconds a changed file must be left alone before it is read (default 1)")
    ] = None,
    poll: Annotated[Optional[float], typer.Option(help="seconds between scans without file events (default 2)")] = None,
    events: Annotated[
        Optional[bool],
        typer.Option(
            "--events/--poll-only",
            help="wake on inotify events where they start (default), or only scan every --poll seconds",
        ),
    ] = None,
    batch_max: Annotated[Optional[int], typer.Option(help="changed files per version (default 500)")] = None,
    metrics_port: Annotated[
        Optional[int], typer.Option(help="port of the watcher's Prometheus /metrics (default 9109; 0: none)")
    ] = None,
    workers: Workers = None,
    batch_size: BatchSize = None,
    max_pixels: MaxPixels = None,
    threads: Threads = None,
    ocr: Ocr = None,
):
    """Keep NAME in step with a folder: new, changed, moved and deleted files reach the served index within
    seconds, each batch as one new version (readers see all of it or none). Runs until SIGTERM or Ctrl-C; a
    killed watcher started again finds what it had not applied."""
    import signal
    import threading

    from redis.exceptions import RedisError

    from crossprobe.indexer.jobs.watch import Watcher

    enc = encode_settings(
        workers=workers, batch_size=batch_size, max_pixels=max_pixels, threads=threads, ocr=ocr, model=model, ckpt=ckpt
    )
    settings = _settings(
        index_root=root,
        watch_settle_s=settle,
        watch_poll_s=poll,
        watch_events=events,
        watch_batch_max=batch_max,
        watch_metrics_port=metrics_port,
        progress=False,
        **enc,
    )
    stop = threading.Event()
    try:
        w = Watcher(name, images, settings, say=typer.echo)

        def on_term(*_) -> None:  # finish the batch in hand, exit 0
            stop.set()
            w.wake.set()

        signal.signal(signal.SIGTERM, on_term)
        w.run(stop)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except (ValueError, LookupError, FileNotFoundError, RedisError) as e:
        _fail(e)


@index_app.command("list")
def list_cmd(name: Annotated[Optional[str], typer.Argument()] = None, root: Root = None):
    """Versions of every index (or one): state, items, model fingerprint, factory, keyword index (words: names,
    captions, tags; words+ocr: and the text read in the photos; -: none, a version from before them)."""
    from crossprobe.storage.redis_conn import connect
    from crossprobe.storage.store import Store

    settings = _settings(index_root=root)
    store = Store(settings, connect(settings))
    for n in [name] if name else store.names():
        for v in store.versions(n):
            typer.echo(
                f"{n:<20} {v.version:<24} {v.state:<9} {v.count if v.count is not None else '-':>9} "
                f"{v.fingerprint or '-':<17} {v.factory or '-':<14} {v.words or '-':<9} {v.created or ''}"
            )


@index_app.command("activate")
def activate_cmd(name: str, version: str, root: Root = None):
    """Make VERSION the live one (one Redis SET); e.g. roll back to an earlier version."""
    from crossprobe.storage.redis_conn import connect
    from crossprobe.storage.store import Store

    settings = _settings(index_root=root)
    try:
        Store(settings, connect(settings)).activate(name, version)
    except (ValueError, RuntimeError) as e:
        _fail(e)
    typer.echo(f"{name}: active version is now {version}")


@index_app.command("gc")
def gc_cmd(name: str, root: Root = None):
    """Delete every inactive version of NAME (disk and Redis), except builds still running: the photos that
    `delete` (or a watched folder) removed leave the last version that held them."""
    from crossprobe.storage.redis_conn import connect
    from crossprobe.storage.store import Store

    settings = _settings(index_root=root)
    store = Store(settings, connect(settings))
    removed = store.gc(name)
    for v, n in removed:
        typer.echo(f"removed {name}/{v} ({n} Redis keys)")
    typer.echo(f"{len(removed)} version(s) removed")
    if removed:
        _snapshot(store)


@index_app.command("drop")
def drop_cmd(
    name: Annotated[str, typer.Argument(help="the index to remove")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask (scripts)")] = False,
    root: Root = None,
):
    """Remove index NAME for good: every version, on disk and in Redis (its active key, values, keyword index,
    FAISS files or Milvus collections). A running service stops serving it at its next reload (404
    index_not_found). Refused while a job or `index watch` is writing one of its versions: stop the watcher first,
    or it builds the index again from its folder."""
    from redis.exceptions import RedisError

    from crossprobe.storage.redis_conn import connect
    from crossprobe.storage.store import Store, check_name

    try:
        check_name(name)
    except ValueError as e:
        _fail(e, 2)
    settings = _settings(index_root=root)
    store = Store(settings, connect(settings))
    versions = store.versions(name)
    if not yes:
        active = next((v for v in versions if v.state == "active"), None)
        what = f"{len(versions)} version(s)" + (f", {active.count} items active" if active else "")
        typer.confirm(
            f"drop index {name!r} ({what}) from {settings.index_root.resolve()} and Redis, for good?", abort=True
        )
    try:
        dropped, rest = store.drop_index(name)
    except (RuntimeError, RedisError, OSError) as e:
        _fail(e)
    if not dropped and not rest:
        _fail(f"no index {name!r} under {settings.index_root.resolve()} (nothing in Redis under its name either)")
    for v, n in dropped:
        typer.echo(f"removed {name}/{v} ({n} Redis keys)")
    typer.echo(f"dropped {name}: {len(dropped)} version(s), {sum(n for _, n in dropped) + rest} Redis keys")
    _snapshot(store)


def _snapshot(store) -> None:
    """The embedded Redis keeps its data in <root>/redis.db: write that snapshot again now, so what gc or drop
    removed leaves the disk too. An external Redis's files (RDB, AOF, replicas, backups) are its operator's."""
    from redis.exceptions import RedisError

    try:
        if store.snapshot_embedded():
            typer.echo(f"embedded Redis snapshot {store.settings.rdb} written again")
    except (RedisError, TimeoutError) as e:
        typer.echo(
            f"warning: the embedded Redis snapshot was not written again ({e}); it holds the removed values "
            f"until its next save",
            err=True,
        )
