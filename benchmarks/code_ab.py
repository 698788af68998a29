"""Is it the code or the host? The service of an older commit and of this checkout, alternated on one host.

    .venv/bin/python -m benchmarks.code_ab --old 10cb137 [--index-root artifacts/bench-service/indexes]
        [--index flickr8k] [--rounds 2] [--requests 300]

The old commit is checked out into a git worktree and put first on the import path (a `crossprobe` namespace
folder whose models/, indexer/, service/ (and cli/, where the commit has it) link into it), so the same venv runs both. Each round starts `crossprobe
serve` for old, then new, over the same index (built by `make bench`'s service benchmark), and sends 20 warm-up and
--requests timed searches per rerank mode from one client (benchmarks/loadgen.py). Prints p50 / p99 per run.
Nothing else may run meanwhile. The worktree is removed at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.loadgen import Generator, search_requests
from benchmarks.harness import stop_server
from crossprobe.models.data.flickr8k import Flickr8k
from crossprobe.service.server import free_port


def serve(env: dict, log: Path, cli: str) -> tuple[subprocess.Popen, int]:
    """`python -m <cli> serve`: cli is the command line's module of that commit (crossprobe.cli since it left
    service/, crossprobe.service.cli before)."""
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", cli, "serve", "--port", str(port)], env=env,
                         cwd=tempfile.gettempdir(), stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while True:
        assert p.poll() is None, log.read_text()[-2000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return p, port
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="a commit of this repository")
    ap.add_argument("--index-root", type=Path, default=Path("artifacts/bench-service/indexes"))
    ap.add_argument("--index", default="flickr8k")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--modes", default="cp,none")
    args = ap.parse_args()
    ds = Flickr8k.load()
    captions = [ds.captions[j] for j in ds.captions_of(ds.splits["test"])][:400]
    work = Path(tempfile.mkdtemp(prefix="code-ab-"))
    tree, shim = work / "tree", work / "shim" / "crossprobe"
    subprocess.run(["git", "worktree", "add", "-q", str(tree), args.old], check=True)
    try:
        shim.mkdir(parents=True)
        for d in ("models", "indexer", "service", "cli"):
            if (tree / d).is_dir():
                (shim / d).symlink_to(tree / d)
        base = {**os.environ, "CROSSPROBE_INDEX_ROOT": str(args.index_root.resolve()), "CROSSPROBE_INDEXES": args.index,
                "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning"}
        base.pop("PYTHONPATH", None)
        for rnd in range(args.rounds):
            for which in ("old", "new"):
                env = {**base, "PYTHONPATH": str(shim.parent)} if which == "old" else base
                cli = "crossprobe.cli" if which == "new" or (tree / "cli").is_dir() else "crossprobe.service.cli"
                p, port = serve(env, work / f"{which}.log", cli)
                try:
                    for mode in args.modes.split(","):
                        g = Generator("127.0.0.1", port, search_requests("127.0.0.1", port, captions, mode, args.index))
                        asyncio.run(g.closed_loop(1, 20))
                        s = asyncio.run(g.closed_loop(1, args.requests)).summary()
                        print(f"round {rnd} {which} ({args.old if which == 'old' else 'checkout'}) {mode}: "
                              f"p50 {s['p50_ms']} p99 {s['p99_ms']} ms", flush=True)
                finally:
                    stop_server(p)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=False)


if __name__ == "__main__":
    main()
