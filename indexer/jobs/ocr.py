"""Words in images at index time (CROSSPROBE_INDEX_OCR=true): rapidocr-onnxruntime behind a detector gate.

Why rapidocr: on a text-in-image set it read four times the words tesseract read, with a third of the spurious
words, at about 220 ms a photo on one thread (docs/research/text_search.md). Its PP-OCRv4 ONNX models ship in
its wheel: nothing is downloaded.

Why a gate: most photos carry no text, and full OCR of every photo would cut indexing to a few photos a second
per core. The gate runs the text detector alone on the photo scaled to a longer side of `ocr_gate_side` (480 px:
about 13 ms); only a photo where it finds a text box is read in full (detection at the engine's own 736 px, then
recognition of each box). Its recall and cost: docs/research/text_search.md.

What is kept: the recognised lines joined by spaces (at most MAX_CHARS characters: an image of a page with
10,000 words keeps its first ones), as the item's metadata "text", which the keyword index holds
(indexer/storage/keyword.py) and search answers show. A photo whose OCR fails keeps its vectors: its metadata
gets "text_error" instead (logged and counted in the job's report), never a lost item.
"""
from __future__ import annotations

import logging
import threading

import numpy as np
from PIL import ImageOps

from crossprobe.models import image_formats

log = logging.getLogger("crossprobe.indexer")

MAX_CHARS = 2000
MAX_SIDE = 1280  # the photo OCR sees: a 50 MP or 400 MP photo is scaled to this first (draft decoding for JPEG)
MIN_SCORE = 0.5  # recognition confidence below this: a texture read as letters, dropped


class OcrUnavailable(RuntimeError):
    """OCR was asked for and rapidocr-onnxruntime is not installed."""


class Reader:
    """One engine per decode thread (the engines hold per-run state); the ONNX sessions release the GIL."""

    def __init__(self, gate_side: int = 480, threads: int = 1):
        try:
            import rapidocr_onnxruntime  # noqa: F401
        except ImportError as e:
            raise OcrUnavailable("CROSSPROBE_INDEX_OCR=true needs rapidocr-onnxruntime: "
                                 "pip install 'crossprobe[ocr]'") from e
        self.gate_side, self.threads = gate_side, threads
        self._local = threading.local()

    def _engines(self):
        eng = getattr(self._local, "engines", None)
        if eng is None:
            _share_pool_when_shared()
            from rapidocr_onnxruntime import RapidOCR

            full = RapidOCR(intra_op_num_threads=self.threads, inter_op_num_threads=1)
            gate = RapidOCR(intra_op_num_threads=self.threads, inter_op_num_threads=1,
                            det_limit_side_len=self.gate_side, det_limit_type="max") if self.gate_side else None
            eng = self._local.engines = (gate, full)
        return eng

    def read(self, path: str) -> dict:
        """A decodable image file -> {"text": words} when the gate passes and words are read, {} when not,
        {"text_error": why} when OCR fails."""
        try:
            bgr = _pixels(path)
            gate, full = self._engines()
            if gate is not None:  # gate_side 0: every photo is read in full
                boxes, _ = gate(bgr, use_det=True, use_cls=False, use_rec=False)
                if not boxes:
                    return {}
            result, _ = full(bgr)
            words = " ".join(r[1] for r in result or [] if float(r[2]) >= MIN_SCORE and r[1].strip())
            return {"text": words[:MAX_CHARS]} if words else {}
        except Exception as e:  # noqa: BLE001 - the item keeps its vectors; its text is what is lost, and said
            log.warning("OCR failed on %s: %s: %s", path, type(e).__name__, e)
            return {"text_error": f"{type(e).__name__}: {e}"[:200]}


_patched = threading.Lock()


def _share_pool_when_shared() -> None:
    """In a process where crossprobe's models run on ONNX Runtime's process-wide thread pool (the service:
    models/runtime.py share_thread_pool), a session with threads of its own cannot be created ("use_per_session_threads
    must be false when using a global thread pool"), and rapidocr builds its sessions with their own. Its session
    options then get use_per_session_threads = False too (rapidocr_onnxruntime 1.4's one options factory)."""
    from crossprobe.models import runtime

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


def _pixels(path: str) -> np.ndarray:
    """(h, w, 3) uint8 BGR (the engine's OpenCV order), longer side at most MAX_SIDE, EXIF orientation applied."""
    with image_formats.open_path(path, MAX_SIDE) as pic:
        img = ImageOps.exif_transpose(pic.image).convert("RGB")
        img.thumbnail((MAX_SIDE, MAX_SIDE))
        return np.ascontiguousarray(np.asarray(img)[:, :, ::-1])
