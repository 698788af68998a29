"""SIGKILL a real `crossprobe index build` process mid-build; the same command again
finishes it without recomputing committed batches, identical to an uninterrupted build."""
import random
import signal
import subprocess
import sys
import time

import numpy as np

from crossprobe.indexer import build, open_index
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images, without_added


def _values(rd):
    st = rd.store
    keys = [k for i in rd.ids for k in (st.feat_key(rd.name, rd.version, i), st.meta_key(rd.name, rd.version, i))]
    return dict(zip(keys, (without_added(v) for v in st.r.mget(keys))))  # "added": each run's own time


def _version_keys(store: Store, name: str, version: str) -> list[bytes]:
    return list(store.r.scan_iter(match=store.key_base(name, version) + "*", count=1000))


def test_kill_and_resume_gives_the_uninterrupted_result(settings, env, tmp_path, ckpt, bert):
    images = tmp_path / "imgs"
    make_images(images, 26)  # + broken.jpg: 27 files, 7 batches of 4
    (images / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")  # a skip inside a batch survives the resume too
    build("ref", images=images, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)  # also exports the head graph

    cmd = [sys.executable, "-m", "crossprobe.cli", "index", "build", "--name", "k", "--images", str(images),
           "--ckpt", str(ckpt), "--throttle", "0.1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    root = settings.index_root / "k"
    deadline = time.time() + 60
    while time.time() < deadline and not list(root.glob("v*/build/batches/*.npz")):
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.005)
    # then a random moment: decoding, encoding, mid-pipeline, mid-commit or asleep. Six batches
    # with >= 0.1 s of throttle each are still to go, so it cannot have finished yet.
    time.sleep(random.uniform(0, 0.35))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (vdir,) = root.glob("v*")
    assert not (vdir / "manifest.json").exists(), "the build finished before it could be killed"
    committed = len(list((vdir / "build" / "batches").glob("*.npz")))
    assert committed >= 1
    store = Store(settings, connect(settings))
    assert store.active("k") is None  # nothing half-built is ever live

    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"resuming build of 'k' as version {vdir.name}" in out.stdout
    assert f"{committed} batches reused" in out.stdout  # committed batches were not recomputed
    assert not (vdir / "build").exists()  # journal removed once active

    a, b = open_index("ref", None, settings), open_index("k", None, settings)
    assert b.version == vdir.name and store.active("k") == vdir.name
    assert a.ids == b.ids and len(set(b.ids)) == len(b.ids) == 26  # exactly one entry per item, same order
    va, vb = np.load(a.store.version_dir("ref", a.version) / "vectors.npy"), np.load(vdir / "vectors.npy")
    assert np.array_equal(va, vb)
    assert np.array_equal(b.index.reconstruct_n(0, len(b.ids)), vb)
    vals_a, vals_b = _values(a), _values(b)
    assert list(vals_a.values()) == list(vals_b.values())  # byte-identical features and metadata
    assert len(_version_keys(store, "k", b.version)) == 2 * 26  # no stray keys: one feature + one metadata per item
    assert b.manifest["skipped"] == {"not_image": 1}


def test_crash_between_finish_and_activation(settings, gallery, ckpt, bert, monkeypatch):
    """The other window: everything written, `active` not yet flipped. The rerun only activates."""
    def die(*a, **k):
        raise KeyboardInterrupt  # stands in for the kill: nothing after this point runs

    with monkeypatch.context() as m:
        m.setattr(Store, "activate", die)
        try:
            build("late", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
        except KeyboardInterrupt:
            pass
    store = Store(settings, connect(settings))
    (vdir,) = (settings.index_root / "late").glob("v*")
    assert (vdir / "manifest.json").exists() and store.active("late") is None
    res = build("late", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
    assert res.version == vdir.name and res.encoded == 0 and res.count == 12
    assert store.active("late") == vdir.name and not (vdir / "build").exists()
