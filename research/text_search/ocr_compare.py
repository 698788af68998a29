"""Which OCR engine reads the words in photos, how well and how fast, and how cheaply can a gate skip photos
without text (issue 31, item 1). Measured on textset.py's set (words on signs, screens and paper in Flickr8k
photos, and as many photos left as they are).

    python -m research.text_search.textset --split dev --n 200
    python -m research.text_search.ocr_compare [--set artifacts/textset/dev] [--threads 1]
        -> docs/research/results/text_search.json "ocr" (per engine: word recall, photos read whole, spurious
           words per photo without text, ms per photo; the gate's recall, pass rate and ms), printed as a table

Engines: rapidocr-onnxruntime (PP-OCRv4 detection + recognition, ONNX models inside its wheel) and Debian's
tesseract-ocr 5 with its English data, through pytesseract (page segmentation 11: sparse text, which photos
are). A word counts as read when the engine's output holds it as a token (upper-cased; codes like K7-2291 as
one token; word_recall_in_a_token also counts it inside a longer token, as in "POSTOFFICE" for two words the
engine ran together). Gate: rapidocr's detector alone on the photo scaled to a longer side of GATE_SIDE px: text likely
when it finds a box. Timing: one photo at a time, the engine's threads set by --threads; nothing else may run.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from crossprobe.models.evaluation.report import machine

TOKEN = re.compile(r"[A-Z0-9]+(?:-[A-Z0-9]+)*")
GATE_SIDE = 480


def tokens(text: str) -> set[str]:
    return set(TOKEN.findall(text.upper()))


class Rapid:
    name = "rapidocr-onnxruntime"

    def __init__(self, threads: int):
        from rapidocr_onnxruntime import RapidOCR

        self.ocr = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1)
        self.gate_ocr = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1, det_limit_side_len=GATE_SIDE,
                                 det_limit_type="max")

    def read(self, rgb: np.ndarray) -> str:
        result, _ = self.ocr(rgb[:, :, ::-1])  # it takes OpenCV's BGR
        return " ".join(r[1] for r in result or [])

    def gate(self, rgb: np.ndarray) -> bool:
        result, _ = self.gate_ocr(rgb[:, :, ::-1], use_det=True, use_cls=False, use_rec=False)
        return bool(result)


class Tesseract:
    name = "tesseract-5 (pytesseract, psm 11)"

    def __init__(self, threads: int):
        import os

        import pytesseract

        os.environ["OMP_THREAD_LIMIT"] = str(threads)
        self.t = pytesseract

    def read(self, rgb: np.ndarray) -> str:
        return self.t.image_to_string(Image.fromarray(rgb), lang="eng", config="--psm 11")


def run(engine, truth: dict, folder: Path, read_any: dict | None = None) -> dict:
    """read_any, if given, gets per photo with text whether the engine read at least one of its words."""
    found = inside = total = whole = with_text = 0
    spurious, ms = [], []
    for name, words in truth.items():
        rgb = np.asarray(Image.open(folder / name).convert("RGB"))
        t = time.perf_counter()
        out = tokens(engine.read(rgb))
        ms.append((time.perf_counter() - t) * 1000)
        if words:
            want = {w.upper() for w in words}
            found += len(want & out)
            inside += sum(1 for w in want if any(w in tok for tok in out))  # also "POSTOFFICE" for POST, OFFICE
            total += len(want)
            whole += want <= out
            with_text += 1
            if read_any is not None:
                read_any[name] = any(any(w in tok for tok in out) for w in want)
        else:
            spurious.append(sum(1 for tok in out if len(tok) >= 3))
    return {"word_recall": round(found / total, 4), "word_recall_in_a_token": round(inside / total, 4),
            "photos_read_whole": round(whole / with_text, 4),
            "spurious_words_per_photo_without_text": round(float(np.mean(spurious)), 3),
            "ms_per_photo": {"p50": round(statistics.median(ms), 1), "mean": round(float(np.mean(ms)), 1),
                             "p90": round(float(np.percentile(ms, 90)), 1)},
            "photos": len(ms)}


def gate(engine: Rapid, truth: dict, folder: Path, read_any: dict) -> dict:
    """The detector gate's recall on photos with text, and on those of them OCR reads at least a word of (what
    the gate must not lose), its pass rate on photos without text, and its cost."""
    hit = {True: 0, False: 0}
    n = {True: 0, False: 0}
    kept_readable = []
    ms = []
    for name, words in truth.items():
        rgb = np.asarray(Image.open(folder / name).convert("RGB"))
        t = time.perf_counter()
        likely = engine.gate(rgb)
        ms.append((time.perf_counter() - t) * 1000)
        hit[bool(words)] += likely
        n[bool(words)] += 1
        if read_any.get(name):
            kept_readable.append(likely)
    return {"how": f"rapidocr's detector alone at a longer side of {GATE_SIDE} px: text likely when it finds a box",
            "recall_on_photos_with_text": round(hit[True] / n[True], 4),
            "recall_on_photos_rapidocr_reads": round(float(np.mean(kept_readable)), 4),
            "pass_rate_on_photos_without_text": round(hit[False] / n[False], 4),
            "ms_per_photo": {"p50": round(statistics.median(ms), 1), "mean": round(float(np.mean(ms)), 1)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", type=Path, default=Path("artifacts/textset/dev"))
    ap.add_argument("--threads", type=int, default=1, help="threads per engine (the indexer runs OCR beside the encoder)")
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/text_search.json"))
    args = ap.parse_args()
    truth = json.loads((args.set / "truth.json").read_text())
    folder = args.set / "images"
    res: dict = {"set": {"path": str(args.set), "photos_with_text": sum(bool(w) for w in truth.values()),
                         "photos_without_text": sum(not w for w in truth.values()),
                         "words": sum(len(w) for w in truth.values())},
                 "engines": {}, "threads": args.threads}
    rapid = Rapid(args.threads)
    readable: dict = {}
    for engine in (rapid, Tesseract(args.threads)):
        engine.read(np.zeros((64, 64, 3), np.uint8))  # load and warm up outside the timing
        res["engines"][engine.name] = run(engine, truth, folder, readable if engine is rapid else None)
        print(engine.name, res["engines"][engine.name], flush=True)
    res["gate"] = gate(rapid, truth, folder, readable)
    print("gate", res["gate"])
    res["command"] = f"python -m research.text_search.ocr_compare --set {args.set} --threads {args.threads}"
    res["machine"] = machine()
    j = json.loads(args.out.read_text()) if args.out.exists() else {}
    j["ocr"] = res
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(j, indent=1))


if __name__ == "__main__":
    main()
