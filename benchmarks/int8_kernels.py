"""int8 query graphs on this host's kernel path: for each family (random-weight Hugging Face CLIP and SigLIP at
tiny and ViT-B/32 text-tower shapes, and the committed checkpoint's query tower), both weight formats (s8: int8
weights, U8S8 kernels; u8: uint8 weights, U8U8 kernels): the lowest cosine to fp32 over core/int8.py's probe
queries and the encode ms per query (1 ONNX Runtime thread, median). One row set per kernel path, merged into
docs/research/results/int8_kernels.json (a run on another kind of host adds its own).

Run it on each kind of host, and on an emulated AVX2 host without VNNI (QEMU's user mode reports the emulated
CPU's CPUID to ONNX Runtime and numpy; its timings are the emulator's, so they are recorded as not comparable):
    python -m benchmarks.int8_kernels
    python -m benchmarks.int8_kernels --work artifacts/int8-kernels --out /tmp/exports.json --repeat 1  # exports
    qemu-x86_64 -cpu Haswell .venv/bin/python -m benchmarks.int8_kernels --work artifacts/int8-kernels \
        --repeat 1 --no-base --emulated "qemu-x86_64 -cpu Haswell"
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from crossprobe.core import int8
from crossprobe.core.atomic import atomic_write

OUT = Path("docs/research/results/int8_kernels.json")


def _timed(run, texts: list[str], repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        for t in texts:
            t0 = time.perf_counter()
            run(t)
            ts.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(ts), 3)


def family_rows(tmp: Path, repeat: int, base: bool = True) -> dict:
    """Random Hugging Face CLIP / SigLIP text towers exported as a user's would be."""
    from crossprobe.core import runtime
    from crossprobe.models import families
    from crossprobe.core.inference import RuntimeOptions
    from crossprobe.core.inference.exported import ExportedBackend, find_exported, int8_graph
    from tests.support import reference_models as rm

    rows = {}
    for family, size in (("hf_clip", "tiny"), ("hf_siglip", "tiny")) + ((("hf_clip", "base"),) if base else ()):
        ref = tmp / f"{family}-{size}"
        spec = f"hf:{ref}"
        folder = find_exported(tmp / "graphs", spec) if ref.exists() else None
        if folder is None:
            rm.build(family, ref, size=size)
            folder = families.export(spec, tmp / "graphs")
        b = ExportedBackend(folder, RuntimeOptions(threads=1))
        fp32 = b._session("text")
        row = {"fp32_ms": _timed(lambda t: b._run_text(fp32, [t]), list(int8.PROBES), repeat)}
        for weights in ("s8", "u8"):
            q8 = runtime.session(int8_graph(b.folder / "text.onnx", weights), 1)
            low = int8.check(lambda ts: b._run_text(fp32, ts)[0], lambda t: b._run_text(q8, [t])[0], 0.0, weights,
                             family).min_cosine
            row[weights] = {"min_cosine": round(low, 5), "ms": _timed(lambda t: b._run_text(q8, [t]),
                                                                      list(int8.PROBES), repeat)}
        rows[f"{family} ({size})"] = row
    return rows


def checkpoint_rows(tmp: Path, repeat: int) -> dict:
    """The committed checkpoint's query tower (MiniLM-L6 + heads; the heads stay fp32, export.py)."""
    from crossprobe.core import inference
    from crossprobe.models import export
    from crossprobe.core.inference import RuntimeOptions

    b = inference.load(None, RuntimeOptions(graphs=tmp / "cp", threads=1))
    b.warm("search")
    fp32, tok = b._query()
    row = {"fp32_ms": _timed(lambda t: b._run_query(fp32, tok, [t]), list(int8.PROBES), repeat)}
    graphs = next(p for p in (tmp / "cp").iterdir() if (p / "query_tower.onnx").exists())
    for weights in ("s8", "u8"):
        q8 = b._session(export.ensure_int8_query(graphs, weights))
        low = int8.check(lambda ts: b._run_query(fp32, tok, ts)[0], lambda t: b._run_query(q8, tok, [t])[0], 0.0,
                         weights, "checkpoint").min_cosine
        row[weights] = {"min_cosine": round(low, 5), "ms": _timed(lambda t: b._run_query(q8, tok, [t]),
                                                                  list(int8.PROBES), repeat)}
    return {f"crossprobe {b.fingerprint}": row}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per probe query")
    ap.add_argument("--emulated", default="", help="the CPU emulator this runs under (its timings are not speeds)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--no-base", action="store_true", help="leave out the ViT-B/32-shaped text tower (under an "
                    "emulator it takes most of an hour)")
    ap.add_argument("--work", type=Path, default=None, help="keep the models and graphs here (default: a temp folder); "
                    "an emulated run reuses a native run's, since exporting under an emulator takes long")
    args = ap.parse_args(argv)
    from crossprobe.models.evaluation.report import machine

    kernel = int8.kernel_path()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        rows = {**family_rows(work, args.repeat, not args.no_base), **checkpoint_rows(work, args.repeat)}
    entry = {"kernel": kernel, "chosen_weights": int8.weight_format(kernel), "required": int8.MIN_COSINE,
             "machine": machine(), "python": platform.python_version(), "emulated": args.emulated or None,
             "timings_comparable": not args.emulated, "probes": len(int8.PROBES), "families": rows,
             "command": "python -m benchmarks.int8_kernels" + (f" (under {args.emulated})" if args.emulated else "")}
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    old[kernel] = entry
    atomic_write(args.out, json.dumps(old, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(entry, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
