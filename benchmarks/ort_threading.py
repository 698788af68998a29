"""ONNX Runtime thread pools on the service's request path: one pool per graph or one shared pool.

Per query the service runs the (int8) query tower, then the CP scorer over the 100
shortlisted candidates, with a few ms of other work (FAISS, Redis, HTTP) between
requests. This replays that sequence (tokenizer + query tower, CP over 100 candidates,
3 ms pause) 300 times after 30 warm-up rounds, in a fresh process per setting
(the shared pool is process-wide), and reports the median ms of each graph:

  own pools, spinning      CROSSPROBE_ORT_SHARED_POOL=false (the setting before this benchmark)
  own pools, no spinning   CROSSPROBE_ORT_SHARED_POOL=false CROSSPROBE_ORT_SPINNING=false
  shared pool              the default: one process-wide pool (core/runtime.py)

Sessions are made exactly as the service makes them (crossprobe.service.state.load_model).
Writes docs/research/ort_threading.md and docs/research/results/ort_threading.json.
Run: .venv/bin/python -m benchmarks.ort_threading   (CPU otherwise idle)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {
    "own pools, spinning": {"CROSSPROBE_ORT_SHARED_POOL": "false", "CROSSPROBE_ORT_SPINNING": "true"},
    "own pools, no spinning": {"CROSSPROBE_ORT_SHARED_POOL": "false", "CROSSPROBE_ORT_SPINNING": "false"},
    "shared pool (default)": {"CROSSPROBE_ORT_SHARED_POOL": "true"},
}
CAPTION = "a black dog is running through the grass with a ball in its mouth"


def measure(rounds: int = 300, warmup: int = 30, pause_s: float = 0.003) -> dict:
    """In this process: the service's model from the environment's settings -> median ms per graph."""
    import statistics
    import time

    import numpy as np

    from crossprobe.service.settings import Settings
    from crossprobe.service.state import load_model

    models = load_model(Settings())
    rng = np.random.default_rng(0)
    K, n, d = 100, models.dims.item.n, models.dims.item.dc
    feats = {"p_v": rng.standard_normal((K, n, d), np.float32), "b_bar": rng.standard_normal((K, d), np.float32)}
    s_tt = rng.standard_normal(K).astype(np.float32)
    enc, cp = [], []
    for i in range(warmup + rounds):
        t0 = time.perf_counter()
        q = models.encode_texts([CAPTION])[0]
        t1 = time.perf_counter()
        models.rerank("cp", q, feats, s_tt)
        t2 = time.perf_counter()
        if i >= warmup:
            enc.append((t1 - t0) * 1e3)
            cp.append((t2 - t1) * 1e3)
        time.sleep(pause_s)
    return {"encode_ms": round(statistics.median(enc), 3), "cp_rerank_100_ms": round(statistics.median(cp), 3),
            "sum_ms": round(statistics.median(e + c for e, c in zip(enc, cp)), 3),
            "query_precision": models.query_precision}


def main() -> None:
    from crossprobe.models.evaluation.report import machine

    res = {}
    for name, env in SETTINGS.items():
        out = subprocess.run([sys.executable, "-m", "benchmarks.ort_threading", "--child"], cwd=REPO,
                             env={**os.environ, **env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, check=True)
        res[name] = {**json.loads(out.stdout.strip().splitlines()[-1]), "env": env}
        print(name, res[name])
    res["command"] = "python -m benchmarks.ort_threading"
    res["machine"] = machine()
    docs = Path("docs/research")
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "ort_threading.json").write_text(json.dumps(res, indent=2))
    rows = [f"| {k} | {v['encode_ms']} | {v['cp_rerank_100_ms']} | {v['sum_ms']} | "
            + " ".join(f"{a}={b}" for a, b in v["env"].items()) + " |" for k, v in res.items() if isinstance(v, dict)]
    (docs / "ort_threading.md").write_text("\n".join([
        "# ONNX Runtime thread pools on the request path", "",
        f"`{res['command']}`. Machine: {res['machine']}.", "",
        "Per query, as the service does it: tokenizer + query tower (the served precision), then the CP scorer over "
        "100 candidates, then 3 ms of other work; 300 rounds after 30 warm-up ones, medians, a fresh process per "
        "setting. Sessions are the service's own (`load_model`).", "",
        "| setting | encode ms | CP rerank of 100 ms | encode + rerank ms | environment |", "|---|---|---|---|---|",
        *rows, "",
        "With a pool per graph and spinning workers, the pool that just finished keeps spinning on the two cores "
        "while the next graph runs: each graph is slower than it is alone. One shared pool has no such neighbour. "
        "The service therefore makes one process-wide pool (CROSSPROBE_ORT_SHARED_POOL, default true; "
        "core/runtime.py); end-to-end numbers are in docs/research/latency.md.", ""]))


if __name__ == "__main__":
    if "--child" in sys.argv:
        print(json.dumps(measure()))
    else:
        main()
