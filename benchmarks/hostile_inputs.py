"""Hostile files against a live service (issue 55, item 1): each is posted to POST /v1/search/image, beside a normal
photo, and the table records its bytes, its declared dimensions, the answer, the time and how far the service's
peak memory rose above what it held before (its VmHWM after the request, reset before it through
/proc/<pid>/clear_refs, minus its VmRSS then).

The files are made here, none from outside (artifacts/hostile/):
  normal.jpg             a 640 x 480 photo
  progressive_bomb.jpg   a progressive JPEG of 10000 x 10000 (libjpeg holds its full-size coefficients)
  baseline_bomb.jpg      a baseline gray JPEG of 7000 x 7000 (decodes at 1/8 scale: cheap, and answered)
  png_bomb.png           a PNG of 20000 x 20000 zeros, a few hundred KB
  tiff_bomb.tif          a TIFF whose header declares 50000 x 50000 (one deflate strip)
  dng_crafted.dng        a DNG whose raw IFD declares 60000 x 60000 photosites
  gif_frames.gif         an animated GIF of 5,000 frames
  heif_huge.heic         a small HEIF whose ispe box declares 60000 x 60000

    .venv/bin/python -m benchmarks.hostile_inputs   -> docs/research/results/hostile_inputs.json
"""
from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from benchmarks.harness import start_server, stop_server
from benchmarks.model_end_to_end import _host
from crossprobe.core.atomic import atomic_write
from tests.support import hostile_files

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "artifacts" / "hostile"
OUT = REPO / "docs" / "research" / "results" / "hostile_inputs.json"
LIMIT_MB = 64


def make(work: Path) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, the dimensions it declares)."""
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out: dict[str, tuple[bytes, str]] = {}
    small = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((640, 480), Image.BICUBIC)
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=90)
    out["normal.jpg"] = (buf.getvalue(), "640x480")
    # under the service's 768 KB image limit, as the 767 KB one was
    for name, mode, side, progressive in (("progressive_bomb.jpg", "RGB", 10000, True),
                                          ("baseline_bomb.jpg", "L", 7000, False)):
        path = work / name
        if not path.exists():
            Image.new(mode, (side, side), 120).save(path, "JPEG", quality=20, progressive=progressive)
        out[name] = (path.read_bytes(), f"{side}x{side}" + (" gray" if mode == "L" else ""))
    out["png_bomb.png"] = (hostile_files.png_zeros(20000, 20000), "20000x20000")
    out["tiff_bomb.tif"] = (hostile_files.tiff(50000, 50000), "50000x50000")
    out["dng_crafted.dng"] = (hostile_files.dng(60000, 60000), "60000x60000 photosites")
    out["gif_frames.gif"] = (hostile_files.gif_frames(5000), "64x64, 5000 frames")
    assert all(len(d) <= 768 * 1024 for d, _ in out.values()), {k: len(d) for k, (d, _) in out.items()}
    out["heif_huge.heic"] = (hostile_files.heif_declaring(60000), "60000x60000 (declared)")
    for name, (data, _) in out.items():
        (work / name).write_bytes(data)
    return out


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            fields[k] = int(v.split()[0]) * 1024
    return fields


def gallery_index(work: Path) -> dict:
    """A 16-photo index with the committed checkpoint (the service needs one to answer searches)."""
    from tests.support import reference_models as rm

    photos = rm.sample_photos(work / "gallery")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CROSSPROBE_", "REDIS_URL"))}
    env.update(CROSSPROBE_INDEX_ROOT=str(work / "indexes"), CROSSPROBE_INDEX_PROGRESS="false")
    if not (work / "indexes" / "gallery").is_dir():
        import subprocess

        subprocess.run([sys.executable, "-m", "crossprobe.cli", "index", "build", "--name", "gallery", "--images",
                        str(photos[0].parent)], env=env, check=True, capture_output=True, timeout=900)
    return env


def main() -> None:
    files = make(WORK)
    env = gallery_index(WORK)
    from crossprobe.service.server import free_port

    port = free_port()
    proc = start_server({**env, "CROSSPROBE_INDEXES": "gallery", "CROSSPROBE_ACCESS_LOG": "false",
                         "CROSSPROBE_LOG_LEVEL": "warning", "HF_HUB_OFFLINE": "1"}, port, WORK / "serve.log")
    rows = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            for _ in range(3):  # warm: the image tower is made on first use
                http.post("/v1/search/image?k=3", content=files["normal.jpg"][0])
            for name, (data, dims) in files.items():
                Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
                before = _status(proc.pid)["VmRSS"]
                t = time.perf_counter()
                r = http.post("/v1/search/image?k=3", content=data, headers={"Content-Type": "application/octet-stream"})
                ms = (time.perf_counter() - t) * 1000
                peak = _status(proc.pid)["VmHWM"]
                body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                err = body.get("error") or {}
                rows.append({"file": name, "bytes": len(data), "dimensions": dims, "status": r.status_code,
                             "code": err.get("code") if isinstance(err, dict) else None,
                             "message": (err.get("message") if isinstance(err, dict) else str(err))[:300] if err else "",
                             "ms": round(ms, 1), "peak_growth_mb": round((peak - before) / 2**20, 1)})
                print(f"{name:22} {len(data):>9} B  {dims:>24}  {r.status_code}  {ms:8.1f} ms  "
                      f"+{rows[-1]['peak_growth_mb']} MB  {rows[-1]['message'][:90]}", flush=True)
    finally:
        stop_server(proc)
    ok = all(r["peak_growth_mb"] <= LIMIT_MB and r["status"] < 500 for r in rows)
    atomic_write(OUT, json.dumps({"command": "python -m benchmarks.hostile_inputs", "host": _host(),
                                  "route": "POST /v1/search/image (the body is the file)",
                                  "model": "the committed checkpoint", "limit_mb": LIMIT_MB, "ok": ok, "rows": rows},
                                 indent=1) + "\n")
    print("every row within the limit" if ok else "A ROW IS OVER THE LIMIT (or a 5xx)")


if __name__ == "__main__":
    main()
