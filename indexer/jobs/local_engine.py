"""The single-process engine of build / add / reindex (IndexerSettings.engine = "single", the default).

    decode   `workers` threads, a few journal batches ahead (overlap.run_overlapped; Pillow releases the GIL)
    encode   this thread: the model's backbone + head (encoder.py: the inference seam) and the codec values
    ocr      with OCR on, one thread beside the encoder: the text gate on the batch's grid picks the photos and the
             part of each to read (ocr.py), while the encoder works on the next batch
    write    sink.BatchWriter, in batch order (Redis values, then the journal commit)

ray_engine.py is the same pipeline on Ray Data; both write through the same BatchWriter, so a job killed under
one engine resumes under the other.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

from crossprobe.core.runtime import StageTimer
from crossprobe.indexer.jobs import ocr
from crossprobe.indexer.jobs.decode import Decoded, decode_batch
from crossprobe.indexer.jobs.encoder import job_backend
from crossprobe.indexer.jobs.overlap import run_overlapped
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.indexer.jobs.sink import EncodedBatch
from crossprobe.indexer.jobs.sources import Item
from crossprobe.storage import codec


def encode(
    items: list[Item],
    todo: list[int],
    layout: codec.Layout,
    settings: IndexerSettings,
    times: StageTimer,
    spec,
    model,
    bert,
    write: Callable[[EncodedBatch], None],
) -> None:
    """Decode, encode [and read the words of] the journal batches `todo`, handing each to `write` in order."""
    bs = settings.batch_size
    with times.stage("load_model"):
        model = job_backend(settings, spec, model, bert)
        model.warm("image")
        # one OCR thread beside the encoder's: its engine takes one core (docs/research/text_search.md)
        reader = ocr.Reader(settings.ocr_gate_threshold, 1, model) if settings.ocr else None
    ocr_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ocr") if reader is not None else None
    waiting: list[tuple[EncodedBatch, Future]] = []  # at most one batch whose OCR is running

    def read(uris: list[str], grid: np.ndarray, meta: list[dict]) -> list[dict]:
        with times.stage("ocr"):  # where the text gate, on the grid just computed, sees writing
            return ocr.read_batch(reader, uris, grid, meta)

    def flush() -> None:
        while waiting:
            batch, fut = waiting.pop(0)
            with times.stage("ocr_wait"):  # the encoder idle, waiting for the batch before's OCR
                batch.meta = fut.result()
            write(batch)

    def produce(b: int) -> Decoded:
        return decode_batch(
            items[b * bs : (b + 1) * bs],
            b * bs,
            settings.max_pixels,
            model.preprocess,
            model.image_size,
            settings.reduce_for(model.reduced_decoding),
        )

    def consume(b: int, dec: Decoded) -> None:
        g, values, grid = np.zeros((0, model.dims.d), np.float32), [], None
        if dec.rows:
            with times.stage("backbone"):
                grid = model.image_grid(dec.pixels)  # cells (b, 49, 1280) for crossprobe's own model
            with times.stage("head"):
                e = model.image_features(grid)
            g = e.g
            with times.stage("write_redis"):
                values = codec.encode(layout, e.p_v, e.b_bar, e.s_i, e.labels)
        batch = EncodedBatch(b, dec.rows, dec.meta, dec.skips, values, g)
        flush()
        if ocr_pool is None or grid is None:
            write(batch)
        else:
            waiting.append((batch, ocr_pool.submit(read, [items[r].uri for r in dec.rows], grid.cells, dec.meta)))

    try:
        run_overlapped(todo, produce, consume, settings.decode_workers, times)
        flush()
    finally:
        if ocr_pool is not None:
            ocr_pool.shutdown(wait=True, cancel_futures=True)
