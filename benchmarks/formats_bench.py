"""Indexing throughput on what phones and cameras write (issue 34): 50 MP and 200 MP JPEGs, 50 MP HEICs (with the
thumbnail phones embed, and without), 50 MP AVIFs, 24 MP DNGs (with a JPEG preview, and the mosaic alone).

Files are made by benchmarks/library_files.py (with sensor-like grain, so that they are as large as a phone's and
the entropy decoding, which draft mode does not save, costs what it does on a real photo): `--distinct` different
pictures per format, hard-linked to
`--count` files (a 50 MP HEIC takes ~30 s to encode; the indexer reads and decodes every link as its own file).
Each format is one `crossprobe index build` (the build() API, the committed checkpoint, an embedded Redis)
into a fresh index; images/s = encoded / (build seconds - model load), as benchmarks/indexer_bench.py counts it.
decode_ms: the decode stage alone (indexer/jobs/decode.py decode_one: open, reduced decode, 224 x 224), median of
3 on one file, page cache warm.

    .venv/bin/python -m benchmarks.formats_bench [--count 20] [--distinct 2] [--workers 2] [--only jpeg-50mp,...]
        -> docs/research/results/library_features.json, docs/research/library_features.md
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import library_files
from benchmarks.harness import machine

GRAIN = 8  # sensor-like noise: files of a phone's size (a 50 MP JPEG ~10 MB), not a smooth picture's 2 MB
# name -> (kind, width, height, options, what it stands for)
FORMATS = {
    "jpeg-50mp": ("jpeg", 8160, 6120, {}, "a phone's default 50 MP photo"),
    "jpeg-200mp": ("jpeg", 16320, 12240, {}, "a phone's 200 MP high-resolution mode"),
    "heic-50mp-thumbnail": ("heic", 8160, 6120, {"thumbnails": [320]},
                            "HEIC (512 px tiles) with the 320 px thumbnail phones embed"),
    "heic-50mp": ("heic", 8160, 6120, {}, "HEIC (512 px tiles) without a thumbnail: decoded in full"),
    "avif-50mp": ("avif", 8160, 6120, {}, "AVIF: decoded in full"),
    "dng-24mp-preview": ("dng", 6000, 4000, {"preview": 1024}, "DNG with a 1024 px JPEG preview (the usual case)"),
    "dng-24mp-mosaic": ("dng", 6000, 4000, {"preview": None}, "DNG with no preview: demosaiced at half size"),
}


def make(folder: Path, name: str, count: int, distinct: int) -> tuple[list[Path], float]:
    """count files of one format (distinct pictures, hard-linked) -> (paths, seconds spent writing them)."""
    kind, w, h, opts, _ = FORMATS[name]
    ext = {"jpeg": "jpg"}.get(kind, kind)
    t = time.perf_counter()
    firsts = [library_files.write(folder / f"src_{i}.{ext}", kind, w, h, seed=i, taken="2024:06:01 12:00:00",
                                  grain=GRAIN, **opts) for i in range(distinct)]
    paths = []
    for n in range(count):
        p = folder / f"{name}_{n:03d}.{ext}"
        os.link(firsts[n % distinct], p)
        paths.append(p)
    for f in firsts:  # only the links are indexed
        f.rename(folder.parent / f"{folder.name}-{f.name}")
    return paths, time.perf_counter() - t


def decode_ms(path: Path, max_pixels: int) -> tuple[float, list[int]]:
    from crossprobe.indexer.jobs.decode import decode_one
    from crossprobe.indexer.jobs.sources import Item
    from crossprobe.core import image_formats

    ts = []
    for _ in range(3):
        t = time.perf_counter()
        r = decode_one(Item(path.name, str(path)), max_pixels)
        ts.append(time.perf_counter() - t)
        assert not hasattr(r, "reason"), r
    with image_formats.open_path(path) as pic:
        size = list(pic.image.size)
    return round(statistics.median(ts) * 1000, 1), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20, help="files per format")
    ap.add_argument("--distinct", type=int, default=2, help="different pictures per format (the rest are links)")
    ap.add_argument("--workers", type=int, default=2, help="decode threads (IndexerSettings.workers)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--only", default="", help="comma-separated format names (default: all)")
    ap.add_argument("--note", default="", help="a remark for the JSON (e.g. other jobs on the machine)")
    ap.add_argument("--docs", type=Path, default=Path("docs/research"))
    args = ap.parse_args()

    from crossprobe.indexer import IndexerSettings, build
    from crossprobe.storage.redis_conn import close_embedded
    from crossprobe.models import checkpoint

    names = [n for n in (args.only.split(",") if args.only else FORMATS) if n]
    unknown = set(names) - set(FORMATS)
    if unknown:
        sys.exit(f"unknown formats {sorted(unknown)}; known: {', '.join(FORMATS)}")
    ckpt = checkpoint.DEFAULT_CHECKPOINT
    command = "python -m benchmarks.formats_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    res: dict = {"command": command, "machine": machine(), "note": args.note, "count": args.count,
                 "distinct": args.distinct, "workers": args.workers, "batch_size": args.batch_size,
                 "max_pixels": IndexerSettings().max_pixels, "formats": {}}
    with tempfile.TemporaryDirectory(prefix="formats-bench-") as tmp:
        tmp = Path(tmp)
        models = tmp / "models"
        for name in names:
            kind, w, h, opts, what = FORMATS[name]
            folder = tmp / name
            folder.mkdir()
            print(f"{name}: writing {args.distinct} distinct {w}x{h} {kind} files ...", flush=True)
            paths, made_s = make(folder, name, args.count, args.distinct)
            for p in paths[: args.distinct]:  # warm page cache
                p.read_bytes()
            s = IndexerSettings(index_root=tmp / "indexes", models_dir=models, index_embedded_db=tmp / "redis.db",
                                workers=args.workers, batch_size=args.batch_size, progress=False,
                                index_key_prefix=f"fmt{os.getpid()}")
            try:
                dms, decoded = decode_ms(paths[0], s.max_pixels)
            except AssertionError as e:  # a skip: recorded, and the build below counts it
                dms, decoded = None, [0, 0]
                print(f"  decode_one skipped it: {e}", flush=True)
            r = build(name, images=folder, settings=s, ckpt=ckpt, log=lambda *_: None)
            load = r.stages_s.get("load_model", 0.0)
            row = {"what": what, "kind": kind, "width": w, "height": h, "megapixels": round(w * h / 1e6, 1),
                   "file_mb": round(paths[0].stat().st_size / 1e6, 2), "files": len(paths), "indexed": r.count,
                   "skipped": r.skipped, "images_per_s": round(r.encoded / (r.seconds - load), 2),
                   "build_s": round(r.seconds, 2), "decode_ms_one_file": dms, "decoded_size": decoded,
                   "images_per_s_note": "indexed files only" if r.count < len(paths) else None,
                   "stages_s": r.stages_s, "files_written_s": round(made_s, 1)}
            res["formats"][name] = row
            print(f"  {row['indexed']}/{row['files']} indexed, {row['images_per_s']} images/s, decode {dms} ms "
                  f"(decoded at {decoded[0]}x{decoded[1]})", flush=True)
            for p in folder.iterdir():
                p.unlink()
        close_embedded()
    write(res, args.docs)


def write(res: dict, docs: Path) -> None:
    (docs / "results").mkdir(parents=True, exist_ok=True)
    out = docs / "results" / "library_features.json"
    kept = {k: v for k, v in json.loads(out.read_text()).items() if k not in res} if out.exists() else {}
    out.write_text(json.dumps({**res, **kept}, indent=2) + "\n")  # other benchmarks' keys (watch) stay
    lines = [
        "# What a photo library holds: formats and sizes (issue 34)", "",
        f"`{res['command']}`: {res['count']} files per format ({res['distinct']} distinct pictures, the rest hard "
        f"links), each format one `crossprobe index build` (decode workers {res['workers']}, batch "
        f"{res['batch_size']}, the committed checkpoint, embedded Redis), max_pixels {res['max_pixels']:,}.",
        f"Machine: {res['machine']}." + (f" {res['note']}" if res["note"] else ""), "",
        "| format | what | MB per file | indexed | images/s | decode ms (one file) | decoded at |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in res["formats"].items():
        lines.append(f"| {name} | {r['what']} | {r['file_mb']} | {r['indexed']}/{r['files']} | {r['images_per_s']} | "
                     f"{r['decode_ms_one_file']} | {r['decoded_size'][0]}x{r['decoded_size'][1]} |")
    lines += ["", "images/s: end to end (decode, backbone, head, Redis writes, commit), model load excluded. "
              "decode ms: opening the file and decoding it at the reduced size the indexer asks for (JPEG draft "
              "scale, a HEIC's thumbnail, a RAW's preview), one file, median of 3.", ""]
    (docs / "library_features.md").write_text("\n".join(lines) + EXPLAINED)


EXPLAINED = """
## Why these numbers

- JPEG: libjpeg decodes at 1/8 scale (draft mode): the inverse DCT and colour conversion run on 1/64 of the
  pixels, while the entropy decoding still reads every byte of the file, so decode time follows the file's size
  (a grainy 50 MP JPEG of 7.6 MB, a 200 MP one of 30 MB) rather than its pixels. Neither is skipped any more (they
  were "oversized" at 40 MP before): the limit (CROSSPROBE_INDEX_MAX_PIXELS, 100 MP by default) counts the pixels
  decoding produces.
- HEIC: libheif has no reduced decode, but phones embed a small thumbnail (an iPhone's is 320 x 240) and
  pillow-heif's draft() decodes that instead when it is at least 224 px a side: the fastest format here. A HEIC
  without one is decoded in full (every 512 px HEVC tile) and counts against the pixel limit in full: the
  slowest. The test files are grainy, so larger than a phone's (20 MB); a phone's 5-8 MB HEIC decodes faster.
- AVIF: decoded in full (Pillow's AVIF plugin has no reduced decode); 50 MP AVIFs are rare (phones write HEIC or
  JPEG).
- RAW: LibRaw (rawpy) hands over the embedded JPEG preview, decoded at draft scale, so a 48 MB DNG indexes as
  fast as a small JPEG; only a file with no preview of at least 224 px is demosaiced (half size).
- Files are hard links of two pictures: decode time does not depend on which picture, and the page cache holds
  them all, so this measures decoding and encoding, not the disk. The machine line gives the load average at
  the start; the note says whether other jobs shared the cores (then the numbers are lower bounds).
"""


if __name__ == "__main__":
    main()
