"""Issue 47's costs per model family, measured here on the CPU, back to back on one host with today's default model:
images/s indexed, query p50 / p99 with one client, the service's memory, the graphs' size; fp32, and int8 (the graphs'
MatMuls dynamically quantized per channel) with the int8 embeddings' cosine to fp32. Random weights of each family's
real shapes (tests/support/reference_models.py): cost does not depend on weight values.

    scripts/openclip-env.sh && artifacts/openclip-venv/bin/python -m benchmarks.model_costs prepare
    .venv/bin/python -m benchmarks.model_costs measure [--photos 512] [--queries 200]
        -> docs/research/results/model_choice.json, its "costs" section (the file's other sections are kept)

prepare (the export venv: open_clip and M-CLIP need torchvision) builds the references and exports them into
artifacts/model_costs/graphs. measure (the main .venv, torch-free serving as users run it) for each model: `crossprobe
index build` of the first N Flickr8k dev photos (read from /work/shared, never copied) in a process of its own
(images/s: the job's own summary, photos encoded over the job's whole time, loading included; its stages; its peak RSS), then `crossprobe serve` over that index and Q dev
captions one at a time (client-side latency of POST /v1/search with the defaults: the model's own reranker where it
has one, mode hybrid; the server's RSS after them), then int8 offline (image and text graphs quantized, the same
photos and captions timed through ONNX Runtime with one thread per graph as the service's defaults give). Run it on
an idle machine: every number is a timing but the sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from crossprobe.core.atomic import atomic_dir, atomic_write

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "research" / "results" / "model_choice.json"
WORK = REPO / "artifacts" / "model_costs"
FLICKR = Path(os.environ.get("FLICKR8K_DIR", "/work/shared/datasets/flickr8k"))
# name -> (reference family, open_clip architecture, what it is)
MODELS = {
    "vit_b32": ("open_clip", "ViT-B-32", "open_clip ViT-B-32"),
    "vit_b16": ("open_clip", "ViT-B-16", "open_clip ViT-B-16"),
    "siglip_base": ("hf_siglip", None, "SigLIP base patch16-224 (Hugging Face)"),
    "mclip": ("mclip", None, "M-CLIP XLM-Roberta-Large-Vit-B-32 (multilingual)"),
}


def spec_of(name: str) -> str:
    family, arch, _ = MODELS[name]
    ref = WORK / "refs" / name
    return f"open_clip:{arch}/{ref / 'open_clip_model.safetensors'}" if family == "open_clip" else f"hf:{ref}"


def prepare(names: list[str]) -> None:
    from crossprobe.models import families
    from tests.support import reference_models as rm

    for name in names:
        family, arch, _ = MODELS[name]
        ref = WORK / "refs" / name
        if not (ref / rm.META).exists():
            rm.build(family, ref, size="base", **({"arch": arch} if arch else {}))
        print(name, families.export(spec_of(name), WORK / "graphs", log=print), flush=True)


# ---- measure ---------------------------------------------------------------------------------------------------------
def dev_data(n_photos: int, n_queries: int) -> tuple[Path, list[str]]:
    """A folder of symlinks to the first n dev photos (no copy), and the first n_queries dev captions."""
    import csv

    names = [s.strip() for s in (FLICKR / "splits" / "dev.txt").read_text().splitlines() if s.strip()]
    folder = WORK / "photos"
    folder.mkdir(parents=True, exist_ok=True)
    for n in names[:n_photos]:
        link = folder / n
        if not link.exists():
            link.symlink_to(FLICKR / "images" / n)
    captions = []
    with open(FLICKR / "captions.tsv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if row["image"] in set(names[n_photos:n_photos + n_queries]):
                captions.append(row["caption"])
    return folder, captions[:n_queries]


def _env(root: Path, spec: str | None) -> dict:
    env = {**os.environ, "CROSSPROBE_INDEX_ROOT": str(root), "CROSSPROBE_MODELS_DIR": str(WORK / "graphs"),
           "CROSSPROBE_INDEX_PROGRESS": "false",
           "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning", "HF_HUB_OFFLINE": "1"}
    env.pop("REDIS_URL", None)
    if spec:
        env["CROSSPROBE_MODEL"] = spec
    else:
        env.pop("CROSSPROBE_MODEL", None)
    return env


def _peak_rss(proc: subprocess.Popen) -> tuple[int, str]:
    """Poll a process's RSS (its children's too) every 50 ms until it ends -> (peak bytes, its stdout)."""
    import psutil

    p, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            peak = max(peak, sum(c.memory_info().rss for c in [p, *p.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(0.05)
    return peak, proc.stdout.read()


def index(spec: str | None, photos: Path, root: Path) -> dict:
    cli = [str(REPO / ".venv" / "bin" / "crossprobe"), "index", "build", "--name", "costs", "--images", str(photos),
           "--threads", "2"]
    proc = subprocess.Popen(cli, env=_env(root, spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, out = _peak_rss(proc)
    if proc.returncode:
        raise RuntimeError(f"index build failed:\n{out[-3000:]}")
    line = next(s for s in out.splitlines() if "img/s" in s)
    rate = float(re.search(r"encoded \d+ in [\d.]+s \(([\d.]+) img/s\)", line).group(1))
    stages = next((s for s in out.splitlines() if s.startswith("stages:")), "")
    return {"images_per_s": rate, "job_peak_rss_mb": round(peak / 2**20, 1), "summary": line.strip(),
            "stages": stages.removeprefix("stages: ")}


def serve(spec: str | None, root: Path, queries: list[str], warm: int = 20) -> dict:
    import httpx
    import psutil

    from crossprobe.service.server import free_port

    port = free_port()
    cli = [str(REPO / ".venv" / "bin" / "crossprobe"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cli, env=_env(root, spec), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            deadline = time.time() + 300
            while time.time() < deadline:
                try:
                    if http.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError(f"serve exited: {proc.stderr.read()[-3000:]}")
                time.sleep(0.2)
            else:
                raise RuntimeError("serve not ready in 300 s")
            ms, encode, rerank = [], [], None
            for i, q in enumerate(queries[:warm] + queries):
                t = time.perf_counter()
                r = http.post("/v1/search", json={"query": q, "k": 10})
                dt = (time.perf_counter() - t) * 1000
                r.raise_for_status()
                if i >= warm:
                    body = r.json()
                    ms.append(dt)
                    encode.append(body["timings_ms"].get("encode", 0.0))
                    rerank = body["rerank"]
            rss = psutil.Process(proc.pid).memory_info().rss
    finally:
        proc.terminate()
        proc.wait(30)
    q = np.percentile(ms, [50, 99])
    return {"query_p50_ms": round(float(q[0]), 2), "query_p99_ms": round(float(q[1]), 2),
            "encode_p50_ms": round(statistics.median(encode), 2), "queries": len(ms), "rerank": rerank,
            "service_rss_mb": round(rss / 2**20, 1)}


def int8(folder: Path, photos: Path, queries: list[str], n_photos: int = 64) -> dict:
    """The exported graphs' MatMuls quantized to int8 (dynamic, per channel), timed against fp32 through the same
    backend code, one ONNX Runtime thread: ms per image (batch of 32) and per query, and the cosine of each int8
    embedding to its fp32 one."""
    import shutil

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from crossprobe.core.inference import RuntimeOptions
    from crossprobe.core.inference.exported import ExportedBackend, read_model_json
    from crossprobe.core.inference.decode import Unreadable, decode_file

    q8 = WORK / "int8" / folder.name
    if not (q8 / "model.json").exists():
        with atomic_dir(q8, unique=True) as tmp:
            for f in folder.iterdir():
                if f.suffix not in (".onnx", ".data"):
                    shutil.copy(f, tmp / f.name)
            for g in ("image", "text"):
                quantize_dynamic(str(folder / f"{g}.onnx"), str(tmp / f"{g}.onnx"), weight_type=QuantType.QInt8,
                                 per_channel=True, op_types_to_quantize=["MatMul"], use_external_data_format=True)
    opts = RuntimeOptions(graphs=WORK / "graphs", threads=1)
    fp, qb = ExportedBackend(folder, opts), ExportedBackend(q8, opts, meta=read_model_json(q8))
    paths = sorted(photos.iterdir())[:n_photos]
    px = np.stack([r[0] for p in paths if not isinstance(r := decode_file(str(p), 10**8, fp.preprocessor(),
                                                                            fp.image_size), Unreadable)])
    out = {}
    for label, backend in (("fp32", fp), ("int8", qb)):
        backend.encode_images(px[:2]), backend.encode_texts(queries[:2])  # warm
        t = time.perf_counter()
        g = np.concatenate([backend.encode_images(px[i:i + 32]).g for i in range(0, len(px), 32)])
        img_ms = (time.perf_counter() - t) * 1000 / len(px)
        times, qv = [], []
        for q in queries[:100]:
            t = time.perf_counter()
            qv.append(backend.encode_texts([q])[0].g_q)
            times.append((time.perf_counter() - t) * 1000)
        out[label] = {"image_ms_per_photo": round(img_ms, 2), "query_encode_p50_ms": round(statistics.median(times), 2),
                      "g": g, "q": np.stack(qv)}
    cos_i = (out["fp32"]["g"] * out["int8"]["g"]).sum(1)
    cos_q = (out["fp32"]["q"] * out["int8"]["q"]).sum(1)
    res = {k: {m: v for m, v in d.items() if m not in ("g", "q")} for k, d in out.items()}
    res["cosine_to_fp32"] = {"image_min": round(float(cos_i.min()), 4), "image_mean": round(float(cos_i.mean()), 4),
                             "query_min": round(float(cos_q.min()), 4), "query_mean": round(float(cos_q.mean()), 4)}
    res["graphs_mb"] = round(sum(f.stat().st_size for f in q8.rglob("*.onnx*")) / 1e6, 1)
    return res


def measure(names: list[str], n_photos: int, n_queries: int) -> dict:
    from crossprobe.core.inference.exported import find_exported
    from crossprobe.models.evaluation.report import machine

    photos, queries = dev_data(n_photos, n_queries)
    # crossprobe's own graphs exported before anything is timed (a family's were exported by `prepare`)
    subprocess.run([str(REPO / ".venv" / "bin" / "crossprobe"), "export", "--out", str(WORK / "graphs")], check=True,
                   stdout=subprocess.DEVNULL)
    rows = {}
    for name in ["default", *names]:
        spec = None if name == "default" else spec_of(name)
        folder = None if spec is None else find_exported(WORK / "graphs", spec)
        if spec is not None and folder is None:
            raise SystemExit(f"{name}: not exported: run `benchmarks.model_costs prepare` in the export venv first")
        root = Path(tempfile.mkdtemp(dir=WORK, prefix=f"idx-{name}-"))
        row = {"model": "crossprobe (the committed checkpoint)" if spec is None else MODELS[name][2],
               "graphs_mb": _graphs_mb(folder), **index(spec, photos, root), **serve(spec, root, queries)}
        if folder is not None:
            row["int8"] = int8(folder, photos, queries)
        print(name, json.dumps(row), flush=True)
        rows[name] = row
    return {"rows": rows, "photos": n_photos, "queries": n_queries, "machine": machine(),
            "command": f"python -m benchmarks.model_costs measure --photos {n_photos} --queries {n_queries}",
            "photo_set": f"the first {n_photos} Flickr8k dev photos", "weights": "random, each family's real shapes",
            "date": time.strftime("%Y-%m-%d")}


def _graphs_mb(folder: Path | None) -> float:
    if folder is None:  # crossprobe's own: the service's search graphs + the indexer's image graphs
        from crossprobe.core import DEFAULT_CHECKPOINT, read_config

        g = WORK / "graphs"
        fp = read_config(DEFAULT_CHECKPOINT)["fingerprint"]
        files = [*(g / fp).glob("*.onnx"), g / "image_backbone.onnx"]
        return round(sum(f.stat().st_size for f in files if f.exists()) / 1e6, 1)
    return round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("prepare", "measure"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--photos", type=int, default=512)
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    WORK.mkdir(parents=True, exist_ok=True)
    if args.step == "prepare":
        prepare(names)
        return
    res = measure(names, args.photos, args.queries)
    doc = json.loads(OUT.read_text()) if OUT.exists() else {}
    doc["costs"] = res
    atomic_write(OUT, json.dumps(doc, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
