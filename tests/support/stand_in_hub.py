"""A local stand-in for the Hugging Face hub: the part of its HTTP protocol that huggingface_hub's own client
(snapshot_download, hf_hub_download) speaks, over repos the tests write from random-weight models. Pointed at by
HF_ENDPOINT, it lets the tests run crossprobe's real download path (core/hub.py) with no network.

    GET  /api/models/<owner>/<name>[/revision/<rev>]   repo info: id, sha, siblings
    GET  /api/models/<owner>/<name>/tree/<rev>          the files, recursively (path, size, oid, lfs)
    HEAD /<owner>/<name>/resolve/<rev>/<file>           X-Repo-Commit, ETag, Content-Length
    GET  /<owner>/<name>/resolve/<rev>/<file>           the bytes; Range: bytes=N- answered 206

Faults, set on the object while it runs:
    cut[file] = N    the next GET of that file sends N bytes of it and drops the connection (once)
    silent = True    every request is accepted and never answered (a dead hub behind a live socket)
requests records (method, path, Range header) of every request, so a test can see a resume ask for the rest.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class StandInHub:
    def __init__(self, root: Path):
        self.root = Path(root)  # <root>/<owner>/<name>/<files>
        self.cut: dict[str, int] = {}
        self.silent = False
        self.requests: list[tuple[str, str, str | None]] = []
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    # ---- the repos --------------------------------------------------------------------------------------
    def repo(self, repo_id: str) -> Path:
        return self.root / repo_id

    def _files(self, repo_id: str) -> list[Path]:
        base = self.repo(repo_id)
        return sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []

    def sha(self, repo_id: str) -> str:
        h = hashlib.sha1()
        for p in self._files(repo_id):
            h.update(str(p.relative_to(self.repo(repo_id))).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
        return h.hexdigest()

    def _entry(self, repo_id: str, p: Path) -> dict:
        data = p.read_bytes()
        e = {"type": "file", "path": str(p.relative_to(self.repo(repo_id))), "size": len(data),
             "oid": _git_blob_oid(data)}
        if p.suffix in (".onnx", ".safetensors", ".bin"):  # stored in LFS on the real hub
            e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return e

    # ---- the server -------------------------------------------------------------------------------------
    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, head=True)

            def do_GET(self):
                hub._answer(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> StandInHub:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- answers ----------------------------------------------------------------------------------------
    def _answer(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Range")))
        if self.silent:
            while not self._stop.wait(0.1):
                pass
            return
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            if not self._files(repo_id):
                return self._error(h, 404, "RepoNotFound", f"Repository {repo_id} not found")
            if len(parts) >= 6 and parts[4] == "tree":
                return self._json(h, [self._entry(repo_id, p) for p in self._files(repo_id)])
            sha = self.sha(repo_id)
            siblings = [{"rfilename": e["path"]} for e in (self._entry(repo_id, p) for p in self._files(repo_id))]
            return self._json(h, {"id": repo_id, "modelId": repo_id, "sha": sha, "siblings": siblings,
                                  "private": False, "tags": []})
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, name = "/".join(parts[:2]), "/".join(parts[4:])
            f = self.repo(repo_id) / name
            if not f.is_file():
                return self._error(h, 404, "EntryNotFound", f"{name} not in {repo_id}")
            return self._file(h, repo_id, f, name, head)
        return self._error(h, 404, "RepoNotFound", "not found")

    def _file(self, h, repo_id: str, f: Path, name: str, head: bool) -> None:
        data = f.read_bytes()
        entry = self._entry(repo_id, f)
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and not head:
            start = int(rng[6:].split("-", 1)[0] or 0)
        body = data[start:]
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", self.sha(repo_id))
        h.send_header("ETag", f'"{etag}"')
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(data) if head else len(body)))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        cut = self.cut.pop(name, None)
        if cut is not None and cut < len(body):
            h.wfile.write(body[:cut])
            h.wfile.flush()
            time.sleep(0.05)
            h.close_connection = True
            h.connection.shutdown(2)  # mid-file: the client sees the body end short
            return
        h.wfile.write(body)

    def _json(self, h, obj) -> None:
        raw = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(raw)

    def _error(self, h, status: int, code: str, message: str) -> None:
        raw = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(raw)
