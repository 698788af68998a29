"""The wheel without torch on every Python the core supports: build crossprobe's wheel from a clean copy of the
tree, install it into a fresh virtualenv per Python (no torch, no extras), then in each: `crossprobe index build`
a folder of photos with a model exported beforehand, `crossprobe serve` it, and ask the same queries over HTTP.
Every Python's answers must equal the first one's (the same ids in the same order, scores within 1e-5).

The model is the tests' random-weight Hugging Face CLIP (tests/support/reference_models.py), exported once here
(this venv has torch), as a user exports a model on one machine and serves it on another.

    make wheel-check                      # Python 3.11, 3.12 and 3.13 from pyenv
    PYTHONPATH=. python scripts/wheel_check.py --pythons /usr/bin/python3.12,...   (tests.support from the root)

Writes docs/research/results/wheel_check.json (--out); exit 1 when an answer differs or a step fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ["a dog runs on the beach", "a red car", "two people ride bikes in the rain", "Pies biegnie po plaży",
           "一只猫", "sunset over the sea", "a bowl of fruit", "a city street at night"]
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def run(cmd: list[str], log: Path, env: dict | None = None, timeout: int = 900) -> None:
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(map(str, cmd))}\n".encode())
        out.flush()
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    if p.returncode:
        raise RuntimeError(f"{' '.join(map(str, cmd[:4]))}... exited {p.returncode}; its output: {log}")


def find_python(version: str) -> Path:
    if "/" in version:
        return Path(version)
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}")) or [Path(p) for p in [shutil.which(f"python{version}")] if p]
    if not found:
        raise SystemExit(f"no Python {version}: install it (pyenv install {version}) or pass its path in --pythons")
    return found[-1]


def build_wheel(work: Path) -> Path:
    """The wheel from the files git knows (tracked, or untracked and not ignored): nothing a local build left."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)], work / "build.log")
    return next(dist.glob("crossprobe-*.whl"))


def model_and_photos(work: Path) -> tuple[str, Path, Path]:
    """A random-weight CLIP exported into work/graphs (torch here), and 12 photos of 3 sizes."""
    from crossprobe.models import families
    from tests.support import reference_models as rm

    # from scratch each run: a rebuilt model folder has new file times, which an earlier export's record does not
    # match (a service would then rightly call it not exported)
    shutil.rmtree(work / "model", ignore_errors=True)
    shutil.rmtree(work / "graphs", ignore_errors=True)
    ref = rm.build("hf_clip", work / "model", size="tiny")
    spec = f"hf:{ref.path}"
    families.export(spec, work / "graphs")
    return spec, work / "graphs", write_photos(work / "photos")


def write_photos(dst: Path) -> Path:
    """12 JPEGs of 3 sizes, each a smooth picture: an 8x8 field scaled up."""
    dst.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(12):
        h, w = [(480, 640), (1200, 1600), (300, 300)][i % 3]
        base = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(base).resize((w, h), Image.BICUBIC).save(dst / f"p{i:02d}.jpg", quality=90)
    return dst


def check_python(python: Path, wheel: Path, spec: str, graphs: Path, photos: Path, work: Path) -> dict:
    """A fresh venv on `python` with the wheel alone; index, serve, query -> what it answered."""
    version = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    venv = work / f"py{version}"
    shutil.rmtree(venv, ignore_errors=True)
    log = work / f"py{version}.log"
    log.unlink(missing_ok=True)
    t0 = time.monotonic()
    # no PYTHONPATH (make sets it to the checkout): pip would see the checkout's crossprobe.egg-info of `pip install
    # -e .` as crossprobe installed already and skip the wheel
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([str(python), "-m", "venv", str(venv)], log, clean)
    run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], log, clean, timeout=1800)
    if not (venv / "bin" / "crossprobe").exists():
        raise RuntimeError(f"{venv}: the wheel did not install (no crossprobe command); its output: {log}")
    installed_s = time.monotonic() - t0
    no_torch = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"], capture_output=True).returncode != 0
    if not no_torch:
        raise RuntimeError(f"{venv}: torch is importable; the wheel must install without it")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CROSSPROBE_", "REDIS_URL", "PYTHONPATH"))}
    env.update(CROSSPROBE_INDEX_ROOT=str(venv / "indexes"), CROSSPROBE_MODELS_DIR=str(graphs),
               CROSSPROBE_MODEL=spec, CROSSPROBE_INDEXES="wc",
               CROSSPROBE_ACCESS_LOG="false", HF_HUB_OFFLINE="1")
    crossprobe = str(venv / "bin" / "crossprobe")
    t0 = time.monotonic()
    run([crossprobe, "index", "build", "--name", "wc", "--images", str(photos)], log, env)
    index_s = time.monotonic() - t0
    from crossprobe.service.server import free_port

    port = free_port()
    with open(log, "ab") as out:
        server = subprocess.Popen([crossprobe, "serve", "--port", str(port)], env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        answers = query(port, server, log)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    modules = subprocess.run([str(venv / "bin" / "python"), "-c", "import crossprobe.service.app, crossprobe.cli, sys;"
                              "print(sorted({'torch', 'transformers', 'crossprobe.models'} & set(sys.modules)))"],
                             capture_output=True, text=True, env=env).stdout.strip()
    return {"python": version, "torch_importable": not no_torch, "torch_modules_after_import": modules,
            "install_s": round(installed_s, 1), "index_build_s": round(index_s, 1), "answers": answers}


def wait_ready(http: httpx.Client, server: subprocess.Popen, log: Path, timeout_s: float = 300) -> None:
    """Until the service's /readyz answers 200; a RuntimeError with its log's tail if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the service did not become ready: {log.read_text()[-3000:]}")
        try:
            if http.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)


def query(port: int, server: subprocess.Popen, log: Path) -> dict:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        wait_ready(http, server, log)
        out = {}
        for q in QUERIES:
            r = http.post("/v1/search", json={"query": q, "index": "wc", "k": 5, "rerank": "none"})
            r.raise_for_status()
            out[q] = [(h["id"], h["score"]) for h in r.json()["results"]]
        return out


def compare(first: dict, other: dict) -> dict:
    same = all([i for i, _ in first["answers"][q]] == [i for i, _ in other["answers"][q]] for q in QUERIES)
    diff = max(abs(a[1] - b[1]) for q in QUERIES for a, b in zip(first["answers"][q], other["answers"][q]))
    return {"ids_equal": same, "max_score_diff": float(diff)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pythons", default="3.11,3.12,3.13", help="versions (from pyenv or PATH) or interpreter paths")
    ap.add_argument("--work", type=Path, default=ROOT / "artifacts" / "wheel-check")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "research" / "results" / "wheel_check.json")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(args.work)
    spec, graphs, photos = model_and_photos(args.work)
    runs = []
    for v in args.pythons.split(","):
        print(f"Python {v}: a fresh venv with {wheel.name}, no torch; index build, serve, {len(QUERIES)} queries",
              flush=True)
        runs.append(check_python(find_python(v), wheel, spec, graphs, photos, args.work))
    for r in runs:
        r["against_first"] = compare(runs[0], r)
        print(f"  Python {r['python']}: install {r['install_s']} s, index build {r['index_build_s']} s, "
              f"answers as Python {runs[0]['python']}'s: {r['against_first']}")
    ok = all(r["against_first"]["ids_equal"] and r["against_first"]["max_score_diff"] <= 1e-5 for r in runs)
    from crossprobe.core.atomic import atomic_write

    atomic_write(args.out, json.dumps({"command": "make wheel-check", "wheel": wheel.name, "model": "random-weight "
                                       "Hugging Face CLIP (tests/support/reference_models.py, tiny)",
                                       "photos": 12, "queries": QUERIES, "ok": ok, "runs": runs}, indent=1,
                                      ensure_ascii=False) + "\n")
    print(("every Python answered the same" if ok else "ANSWERS DIFFER") + f" -> {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
