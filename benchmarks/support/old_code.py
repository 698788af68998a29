"""An older commit's crossprobe beside this checkout's, in the same venv: what benchmarks/code_ab.py times and
tests/storage/test_previous_release.py upgrades from.

The commit is checked out into a git worktree, and a `crossprobe` namespace folder whose packages (models/,
indexer/, service/, and cli/, core/, storage/ where the commit has them) link into it is put first on
PYTHONPATH of the processes that run the old code. A namespace package's portions are searched in path order, so
those packages come from the old tree; the venv (torch, onnxruntime, FAISS...) is shared.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

PACKAGES = ("core", "storage", "models", "indexer", "service", "cli")
PREVIOUS_RELEASE = "02b8dcb"  # crossprobe 0.1.0 (CHANGELOG.md: 2026-11-25), the commit that dated its section


@dataclass(frozen=True)
class OldCode:
    commit: str
    tree: Path  # the worktree
    shim: Path  # the folder to put first on PYTHONPATH

    @property
    def cli(self) -> str:
        """Its command line's module: crossprobe.cli since the commands left service/, crossprobe.service.cli before."""
        return "crossprobe.cli" if (self.tree / "cli").is_dir() else "crossprobe.service.cli"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose Python imports this commit's crossprobe."""
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = str(self.shim)
        return env


def commit_available(commit: str, repo: Path) -> bool:
    return subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


@contextmanager
def checkout(commit: str, repo: Path | None = None) -> Iterator[OldCode]:
    """The commit's code in a temporary worktree, removed at the end."""
    repo = repo or Path(__file__).resolve().parents[2]
    if not commit_available(commit, repo):
        raise RuntimeError(f"commit {commit} is not in {repo} (a shallow clone?): `git fetch --unshallow` gets it")
    work = Path(tempfile.mkdtemp(prefix=f"crossprobe-{commit[:8]}-"))
    tree, shim = work / "tree", work / "shim"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(tree), commit], check=True)
    try:
        (shim / "crossprobe").mkdir(parents=True)
        for d in PACKAGES:
            if (tree / d).is_dir():
                (shim / "crossprobe" / d).symlink_to(tree / d)
        yield OldCode(commit, tree, shim)
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def serve(env: dict[str, str], log: Path, cli: str = "crossprobe.cli", timeout_s: float = 300) -> tuple[subprocess.Popen, int]:
    """`python -m <cli> serve` on a free loopback port, waited for until /readyz is 200 -> (process, port). cli: the
    command line's module of the code env imports (OldCode.cli for an old commit)."""
    from crossprobe.service.server import free_port

    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", cli, "serve", "--port", str(port)], env=env,
                         cwd=tempfile.gettempdir(), stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while True:
        assert p.poll() is None, log.read_text()[-2000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return p, port
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            p.kill()
            raise AssertionError(f"no ready service after {timeout_s:.0f} s:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
