"""Fetching a model on first use (core/hub.py, core/inference/__init__.py's exported_folder and immich_folder),
against a local stand-in for the Hugging Face hub (tests/support/stand_in_hub.py) that huggingface_hub's own client
reaches through HF_ENDPOINT: a download, a resume after the connection is cut mid-file, a hub that stops
answering, then one command that downloads, exports, indexes and serves. Every case runs the real `crossprobe`
command line in a process of its own (huggingface_hub reads HF_ENDPOINT when it is imported), with a fresh
Hugging Face cache (HF_HOME) and a fresh models folder."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.indexer.conftest import redis_server, redis_url  # noqa: F401 (fixtures)
from tests.service.live import start
from tests.service.live import stop as stop_process
from tests.support import reference_models as rm
from tests.support.stand_in_hub import StandInHub

IMMICH = "test-org/ViT-tiny__random"  # an Immich-layout repo
CLIP = "test-org/clip-tiny"  # a Hugging Face CLIPModel repo
QUERIES = ["a photo of a cat", "a red car", "zwei Hunde im Schnee", "kot na kanapie"]  # Polish and German too


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> Path:
    """The stand-in hub's repos: an Immich folder written from a random tiny CLIP (its layout and graphs), and that
    CLIP itself as a Hugging Face repo; the Immich folder's visual graph grown past one download chunk (10 MiB) by
    an unused initializer, so a cut mid-file leaves whole chunks behind to resume from."""
    from transformers import AutoTokenizer

    from crossprobe.models import families
    from tests.core.inference import immich_layout

    root = tmp_path_factory.mktemp("hub")
    ref = rm.build("hf_clip", tmp_path_factory.mktemp("ref") / "clip", size="tiny")
    shutil.copytree(ref.path, root / CLIP)
    folder = immich_layout.write(root / IMMICH, families.load(f"hf:{ref.path}"), AutoTokenizer.from_pretrained(ref.path),
                                 77)
    _pad_graph(folder / "visual" / "model.onnx", 24 * 2**20)
    return root


def _pad_graph(path: Path, nbytes: int) -> None:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    pad = numpy_helper.from_array(np.random.default_rng(0).normal(size=nbytes // 4).astype(np.float32), "unused_pad")
    m.graph.initializer.append(pad)
    onnx.save(m, str(path))


@pytest.fixture
def hub(repos):
    with StandInHub(repos) as h:
        yield h


def _env(hub: StandInHub, tmp_path: Path, **extra) -> dict:
    """What the user's shell would hold: the stand-in hub as the endpoint, a cache and an index root of their own,
    no offline switch of theirs."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "CROSSPROBE_MODEL", "CROSSPROBE_CKPT")}
    return {**full, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"),
            "CROSSPROBE_INDEX_ROOT": str(tmp_path / "indexes"), "CROSSPROBE_INDEX_PROGRESS": "false", **extra}


def _crossprobe(env: dict, *args: str, timeout: float = 300) -> tuple[int, str, float]:
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "crossprobe.cli", *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t


def _snapshot(tmp_path: Path, repo: str) -> Path:
    snaps = list((tmp_path / "hf-home" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
    assert len(snaps) == 1, snaps
    return snaps[0]


def _same_files(got: Path, want: Path) -> None:
    names = sorted(str(p.relative_to(want)) for p in want.rglob("*") if p.is_file())
    assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == names
    for n in names:
        assert (got / n).read_bytes() == (want / n).read_bytes(), n


def test_pull_downloads_every_file_of_a_repo(hub, tmp_path):
    rc, out, _ = _crossprobe(_env(hub, tmp_path), "models", "pull", f"immich:{IMMICH}")
    assert rc == 0, out
    folder = _snapshot(tmp_path, IMMICH)
    _same_files(folder, hub.repo(IMMICH))
    assert f"downloading {IMMICH} from {hub.url}" in out and f"pulled: use immich:{folder}" in out
    assert "Fetching" in out  # huggingface_hub's progress bar


def test_a_connection_cut_mid_file_resumes_where_it_stopped(hub, tmp_path):
    hub.cut["visual/model.onnx"] = 15 * 2**20  # one 10 MiB chunk written, then the connection drops
    rc, out, _ = _crossprobe(_env(hub, tmp_path), "models", "pull", f"immich:{IMMICH}")
    assert rc == 0, out
    assert "Trying to resume download" in out  # what the user sees
    gets = [r for r in hub.requests if r[0] == "GET" and r[1].endswith("visual/model.onnx")]
    assert [g[2] for g in gets] == [None, f"bytes={10 * 2**20}-"], gets  # the rest only, not the whole file again
    _same_files(_snapshot(tmp_path, IMMICH), hub.repo(IMMICH))


def test_a_hub_that_stops_answering_ends_the_command_and_the_next_try_fetches_only_what_is_missing(hub, tmp_path):
    """The connection drops mid-file and the hub then accepts connections and answers nothing: the command ends
    within its timeout's retries with what to do; run again once the hub answers, it fetches only the file it
    lacked (huggingface_hub keeps no partial file between runs, so that one starts again)."""
    import threading

    env = _env(hub, tmp_path)
    hub.cut["visual/model.onnx"] = 15 * 2**20
    seen = len(hub.requests)

    def fall_silent():  # once the big file's first GET has started (the small files are complete by then)
        while not any(r[1].endswith("visual/model.onnx") and r[0] == "GET" for r in hub.requests[seen:]):
            time.sleep(0.01)
        hub.silent = True

    threading.Thread(target=fall_silent, daemon=True).start()
    rc, out, took = _crossprobe(env, "models", "pull", f"immich:{IMMICH}", "--timeout", "1")
    assert rc == 3, out
    assert "stopped answering" in out and "the next try fetches only the others" in out
    assert "Download the model on a machine" in out and "Traceback" not in out
    assert took < 60, took  # five 1 s retries and the interpreter, not a hang
    hub.silent = False
    del hub.requests[:]
    rc, out, _ = _crossprobe(env, "models", "pull", f"immich:{IMMICH}")
    assert rc == 0, out
    fetched = sorted({r[1].split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.requests
                      if r[0] == "GET" and "/resolve/" in r[1]})
    assert fetched == ["visual/model.onnx"], hub.requests
    _same_files(_snapshot(tmp_path, IMMICH), hub.repo(IMMICH))


def test_no_network_at_first_use_names_what_to_do(tmp_path):
    """`crossprobe index build --model immich:<repo id>` with the hub unreachable: one message, exit 1, nothing
    built."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}, "HF_ENDPOINT": f"http://127.0.0.1:{port}",
           "HF_HOME": str(tmp_path / "hf-home"), "CROSSPROBE_INDEX_ROOT": str(tmp_path / "indexes")}
    photos = rm.sample_photos(tmp_path / "photos")
    rc, out, _ = _crossprobe(env, "index", "build", "--name", "photos", "--images", str(photos[0].parent),
                             "--model", f"immich:{IMMICH}")
    assert rc != 0 and "no network" in out and "Download the model on a machine" in out and "Traceback" not in out
    assert not (tmp_path / "indexes" / "photos").exists() or not any((tmp_path / "indexes" / "photos").iterdir())


def _search_all(url: str, names: list[str]) -> dict[str, dict[str, float]]:
    out = {}
    with httpx.Client(base_url=url, timeout=60) as c:
        for q in QUERIES:
            body = c.post("/v1/search", json={"query": q, "k": len(names), "mode": "vector", "rerank": "none"}).json()
            out[q] = {h["id"]: h["score"] for h in body["results"]}
    return out


def test_one_command_downloads_an_immich_model_and_indexes_and_serves_without_torch(
        hub, no_torch, redis_server, redis_url, tmp_path):  # noqa: F811
    """immich:<hub repo id> from nothing to answers with no PyTorch installed: `index build --model` fetches the repo
    and indexes with it; `serve --model` finds it in the cache (no second download) and its two-tower scores equal
    the repo's own graphs'. Queries in Polish and German reach the text graph as they are."""
    from crossprobe.core import inference
    from crossprobe.core.inference import RuntimeOptions

    redis_server.flushall()
    photos = rm.sample_photos(tmp_path / "photos")
    names = sorted(p.name for p in photos)
    env = _env(hub, tmp_path, REDIS_URL=redis_url, PYTHONPATH=str(no_torch))
    spec = f"immich:{IMMICH}"
    rc, out, _ = _crossprobe(env, "index", "build", "--name", "photos", "--images", str(photos[0].parent),
                             "--model", spec)
    assert rc == 0, out
    assert f"downloading {IMMICH}" in out and "Traceback" not in out
    fetched = len(hub.requests)
    proc, url = start({**env, "CROSSPROBE_MODEL": spec, "HF_HUB_OFFLINE": ""}, tmp_path / "serve.log",
                      timeout_s=180)
    try:
        got = _search_all(url, names)
    finally:
        stop_process(proc)
    assert len(hub.requests) == fetched, hub.requests[fetched:]  # served from the cache
    own = inference.load(f"immich:{hub.repo(IMMICH)}", RuntimeOptions(threads=1))
    pixels = np.stack([own.preprocess(im) for im in rm.open_images(sorted(photos))])
    g = own.encode_images(pixels).g
    for q in QUERIES:
        want = g @ own.encode_texts([q])[0].g_q
        api = np.array([got[q][n] for n in names])
        assert np.abs(api - want).max() <= 1e-4, (q, api, want)


def test_one_command_downloads_and_exports_a_hugging_face_model_into_the_one_models_folder(
        hub, redis_server, redis_url, tmp_path):  # noqa: F811
    """hf:<hub repo id> that this machine has never seen: `index build --model` downloads the repo, exports its
    graphs into the models folder (<index root>/_models) with the export's checks, and indexes; `serve --model`
    reads that folder, exporting nothing again, and answers."""
    redis_server.flushall()
    photos = rm.sample_photos(tmp_path / "photos")
    env = _env(hub, tmp_path, REDIS_URL=redis_url)
    spec = f"hf:{CLIP}"
    rc, out, _ = _crossprobe(env, "index", "build", "--name", "photos", "--images", str(photos[0].parent),
                             "--model", spec)
    assert rc == 0, out
    assert f"downloading {CLIP}" in out and "ids equal" in out and "image.onnx: max |ONNX Runtime - PyTorch|" in out
    exported = list((tmp_path / "indexes" / "_models").glob("*/model.json"))
    assert len(exported) == 1, exported
    stamp = exported[0].stat().st_mtime_ns
    proc, url = start({**env, "CROSSPROBE_MODEL": spec, "HF_HUB_OFFLINE": ""}, tmp_path / "serve.log",
                      timeout_s=180)
    try:
        got = _search_all(url, sorted(p.name for p in photos))
    finally:
        stop_process(proc)
    assert all(len(v) == len(photos) for v in got.values()), got
    assert list((tmp_path / "indexes" / "_models").glob("*/model.json")) == exported
    assert exported[0].stat().st_mtime_ns == stamp and "exported" not in (tmp_path / "serve.log").read_text()
