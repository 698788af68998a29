"""Words in images at index time (CROSSPROBE_INDEX_OCR=true): rapidocr-onnxruntime where the text gate sees writing.

Why rapidocr: on a text-in-image set it read four times the words tesseract read, with a third of the spurious
words, at about 200 ms a photo on one thread (docs/research/text_search.md). Its PP-OCRv4 ONNX models ship in
its wheel: nothing is downloaded.

Why a gate: most photos carry no text, and full OCR of every photo would cut indexing to a few photos a second
per core. The gate is core/text_gate.py: a probe over the backbone grid the encoder has just computed, so it
costs nothing; it says which photos hold writing and where. Only those photos are read, and only the part the
gate points at (the passing cells, widened by a cell), at the scale full OCR would read the whole photo at: its
shorter side enlarged to DET_SHORT_SIDE. Threshold 0 (CROSSPROBE_INDEX_OCR_GATE_THRESHOLD=0) reads every photo
whole. Recall and cost against rapidocr's own detector as the gate: docs/research/text_search.md.

What is kept: the recognised lines joined by spaces (at most MAX_CHARS characters: an image of a page with
10,000 words keeps its first ones), as the item's metadata "text", which the keyword index holds
(storage/keyword.py) and search answers show. A photo whose OCR fails keeps its vectors: its metadata
gets "text_error" instead (logged and counted in the job's report), never a lost item.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
from PIL import Image, ImageOps

from crossprobe.core import image_formats

log = logging.getLogger("crossprobe.indexer")

MAX_CHARS = 2000
MAX_SIDE = 1280  # the photo OCR sees: a 50 MP or 400 MP photo is scaled to this first (draft decoding for JPEG)
# a smaller photo is enlarged so that its shorter side is this, for detection (rapidocr's own default is 736; 600
# reads as many words of the gate's crops, faster: docs/research/text_search.md, "Reading the crop")
DET_SHORT_SIDE = 600
DET_MAX_SIDE = 2000  # and nothing the detector sees is longer than this (rapidocr's max_side_len)
MIN_SCORE = 0.5  # recognition confidence below this: a texture read as letters, dropped


class OcrUnavailable(RuntimeError):
    """OCR was asked for and rapidocr-onnxruntime is not installed."""


class Reader:
    """One engine per thread (the engines hold per-run state); the ONNX sessions release the GIL.
    threshold: the text gate's (None: the trained one; 0: no gate, every photo read whole). threads: ONNX Runtime
    intra-op threads of each engine (-1: its default, one per core, as the encoder's). model: the job's Backend,
    whose text gate reads its grid (default: crossprobe's own backbone's)."""

    def __init__(self, threshold: float | None = None, threads: int = 1, model=None):
        try:
            import rapidocr_onnxruntime  # noqa: F401
        except ImportError as e:
            raise OcrUnavailable(
                "CROSSPROBE_INDEX_OCR=true needs rapidocr-onnxruntime: pip install 'crossprobe[ocr]'"
            ) from e
        if model is None:
            from crossprobe.core import inference

            model = inference.load(None, inference.RuntimeOptions())
        self.gate = model.text_gate(threshold) if threshold != 0 else None
        self.threads = threads
        self._local = threading.local()

    def _engine(self):
        eng = getattr(self._local, "engine", None)
        if eng is None:
            _share_pool_when_shared()
            from rapidocr_onnxruntime import RapidOCR

            # the caller scales the crop (_scaled): the detector takes it as it is, up to DET_MAX_SIDE
            eng = self._local.engine = RapidOCR(
                intra_op_num_threads=self.threads,
                inter_op_num_threads=1,
                det_limit_side_len=DET_MAX_SIDE,
                det_limit_type="max",
            )
        return eng

    def cells(self, grid: np.ndarray) -> np.ndarray:
        """(B, 49, 1280) backbone grid -> (B, 49) the gate's cell probabilities (all 1 without a gate)."""
        return self.gate.cells(grid) if self.gate is not None else np.ones(grid.shape[:2], np.float32)

    def read(self, path: str, cells: np.ndarray) -> dict:
        """A decodable image file, its (49,) cell probabilities -> {"text": words} where the gate passes and words
        are read, {} where not, {"text_error": why} where OCR fails."""
        if self.gate is not None and float(cells.max()) < self.gate.cfg.threshold:
            return {}  # most photos: nothing decoded again
        try:
            img = _photo(path)
            box = self.gate.crop(cells, *img.size) if self.gate is not None else (0, 0, *img.size)
            # no angle classifier: it only turns lines read upside down, rare in photos (as many words read on dev)
            result, _ = self._engine()(_scaled(img, box), use_cls=False)
            words = " ".join(r[1] for r in result or [] if float(r[2]) >= MIN_SCORE and r[1].strip())
            return {"text": words[:MAX_CHARS]} if words else {}
        except Exception as e:  # noqa: BLE001 - the item keeps its vectors; its text is what is lost, and said
            log.warning("OCR failed on %s: %s: %s", path, type(e).__name__, e)
            return {"text_error": f"{type(e).__name__}: {e}"[:200]}


def read_batch(reader: Reader | None, uris: list[str], grid: np.ndarray, meta: list[dict]) -> list[dict]:
    """The decoded rows' metadata with each row's OCR result merged in (reader None: OCR off, unchanged)."""
    if reader is None or not uris:
        return meta
    cells = reader.cells(grid)
    return [{**m, **reader.read(u, c)} for u, c, m in zip(uris, cells, meta)]


_patched = threading.Lock()


def _share_pool_when_shared() -> None:
    """In a process where crossprobe's models run on ONNX Runtime's process-wide thread pool (the service:
    core/runtime.py share_thread_pool), a session with threads of its own cannot be created ("use_per_session_threads
    must be false when using a global thread pool"), and rapidocr builds its sessions with their own. Its session
    options then get use_per_session_threads = False too (rapidocr_onnxruntime 1.4's one options factory)."""
    from crossprobe.core import runtime

    with _patched:
        from rapidocr_onnxruntime.utils import infer_engine

        cls = infer_engine.OrtInferSession
        if getattr(cls, "_crossprobe_shared", False):
            return
        own = cls._init_sess_opts

        def init(config):
            opts = own(config)
            if runtime.shared_pool_threads() is not None:
                opts.use_per_session_threads = False
            return opts

        cls._init_sess_opts = staticmethod(init)
        cls._crossprobe_shared = True


def _photo(path: str) -> Image.Image:
    """The photo in RGB, longer side at most MAX_SIDE, EXIF orientation applied."""
    with image_formats.open_path(path, MAX_SIDE) as pic:
        img = ImageOps.exif_transpose(pic.image).convert("RGB")
    img.thumbnail((MAX_SIDE, MAX_SIDE))
    return img


def _scaled(img: Image.Image, box: tuple[int, int, int, int]) -> np.ndarray:
    """The box of the photo at the scale full OCR would read the whole photo at -> (h, w, 3) uint8 BGR (the
    engine's OpenCV order)."""
    s = max(1.0, DET_SHORT_SIDE / min(img.size))
    crop = img.crop(box)
    s = min(s, DET_MAX_SIDE / max(crop.size))
    if s != 1.0:
        crop = crop.resize((max(1, round(crop.width * s)), max(1, round(crop.height * s))), Image.Resampling.BILINEAR)
    return np.ascontiguousarray(np.asarray(crop)[:, :, ::-1])
