"""The Ray Data engine (indexer/jobs/ray_engine.py) in Ray local mode on a tiny folder: the same version as the
single-process build (ids and their order, vectors, Redis values byte for byte, skips by reason), a reindex
too, and a `crossprobe index build --engine ray` SIGKILLed mid-run resumes to that same result.

One local Ray instance serves the in-process tests of this module (started once, shut down at the end); the
CLI runs start their own, as a real job does, and a killed one must take its Ray processes with it.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from crossprobe.indexer import add, build, open_index, reindex
from crossprobe.indexer.jobs import ray_engine
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images, without_added

ray = pytest.importorskip("ray")

QUIET = {"log": lambda *_: None}


@pytest.fixture(scope="module")
def ray_tmp():
    # Ray's unix sockets live under its temp dir: a pytest tmp path would pass the 107-byte socket path limit
    d = tempfile.mkdtemp(prefix="cpray", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def local_ray(ray_tmp):
    """One local Ray instance (2 CPUs) for the module, as ray_engine.start makes it."""
    assert not ray.is_initialized()
    assert ray_engine.start(IndexerSettings(ray_num_cpus=2, ray_temp_dir=ray_tmp, ray_address=None))
    yield
    ray.shutdown()


def _values(rd) -> list[bytes]:
    st = rd.store
    keys = [k for i in rd.ids for k in (st.feat_key(rd.name, rd.version, i), st.meta_key(rd.name, rd.version, i))]
    return [without_added(v) for v in st.r.mget(keys)]  # "added": each run's own time


def _assert_same_version(settings: IndexerSettings, a_name: str, b_name: str) -> None:
    """b is a's equal: ids in the same order, the same vectors (here bit for bit: same batches, same ORT
    threads), FAISS rows, Redis feature and metadata values byte for byte, skips, and no stray key."""
    a, b = open_index(a_name, None, settings), open_index(b_name, None, settings)
    assert a.ids == b.ids and len(set(b.ids)) == len(b.ids)
    va = np.load(a.store.version_dir(a_name, a.version) / "vectors.npy")
    vb = np.load(b.store.version_dir(b_name, b.version) / "vectors.npy")
    assert va.shape == vb.shape and np.allclose(va, vb, atol=1e-6)
    assert np.array_equal(va, vb)
    assert np.array_equal(b.index.reconstruct_n(0, len(b.ids)), vb)
    assert _values(a) == _values(b)
    assert a.manifest["skipped"] == b.manifest["skipped"]
    assert a.manifest["fingerprint"] == b.manifest["fingerprint"] and a.manifest["layout"] == b.manifest["layout"]
    st = b.store
    assert len(list(st.r.scan_iter(match=st.key_base(b_name, b.version) + "*", count=1000))) == 2 * len(b.ids)


@pytest.fixture()
def folder(tmp_path) -> Path:
    """13 good images in mixed formats (4 batches of 4) + one of each kind of bad file."""
    f = tmp_path / "imgs"
    make_images(f, 13)
    (f / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    (f / "empty.png").write_bytes(b"")
    return f


def test_ray_build_equals_the_single_process_build(local_ray, settings, folder, ckpt, bert):
    one = build("one", images=folder, settings=settings, ckpt=ckpt, bert=bert, **QUIET)
    said = []
    res = build("ray", images=folder, settings=settings.model_copy(update={"engine": "ray"}), ckpt=ckpt, bert=bert,
                log=said.append)
    assert any(line.startswith("engine ray: local Ray, 4 batches, 1 decode tasks, 1 encoder actor(s) (1 CPU and 2 ONNX")
               for line in said), said
    assert res.count == one.count == 13 and res.encoded == 13
    # bad files: counted and reported exactly as the single-process engine does
    assert res.skipped == one.skipped == {"not_image": 1, "empty": 1}
    assert {"ray_start", "ray_wait", "decode", "backbone", "head", "write_redis", "commit", "write_faiss"} <= set(res.stages_s)
    rep_one, rep_ray = (Store(settings, connect(settings)).version_dir(n, r.version) / "report.json"
                        for n, r in (("one", one), ("ray", res)))
    import json

    sk_one, sk_ray = json.loads(rep_one.read_text())["skipped"], json.loads(rep_ray.read_text())["skipped"]
    assert sk_one == sk_ray and {s["id"] for s in sk_ray} == {"broken.jpg", "empty.png"}
    _assert_same_version(settings, "one", "ray")
    assert ray.is_initialized()  # the module's instance: the engine used it and left it running


def test_ray_build_reads_the_words_the_single_process_build_reads(local_ray, settings, folder, ckpt, bert):
    # OCR runs in the encoder actor, on the grid it computes (the text gate): the same words in the metadata
    from tests.indexer.jobs.test_ocr import sign

    sign(folder / "shop.jpg", "PHARMACY")
    on = settings.model_copy(update={"ocr": True})
    build("one", images=folder, settings=on, ckpt=ckpt, bert=bert, **QUIET)
    build("ray", images=folder, settings=on.model_copy(update={"engine": "ray"}), ckpt=ckpt, bert=bert, **QUIET)
    metas = {}
    for name in ("one", "ray"):
        rd = open_index(name, None, settings)
        metas[name] = dict(zip(rd.ids, rd.metadata(rd.ids)))
    assert "PHARMACY" in metas["ray"]["shop.jpg"]["text"].upper()
    assert {i: m.get("text") for i, m in metas["ray"].items()} == {i: m.get("text") for i, m in metas["one"].items()}


def test_ray_reindex_equals_the_single_process_reindex(local_ray, settings, folder, ckpt, bert):
    """Two equal indexes, one reindexed in this process and one on Ray: the same new versions."""
    for name in ("a", "b"):
        build(name, images=folder, settings=settings, ckpt=ckpt, bert=bert, **QUIET)
    one = reindex("a", settings=settings, ckpt=ckpt, bert=bert, **QUIET)
    res = reindex("b", settings=settings.model_copy(update={"engine": "ray"}), ckpt=ckpt, bert=bert, **QUIET)
    assert res.kind == "reindex" and res.count == one.count == 13 and res.encoded == 13
    assert res.extra["lost"] == one.extra["lost"] == 0 and res.extra["base"] != res.version
    assert open_index("b", None, settings).version == res.version  # activated
    _assert_same_version(settings, "a", "b")


def test_ray_add_equals_the_single_process_add(local_ray, settings, folder, ckpt, bert, tmp_path):
    """`add` encodes too: new items (one replacing an old id, one bad file) on Ray equal the same add here."""
    more = tmp_path / "more"
    make_images(more, 6, seed=7)  # ids img_000.jpg ... overlap the folder's: replaced when they decode
    (more / "bad.png").write_bytes(b"\x89PNG not really")
    for name in ("a", "b"):
        build(name, images=folder, settings=settings, ckpt=ckpt, bert=bert, **QUIET)
    one = add("a", images=more, settings=settings, ckpt=ckpt, bert=bert, **QUIET)
    res = add("b", images=more, settings=settings.model_copy(update={"engine": "ray"}), ckpt=ckpt, bert=bert, **QUIET)
    assert res.kind == "add" and res.encoded == one.encoded == 6 and res.skipped == one.skipped == {"not_image": 1}
    assert res.extra["replaced"] == one.extra["replaced"] > 0
    _assert_same_version(settings, "a", "b")


def test_plan_resources_fits_the_cluster():
    """Actors and decode tasks from the cluster's resources; never more than it has (a pool that cannot be
    placed would wait for ever)."""
    s = IndexerSettings(threads=None, ray_actors=None, workers=1)
    plan = ray_engine.plan_resources
    assert plan(s, {"CPU": 2.0}) == {"decoders": 1, "decode_cpus": 1.0, "actors": 1, "num_gpus": 0, "num_cpus": 1.0,
                                     "threads": 2}  # ORT threads: the actor's share of all CPUs (decode is light)
    assert plan(s.model_copy(update={"threads": 1}), {"CPU": 2.0})["threads"] == 1  # as set
    two = plan(s.model_copy(update={"ray_actors": 2}), {"CPU": 2.0})  # 2 actors on the 1 CPU left: half each
    assert two["actors"] == 2 and two["num_cpus"] == 0.5 and two["threads"] == 1
    one = plan(s, {"CPU": 1.0})
    assert one["decode_cpus"] + one["actors"] * one["num_cpus"] <= 1.0 and one["actors"] == 1
    big = plan(s, {"CPU": 16.0})
    assert big["decoders"] == 4 and big["actors"] == 12 and big["num_cpus"] == 1.0 and big["threads"] == 1
    gpu = plan(s, {"CPU": 32.0, "GPU": 4.0})
    assert gpu["actors"] == 4 and gpu["num_gpus"] == 1 and gpu["decoders"] == 8 and gpu["num_cpus"] == 1.0
    assert plan(s.model_copy(update={"ray_actors": 8}), {"CPU": 32.0, "GPU": 4.0})["actors"] == 4  # one per GPU
    assert plan(s.model_copy(update={"ray_actors": 3}), {"CPU": 8.0}) | {"decoders": 0} == {
        "decoders": 0, "decode_cpus": 1.0, "actors": 3, "num_gpus": 0, "num_cpus": 2.0, "threads": 3}
    for cl in ({"CPU": c, **({"GPU": g} if g else {})} for c in (1.0, 2.0, 3.0, 5.0, 64.0) for g in (0, 1, 8)):
        for a in (None, 1, 3):
            p = plan(s.model_copy(update={"ray_actors": a}), cl)
            assert p["decoders"] * p["decode_cpus"] + p["actors"] * p["num_cpus"] <= cl["CPU"] + 1e-9, (cl, a, p)
            assert p["actors"] * p["num_gpus"] <= cl.get("GPU", 0)


AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_killed_ray_build_resumes_to_the_same_result(local_ray, settings, env, tmp_path, ckpt, bert, ray_tmp):
    """SIGKILL the driver of `crossprobe index build --engine ray` after >= 2 committed batches: its local Ray
    goes with it, nothing is active, and the same command again reuses the committed batches and ends with
    the version the single-process build makes."""
    images = tmp_path / "imgs"
    make_images(images, 30)  # + broken.jpg: 31 files, 8 batches of 4
    (images / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    build("ref", images=images, settings=settings, ckpt=ckpt, bert=bert, **QUIET)  # also exports the head graph

    env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    env.update(CROSSPROBE_INDEX_RAY_NUM_CPUS="2", CROSSPROBE_INDEX_RAY_TEMP_DIR=str(ray_tmp / "cli"),
               CROSSPROBE_INDEX_ENGINE="ray")
    cmd = [sys.executable, "-m", "crossprobe.cli", "index", "build", "--name", "k", "--images", str(images),
           "--ckpt", str(ckpt)]
    proc = subprocess.Popen(cmd + ["--throttle", "0.3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    root = settings.index_root / "k"
    ray_procs: list[psutil.Process] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(list(root.glob("v*/build/batches/*.npz"))) < 2:
            assert proc.poll() is None, proc.stdout.read().decode()
            ray_procs = _tree(proc.pid) or ray_procs
            time.sleep(0.02)
        ray_procs = _tree(proc.pid)
        names = {p.pid: _name(p) for p in ray_procs}
        assert "raylet" in names.values(), f"no local Ray under the CLI: {names}"
        # the encoder actor runs encode only: decode stays in tasks beside it (not fused into the actor)
        workers = [n for n in names.values() if n.startswith("ray::MapWorker")]  # + ".submit" while it runs
        assert workers and all(n.startswith("ray::MapWorker(MapBatches(_EncodeActor))") for n in workers), workers
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # fate-sharing: the GCS, the raylet and every worker die with the killed driver. Ray's two agents notice
        # at once too (their logs say so) but first try to report the raylet's death to the GCS, which is gone,
        # and exit when that call times out (60 s in Ray 2.60): this test stops them by PID at its end instead
        # of waiting.
        agents = [p for p in ray_procs if names[p.pid] in AGENTS]
        _, alive = psutil.wait_procs([p for p in ray_procs if names[p.pid] not in AGENTS], timeout=30)
        assert not alive, f"Ray processes outlived the killed driver: {[(p.pid, names[p.pid]) for p in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in ray_procs:  # only if the assertion above failed: by PID, the ones this test started
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    (vdir,) = root.glob("v*")
    assert not (vdir / "manifest.json").exists(), "the build finished before it could be killed"
    committed = len(list((vdir / "build" / "batches").glob("*.npz")))
    assert 2 <= committed < 8
    store = Store(settings, connect(settings))
    assert store.active("k") is None  # nothing half-built is ever live

    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"resuming build of 'k' as version {vdir.name}" in out.stdout
    assert f"engine ray: local Ray, {8 - committed} batches" in out.stdout  # only the batches not committed
    assert f"{committed} batches reused" in out.stdout
    assert not (vdir / "build").exists()  # journal removed once active
    assert store.active("k") == vdir.name
    _assert_same_version(settings, "ref", "k")
    assert open_index("k", None, settings).manifest["skipped"] == {"not_image": 1}
    logs = sorted((ray_tmp / "cli").glob("session_2*"))[0]  # the killed run's session (names start with the time)
    assert "Raylet is dead! Exiting" in (logs / "logs" / "runtime_env_agent.log").read_text()
    assert "The parent is dead" in (logs / "logs" / "dashboard_agent.log").read_text()
    for p in agents:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def test_local_ray_listens_on_loopback_only(local_ray):
    """ray_engine.start's local instance: every listening socket of every Ray process is on loopback."""
    procs = [p for p in psutil.Process().children(recursive=True) if _name(p) in ("raylet", "gcs_server")
             or _name(p).startswith("ray::")]
    assert {"raylet", "gcs_server"} <= {_name(p) for p in procs}
    listening = [(c.laddr.ip, c.laddr.port) for p in procs for c in p.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip, _ in listening), listening


def test_bad_engine_is_a_usage_error(env):
    out = subprocess.run([sys.executable, "-m", "crossprobe.cli", "index", "build", "--name", "x",
                          "--images", "/nonexistent", "--engine", "spark"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "engine" in out.stderr and "Traceback" not in out.stderr
