"""`crossprobe index ...`: the command line's options reach the settings the jobs run with."""
from __future__ import annotations

from typer.testing import CliRunner

from crossprobe.indexer.jobs import cli
from crossprobe.indexer.storage.redis_conn import close_embedded


def test_root_option_moves_the_index_root(tmp_path, monkeypatch):
    """--root is IndexerSettings.index_root: the embedded Redis and the versions live under it (an option the
    settings did not know would be dropped silently)."""
    for var in ("REDIS_URL", "CROSSPROBE_INDEX_ROOT", "CROSSPROBE_INDEX_EMBEDDED_DB"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "elsewhere"
    try:
        r = CliRunner().invoke(cli.index_app, ["list", "--root", str(root)])
        assert r.exit_code == 0, r.output
    finally:
        close_embedded()
    assert (root / "redis.db").exists() and not (tmp_path / "indexes").exists()
    assert cli._settings(index_root=root).index_root == root
