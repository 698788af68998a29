"""`crossprobe index backup` / `crossprobe index restore` (storage/backup.py): the active version of an index, its
files and its Redis values, as one archive file; and back, into the same stack or an empty one.

The commands sit on `crossprobe index` (cli/index.py's index_app: cli/__init__.py imports this module to register
them). Exit status: 0 done, 1 failed (the reason in one line, never a traceback), 2 bad usage. Progress bars unless
CROSSPROBE_INDEX_PROGRESS=false, as for the other index commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from crossprobe.cli.index import Root, _fail, _settings, index_app


def _store(root: Path | None):
    from crossprobe.storage.redis_conn import connect
    from crossprobe.storage.store import Store

    settings = _settings(index_root=root)
    return Store(settings, connect(settings)), settings.progress


@index_app.command("backup")
def backup_cmd(
    names: Annotated[Optional[list[str]], typer.Argument(help="the index(es) to back up", show_default=False)] = None,
    to: Annotated[
        Optional[Path],
        typer.Option(
            "--to",
            help="the archive file to write (one index); with --all or several names a folder, one <name>.tar each",
        ),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every index under the root that has an active version")] = False,
    lock_timeout: Annotated[
        float, typer.Option(min=0, help="seconds to wait for a version a job or gc holds at that moment")
    ] = 60.0,
    root: Root = None,
):
    """Write the ACTIVE version of NAME (its folder: FAISS index, ids, vectors, keyword index, report, manifest;
    and its Redis values) into one archive, consistent even while `index watch` or a job runs: the version is held
    for the copy, so gc cannot remove it. FAISS versions only (a Milvus collection is Milvus's to back up)."""
    from redis.exceptions import RedisError

    from crossprobe.storage.backup import BackupError, backup
    from crossprobe.storage.store import check_name

    if bool(names) == all_:
        _fail("give index names or --all (not both)", 2)
    if to is None:
        _fail("give the archive to write: --to FILE (a folder with --all or several names)", 2)
    try:
        store, progress = _store(root)
        if all_:
            names = [n for n in store.names() if store.active(n)]
            if not names:
                _fail(f"no index with an active version under {store.root.resolve()}", 1)
        assert names is not None
        for n in names:
            check_name(n)
    except ValueError as e:
        _fail(e, 2)
    except RedisError as e:
        _fail(f"cannot reach Redis: {e}")
    several = all_ or len(names) > 1
    if several:
        if to.exists() and not to.is_dir():
            _fail(f"--to {to}: with --all or several names, --to is a folder (one <name>.tar each)", 2)
        to.mkdir(parents=True, exist_ok=True)
    failed = []
    for n in names:
        dest = to / f"{n}.tar" if several else to
        try:
            typer.echo(backup(store, n, dest, progress=progress, lock_timeout_s=lock_timeout).line())
        except (BackupError, ValueError, OSError, RedisError) as e:
            typer.echo(f"error: {e}", err=True)
            failed.append(n)
    if failed:
        _fail(f"backup failed for {', '.join(failed)} ({len(names) - len(failed)} of {len(names)} done)")


@index_app.command("restore")
def restore_cmd(
    archives: Annotated[
        list[Path], typer.Argument(help="archive(s) written by `crossprobe index backup`", show_default=False)
    ],
    name: Annotated[
        Optional[str], typer.Option(help="restore as this index (default: the name it was backed up from)")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="replace an inactive version of the same name already there")
    ] = False,
    activate: Annotated[
        bool, typer.Option("--activate/--no-activate", help="make the restored version the active one (default)")
    ] = True,
    root: Root = None,
):
    """Restore archives into this stack (the index root and Redis the settings name; an empty one is fine). Every
    checksum is checked before anything is written; the version is written whole, then made active with one SET:
    a service sees the version before or the restored one, never half. The index's other versions stay until
    `crossprobe index gc`."""
    from redis.exceptions import RedisError

    from crossprobe.storage.backup import BackupError, restore

    if name is not None and len(archives) > 1:
        _fail("--name takes one archive", 2)
    try:
        store, progress = _store(root)
    except RedisError as e:
        _fail(f"cannot reach Redis: {e}")
    failed = []
    for a in archives:
        try:
            typer.echo(restore(store, a, name, force=force, activate=activate, progress=progress).line())
        except (BackupError, ValueError, OSError, RedisError) as e:
            typer.echo(f"error: {e}", err=True)
            failed.append(str(a))
    if len(failed) < len(archives):
        _save(store)
    if failed:
        _fail(f"restore failed for {', '.join(failed)} ({len(archives) - len(failed)} of {len(archives)} done)")


def _save(store) -> None:
    """The embedded Redis (REDIS_URL unset) keeps its data in <root>/redis.db: write it now, so the restored values
    are on the disk, not only in memory until its next save. An external Redis persists by its own settings."""
    from redis.exceptions import RedisError

    try:
        if store.snapshot_embedded():
            typer.echo(f"embedded Redis snapshot {store.settings.rdb} written")
    except (RedisError, TimeoutError) as e:
        typer.echo(
            f"warning: the embedded Redis snapshot was not written ({e}); it is written at its next save", err=True
        )
