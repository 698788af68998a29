"""`crossprobe index reindex`: every item of the active version re-encoded from its recorded source with the
current checkpoint into a new version, activated in one switch, the old version kept until gc; vanished
sources are reported skips, checked against the old count; resumable after SIGKILL; a running service
switches without a failed request."""
from __future__ import annotations

import copy
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from crossprobe.indexer import FingerprintMismatch, TooManyLost, build, open_index, reindex
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store
from crossprobe.models import checkpoint
from crossprobe.cli import app
from tests.conftest import random_labels
from tests.indexer.conftest import make_images
from tests.service.conftest import artifacts, svc_ckpt  # noqa: F401 (fixtures: the service's checkpoint and graphs)
from tests.service.live import Traffic, start
from tests.service.live import stop as stop_process

quiet = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def ckpt_b(small_cfg, bert, tmp_path_factory) -> Path:
    """A second tiny checkpoint: the same config, other weights, so another fingerprint (a "new model")."""
    import torch

    from crossprobe.models.model import SearchModel

    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("ckpt-b") / "ck"
    checkpoint.save(random_labels(SearchModel(copy.deepcopy(small_cfg), bert)).eval(), path)
    return path


def _fp(ckpt: Path) -> str:
    return checkpoint.read_config(ckpt)["fingerprint"]


def _metadata(rd) -> dict[str, dict]:
    return dict(zip(rd.ids, rd.metadata(rd.ids)))


def _value_keys(rd) -> list[str]:
    st = rd.store
    return [k for i in rd.ids for k in (st.feat_key(rd.name, rd.version, i), st.meta_key(rd.name, rd.version, i))]


def _version_keys(store: Store, name: str, version: str) -> int:
    return sum(1 for _ in store.r.scan_iter(match=store.key_base(name, version) + "*", count=1000))


def test_reindex_moves_an_index_to_another_checkpoint(settings, gallery, ckpt, ckpt_b, bert):
    fp_a, fp_b = _fp(ckpt), _fp(ckpt_b)
    assert fp_a != fp_b
    v1 = build("photos", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet).version
    old = open_index("photos", fp_a, settings)
    gone = gallery / "img_003.bmp"
    gone.unlink()  # a source that vanished since the build

    s = settings.model_copy(update={"reindex_max_lost": 0.1})  # 1 of 12 lost: 8.3%
    res = reindex("photos", settings=s, ckpt=ckpt_b, bert=bert, **quiet)
    assert res.kind == "reindex" and res.version != v1 and res.extra["base"] == v1
    assert res.count == 11 and res.skipped == {"missing": 1}
    assert res.extra["base_count"] == 12 and res.extra["lost"] == 1

    store = Store(settings, connect(settings))
    assert store.active("photos") == res.version
    new = open_index("photos", fp_b, settings)  # the new model's index: served by a service on checkpoint B
    assert new.manifest["fingerprint"] == fp_b and new.manifest["kind"] == "reindex"
    assert new.manifest["base_version"] == v1 and new.manifest["count"] == 11
    assert new.ids == [i for i in old.ids if i != "img_003.bmp"]  # same ids, same order, minus the lost one
    meta_old, meta_new = _metadata(old), _metadata(new)
    assert meta_new == {i: m for i, m in meta_old.items() if i != "img_003.bmp"}  # metadata unchanged
    assert _version_keys(store, "photos", res.version) == 2 * 11  # one feature + one metadata value per item

    report = json.loads(res.report.read_text())
    assert report["kind"] == "reindex"
    assert report["counts"]["total"] == 11 and report["counts"]["skipped"] == {"missing": 1}
    assert report["counts"]["base_count"] == 12 and report["counts"]["lost"] == 1
    (skip,) = report["skipped"]
    assert skip["id"] == "img_003.bmp" and skip["reason"] == "missing" and skip["uri"] == str(gone)

    # the vectors are checkpoint B's: what a fresh build with B gives for the same files (another batch
    # composition after the skip: equal up to float rounding)
    fresh = build("fresh", images=gallery, settings=settings, ckpt=ckpt_b, bert=bert, **quiet)
    ref = open_index("fresh", fp_b, settings)
    assert ref.ids == new.ids
    vec_new = store.read_vectors("photos", new.version)
    assert np.allclose(vec_new, store.read_vectors("fresh", fresh.version), atol=1e-5)
    assert not np.allclose(vec_new, store.read_vectors("photos", v1)[[old.ids.index(i) for i in new.ids]], atol=1e-2)
    assert np.allclose(new.features(new.ids)["p_v"], ref.features(ref.ids)["p_v"], atol=2e-3)

    # the old model's service refuses the new version and names the way forward
    with pytest.raises(FingerprintMismatch, match=rf"built with model crossprobe:{ckpt_b} \({fp_b}\).*"
                                                  r"crossprobe index reindex photos --model"):
        open_index("photos", fp_a, settings)
    # the old version stays (a service on checkpoint A keeps serving it) until gc
    states = {v.version: (v.state, v.fingerprint) for v in store.versions("photos")}
    assert states == {v1: ("complete", fp_a), res.version: ("active", fp_b)}
    assert [v for v, _ in store.gc("photos")] == [v1]
    assert [v.version for v in store.versions("photos")] == [res.version]
    assert _version_keys(store, "photos", v1) == 0


def test_too_many_lost_is_refused_and_the_cli_errors_are_clear(settings, env, gallery, ckpt, ckpt_b, bert):
    v1 = build("photos", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet).version
    files = sorted(gallery.rglob("*.*"))
    for p in files[:3]:  # 3 of 12 sources gone: 25% > the default 1%
        p.unlink()
    runner = CliRunner()
    out = runner.invoke(app, ["index", "reindex", "photos", "--ckpt", str(ckpt_b)], env=env)
    assert out.exit_code == 1, out.output
    assert "lost 3 of the 12 items" in out.output and "NOT activated" in out.output
    assert "reindex failed for photos" in out.output and isinstance(out.exception, SystemExit)  # no traceback
    store = Store(settings, connect(settings))
    assert store.active("photos") == v1  # nothing changed for readers
    (refused,) = [v for v in store.versions("photos") if v.version != v1]
    assert refused.state == "complete" and refused.count == 9  # complete and inspectable, not active
    vdir = settings.index_root / "photos" / refused.version
    assert not (vdir / "build").exists()  # no journal left: a rerun after restoring the sources starts afresh
    report = json.loads((vdir / "report.json").read_text())
    assert report["counts"]["skipped"] == {"missing": 3} and report["counts"]["lost"] == 3

    # accepting the loss is one switch, as the message says
    assert f"crossprobe index activate photos {refused.version}" in out.output
    out = runner.invoke(app, ["index", "activate", "photos", refused.version], env=env)
    assert out.exit_code == 0 and store.active("photos") == refused.version

    # from the 9-item version, one more source gone (1 of 9): the API raises the same refusal ...
    files[3].unlink()
    with pytest.raises(TooManyLost, match="lost 1 of the 9 items"):
        reindex("photos", settings=settings, ckpt=ckpt_b, bert=bert, **quiet)
    assert store.active("photos") == refused.version
    # ... and --max-lost lets it through
    out = runner.invoke(app, ["index", "reindex", "photos", "--ckpt", str(ckpt_b), "--max-lost", "0.2"], env=env)
    assert out.exit_code == 0, out.output
    assert "8 items active" in out.output and "9 items, 1 lost" in out.output
    assert open_index("photos", _fp(ckpt_b), settings).manifest["count"] == 8

    # bad usage: exit 2 and one line, never a traceback; checked before any job starts
    for args, msg in ((["nope"], "no index 'nope' with an active version"),
                      (["photos", "nope"], "no index 'nope' with an active version"),
                      (["bad*name"], "index name 'bad*name'"),
                      ([], "give index names or --all"),
                      (["photos", "--all"], "give index names or --all"),
                      (["photos", "--quantization", "int4"], "float16 or int8")):
        out = runner.invoke(app, ["index", "reindex", *args, "--ckpt", str(ckpt_b)], env=env)
        assert out.exit_code == 2, (args, out.output)
        assert msg in out.output and "Traceback" not in out.output, out.output
        assert isinstance(out.exception, SystemExit)
    assert open_index("photos", None, settings).manifest["count"] == 8  # nothing ran


def test_all_reindexes_every_index(settings, env, tmp_path, ckpt, ckpt_b, bert):
    for name in ("one", "two"):
        make_images(tmp_path / name, 4, seed=len(name), prefix=name)
        build(name, images=tmp_path / name, settings=settings, ckpt=ckpt, bert=bert, **quiet)
    out = CliRunner().invoke(app, ["index", "reindex", "--all", "--ckpt", str(ckpt_b)], env=env)
    assert out.exit_code == 0, out.output
    assert out.output.count("reindex one/") == 1 and out.output.count("reindex two/") == 1
    for name in ("one", "two"):
        rd = open_index(name, _fp(ckpt_b), settings)
        assert len(rd) == 4 and rd.manifest["kind"] == "reindex"
        assert len(Store(settings, rd.store.r).versions(name)) == 2  # the old one waits for gc


def test_killed_reindex_resumes_and_finishes(settings, env, tmp_path, ckpt, ckpt_b, bert):
    """SIGKILL a real `crossprobe index reindex` mid-way; the same command finishes it without recomputing
    committed batches, byte-identical to an uninterrupted reindex of the same version."""
    images = tmp_path / "imgs"
    make_images(images, 26)  # 7 batches of 4
    v1 = build("k", images=images, settings=settings, ckpt=ckpt, bert=bert, **quiet).version
    cmd = [sys.executable, "-m", "crossprobe.cli", "index", "reindex", "k", "--ckpt", str(ckpt_b),
           "--throttle", "0.1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    root = settings.index_root / "k"
    deadline = time.time() + 120
    while time.time() < deadline and not list(root.glob("v*/build/batches/*.npz")):
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.005)
    time.sleep(random.uniform(0, 0.35))  # a random moment; >= 6 batches x 0.1 s of throttle are still to go
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (vdir,) = [d for d in root.glob("v*") if d.name != v1]
    assert not (vdir / "manifest.json").exists(), "the reindex finished before it could be killed"
    committed = len(list((vdir / "build" / "batches").glob("*.npz")))
    assert committed >= 1
    store = Store(settings, connect(settings))
    assert store.active("k") == v1  # the old version stays live throughout

    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"resuming reindex of 'k' as version {vdir.name}" in out.stdout
    assert f"{committed} batches reused" in out.stdout
    assert store.active("k") == vdir.name and not (vdir / "build").exists()

    # an uninterrupted reindex of the same old version gives the same bytes
    store.activate("k", v1)
    ref = reindex("k", settings=settings, ckpt=ckpt_b, bert=bert, **quiet)
    assert ref.version not in (v1, vdir.name) and ref.reused_batches == 0
    a, b = open_index("k", None, settings, version=ref.version), open_index("k", None, settings, version=vdir.name)
    assert a.ids == b.ids and len(b.ids) == 26
    assert np.array_equal(store.read_vectors("k", a.version), store.read_vectors("k", b.version))
    assert store.r.mget(_value_keys(a)) == store.r.mget(_value_keys(b))  # byte-identical features and metadata
    assert _version_keys(store, "k", b.version) == 2 * 26  # no stray keys from the killed attempt


# ---- the service during a reindex ---------------------------------------------------------------------------

def _serve(settings, svc_ckpt: Path, artifacts: Path, log: Path) -> tuple[subprocess.Popen, str]:  # noqa: F811
    """`crossprobe serve` as a real process over the test Redis and index root, polling `active` every 0.1 s."""
    return start({"REDIS_URL": settings.redis_url, "CROSSPROBE_INDEX_ROOT": str(settings.index_root),
                  "CROSSPROBE_CKPT": str(svc_ckpt), "CROSSPROBE_MODELS_DIR": str(artifacts),
                  "CROSSPROBE_QUERY_PRECISION": "fp32", "CROSSPROBE_RELOAD_INTERVAL_S": "0.1"}, log)


def _wait_until(cond, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_live_traffic_sees_no_failed_search_through_reindex_and_gc(settings, gallery, svc_ckpt, artifacts,  # noqa: F811
                                                                   bert, tmp_path):
    """A re-encode with the same checkpoint (what an indexer fix needs; another checkpoint is refused by a
    running service, next test) while 3 clients search a real service continuously: the service switches
    to the new version, the old one is gc'ed, and not one search fails."""
    v1 = build("photos", images=gallery, settings=settings, ckpt=svc_ckpt, bert=bert, **quiet).version
    proc, url = _serve(settings, svc_ckpt, artifacts, tmp_path / "server.log")
    traffic = Traffic(url, [{"query": f"query {i}", "k": 3, "rerank": r} for i, r in enumerate(("cp", "temde", "none"))])
    seen, total = traffic.seen, traffic.total
    try:
        with traffic:
            _wait_until(lambda: all(len(s) >= 3 for s in seen))
            before = total()
            res = reindex("photos", settings=settings.model_copy(update={"throttle_s": 0.2}), ckpt=svc_ckpt,
                          bert=bert, **quiet)
            during = total() - before
            assert res.version != v1 and res.count == 12
            _wait_until(lambda: all(any(v == res.version for _, v, _ in s) for s in seen))  # the poller switched
            store = Store(settings, connect(settings))
            assert [v for v, _ in store.gc("photos")] == [v1]  # after the switch, as the README says
            counts = [len(s) for s in seen]
            _wait_until(lambda: all(len(s) >= n + 10 for s, n in zip(seen, counts)) and total() >= 60)
    finally:
        stop_process(proc)
    failed = traffic.failed()
    print(f"\nlive traffic through a reindex: {total()} searches sent ({during} while it ran), {len(failed)} failed")
    assert not failed, failed[:3]
    assert total() >= 60 and during > 0
    for i in range(len(seen)):  # per client: the old version until the switch, the new one after it, never back
        vs = traffic.versions(i)
        cut = vs.index(res.version)
        assert cut > 0 and set(vs[:cut]) == {v1} and set(vs[cut:]) == {res.version}
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_a_service_on_the_old_checkpoint_keeps_serving_and_names_reindex(settings, gallery, svc_ckpt,  # noqa: F811
                                                                         artifacts, ckpt_b, bert):  # noqa: F811
    """A model upgrade's order: reindex with the new checkpoint first. A service still on the old one
    refuses the new version (another fingerprint), says reindex is the way forward, and keeps answering
    from the old version (kept until gc) until it is restarted on the new checkpoint."""
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready
    from crossprobe.service.settings import Settings as ServiceSettings

    v1 = build("photos", images=gallery, settings=settings, ckpt=svc_ckpt, bert=bert, **quiet).version
    ss = ServiceSettings(redis_url=settings.redis_url, index_root=settings.index_root, ckpt=svc_ckpt, models_dir=artifacts,
                         query_precision="fp32", threads=2, workers=2, reload_interval_s=0, access_log=False,
                         admin_key="s3cret-admin-key-0123", batch_wait_ms=1.0)
    with TestClient(create_app(ss)) as c:
        wait_ready(c)
        res = reindex("photos", settings=settings, ckpt=ckpt_b, bert=bert, **quiet)
        out = c.post("/admin/reload", headers={"X-Admin-Key": "s3cret-admin-key-0123"}).json()["indexes"]["photos"]
        assert out["version"] == v1 and not out["changed"]
        assert f"crossprobe index reindex photos --model crossprobe:{svc_ckpt}" in out["error"]
        assert f"model crossprobe:{ckpt_b} (fingerprint {_fp(ckpt_b)})" in out["error"]
        assert f"serve the index's model (CROSSPROBE_MODEL=crossprobe:{ckpt_b})" in out["error"]
        assert "crossprobe index reindex photos" in c.get("/v1/indexes").json()["unavailable"]["photos"]
        r = c.post("/v1/search", json={"query": "a photo", "k": 3, "rerank": "cp"})
        assert r.status_code == 200 and r.json()["index"]["version"] == v1 and not r.json()["degraded"]
        assert Store(settings, connect(settings)).active("photos") == res.version
