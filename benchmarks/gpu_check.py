"""The GPU check (issue 48): one run on a lent GPU machine measures the GPU path against the same machine's CPU cores.

    scripts/gpu-check.sh                         on the lent machine, in one call (set-up from the carried wheels)
    scripts/gpu-check.sh --device cpu --small    the dry run on a machine without a GPU (smaller sizes)
        -> docs/research/results/gpu.json (--out; and $OUT/gpu.json where the device tool sets OUT), printed

Steps, each timed and written into the JSON as it ends (a run cut short keeps what it measured), in this order (the
must-haves first), each skipped and said when too little of --budget-s is left for it:
  environment  GPU, driver, torch / CUDA, CPU, and the random backbones the run uses (benchmarks/gpu_inputs.py)
  photos       synthetic JPEGs of Flickr8k's size (8,091: Flickr8k's count)
  parity       the GPU path (models/torch_backend.py on --device; fp32, fp16, bf16) against the CPU graphs
               (ONNX Runtime): backbone, image tower, query tower, both rerankers; max abs diff and relative error per
               output, against 1e-4 (fp32) and 1e-3 (fp16, bf16)
  index        the indexer (decode, encode, Redis, FAISS; library call of `crossprobe index build`): images/s on the
               device over every photo (the served 8,091-item index) and on the CPU over a subset
  grow         the 1M-item version (gpu_inputs.grow: noisy copies, real Redis values, IVF1024,Flat)
  ann          the ANN stage alone at 1M: exact search on the device (storage/ann/gpu.py) against FAISS on
               the CPU (exact Flat; the version's IVF at the nprobe that reaches recall@100 0.95, which the CPU
               service then uses)
  service      `crossprobe serve` on the CPU, then on the device (per --service-precisions), each serving both indexes;
               per rerank mode (none, cp, temde): p50 / p99 with one client, the most searches/s with 32 clients
               (closed loop), and the median time of each stage (the answers' timings_ms); then the device / CPU
               ratios per index, mode and stage
  encode       images/s of the image side alone (backbone + image tower on decoded pixels): device vs all CPU cores
  vit          a ViT-B/32-shaped image tower's forward images/s (transformers' CLIPVisionModelWithProjection from a
               ViT-B/32 config, random weights: open_clip is not on the machines), device vs CPU
The service is measured as benchmarks/service_bench.py measures it (its service_env, load and stop_server; a start that
gives up at once on a failed start-up is here) and loaded by benchmarks/loadgen.py's generator: the imports below are the
only ties to them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import gpu_inputs
from benchmarks.loadgen import Generator, search_requests
from benchmarks.service_bench import load as service_load
from benchmarks.harness import service_env, start_server, stop_server

RERANKS = ("none", "cp", "temde")
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-3, "bf16": 1e-3}  # max abs diff per output (issue 48)
FULL = dict(photos=8091, cpu_index=1024, parity_images=64, encode_batch=64, encode_batches=16, cpu_encode_batches=4,
            vit_batch=128, vit_batches=16, big=1_000_000, ann_queries=100, latency_requests=200, load_requests=800,
            clients=32)
SMALL = dict(photos=192, cpu_index=64, parity_images=8, encode_batch=2, encode_batches=1, cpu_encode_batches=1,
             vit_batch=2, vit_batches=1, big=20_000, ann_queries=20, latency_requests=20, load_requests=60, clients=8)


class Run:
    """The result being built: each step's numbers and seconds, written to disk after every step."""

    def __init__(self, args):
        self.args, self.t0 = args, time.perf_counter()
        self.res: dict = {"command": "scripts/gpu-check.sh " + " ".join(sys.argv[1:]), "device": args.device,
                          "sizes": args.sizes, "steps": {}}

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def step(self, name: str, fn, *a, need_s: float = 0.0, **kw):
        """Run one step: its result under res[name], its time under steps; skipped (and said) when fewer than
        need_s seconds of the budget are left, or failed (and said) without stopping the later steps."""
        if self.left() < need_s:
            self.res["steps"][name] = {"skipped": f"{self.left():.0f} s of the budget left, {need_s:.0f} s needed"}
            self.save()
            return None
        t = time.perf_counter()
        print(f"== {name} ({self.left():.0f} s of the budget left)", flush=True)
        try:
            out = self.res[name] = fn(*a, **kw)
            self.res["steps"][name] = {"seconds": round(time.perf_counter() - t, 1)}
        except (Exception, SystemExit) as e:  # noqa: BLE001 - recorded; the next steps still run
            out = None
            self.res["steps"][name] = {"seconds": round(time.perf_counter() - t, 1), "error": f"{type(e).__name__}: "
                                       f"{str(e)[-2000:]}"}
            print(f"   {name} failed: {e}", flush=True)
        self.save()
        return out

    def save(self) -> None:
        self.res["total_s"] = round(time.perf_counter() - self.t0, 1)
        text = json.dumps(self.res, indent=2)
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        self.args.out.write_text(text + "\n")
        if os.environ.get("OUT"):  # the device tool brings $OUT back
            Path(os.environ["OUT"], "gpu.json").write_text(text + "\n")


# ---- environment ------------------------------------------------------------------------------------------------
def environment(device: str) -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    env = {"cpu": f"{os.cpu_count()} cores, {cpu}",
           "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
           "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "backbones": json.loads(Path(os.environ["GPU_CHECK_BACKBONES"]).read_text())
           if os.environ.get("GPU_CHECK_BACKBONES") else None}
    for pkg in ("onnxruntime", "faiss", "transformers", "numpy"):
        env[pkg] = getattr(__import__(pkg), "__version__", "?")
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        env["gpu"] = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                      "multiprocessors": p.multi_processor_count, "capability": f"{p.major}.{p.minor}"}
        smi = shutil.which("nvidia-smi")
        if smi:
            env["gpu"]["driver"] = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                                  capture_output=True, text=True, timeout=30).stdout.strip()
    else:
        env["gpu"] = None
    travelled = [p for p in Path(".whl").glob("*.whl")]
    env["carried_wheels_mib"] = round(sum(p.stat().st_size for p in travelled) / 2**20, 2) if travelled else None
    return env


# ---- model: parity, encode rate, ViT --------------------------------------------------------------------------
def _backends(graphs: Path, device: str, precision: str | None, threads: int | None = None):
    from crossprobe.core.inference import RuntimeOptions
    from crossprobe.core.inference.crossprobe import CrossprobeBackend
    from crossprobe.models.torch_backend import TorchCrossprobeBackend

    if precision is None:  # the CPU graphs (ONNX Runtime), what the service and the indexer run without a GPU
        return CrossprobeBackend(None, RuntimeOptions(graphs=graphs, threads=threads, device="cpu"))
    return TorchCrossprobeBackend(None, RuntimeOptions(graphs=graphs, device=device, precision=precision))


def _diff(got, want, tol: float) -> dict:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    mx = float(np.max(np.abs(got - want))) if got.size else 0.0
    rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    return {"max_abs": mx, "rel": rel, "tol": tol, "ok": bool(np.isfinite(got).all() and mx <= tol)}


def parity(graphs: Path, device: str, photos: list[Path], queries: list[str]) -> dict:
    """Each GPU-path output against the CPU graphs' on the same inputs (each stage fed the CPU's input, so that an
    error is the stage's own), per precision."""
    from crossprobe.core import inputs

    cpu = _backends(graphs, device, None)
    px = np.stack([inputs.load_image(p) for p in photos])
    grid = cpu.image_grid(px)
    feats, qs = cpu.image_features(grid), cpu.encode_texts(queries)
    stored = {"p_v": feats.p_v, "b_bar": feats.b_bar, "s_i": feats.s_i, "labels": feats.labels}
    want = {"backbone.grid": grid.cells, **{f"image_tower.{k}": getattr(feats, k) for k in ("g", "p_v", "b_bar", "s_i")},
            **{f"query_tower.{k}": np.stack([getattr(q, k) for q in qs]) for k in ("g_q", "p_t", "w_bar", "s_q")}}
    for kind in ("cp", "temde"):
        want[f"rerank.{kind}"] = np.concatenate([cpu.rerank(kind, q, stored, feats.g @ q.g_q) for q in qs[:8]])
    out = {"inputs": {"images": len(photos), "texts": len(queries), "candidates": len(photos)}}
    for prec, tol in TOLERANCE.items():
        dev = _backends(graphs, device, prec)
        dfeats, dqs = dev.image_features(grid), dev.encode_texts(queries)
        got = {"backbone.grid": dev.image_grid(px).cells,
               **{f"image_tower.{k}": getattr(dfeats, k) for k in ("g", "p_v", "b_bar", "s_i")},
               **{f"query_tower.{k}": np.stack([getattr(q, k) for q in dqs]) for k in ("g_q", "p_t", "w_bar", "s_q")}}
        for kind in ("cp", "temde"):  # the device's scorer on the CPU's query and item features
            got[f"rerank.{kind}"] = np.concatenate([dev.rerank(kind, q, stored, feats.g @ q.g_q) for q in qs[:8]])
        rows = {k: _diff(got[k], want[k], tol) for k in want}
        if feats.labels is not None:
            rows["image_tower.labels"] = {"agree": float(np.mean(dfeats.labels == feats.labels))}
        rows["end_to_end.g"] = _diff(dev.encode_images(px).g, feats.g, tol)
        out[prec] = {"ok": all(r.get("ok", True) for r in rows.values()), "providers": dev.providers, "outputs": rows}
        print(f"   {prec}: ok={out[prec]['ok']}  " + ", ".join(f"{k} {r['max_abs']:.1e}" for k, r in rows.items()
                                                           if "max_abs" in r), flush=True)
    return out


def _rate(fn, batch, batches: int, sync=lambda: None) -> float:
    fn(batch), sync()  # warm-up: allocation, kernel selection
    t = time.perf_counter()
    for _ in range(batches):
        fn(batch)
    sync()
    return round(len(batch) * batches / (time.perf_counter() - t), 1)


def encode_rate(graphs: Path, device: str, photos: list[Path], sizes: dict) -> dict:
    """Images/s of backbone + image tower on decoded pixels (one batch of the indexer's 64), host arrays in and out as the indexer
    calls them: the device per precision, and ONNX Runtime on all CPU cores."""
    from crossprobe.core import inputs

    px = np.stack([inputs.load_image(photos[i % len(photos)]) for i in range(sizes["encode_batch"])])
    out = {"device": device, "batch": len(px), "cpu_onnxruntime": _rate(_backends(graphs, device, None).encode_images, px,
                                                 sizes["cpu_encode_batches"])}
    for prec in TOLERANCE:
        out[f"device_{prec}"] = _rate(_backends(graphs, device, prec).encode_images, px, sizes["encode_batches"])
    out["ratio_fp32"] = round(out["device_fp32"] / out["cpu_onnxruntime"], 2)
    return out


def vit_rate(device: str, sizes: dict) -> dict:
    """A ViT-B/32-shaped image tower (random weights): forward images/s, pixels already in place."""
    import torch
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    cfg = CLIPVisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                           image_size=224, patch_size=32, projection_dim=512)
    torch.manual_seed(0)
    model = CLIPVisionModelWithProjection(cfg).eval()
    bs = sizes["vit_batch"]
    out = {"model": "CLIPVisionModelWithProjection, ViT-B/32 config, random weights", "device": device, "batch": bs,
           "cpu_batch": max(1, bs // 4)}
    with torch.inference_mode():
        x = torch.randn(out["cpu_batch"], 3, 224, 224)
        out["cpu_fp32"] = _rate(lambda b: model(pixel_values=b), x, max(1, sizes["vit_batches"] // 4))
        for prec, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
            m = model.to(device, dtype)
            xb = torch.randn(bs, 3, 224, 224, device=device, dtype=dtype)
            sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
            out[f"device_{prec}"] = _rate(lambda b: m(pixel_values=b), xb, sizes["vit_batches"], sync)
    out["ratio_fp32"] = round(out["device_fp32"] / out["cpu_fp32"], 2)
    return out


# ---- indexing ---------------------------------------------------------------------------------------------------
def index_settings(work: Path, device: str, **over):
    from crossprobe.indexer.jobs.settings import IndexerSettings

    # 8 decode threads (the most IndexerSettings allows) feed the encoder; the embedded Redis of the work folder
    base = dict(redis_url=None, index_root=work / "indexes", models_dir=work / "graphs", device=device, workers=8,
                batch_size=64, progress=False)
    return IndexerSettings(**{**base, **over})


def index_rate(work: Path, device: str, photos: list[Path], cpu_count: int) -> dict:
    """`crossprobe index build` (the library call) over every photo on the device (the served index "photos") and
    over the first cpu_count on the CPU (index "photos-cpu") -> images/s of each, with the job's stages."""
    from crossprobe.indexer import build

    out: dict = {"device": device}
    for key, name, dev, items in (("on_device", "photos", device, photos), ("cpu", "photos-cpu", "cpu", photos[:cpu_count])):
        manifest = work / f"{name}.jsonl"
        manifest.write_text("".join(json.dumps({"id": p.name, "uri": str(p.resolve())}) + "\n" for p in items))
        res = build(name, manifest=manifest, settings=index_settings(work, dev), log=lambda *_: None)
        load = res.stages_s.get("load_model", 0.0)
        out[key] = {
            "index": name, "images": res.encoded, "seconds": round(res.seconds, 1), "factory": res.factory,
            "images_per_s": round(res.encoded / res.seconds, 1),
            "images_per_s_after_model_load": round(res.encoded / max(res.seconds - load, 1e-9), 1),
            "stages_s": {k: round(v, 2) for k, v in res.stages_s.items()}}
        print(f"   {name} on {dev}: {res.summary()}", flush=True)
    out["ratio_after_model_load"] = round(out["on_device"]["images_per_s_after_model_load"] /
                                          out["cpu"]["images_per_s_after_model_load"], 2)
    out["settings"] = {"decode_threads": 8, "batch_size": 64, "device_precision": "fp32"}
    return out


# ---- the ANN stage at 1M ------------------------------------------------------------------------------------
def _per_query(search, q: np.ndarray) -> dict:
    search(q[:1])
    lat = []
    for row in q:
        t = time.perf_counter()
        search(row[None])
        lat.append((time.perf_counter() - t) * 1000)
    t = time.perf_counter()
    search(q)
    batch_s = time.perf_counter() - t
    return {"p50_ms": round(float(np.median(lat)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "batch_queries_per_s": round(len(q) / batch_s, 1)}


def ann_stage(work: Path, device: str, name: str, queries: np.ndarray, k: int = 100) -> dict:
    """The index's top k for real query vectors: exact search on the device (fp32, fp16: storage/ann/gpu.py),
    FAISS's exact Flat on all CPU cores, and the version's own IVF at a few nprobe on one core (as the service runs
    FAISS: CROSSPROBE_THREADS=1) with its recall@k against exact -> per-query latency, batch throughput, and the
    smallest nprobe reaching recall 0.95 (the CPU service then searches with it: a fair baseline)."""
    import faiss

    from crossprobe.storage.ann.faiss_backend import FaissIndex
    from crossprobe.storage.ann.gpu import TorchExactIndex
    from crossprobe.storage.reader import open_index

    rd = open_index(name, None, index_settings(work, "cpu"))
    vdir = rd.store.version_dir(name, rd.version)
    vectors = np.load(vdir / "vectors.npy")
    out: dict = {"items": len(vectors), "k": k, "queries": len(queries), "device": device}
    exact = None
    for prec in ("fp32", "fp16"):
        ix = TorchExactIndex(vectors, device, prec)
        out[f"device_exact_{prec}"] = _per_query(lambda q: ix.search(q, k), queries)
        exact = ix.search(queries, k)[1] if exact is None else exact
        ix.close()
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    out["cpu_exact_flat_all_cores"] = _per_query(lambda q: flat.search(q, k), queries)
    del flat
    faiss.omp_set_num_threads(1)
    factory, out["service_nprobe"] = rd.manifest["factory"], None
    for nprobe in (16, 64, 256):
        ivf = FaissIndex(faiss.read_index(str(vdir / "index.faiss")), nprobe=nprobe)
        row = _per_query(lambda q: ivf.search(q, k), queries)
        row["recall_at_k"] = round(float(np.mean([len(set(a) & set(b)) / k
                                                  for a, b in zip(ivf.search(queries, k)[1], exact)])), 4)
        out[f"cpu_{factory}_nprobe{nprobe}_one_core"] = row
        out["service_nprobe"] = nprobe
        if row["recall_at_k"] >= 0.95:
            break
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    return out


# ---- the service --------------------------------------------------------------------------------------------
def serve_and_load(work: Path, redis_client, names: dict, queries: list[str], device: str, precision: str,
                   sizes: dict, extra_env: dict) -> dict:
    """One `crossprobe serve` on `device` serving every index in names ({size: name}): per index and rerank mode,
    one client's latency (service_bench.load: p50 / p99 and the stages' medians) and the closed-loop throughput
    of sizes["clients"] clients (loadgen)."""
    from crossprobe.service.server import free_port

    env = {**service_env(index_settings(work, device), redis_client, _ckpt(), names, "fp32"),
           "CROSSPROBE_DEVICE": device, "CROSSPROBE_DEVICE_PRECISION": precision, "CROSSPROBE_MODELS_DIR":
           str(work / "graphs"), "CROSSPROBE_FILTER_PRELOAD": "false", **extra_env}
    port = free_port()
    t = time.perf_counter()
    log = work / f"server-{device.replace(':', '')}-{precision}.log"
    proc = start_server(env, port, log, timeout_s=180)  # a lent machine's minutes are few
    out: dict = {"start_s": round(time.perf_counter() - t, 1), "env": {k: v for k, v in env.items() if k in (
        "CROSSPROBE_DEVICE", "CROSSPROBE_DEVICE_PRECISION", "CROSSPROBE_WORKERS", "CROSSPROBE_THREADS",
        "CROSSPROBE_QUEUE_SIZE", "CROSSPROBE_FILTER_PRELOAD", "CROSSPROBE_QUERY_PRECISION", "CROSSPROBE_IVF_NPROBE")}}
    try:
        import httpx

        out["readyz"] = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).json()
        for size, name in names.items():
            out[size] = {}
            for mode in RERANKS:
                one = service_load(f"http://127.0.0.1:{port}", name, mode, queries, 1, sizes["latency_requests"], 10)
                gen = Generator("127.0.0.1", port, search_requests("127.0.0.1", port, queries, mode, name),
                                timeout_s=30)
                many = asyncio.run(gen.closed_loop(sizes["clients"], sizes["load_requests"])).summary()
                out[size][mode] = {"p50_ms": one["p50_ms"], "p99_ms": one["p99_ms"], "stages_ms": one["stages_ms"],
                                   "failed": one["failed"], "max_qps": many["qps"],
                                   "under_load": {k: many[k] for k in ("p50_ms", "p99_ms", "errors", "ok")}}
                print(f"   {device} {precision} {size} {mode}: p50 {one['p50_ms']} p99 {one['p99_ms']} ms, "
                      f"{many['qps']} QPS ({sizes['clients']} clients)  stages {one['stages_ms']}", flush=True)
    finally:
        stop_server(proc)
    return out


def _ckpt() -> Path:
    from crossprobe.core import DEFAULT_CHECKPOINT

    return Path(DEFAULT_CHECKPOINT)


def ratios(service: dict, device_key: str) -> dict:
    """Device over CPU per index, mode and stage: latency ratios (CPU / device: > 1 means the device is faster)
    and the throughput ratio (device / CPU)."""
    cpu, dev = service.get("cpu") or {}, service.get(device_key) or {}
    out: dict = {}
    for size in (k for k in cpu if isinstance(cpu[k], dict) and k in dev and "none" in cpu[k]):
        for mode in RERANKS:
            c, d = cpu[size][mode], dev[size][mode]
            row = {"p50_speedup": round(c["p50_ms"] / d["p50_ms"], 2), "p99_speedup": round(c["p99_ms"] / d["p99_ms"], 2),
                   "qps_ratio": round(d["max_qps"] / c["max_qps"], 2)}
            row["stage_speedup"] = {s: round(c["stages_ms"][s] / d["stages_ms"][s], 2) for s in c["stages_ms"]
                                    if d["stages_ms"].get(s) and c["stages_ms"][s] > 0}
            out.setdefault(size, {})[mode] = row
    return out


# ---- the run ------------------------------------------------------------------------------------------------
TEMPLATES = ("a {} next to a {}", "two people looking at a {} near a {}", "a photo of a {} on a sunny day by a {}",
             "a child playing with a {} in front of a {}", "a {} and a {} on a wooden table")


def query_texts(n: int = 200, seed: int = 0) -> list[str]:
    """Caption-like queries (Flickr8k's captions do not travel): ImageNet class names in caption templates."""
    from crossprobe.models.bridge import class_lemmas

    names = [lem[0] for lem in class_lemmas()]
    rng = np.random.default_rng(seed)
    return [TEMPLATES[i % len(TEMPLATES)].format(*rng.choice(names, 2, replace=False)) for i in range(n)]


def query_vectors(graphs: Path, texts: list[str]) -> np.ndarray:
    cpu = _backends(graphs, "cpu", None)
    return np.stack([q.g_q for q in cpu.encode_texts(texts)]).astype(np.float32)


def run_all(run: Run) -> None:
    from crossprobe.storage.redis_conn import close_embedded, connect

    args, sizes, device = run.args, run.args.sizes, run.args.device
    work, graphs = args.workdir, args.workdir / "graphs"
    run.step("environment", environment, device)
    run.step("photos", gpu_inputs.make_photos, work / "photos", sizes["photos"], os.cpu_count() or 1)
    photos = sorted((work / "photos").glob("p*.jpg"))[:sizes["photos"]]
    texts = query_texts()
    run.step("parity", parity, graphs, device, photos[:sizes["parity_images"]], texts[:16])
    redis_client = connect(index_settings(work, "cpu"))  # the embedded Redis every step and server shares
    redis_client.config_set("save", "")  # no snapshots of the 1M items' values while the check runs
    try:
        run.step("index", index_rate, work, device, photos, sizes["cpu_index"])
        big = f"synthetic-{sizes['big'] // 1000}k"
        run.step("grow", gpu_inputs.grow, index_settings(work, "cpu"), "photos", big, sizes["big"], need_s=60)
        names = {str(len(photos)): "photos", str(sizes["big"]): big}
        ann = run.step("ann", ann_stage, work, device, big, query_vectors(graphs, texts[:sizes["ann_queries"]]),
                       need_s=20)
        env = {"CROSSPROBE_WORKERS": str(min(64, os.cpu_count() or 1))}  # stage threads: one per core
        if ann and ann.get("service_nprobe"):
            env["CROSSPROBE_IVF_NPROBE"] = str(ann["service_nprobe"])  # the CPU's IVF at exact search's recall
        keys = ["cpu"] + [f"device_{p}" for p in args.service_precisions]
        for key, (dev, prec) in zip(keys, [("cpu", "fp32")] + [(device, p) for p in args.service_precisions]):
            run.step(f"service_{key}", serve_and_load, work, redis_client, names, texts, dev, prec, sizes, env,
                     need_s=70 if sizes is FULL else 0)
        run.res["ratios"] = {k: ratios({"cpu": run.res.get("service_cpu"), k: run.res.get(f"service_{k}")}, k)
                             for k in keys[1:]}
        run.save()
        run.step("encode", encode_rate, graphs, device, photos, sizes, need_s=20 if sizes is FULL else 0)
        run.step("vit", vit_rate, device, sizes, need_s=20 if sizes is FULL else 0)
    finally:
        redis_client.flushall()  # disposable: else SHUTDOWN SAVE writes the 1M items' ~4 GB before the server stops
        close_embedded()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu for the dry run (default cuda)")
    ap.add_argument("--small", action="store_true", help="the dry run's sizes (a few hundred photos, 20K items)")
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/gpu.json"))
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/gpu-check"))
    ap.add_argument("--budget-s", type=float, default=400.0, help="steps that would start past it are skipped")
    ap.add_argument("--service-precisions", default="fp32,fp16",
                    help="CROSSPROBE_DEVICE_PRECISION values to serve on the device, comma separated")
    args = ap.parse_args()
    args.sizes = SMALL if args.small else FULL
    args.service_precisions = [p for p in args.service_precisions.split(",") if p]
    if not gpu_inputs.backbones_active():
        sys.exit("the random backbones are not set up: run this through scripts/gpu-check.sh")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: PyTorch {torch.__version__} sees no CUDA device (--device cpu: the dry run)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    run_all(run)
    run.save()
    print(json.dumps(run.res, indent=2))


if __name__ == "__main__":
    main()
