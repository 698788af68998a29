"""A version's data reaches the disk before the manifest that marks it complete, and one job writes an index at a
time (indexer/jobs/finalize.py, run.py; storage/store.py job_lock; issue 55, item 6)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from crossprobe.indexer import add, build
from crossprobe.storage import layout
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store


def test_every_data_file_and_its_folder_are_synced_before_the_manifest(settings, gallery, ckpt, bert, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    v = build("dur", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None).version
    vdir = Path(settings.index_root) / "dur" / v
    first_manifest = next(i for i, p in enumerate(synced) if Path(p).name.startswith(f".{layout.MANIFEST}"))
    before = set(synced[:first_manifest])
    data = [p for p in vdir.rglob("*") if p.is_file() and p.name not in (layout.MANIFEST, ".lock")]
    assert {layout.FAISS_INDEX, layout.VECTORS, layout.IDS, layout.REPORT} <= {p.name for p in data}
    missing = [str(p) for p in data if str(p.resolve()) not in before]
    assert not missing, missing
    folders = {str(vdir.resolve())} | {str(p.resolve()) for p in vdir.rglob("*") if p.is_dir()}
    assert folders <= before  # the folders too: the names of the files, not only their bytes
    assert str(vdir.resolve()) in synced[first_manifest:]  # and the manifest's own name after its rename


def test_a_second_job_on_an_index_is_refused_naming_the_one_holding_it(settings, gallery, ckpt, bert, tmp_path):
    build("one", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
    st = Store(settings, connect(settings))
    before = {i.version for i in st.versions("one")}
    with st.job_lock("one", "crossprobe index reindex"):
        with pytest.raises(RuntimeError, match=r"being written by another job \(crossprobe index reindex, pid \d+"):
            build("one", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
        with pytest.raises(RuntimeError, match="another job"):
            add("one", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
    assert {i.version for i in st.versions("one")} == before  # nothing written meanwhile
    build("two", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)  # other indexes: free
