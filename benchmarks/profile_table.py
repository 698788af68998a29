"""Where the service's time goes under load: py-spy's raw (collapsed) stacks summarised by what the sampled thread
was doing, plus CPU seconds per thread from /proc (ONNX Runtime's pool workers are native threads py-spy
never samples; /proc sees them). Used by load_bench.py profile; runnable on a saved raw file:

    python -m benchmarks.profile_table artifacts/bench-service/profile-default.txt
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

# (label, pattern over the whole stack): the first that matches names the sample. Order matters: the most
# specific work first, the framework around it last.
CATEGORIES = [
    ("tokenizer", r"tokenize \(|tokenizers"),
    ("ORT: query tower run (encode)", r"encode_texts \([^;]*core/inference/crossprobe\.py"),
    ("ORT: rerank scorer run", r"rerank \([^;]*core/inference/crossprobe\.py"),
    ("FAISS search (ann)", r"search \([^;]*indexer/reader\.py"),
    ("Redis: fetch features (MGET + decode)", r"features \([^;]*indexer/reader\.py"),
    ("Redis: metadata (MGET + JSON)", r"metadata \([^;]*indexer/reader\.py"),
    ("pipeline, other (argsort, hits, breaker)", r"_after_encode \("),
    ("batcher (gather, futures)", r"service/batcher\.py"),
    ("JSON response (render)", r"render \([^;]*starlette/responses\.py|json/encoder\.py"),
    ("request body + validation (pydantic)", r"pydantic|_validate|request_body_to_args|serialize_response"),
    ("HTTP protocol (uvicorn h11, http_timeouts)", r"h11|uvicorn/protocols|http_timeouts\.py"),
    ("middleware (metrics, body guard, errors)", r"MetricsMiddleware|body_guard\.py|metrics\.py|prometheus_client"),
    ("routing + FastAPI/Starlette dispatch", r"fastapi/|starlette/"),
    ("asyncio event loop (select, callbacks)", r"asyncio/"),
    ("thread pool plumbing", r"concurrent/futures|threading\.py"),
]


def thread_name(frame: str) -> str:
    """py-spy's first frame, 'thread (1234): "stage_0"' -> 'stage_*' (the pool's threads as one)."""
    m = re.search(r'"([^"]+)"', frame) or re.search(r"\):\s*(.+)$", frame)
    return re.sub(r"_\d+$", "_*", m.group(1).strip()) if m else frame


def thread_ids(raw: str) -> dict[int, str]:
    """TID -> thread name, from the raw stacks."""
    out: dict[int, str] = {}
    for line in raw.splitlines():
        first = line.split(";", 1)[0]
        m = re.match(r"thread \((\d+)\)", first.strip().lstrip('"'))
        if m:
            out[int(m.group(1))] = thread_name(first)
    return out


def task_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every thread of pid, from /proc/<pid>/task/<tid>/stat."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (t / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(t.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def cpu_by_thread(before: dict[int, float], after: dict[int, float], names: dict[int, str], wall_s: float) -> dict:
    """CPU per thread group over a window; threads py-spy never saw are native (ONNX Runtime's pool, OpenMP)."""
    groups: dict[str, float] = {}
    for tid, t in after.items():
        name = names.get(tid, "native threads (ONNX Runtime pool, OpenMP, ...)")
        groups[name] = groups.get(name, 0.0) + t - before.get(tid, 0.0)
    total = sum(groups.values())
    return {"wall_s": round(wall_s, 2), "cpu_s": round(total, 2), "cores_used": round(total / wall_s, 2),
            "by_thread": {k: {"cpu_s": round(v, 2), "pct": round(100 * v / max(total, 1e-9), 1)}
                          for k, v in sorted(groups.items(), key=lambda kv: -kv[1])}}


def summarise(raw: str) -> dict:
    """raw: py-spy --format raw lines "frame;frame;... count" -> {category: {"samples": n, "pct": x}} plus the
    split by thread."""
    cats: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, _, n = line.rpartition(" ")
        n = int(n)
        total += n
        label = next((name for name, pat in CATEGORIES if re.search(pat, stack)), "other")
        cats[label] = cats.get(label, 0) + n
        tname = thread_name(stack.split(";", 1)[0])
        threads[tname] = threads.get(tname, 0) + n
    pct = lambda d: {k: {"samples": v, "pct": round(100 * v / max(1, total), 1)}  # noqa: E731
                     for k, v in sorted(d.items(), key=lambda kv: -kv[1])}
    return {"samples": total, "by_activity": pct(cats), "by_thread": pct(threads)}


if __name__ == "__main__":
    import json

    print(json.dumps(summarise(Path(sys.argv[1]).read_text()), indent=1))
