"""`crossprobe index backup` / `crossprobe index restore`: their messages and exit codes (0 done, 1 failed with one
line saying why, 2 bad usage; never a traceback), through the `crossprobe` app as installed (cli/__init__.py
registers them on `index`), against real Redis servers; and a restore into the embedded Redis of an empty root,
whose snapshot holds the restored values when the next process starts."""
from __future__ import annotations

import re

from typer.testing import CliRunner

from crossprobe.cli import app
from crossprobe.indexer import build, open_index
from crossprobe.storage.redis_conn import close_embedded, connect
from crossprobe.storage.settings import StorageSettings
from crossprobe.storage.store import Store
from tests.indexer.conftest import ckpt, make_images, models_dir, redis_server, redis_url, settings  # noqa: F401
from tests.storage.test_backup import empty  # noqa: F401 (a second, empty stack)

quiet = dict(log=lambda *_: None)


def run(s, *args: str, env: dict | None = None):
    base = {"CROSSPROBE_INDEX_PROGRESS": "false"}
    if s is not None:
        base |= {"REDIS_URL": s.redis_url, "CROSSPROBE_INDEX_ROOT": str(s.index_root)}
    r = CliRunner().invoke(app, ["index", *args], env={**base, **(env or {})})
    assert "Traceback" not in r.output and not (r.exception and not isinstance(r.exception, SystemExit)), r.output
    return r


def test_backup_and_restore_say_what_they_did_and_refuse_clearly(settings, empty, ckpt, bert, tmp_path):  # noqa: F811
    gallery = tmp_path / "g"
    make_images(gallery, 6)
    version = build("photos", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet).version
    build("other", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet)
    archive = tmp_path / "photos.tar"

    r = run(settings, "backup", "photos", "--to", str(archive))
    assert r.exit_code == 0, r.output
    assert re.fullmatch(rf"backed up photos/{version}: 6 items, \d+ files -> {re.escape(str(archive))} "
                        r"\(\d+\.\d MB\) in \d+\.\ds\n", r.output), r.output
    r = run(settings, "backup", "--all", "--to", str(tmp_path / "all"))
    assert r.exit_code == 0 and r.output.count("backed up ") == 2, r.output
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["other.tar", "photos.tar"]

    # bad usage: 2, with the way out
    for args, said in [(["backup", "--to", str(archive)], "give index names or --all"),
                       (["backup", "photos"], "--to FILE"),
                       (["backup", "no/such", "--to", str(archive)], "index name 'no/such'"),
                       (["backup", "photos", "other", "--to", str(archive)], "--to is a folder"),
                       (["restore", str(archive), str(archive), "--name", "x"], "--name takes one archive")]:
        r = run(settings, *args)
        assert r.exit_code == 2 and said in r.output, (args, r.output)
    # failures: 1, one line
    r = run(settings, "backup", "nosuch", "--to", str(tmp_path / "n.tar"))
    assert r.exit_code == 1 and "error: index 'nosuch' has no active version" in r.output, r.output
    r = run(settings, "backup", "photos", "--to", str(tmp_path / "missing" / "p.tar"))
    assert r.exit_code == 1 and "does not exist: make it first" in r.output, r.output
    r = run(settings, "backup", "photos", "--to", str(tmp_path / "x.tar"), env={"REDIS_URL": f"unix://{tmp_path}/no.sock"})
    assert r.exit_code == 1 and "error: " in r.output and "backup failed for photos" in r.output, r.output

    # into the empty stack
    r = run(empty, "restore", str(archive))
    assert r.exit_code == 0, r.output
    assert re.fullmatch(rf"restored photos/{version}: 6 items, \d+ files in \d+\.\ds, now active\n", r.output), r.output
    assert Store(empty, connect(empty)).active("photos") == version
    assert open_index("photos", None, empty).ids == open_index("photos", None, settings).ids
    r = run(empty, "restore", str(archive))
    assert r.exit_code == 1 and f"photos/{version} is already the active version" in r.output, r.output
    assert "nothing was restored" in r.output and len(r.output.strip().splitlines()) == 2  # the error, the summary
    r = run(empty, "restore", str(archive), "--name", "copy", "--no-activate")
    assert r.exit_code == 0 and f"restored copy/{version} (from photos)" in r.output and "not activated" in r.output
    assert Store(empty, connect(empty)).active("copy") is None
    cut = tmp_path / "cut.tar"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    r = run(empty, "restore", str(cut))
    assert r.exit_code == 1 and f"error: {cut} is not a whole crossprobe backup" in r.output, r.output
    r = run(empty, "restore", str(tmp_path / "none.tar"))
    assert r.exit_code == 1 and "error: no archive at" in r.output, r.output


def test_a_restore_into_the_embedded_redis_is_on_its_disk(settings, ckpt, bert, tmp_path, monkeypatch):  # noqa: F811
    """REDIS_URL unset: the root's embedded Redis. The restore writes its snapshot, so the restored version is
    there when the next process starts that Redis again from <root>/redis.db."""
    gallery = tmp_path / "g"
    make_images(gallery, 4)
    version = build("photos", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet).version
    archive = tmp_path / "photos.tar"
    assert run(settings, "backup", "photos", "--to", str(archive)).exit_code == 0
    for var in ("REDIS_URL", "CROSSPROBE_INDEX_ROOT", "CROSSPROBE_INDEX_EMBEDDED_DB"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "fresh"
    try:
        r = run(None, "restore", str(archive), "--root", str(root))
        assert r.exit_code == 0 and f"embedded Redis snapshot {root / 'redis.db'} written" in r.output, r.output
    finally:
        close_embedded()
    s = StorageSettings(index_root=root)
    try:
        assert Store(s, connect(s)).active("photos") == version  # a new embedded server, from the snapshot
        assert len(open_index("photos", None, s)) == 4
    finally:
        close_embedded()
