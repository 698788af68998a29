"""The write end of an encoding job, shared by both engines: one encoded batch -> its Redis values, then its
journal commit, then the job's counters (progress bar, Pushgateway metrics, throttle).

Why one module: the single-process engine (run.encode) and the Ray engine (ray_engine.py) must leave
exactly the same Redis keys and values and the same journal, so that a version built by either is the same
and a job killed under one resumes under either. Both hand this writer the same `Encoded batch`; only where
decode and encode ran differs. The order inside `write` is the journal's contract (journal.py): the SETs
return before the batch's .npz is renamed into place, so a committed batch always has its Redis values.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from crossprobe.core.runtime import StageTimer
from crossprobe.indexer.jobs.journal import Journal
from crossprobe.indexer.jobs.push import JobMetrics
from crossprobe.indexer.jobs.sources import Item, Skip, item_metadata
from crossprobe.storage.store import KeyLayout, Store


@dataclass
class EncodedBatch:
    """Journal batch `b` after decode and encode (positions are indexes into the job's frozen item list)."""

    b: int
    rows: list[int]  # positions that decoded, in order
    meta: list[dict]  # per row: width, height, format (+ EXIF taken, camera) of the original file
    skips: list[tuple[int, Skip]]  # (position, why) for the rest
    values: list[bytes]  # per row: the codec value (P_v, b_bar, s_I [, labels]) for Redis
    g: np.ndarray  # (len(rows), d) float32 two-tower vectors, for the journal (FAISS is written once, at the end)


class BatchWriter:
    def __init__(
        self,
        keys: KeyLayout,
        items: list[Item],
        journal: Journal,
        store: Store,
        times: StageTimer,
        metrics: JobMetrics | None,
        bar,
        throttle_s: float = 0.0,
    ):
        self.keys, self.items = keys, items  # the version's key names (hash-tagged on a cluster: store.py)
        self.journal, self.store, self.times = journal, store, times
        self.metrics, self.bar, self.throttle_s = metrics, bar, throttle_s
        self.encoded = 0  # items written by this run
        self.skipped = 0  # decode skips committed by this run

    def write(self, eb: EncodedBatch) -> None:
        st, keys, items = self.store, self.keys, self.items
        with st.r.pipeline(transaction=False) as pipe:
            with self.times.stage("write_redis"):
                for row, val, meta in zip(eb.rows, eb.values, eb.meta):
                    it = items[row]
                    if val:  # a two-tower-only model's value is 0 bytes (codec.Layout.empty): nothing to store
                        pipe.set(keys.feat(it.id), val)
                    pipe.set(keys.meta(it.id), json.dumps(item_metadata(it, meta), ensure_ascii=False))
                for row, _ in eb.skips:  # a value left by an earlier, killed attempt whose file has since gone bad
                    pipe.unlink(keys.feat(items[row].id), keys.meta(items[row].id))  # one slot: an item's two keys
                pipe.execute()
        with self.times.stage("commit"):
            self.journal.commit(eb.b, eb.rows, eb.g, eb.skips)
        self.encoded += len(eb.rows)
        self.skipped += len(eb.skips)
        if self.metrics:
            self.metrics.advance(len(eb.rows) + len(eb.skips), len(eb.skips), len(eb.rows))
        self.bar.update(len(eb.rows) + len(eb.skips))
        self.bar.set_postfix(skipped=self.skipped, refresh=False)
        if self.throttle_s:
            time.sleep(self.throttle_s)
