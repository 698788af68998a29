"""How to read the text gate's crop: at what scale, with or without rapidocr's angle classifier (issue 31).

The indexer reads only the part of a photo the text gate points at (indexer/jobs/ocr.py), enlarged as full OCR
would enlarge the whole photo: its shorter side to DET_SHORT_SIDE. This measures, on the dev text-in-image photos
the served gate passes, the words read (as tokens, and also inside a longer token) and the milliseconds per photo
on one thread, for a few scales, with and without the angle classifier. Nothing else may run: it times.

    python -m research.text_search.crop_read     # about a minute; after feature_gate.py's sets exist
        -> docs/research/results/text_search.json ("crop_read")
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from crossprobe.indexer.jobs import ocr
from crossprobe.models.evaluation.report import machine
from research.text_search.feature_gate import SETS, grids, textset
from research.text_search.ocr_compare import tokens

SCALES = (736, 600, 480)


def main() -> None:
    names, paths, _, _ = textset("dev")
    truth = json.loads((SETS / "dev" / "truth.json").read_text())
    reader = ocr.Reader(threads=1)
    cells = reader.cells(grids(paths, "textset-dev"))
    passed = [i for i in range(len(names)) if truth[names[i]] and cells[i].max() >= reader.gate.cfg.threshold]
    rows = {}
    served = ocr.DET_SHORT_SIDE
    for side in SCALES:
        ocr.DET_SHORT_SIDE = side  # read by ocr._scaled at each call
        for cls in (True, False):
            found = inside = total = 0
            ms = []
            for i in passed:
                t = time.perf_counter()
                img = ocr._photo(str(paths[i]))
                box = reader.gate.crop(cells[i], *img.size)
                res, _ = reader._engine()(ocr._scaled(img, box), use_cls=cls)
                ms.append((time.perf_counter() - t) * 1000)
                toks = tokens(" ".join(r[1] for r in res or [] if float(r[2]) >= ocr.MIN_SCORE))
                want = {w.upper() for w in truth[names[i]]}
                found += len(want & toks)
                inside += sum(1 for w in want if any(w in tok for tok in toks))
                total += len(want)
            rows[f"{side} px, {'with' if cls else 'without'} the angle classifier"] = {
                "words_read": round(100 * found / total, 1), "words_read_in_a_token": round(100 * inside / total, 1),
                "ms_per_photo_mean": round(float(np.mean(ms)), 1)}
            print(side, cls, rows[list(rows)[-1]])
    ocr.DET_SHORT_SIDE = served
    out = {"photos": len(passed), "gate_threshold": reader.gate.cfg.threshold, "served": served,
           "rows": rows, "command": "python -m research.text_search.crop_read", "machine": machine()}
    path = Path("docs/research/results/text_search.json")
    res = json.loads(path.read_text())
    res["crop_read"] = out
    path.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
