"""`make test-upgrade`: an index built by the previous release's own code (0.1.0, benchmarks/support/old_code.py's
worktree of its commit), then served by this checkout -> docs/research/results/upgrade.json.

1. 0.1.0 builds its sample gallery (`crossprobe index build`, its committed checkpoint, the embedded Redis) and
   serves it: its answers to make demo's 16 queries are the reference.
2. This checkout serves that index folder unchanged with 0.1.0's checkpoint (CROSSPROBE_MODEL=crossprobe:<it>):
   the storage format is read as is, with the same answers, ids and scores.
3. With its own default model (0.2.0's checkpoint adds region labels, which 0.1.0's versions do not store) the
   service refuses the index, naming the release whose checkpoint built it and the one command that migrates it;
   that command, run as the message gives it while the service runs, makes a version the service then serves
   with the answers of an index this checkout built itself.

Runs the old code, so it needs the repository's history (a full clone); `make test` runs the format rules alone
(tests/storage/test_layout.py, tests/service/test_storage_format.py).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from benchmarks.harness import stop_server
from benchmarks.support import old_code
from crossprobe.models.demo import EXPECTED, write_sample_gallery

pytestmark = pytest.mark.upgrade

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "research" / "results" / "upgrade.json"
RELEASE = "0.1.0"
MODES = ("none", "cp", "temde")  # the two-tower scores alone, then each reranker


def env_for(root: Path, base: dict | None = None, **extra: str) -> dict[str, str]:
    env = {**(base or os.environ), "CROSSPROBE_INDEX_ROOT": str(root), "CROSSPROBE_INDEX_PROGRESS": "false",
           "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_RELOAD_INTERVAL_S": "0.5", **extra}
    for k in ("REDIS_URL", "CROSSPROBE_MODEL", "CROSSPROBE_CKPT", "CROSSPROBE_MODELS_DIR"):
        if k not in extra:
            env.pop(k, None)  # the embedded Redis at <root>/redis.db and each release's default model
    return env


def cli(module: str, args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", module, *args], env=env, cwd="/tmp", capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{module} {' '.join(args)} -> {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def answers(port: int) -> dict[tuple[str, str], list[tuple[str, float]]]:
    """(query, rerank mode) -> [(id, score)] for each mode by name (the server's default mode changed since 0.1.0)."""
    out = {}
    with httpx.Client(timeout=30) as c:
        for q in EXPECTED:
            for mode in MODES:
                r = c.post(f"http://127.0.0.1:{port}/v1/search", json={"query": q, "index": "photos", "k": 3,
                                                                     "rerank": mode})
                assert r.status_code == 200, r.text
                out[q, mode] = [(h["id"], h["score"]) for h in r.json()["results"]]
    return out


def largest_difference(a: dict, b: dict) -> float:
    assert {q: [i for i, _ in hits] for q, hits in a.items()} == {q: [i for i, _ in hits] for q, hits in b.items()}
    return max(abs(x[1] - y[1]) for q in a for x, y in zip(a[q], b[q]))


def only_version(root: Path) -> dict:
    (m,) = [json.loads(p.read_text()) for p in (root / "photos").glob("v*/manifest.json")]
    return m


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    if not old_code.commit_available(old_code.PREVIOUS_RELEASE, REPO):
        pytest.fail(f"release {RELEASE}'s commit {old_code.PREVIOUS_RELEASE} is not in this clone (a shallow one?): "
                    "`git fetch --unshallow`, then make test-upgrade again")
    with old_code.checkout(old_code.PREVIOUS_RELEASE) as old:
        yield old, tmp_path_factory.mktemp("upgrade")


def test_an_index_of_the_previous_release_is_served_or_migrated_by_its_one_command(release):
    old, work = release
    gallery = write_sample_gallery(work / "gallery")
    built_by_old = work / "built-by-0.1.0"
    result: dict = {"release": RELEASE, "commit": old.commit, "gallery": "crossprobe.models.demo's 16 photos",
                    "queries": "make demo's 16, k 3, each rerank mode (none, cp, temde)"}

    # 1. the release builds and serves its index
    t = time.monotonic()
    cli(old.cli, ["index", "build", "--name", "photos", "--images", str(gallery)], env_for(built_by_old, old.env()))
    result["old_build_s"] = round(time.monotonic() - t, 1)
    m_old = only_version(built_by_old)
    result["old_manifest"] = {"fields": sorted(m_old), "format": m_old.get("format"),
                              "fingerprint": m_old["fingerprint"], "keyword_index": (built_by_old / "photos" /
                                                                                    m_old["version"] / "text").exists()}
    p, port = old_code.serve(env_for(built_by_old, old.env()), work / "old-serve.log", old.cli)
    try:
        reference = answers(port)
    finally:
        stop_server(p)

    # 2. this checkout serves the folder as it is, with the release's checkpoint
    kept = work / "served-as-is"
    shutil.copytree(built_by_old, kept)
    old_ckpt = old.tree / "models" / "checkpoints" / "default"
    p, port = old_code.serve(env_for(kept, CROSSPROBE_MODEL=f"crossprobe:{old_ckpt}"), work / "as-is.log")
    try:
        as_is = answers(port)
        served = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()["indexes"]["photos"]
    finally:
        stop_server(p)
    assert served == m_old["version"]
    result["served_as_is"] = {"model": "crossprobe:<0.1.0's models/checkpoints/default>", "version": served,
                              "same_ids": True, "largest_score_difference": largest_difference(reference, as_is)}
    assert result["served_as_is"]["largest_score_difference"] < 1e-4

    # 3. this checkout's own model: refused, with the command that migrates it, which is then run as given
    upgraded = work / "upgraded"
    shutil.copytree(built_by_old, upgraded)
    from crossprobe.service.server import free_port

    port = free_port()
    log = work / "upgrade-serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "crossprobe.cli", "serve", "--port", str(port)],
                            env=env_for(upgraded), cwd="/tmp", stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                if r.status_code == 503 and "photos" in r.text:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        message = r.json()["error"]["message"]
        assert f"was built with the checkpoint crossprobe {RELEASE} shipped (fingerprint {m_old['fingerprint']})" in message
        command = re.search(r"move the index to this service's model: (crossprobe index reindex [^(]+?) \(", message)
        assert command, message
        result["refused_with"] = message
        result["migrate_command"] = command.group(1)
        t = time.monotonic()
        p = cli("crossprobe.cli", shlex.split(command.group(1))[1:], env_for(upgraded))
        result["migrate_s"] = round(time.monotonic() - t, 1)
        result["migrate_said"] = next(ln for ln in p.stdout.splitlines() if " items active" in ln)
        deadline = time.monotonic() + 60
        while httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        migrated = answers(port)
    finally:
        stop_server(proc)

    # the same photos built by this checkout from nothing: what the migrated index must answer
    fresh = work / "built-by-this-checkout"
    cli("crossprobe.cli", ["index", "build", "--name", "photos", "--images", str(gallery)], env_for(fresh))
    p, port = old_code.serve(env_for(fresh), work / "fresh.log")
    try:
        own = answers(port)
    finally:
        stop_server(p)
    result["migrated"] = {"same_ids_as_a_fresh_build": True, "largest_score_difference": largest_difference(own, migrated),
                          "first_hits_expected": sum(migrated[q, "cp"][0][0].startswith(w + ".") for q, w in EXPECTED.items()),
                          "of": len(EXPECTED)}
    assert result["migrated"]["largest_score_difference"] < 1e-4
    result["command"] = "make test-upgrade"
    result["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    OUT.write_text(json.dumps(result, indent=2) + "\n")
