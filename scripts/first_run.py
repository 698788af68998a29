"""A user's first run, counted: from nothing to answers over their own folder with a chosen model, in the two
commands the README's first screen shows, on a fresh Python 3.13 virtualenv with no PyTorch:

    pip install crossprobe                                          (here: the wheel built from this tree)
    crossprobe serve --images PHOTOS --model immich:<hub repo id>   (downloads, indexes, serves)

The hub is a local stand-in (tests/support/stand_in_hub.py, which huggingface_hub's own client reaches through
HF_ENDPOINT) serving an Immich-layout repo written from a random-weight CLIP; the photos are 12 generated JPEGs.
The command's output is kept (what the user sees), the search page's first answers are checked against the
repo's own graphs run here, and the whole run is written to docs/research/results/first_run.json (--out).

    make first-run                       # Python 3.13 from pyenv
    PYTHONPATH=.:scripts python scripts/first_run.py --python /usr/bin/python3.13
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

from wheel_check import build_wheel, find_python, run, wait_ready, write_photos  # scripts/ is on PYTHONPATH (make first-run)

ROOT = Path(__file__).resolve().parents[1]
REPO = "test-org/ViT-tiny__random"
QUERIES = ["a dog runs on the beach", "Pies biegnie po plaży", "a red car", "sunset over the sea"]


def hub_repo(root: Path) -> Path:
    """The stand-in hub's repo: Immich's layout, from the tests' random tiny CLIP (torch here, on the hub's side)."""
    from transformers import AutoTokenizer

    from crossprobe.models import families
    from tests.core.inference import immich_layout
    from tests.support import reference_models as rm

    shutil.rmtree(root, ignore_errors=True)
    ref = rm.build("hf_clip", root.parent / "ref", size="tiny")
    immich_layout.write(root / REPO, families.load(f"hf:{ref.path}"), AutoTokenizer.from_pretrained(ref.path), 77)
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default="3.13", help="a version (pyenv's or on PATH) or an interpreter's path")
    ap.add_argument("--work", type=Path, default=ROOT / "artifacts" / "first-run")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "research" / "results" / "first_run.json")
    args = ap.parse_args(argv)
    from crossprobe.core import inference
    from crossprobe.service.server import free_port
    from tests.support.stand_in_hub import StandInHub

    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    wheel = build_wheel(work)
    hub_root = hub_repo(work / "hub")
    folder = write_photos(work / "home" / "Pictures")
    python = find_python(args.python)
    version = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    venv, log = work / "venv", work / "install.log"
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("CROSSPROBE_", "REDIS_URL", "PYTHONPATH", "HF_", "TRANSFORMERS_"))}
    run([str(python), "-m", "venv", str(venv)], log, clean)
    t0 = time.monotonic()
    commands = [f"pip install {wheel.name}"]
    run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], log, clean, timeout=1800)
    install_s = time.monotonic() - t0
    torch_importable = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"],
                                      capture_output=True).returncode == 0
    spec = f"immich:{REPO}"
    port = free_port()
    commands.append(f"crossprobe serve --images ~/Pictures --model {spec}")
    with StandInHub(hub_root) as hub:
        env = {**clean, "HF_ENDPOINT": hub.url, "HF_HOME": str(work / "home" / ".cache" / "huggingface"),
               "HOME": str(work / "home"), "PATH": f"{venv / 'bin'}:{clean.get('PATH', '')}"}
        out_path = work / "serve.log"
        t0 = time.monotonic()
        with open(out_path, "wb") as out:
            server = subprocess.Popen(["crossprobe", "serve", "--images", str(folder), "--model", spec, "--port",
                                       str(port)], cwd=work / "home", env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            answers, ready_s = _answers(port, server, out_path, t0)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        fetched = sorted({r[1].split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.requests
                          if r[0] == "GET" and "/resolve/" in r[1]})
    shown = out_path.read_text(errors="replace")
    # the same repo's graphs run here, over the same photos: the answers must be theirs
    own = inference.load(f"immich:{hub_root / REPO}", inference.RuntimeOptions(threads=1))
    from tests.support.reference_models import open_images

    names = sorted(p.name for p in folder.iterdir())
    g = own.encode_images(np.stack([own.preprocess(im) for im in open_images([folder / n for n in names])])).g
    diffs = []
    for q in QUERIES:
        want = dict(zip(names, (g @ own.encode_texts([q])[0].g_q).tolist()))
        diffs += [abs(score - want[i]) for i, score in answers[q]]
    ok = (not torch_importable and len(commands) == 2 and all(len(a) == len(names) for a in answers.values())
          and max(diffs) <= 1e-4 and "Traceback" not in shown)
    result = {"command": "make first-run", "python": version, "wheel": wheel.name, "commands": commands,
              "commands_count": len(commands), "torch_importable": torch_importable, "install_s": round(install_s, 1),
              "serve_ready_s": round(ready_s, 1), "hub": "a local stand-in (tests/support/stand_in_hub.py), HF_ENDPOINT",
              "model": f"{spec}: Immich's layout, a random-weight tiny CLIP", "files_fetched": fetched,
              "photos": len(names), "queries": QUERIES, "max_score_diff_to_the_repos_graphs": float(max(diffs)),
              "what_the_user_sees": [line for line in shown.splitlines()
                                     if not line.startswith(("INFO:", "20")) and "it/s]" not in line][:14],
              "ok": ok}
    from crossprobe.core.atomic import atomic_write

    atomic_write(args.out, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: result[k] for k in ("python", "commands", "torch_importable", "serve_ready_s",
                                             "max_score_diff_to_the_repos_graphs", "ok")}, ensure_ascii=False))
    return 0 if ok else 1


def _answers(port: int, server: subprocess.Popen, log: Path, t0: float) -> tuple[dict, float]:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        wait_ready(http, server, log, 600)
        ready_s = time.monotonic() - t0
        out = {}
        for q in QUERIES:  # no "index": the folder's index is the default one
            r = http.post("/v1/search", json={"query": q, "k": 50, "mode": "vector"})
            r.raise_for_status()
            out[q] = [(h["id"], h["score"]) for h in r.json()["results"]]
        return out, ready_s


if __name__ == "__main__":
    sys.exit(main())
