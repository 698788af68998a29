"""add / delete derive a new version and switch once: FAISS and Redis always hold the same ids;
gc removes the old versions' keys and directories; the CLI drives all of it."""
import json

import numpy as np
from typer.testing import CliRunner

from crossprobe.cli import app
from crossprobe.indexer import add, build, delete, open_index
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images


def _redis_ids(rd) -> tuple[set[str], set[str]]:
    """Item ids that have a feature value / a metadata value in the reader's version."""
    ids = {"f": set(), "m": set()}
    for k in rd.store.r.scan_iter(match=rd.keys.base + "*", count=1000):
        kind, item = rd.keys.parse(k)
        ids[kind].add(item)
    return ids["f"], ids["m"]


def _consistent(rd) -> set[str]:
    f, m = _redis_ids(rd)
    assert set(rd.ids) == f == m and len(rd.ids) == len(set(rd.ids)) == rd.index.ntotal
    vec = np.load(rd.store.version_dir(rd.name, rd.version) / "vectors.npy")
    assert np.array_equal(rd.index.reconstruct_n(0, rd.index.ntotal), vec)
    return set(rd.ids)


def test_add_delete_gc_keep_faiss_and_redis_consistent(settings, gallery, ckpt, bert, tmp_path):
    quiet = dict(log=lambda *_: None)
    v1 = build("inc", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet).version
    r1 = open_index("inc", None, settings)
    ids1 = _consistent(r1)

    new = tmp_path / "new"
    paths = make_images(new, 4, seed=3, prefix="new")
    lines = [{"id": f"new/{p.name}", "uri": str(p), "caption": "a new one"} for p in paths]
    lines.append({"id": "img_000.jpg", "uri": str(paths[0])})  # replaces an existing item
    (tmp_path / "add.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    res = add("inc", manifest=tmp_path / "add.jsonl", settings=settings, ckpt=ckpt, bert=bert, **quiet)
    assert res.extra["base"] == v1 and res.count == 16
    r2 = open_index("inc", None, settings)
    assert r2.version == res.version != v1
    assert _consistent(r2) == ids1 | {f"new/{p.name}" for p in paths}
    # the replaced item now carries the new file's vector, features and metadata (same file, another
    # position in the batch: equal up to float rounding)
    v2 = np.load(r2.store.version_dir("inc", r2.version) / "vectors.npy")
    row = {i: n for n, i in enumerate(r2.ids)}
    assert np.allclose(v2[row["img_000.jpg"]], v2[row["new/new_000.jpg"]], atol=1e-5)
    assert r2.metadata(["img_000.jpg"])[0]["uri"] == str(paths[0])
    assert np.allclose(r2.features(["img_000.jpg"])["p_v"], r2.features(["new/new_000.jpg"])["p_v"], atol=2e-3)
    # untouched items: values copied from v1 byte for byte
    st = r2.store
    assert st.r.get(st.feat_key("inc", v1, "img_003.bmp")) == st.r.get(st.feat_key("inc", r2.version, "img_003.bmp"))

    res = delete("inc", ["img_003.bmp", "new/new_001.gif", "not-there"], settings=settings, **quiet)
    assert res.extra["deleted"] == 2 and res.extra["not_found"] == ["not-there"]
    r3 = open_index("inc", None, settings)
    ids3 = _consistent(r3)
    assert ids3 == _consistent(r2) - {"img_003.bmp", "new/new_001.gif"} and len(ids3) == 14
    hits, _ = r3.search(np.load(st.version_dir("inc", r2.version) / "vectors.npy")[[row["img_003.bmp"]]], 14)
    assert "img_003.bmp" not in hits[0]

    removed = dict(Store(settings, st.r).gc("inc"))
    assert set(removed) == {v1, r2.version}
    assert not _redis_ids(r1)[0] and not _redis_ids(r2)[0]  # old versions' keys are gone
    assert not st.version_dir("inc", v1).exists() and st.version_dir("inc", r3.version).exists()
    assert [v.version for v in Store(settings, st.r).versions("inc")] == [r3.version]
    _consistent(open_index("inc", None, settings))


def test_cli_list_activate_delete_gc(settings, env, gallery, ckpt, bert):
    quiet = dict(log=lambda *_: None)
    v1 = build("cli", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet).version
    runner = CliRunner()
    out = runner.invoke(app, ["index", "delete", "--name", "cli", "--ids", "img_000.jpg,img_002.webp"], env=env)
    assert out.exit_code == 0, out.output
    st = Store(settings, open_index("cli", None, settings).store.r)
    v2 = st.active("cli")
    assert v2 != v1 and len(open_index("cli", None, settings)) == 10
    out = runner.invoke(app, ["index", "list", "cli"], env=env)
    assert out.exit_code == 0 and v1 in out.output and "active" in out.output and "complete" in out.output
    assert all(" words " in line for line in out.output.splitlines() if line.strip())  # keyword index, no OCR
    out = runner.invoke(app, ["index", "activate", "cli", v1], env=env)  # roll back: one SET
    assert out.exit_code == 0 and st.active("cli") == v1 and len(open_index("cli", None, settings)) == 12
    out = runner.invoke(app, ["index", "gc", "cli"], env=env)
    assert out.exit_code == 0 and "1 version(s) removed" in out.output
    out = runner.invoke(app, ["index", "activate", "cli", v2], env=env)
    assert out.exit_code == 1 and "not a complete version" in out.output
    out = runner.invoke(app, ["index", "add", "--name", "nope", "--images", "x"], env=env)
    assert out.exit_code == 1 and "no active version" in out.output
