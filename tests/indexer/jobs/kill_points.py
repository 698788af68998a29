"""`python kill_points.py index ...`: the crossprobe CLI, with one function wrapped to SIGKILL the process at the
point CHAOS_KILL_AT names (":n" = at the n-th batch), for the windows too short to hit by timing
(tests/indexer/jobs/test_kill_runs.py, the injected runs; kill_world.POINTS lists the points per command)."""
from __future__ import annotations

import os
import signal
import types
from pathlib import Path

from crossprobe.indexer.jobs import finalize, journal
from crossprobe.storage import faiss_io, keyword, store


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


point, _, n = os.environ["CHAOS_KILL_AT"].partition(":")

if point == "journal_create":  # items.jsonl written, spec.json (the journal's "usable" mark) not
    real_aw = journal.atomic_write
    def journal_aw(path, data):
        if Path(path).name == "spec.json":
            die()
        return real_aw(path, data)
    journal.atomic_write = journal_aw
elif point == "redis_written":  # the n-th batch's Redis values written (pipeline executed), not committed
    real_commit, calls = journal.Journal.commit, [0]
    def commit(self, *a, **k):
        calls[0] += 1
        if calls[0] == int(n):
            die()
        return real_commit(self, *a, **k)
    journal.Journal.commit = commit
elif point == "commit_rename":  # the n-th batch's .npz written and fsynced, not renamed into place
    real_replace, calls = os.replace, [0]
    def replace(src, dst, *a, **k):
        if "/build/batches/" in str(src):
            calls[0] += 1
            if calls[0] == int(n):
                die()
        return real_replace(src, dst, *a, **k)
    os.replace = replace
elif point == "mid_copy":  # half of the kept items' values COPYed into the new version
    real_copy = finalize._copy_values
    def copy_values(st, src, dst, ids, chunk, **kw):
        real_copy(st, src, dst, ids[: len(ids) // 2], chunk, **kw)
        die()
    finalize._copy_values = copy_values
elif point in ("write_index", "write_vectors"):  # before index.faiss / after index.faiss and ids
    setattr(faiss_io, point, lambda *a, **k: die())
elif point == "write_text":  # the keyword index written under its temporary name, not yet renamed
    keyword.sync_tree = lambda folder: die()
elif point == "manifest":  # every file of the version but manifest.json
    real_jaw = finalize.durable_write
    def finalize_aw(path, data):
        if Path(path).name == "manifest.json":
            die()
        return real_jaw(path, data)
    finalize.durable_write = finalize_aw
elif point in ("before_activate", "after_activate"):  # complete, not active / active, journal still there
    real_activate = store.Store.activate
    def activate(self, *a, **k):
        if point == "before_activate":
            die()
        real_activate(self, *a, **k)
        die()
    store.Store.activate = activate
elif point == "journal_rmtree":  # the journal half-removed: rmtree's order is the directory's, any file first
    import shutil
    def rmtree(path, ignore_errors=False, *a, **k):
        p = Path(path)
        if (p / "items.jsonl").exists():
            (p / "items.jsonl").unlink()
            die()
        return shutil.rmtree(path, ignore_errors, *a, **k)
    journal.shutil = types.SimpleNamespace(rmtree=rmtree)
else:
    raise SystemExit(f"unknown kill point {point!r}")

from crossprobe.cli import app  # noqa: E402 - imported once the patch is in place, then run

app()
