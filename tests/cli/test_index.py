"""`crossprobe index ...`: the command line's options reach the settings the jobs run with."""
from __future__ import annotations

from typer.testing import CliRunner

from crossprobe.cli import index as cli
from crossprobe.storage.redis_conn import close_embedded


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


def test_the_model_option_is_a_spec_and_a_flag_replaces_the_environments_model(tmp_path, monkeypatch):
    """--model (and --ckpt, its older form) are encode options: IndexerSettings.model / ckpt, whose model_spec the job
    runs. A flag names the model alone (CROSSPROBE_MODEL / CROSSPROBE_CKPT set in the environment do not join it);
    the variables by themselves must agree; a spec that cannot name a model is a usage error (exit 2), at once."""
    from crossprobe.core.inference.spec import ModelSpec

    monkeypatch.setenv("CROSSPROBE_CKPT", str(tmp_path / "old"))
    s = cli._settings(**cli.encode_settings(model="hf:/models/clip"))
    assert (s.model, s.ckpt, s.model_spec) == ("hf:/models/clip", None, ModelSpec("hf", "/models/clip"))
    s = cli._settings(**cli.encode_settings(ckpt=tmp_path / "new"))
    assert s.model_spec == ModelSpec("crossprobe", str(tmp_path / "new"))
    assert cli._settings().model_spec == ModelSpec("crossprobe", str(tmp_path / "old"))  # no flag: the variable
    monkeypatch.setenv("CROSSPROBE_MODEL", "hf:/models/clip")
    r = CliRunner().invoke(cli.index_app, ["list", "--root", str(tmp_path)])  # the two variables disagree
    assert r.exit_code == 2 and "name different models" in r.output, r.output
    monkeypatch.delenv("CROSSPROBE_MODEL")
    monkeypatch.delenv("CROSSPROBE_CKPT")
    for cmd in (["build", "--name", "x", "--images", str(tmp_path)], ["reindex", "x"], ["add", "--name", "x"]):
        r = CliRunner().invoke(cli.index_app, [*cmd, "--model", "clip:ViT-B-32", "--root", str(tmp_path)])
        assert r.exit_code == 2 and "unknown family 'clip'" in r.output, (cmd, r.output)
    r = CliRunner().invoke(cli.index_app, ["reindex", "x", "--model", "hf:/m", "--ckpt", str(tmp_path),
                                           "--root", str(tmp_path)])
    assert r.exit_code == 2 and "name different models" in r.output, r.output
