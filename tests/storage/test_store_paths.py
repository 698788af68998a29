"""Version names read from Redis never become paths out of the index root (storage/store.py; issue 55): a poisoned
versions set or active key is ignored with a warning, and gc and drop leave a folder outside the root alone."""
from __future__ import annotations

import os

import pytest

from crossprobe.indexer import build
from crossprobe.storage.store import Store, check_version


@pytest.mark.parametrize("bad", ["../../outside", "v1/../../outside", "..", ".", "v", "/etc", "x20261202", ""])
def test_a_version_name_is_never_a_path(bad):
    with pytest.raises(ValueError):
        check_version(bad)


def test_poisoned_versions_survive_gc_and_drop(settings, gallery, ckpt, bert, tmp_path, caplog):
    outside = settings.index_root.parent / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    v = build("pz", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None).version
    from crossprobe.storage.redis_conn import connect

    st = Store(settings, connect(settings))
    rel = "../../outside"  # from <root>/pz/ that is <root>/../outside
    st.r.sadd(st.versions_key("pz"), rel, "../outside", "v1/../../../outside")
    assert [i.version for i in st.versions("pz")] == [v]
    assert "not version names" in caplog.text
    with pytest.raises(ValueError):
        st.version_dir("pz", rel)
    st.gc("pz")
    assert (outside / "precious.txt").read_text() == "keep me"
    st.r.set(st.active_key("pz"), "../../outside")  # a poisoned active key: no version is active
    assert st.active("pz") is None
    st.r.set(st.active_key("pz"), v)
    st.drop_index("pz")
    assert (outside / "precious.txt").read_text() == "keep me"
    assert not (settings.index_root / "pz").exists()


def test_image_roots_and_within_roots(tmp_path):
    from crossprobe.storage.store import image_roots, within_roots

    lib, other = tmp_path / "lib", tmp_path / "lib-other"
    (lib / "sub").mkdir(parents=True)
    other.mkdir()
    (lib / "a.jpg").write_bytes(b"x")
    (other / "b.jpg").write_bytes(b"x")
    os.symlink(other / "b.jpg", lib / "sub" / "link.jpg")
    roots = [str(lib)]
    assert within_roots(str(lib / "a.jpg"), roots) and within_roots(str(lib / "sub" / ".." / "a.jpg"), roots)
    assert not within_roots(str(other / "b.jpg"), roots)  # a sibling whose name starts like the root's
    assert not within_roots(str(lib / "sub" / "link.jpg"), roots)  # a link made in the folder, leading out
    assert not within_roots(str(lib / ".." / "lib-other" / "b.jpg"), roots)
    assert image_roots({"image_roots": ["/x"]}) == ["/x"]
    assert image_roots({"source": {"images": str(lib)}}) == [str(lib)]  # a version from before image_roots
    assert image_roots({"source": {"manifest": "/m.jsonl"}}) is None and within_roots("/etc/passwd", None)


def test_a_build_records_its_image_roots(settings, gallery, ckpt, bert, tmp_path):
    """A folder build: the folder; a manifest whose files lie in two places: both, resolved."""
    import json

    from crossprobe.indexer.jobs.sources import Item, image_roots as roots_of

    v = build("roots", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None).version
    from crossprobe.storage.redis_conn import connect

    m = Store(settings, connect(settings)).read_manifest("roots", v)
    assert m["image_roots"] == [os.path.realpath(gallery)]
    items = [Item("a", str(tmp_path / "x" / "1.jpg")), Item("b", str(tmp_path / "x" / "y" / "2.jpg")),
             Item("c", str(tmp_path / "z" / "3.jpg"))]
    assert roots_of(items, {"manifest": "m.jsonl"}) == [str(tmp_path / "x"), str(tmp_path / "z")]
    assert roots_of(items[:1], {"images": str(tmp_path / "x")}, base=[str(tmp_path / "z")]) == [
        str(tmp_path / "x"), str(tmp_path / "z")]
    json.dumps(m)
