"""`crossprobe serve --images DIR`: one command from a folder of photos to its search page. The folder's index is
brought in step with it first (built on first use, its model fetched and exported first where it is missing: the
model resolution in crossprobe.core.inference), then served, while a watcher keeps it in step (the same
indexer.jobs.watch.Watcher that `crossprobe index watch` runs, here in a thread of the serving process).

    folder_index(images, name)  the index name a folder gets: --name, else the folder's own name made valid
    FolderSync(...)             the first sync (start) and the watcher thread (watch / stop)
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Callable

from crossprobe.storage.store import NAME_RE


def folder_index(images: Path, name: str | None) -> str:
    """--name as given (checked), else the folder's name with what an index name may not hold replaced by "-"
    (~/Pictures -> "Pictures"; "My Photos 2024" -> "My-Photos-2024")."""
    if name is not None:
        if not NAME_RE.match(name):
            raise ValueError(f"index name {name!r}: letters, digits and _ . - (at most 64, a letter or digit first)")
        return name
    made = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(images).resolve().name).strip("-._")[:64]
    return made if made and NAME_RE.match(made) else "photos"


class FolderSync:
    """One folder, one index: start() indexes what is there now (a first build, or the changes since the last
    run), watch() keeps it in step in a daemon thread until stop()."""

    def __init__(self, name: str, images: Path, settings, say: Callable[[str], None] = print):
        from crossprobe.indexer.jobs.watch import Watcher

        images = Path(images).expanduser()
        if not images.is_dir():
            raise FileNotFoundError(f"--images {images}: no such folder")
        # the watcher's own /metrics port would clash with a second `serve --images`: the service's /metrics is
        # what a user scrapes
        settings = settings.model_copy(update={"watch_metrics_port": 0})
        self.watcher = Watcher(name, images, settings, say=say)
        self.say = say
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Index the folder as it is now: every step until one finds nothing left to do (files still being
        written wait for the watcher)."""
        while self.watcher.step() is not None:
            pass

    def watch(self) -> None:
        self._thread = threading.Thread(target=self._run, name="crossprobe-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.watcher.run(self._stop)
        except Exception as e:  # the service keeps serving what is indexed; the user learns the folder is not followed
            self.say(f"watch {self.watcher.name}: stopped following {self.watcher.folder}: {type(e).__name__}: {e}")

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self.watcher.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
