"""Is it the code or the host? The service of an older commit and of this checkout, alternated on one host.

    .venv/bin/python -m benchmarks.code_ab --old 10cb137 [--index-root artifacts/bench-service/indexes]
        [--index flickr8k] [--rounds 2] [--requests 300]

The old commit is checked out into a git worktree and put first on the import path (benchmarks/support/old_code.py),
so the same venv runs both. Each round starts `crossprobe
serve` for old, then new, over the same index (built by `make bench`'s service benchmark), and sends 20 warm-up and
--requests timed searches per rerank mode from one client (benchmarks/loadgen.py). Prints p50 / p99 per run.
Nothing else may run meanwhile. The worktree is removed at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from benchmarks.loadgen import Generator, search_requests
from benchmarks.harness import stop_server
from benchmarks.support import old_code
from crossprobe.models.data.flickr8k import Flickr8k


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
    with old_code.checkout(args.old) as old:
        base = {**os.environ, "CROSSPROBE_INDEX_ROOT": str(args.index_root.resolve()), "CROSSPROBE_INDEXES": args.index,
                "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning"}
        base.pop("PYTHONPATH", None)
        for rnd in range(args.rounds):
            for which in ("old", "new"):
                env = old.env(base) if which == "old" else base
                p, port = old_code.serve(env, work / f"{which}.log", old.cli if which == "old" else "crossprobe.cli")
                try:
                    for mode in args.modes.split(","):
                        g = Generator("127.0.0.1", port, search_requests("127.0.0.1", port, captions, mode, args.index))
                        asyncio.run(g.closed_loop(1, 20))
                        s = asyncio.run(g.closed_loop(1, args.requests)).summary()
                        print(f"round {rnd} {which} ({args.old if which == 'old' else 'checkout'}) {mode}: "
                              f"p50 {s['p50_ms']} p99 {s['p99_ms']} ms", flush=True)
                finally:
                    stop_server(p)


if __name__ == "__main__":
    main()
