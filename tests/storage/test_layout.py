"""storage/layout.py's format rule: a release reads every format up to its own and refuses a later one, naming
the release that wrote it; the jobs record both in every manifest."""
from __future__ import annotations

import json

import pytest

from crossprobe.core import release
from crossprobe.indexer import build
from crossprobe.storage import layout
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store


def test_formats_up_to_this_releases_are_read_and_a_missing_one_is_format_1():
    layout.check_format({"name": "photos", "version": "v1"})  # crossprobe 0.1.0 wrote no format: 1
    for fmt in range(1, layout.FORMAT + 1):
        layout.check_format({"format": fmt})


@pytest.mark.parametrize("fmt", [layout.FORMAT + 1, 0, "two", None])
def test_a_later_or_unknown_format_is_refused_naming_its_writer_and_what_to_do(fmt):
    m = {"format": fmt, "crossprobe": "9.1.0", "name": "photos", "version": "v20300101T000000000000"}
    with pytest.raises(layout.UnsupportedFormat) as e:
        layout.check_format(m)
    msg = str(e.value)
    assert f"storage format {fmt!r}, written by crossprobe 9.1.0" in msg
    assert f"crossprobe {release.version()} reads formats 1 to {layout.FORMAT}" in msg
    assert "pip install --upgrade crossprobe" in msg and "crossprobe index list photos" in msg


def test_a_manifest_records_its_format_and_the_release_that_wrote_it(settings, gallery, ckpt):
    """pyproject.toml's version, as installed, is what the manifest names (make venv reinstalls on a change)."""
    import tomllib
    from pathlib import Path

    res = build("photos", images=gallery, settings=settings, ckpt=ckpt, log=lambda *_: None)
    m = Store(settings, connect(settings)).read_manifest("photos", res.version)
    assert m is not None and m["format"] == layout.FORMAT
    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["version"]
    assert m["crossprobe"] == release.version() == declared


def test_activate_refuses_a_later_releases_version(settings, gallery, ckpt):
    store = Store(settings, connect(settings))
    first = build("photos", images=gallery, settings=settings, ckpt=ckpt, log=lambda *_: None).version
    later = build("photos", images=gallery, settings=settings, ckpt=ckpt, log=lambda *_: None).version
    path = store.version_dir("photos", later) / layout.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": layout.FORMAT + 1, "crossprobe": "9.1.0"}))
    store.activate("photos", first)
    with pytest.raises(layout.UnsupportedFormat, match="written by crossprobe 9.1.0"):
        store.activate("photos", later)
    assert store.active("photos") == first
