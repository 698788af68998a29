"""Version names read from Redis never become paths out of the index root (storage/store.py; issue 55): a poisoned
versions set or active key is ignored with a warning, and gc and drop leave a folder outside the root alone."""
from __future__ import annotations

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
