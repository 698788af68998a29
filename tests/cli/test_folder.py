"""`crossprobe serve --images DIR` (cli/folder.py): one command from a folder to answers. It indexes the folder
on first use, serves it as the default index, follows its changes while it runs, and on the next start indexes
only what changed while it was stopped."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from crossprobe.cli.folder import folder_index
from crossprobe.service.server import free_port
from tests.support import reference_models as rm


def test_an_index_is_named_after_its_folder():
    assert folder_index(Path("/home/u/Pictures"), None) == "Pictures"
    assert folder_index(Path("/home/u/My Photos 2024"), None) == "My-Photos-2024"
    assert folder_index(Path("/home/u/Zdjęcia"), None) == "Zdj-cia"
    assert folder_index(Path("/home/u/…"), None) == "photos"  # nothing usable left
    assert folder_index(Path("/x"), "trip") == "trip"
    with pytest.raises(ValueError, match="index name"):
        folder_index(Path("/x"), "../up")


def _serve(folder: Path, cwd: Path, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSPROBE_") and k != "REDIS_URL"}
    env |= {"CROSSPROBE_THREADS": "1", "CROSSPROBE_INDEX_PROGRESS": "false", "CROSSPROBE_INDEX_WATCH_SETTLE_S": "0.2"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "crossprobe.cli", "serve", "--images", str(folder), "--port",
                                 str(port), *extra], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(log.read_text())
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(log.read_text())


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _ids(url: str, query: str, k: int = 50) -> list[str]:
    r = httpx.post(f"{url}/v1/search", json={"query": query, "k": k}, timeout=60)  # no "index": the folder's
    assert r.status_code == 200, r.text
    return [h["id"] for h in r.json()["results"]]


def test_serve_images_indexes_serves_and_follows_the_folder(tmp_path):
    folder = tmp_path / "My Photos"
    photos = rm.sample_photos(folder)
    log = tmp_path / "serve.log"
    proc, url = _serve(folder, tmp_path, log)  # the embedded Redis and ./indexes, as a user's first run
    try:
        assert sorted(_ids(url, "a cat")) == sorted(p.name for p in photos)
        shutil.copy(folder / "cat.png", folder / "kitten.png")  # while it runs: followed
        deadline = time.monotonic() + 60
        while "kitten.png" not in _ids(url, "kitten") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "kitten.png" in _ids(url, "kitten")
    finally:
        _stop(proc)
    text = log.read_text()
    assert "no active version; building it" in text and "search page: http://127.0.0.1:" in text
    assert "Traceback" not in text

    (folder / "horse.png").unlink()  # while it is stopped: the next start brings the index up to date
    proc, url = _serve(folder, tmp_path, log, "--no-watch")
    try:
        got = _ids(url, "a horse")
    finally:
        _stop(proc)
    assert "horse.png" not in got and "kitten.png" in got and len(got) == len(photos)
    assert log.read_text().count("no active version; building it") == 1  # brought up to date, not built again


def test_serve_images_of_a_missing_folder_is_a_usage_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "crossprobe.cli", "serve", "--images", str(tmp_path / "none")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("CROSSPROBE_")})
    assert p.returncode == 2 and "no such folder" in p.stderr and "Traceback" not in p.stderr
