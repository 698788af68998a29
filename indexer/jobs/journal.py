"""The progress journal that makes a build resumable after SIGKILL at any moment.

<version>/build/
  items.jsonl         the item list, frozen at the first start (a resumed build
                      never re-walks the folder, so batch b always means the same items)
  reader_skips.json   bad manifest lines / duplicate ids found by the reader
  spec.json           what is being built; written last, so it marks a usable journal
  batches/NNNNNN.npz  one per committed batch: rows (b,) positions in items.jsonl,
                      g (b, d) float32, skip_rows / skip_reason / skip_error

A batch is committed by renaming its .npz into place *after* its Redis SETs
returned, so a batch file implies its Redis values exist; a batch killed before
its rename is recomputed and its SETs repeated (idempotent, same bytes).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from crossprobe.core.atomic import atomic_path
from crossprobe.core.atomic import durable_write as atomic_write  # fsynced: an index survives a power cut
from crossprobe.indexer.jobs.sources import Item, Skip


class Journal:
    def __init__(self, version_dir: Path):
        self.dir = Path(version_dir) / "build"
        self.batches = self.dir / "batches"

    @property
    def exists(self) -> bool:
        return (self.dir / "spec.json").exists()

    def create(self, spec: dict, items: list[Item], reader_skips: list[Skip]) -> None:
        self.batches.mkdir(parents=True, exist_ok=True)
        atomic_write(self.dir / "items.jsonl", "".join(it.to_json() + "\n" for it in items))
        atomic_write(self.dir / "reader_skips.json", json.dumps([s.__dict__ for s in reader_skips]))
        atomic_write(self.dir / "spec.json", json.dumps(spec, indent=1, sort_keys=True))

    def spec(self) -> dict:
        return json.loads((self.dir / "spec.json").read_text())

    def items(self) -> list[Item]:
        with open(self.dir / "items.jsonl", encoding="utf-8") as f:
            return [Item.from_json(line) for line in f if line.strip()]

    def reader_skips(self) -> list[Skip]:
        return [Skip(**d) for d in json.loads((self.dir / "reader_skips.json").read_text())]

    def committed(self) -> set[int]:
        return {int(p.name[:-4]) for p in self.batches.glob("[0-9]*.npz")}

    def commit(self, batch: int, rows: list[int], g: np.ndarray, skips: list[tuple[int, Skip]]) -> None:
        """rows (b,), g (b, d) float32; skips [(position, Skip)]. Atomic: temp file, fsync, rename."""
        with atomic_path(self.batches / f"{batch:06d}.npz", fsync=True) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                rows=np.asarray(rows, np.int64),
                g=np.asarray(g, np.float32),
                skip_rows=np.asarray([r for r, _ in skips], np.int64),
                skip_reason=np.asarray([s.reason for _, s in skips], dtype=str),
                skip_error=np.asarray([s.error for _, s in skips], dtype=str),
            )

    def progress(self, items: list[Item], batch_size: int) -> tuple[int, int]:
        """(items done, of which skipped) in the committed batches: where a resumed run starts its count."""
        done = skipped = 0
        for b in self.committed():
            done += len(items[b * batch_size : (b + 1) * batch_size])
            with np.load(self.batches / f"{b:06d}.npz") as z:
                skipped += len(z["skip_rows"])  # reads only that member of the .npz
        return done, skipped

    def load(self, items: list[Item], d: int) -> tuple[np.ndarray, np.ndarray, list[Skip]]:
        """-> rows (M,) ascending, g (M, d), skips (in item order) over every committed batch."""
        rows, gs, skips = [], [], []
        for b in sorted(self.committed()):
            with np.load(self.batches / f"{b:06d}.npz") as z:
                rows.append(z["rows"])
                gs.append(z["g"].reshape(-1, d))
                for r, reason, err in zip(z["skip_rows"], z["skip_reason"], z["skip_error"]):
                    it = items[int(r)]
                    skips.append(Skip(it.id, it.uri, str(reason), str(err)))
        if not rows:
            return np.zeros(0, np.int64), np.zeros((0, d), np.float32), skips
        return np.concatenate(rows), np.concatenate(gs), skips

    def remove(self) -> None:
        """Rename build/ away first (atomic), then delete it. A plain rmtree removes files in directory order,
        so a kill in the middle could leave spec.json (the "usable journal" mark) without items.jsonl or some
        batches: every later run of the same command then resumed that broken journal and failed (build:
        FileNotFoundError on items.jsonl, for good), as the kill run injected at journal_rmtree in
        tests/indexer/jobs/test_kill_runs.py found. A leftover build.removed is garbage only (Store.gc deletes it,
        the next remove() here too)."""
        trash = self.dir.with_name(self.dir.name + ".removed")
        shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(self.dir, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)
