"""What the benchmarks share: the machine they ran on, the Flickr8k indexes (built when missing, reused when whole),
the index grown with generated items, and `crossprobe serve` in a subprocess. Every benchmark imports its set-up
from here; where one benchmark uses another's measurement (gpu_check runs service_bench's load, sizing
watch_bench's copy), the imports stay one way (tests/benchmarks/test_modules.py walks them: no circle).
Library-like helpers stay in their own modules: loadgen.py (the open-loop load generator), library_files.py
(photo files of every format) and support/ (servers and the grown library, which the tests use too).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.support import synthetic
from crossprobe.indexer import build, open_index
from crossprobe.indexer.jobs.settings import IndexerSettings

NAME = "flickr8k"  # the index of Flickr8k's photos, built by the indexer


def require_flickr8k() -> None:
    """Exit 0 with a message when ../shared/datasets/flickr8k (or FLICKR8K_DIR) is missing: the benchmarks that
    need it are skipped, not failed, on a machine without the data."""
    from crossprobe.models.data.flickr8k import available, dataset_root

    if not available():
        print(f"Flickr8k not found at {dataset_root()} (set FLICKR8K_DIR); the benchmark needs it. Skipped.")
        sys.exit(0)


def flickr8k_photos(limit: int | None = None) -> list[Path]:
    """Flickr8k's photos sorted by name (the first `limit`). Exit 0 with a message when they are missing, as
    require_flickr8k does: the benchmarks that read them are skipped, not failed, on a machine without the data."""
    from crossprobe.models.data.flickr8k import dataset_root

    folder = dataset_root() / "images"
    if not folder.is_dir():
        print(f"Flickr8k images not found at {folder} (set FLICKR8K_DIR); the benchmark needs them. Skipped.")
        sys.exit(0)
    return sorted(p for p in folder.iterdir() if p.suffix.lower() == ".jpg")[:limit]


def machine() -> str:
    """The shared machine description plus the load at start (a timing is sensitive to it)."""
    from crossprobe.models.evaluation.report import machine as describe

    return f"{describe()}, load average {os.getloadavg()[0]:.2f} at start"


def ensure_ckpt(ckpt: Path | None, workdir: Path) -> tuple[Path, bool]:
    """-> (checkpoint dir, weights are random)."""
    from crossprobe.models import checkpoint

    path = Path(ckpt or checkpoint.DEFAULT_CHECKPOINT)
    if (path / "config.json").exists():
        return path, False
    if ckpt:
        sys.exit(f"no checkpoint at {ckpt}")
    rnd = workdir / "random-ckpt"
    if not (rnd / "config.json").exists():
        import torch

        from crossprobe.models.model import ModelConfig, SearchModel

        torch.manual_seed(0)
        checkpoint.save(SearchModel(ModelConfig()).eval(), rnd, {"note": "random init, for latency only"})
    print(f"no committed checkpoint: using a random-init default-config model at {rnd} (latency only)")
    return rnd, True


def usable(name: str, fp: str, ixs: IndexerSettings, count: int) -> bool:
    """An index of that name, fingerprint and size whose first and last items' features read back."""
    try:
        rd = open_index(name, fp, ixs)
        rd.features(rd.ids[:1] + rd.ids[-1:])
        return len(rd) == count
    except Exception:  # noqa: BLE001 - anything missing: rebuild
        return False


def ensure_flickr8k(ixs: IndexerSettings, fp: str, paths: list[Path], ckpt: Path | None = None) -> int:
    """Index `flickr8k` over these photos with the checkpoint (default: the committed one), unless a usable one of
    that size exists -> its item count."""
    if usable(NAME, fp, ixs, len(paths)):
        return len(paths)
    manifest = Path(ixs.index_root) / f"{NAME}.jsonl"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text("".join(json.dumps({"id": p.name, "uri": str(p)}) + "\n" for p in paths))
    res = build(NAME, manifest=manifest, settings=ixs, ckpt=ckpt, log=print)
    print(res.summary())
    return res.count


def flickr8k_setup(workdir: Path):
    """Flickr8k, its photos in dataset order, the committed checkpoint's fingerprint, and index settings under
    workdir on an embedded Redis (the service reaches it through its unix socket; the caller stops it:
    close_embedded) -> (dataset, paths, fingerprint, index settings, redis client)."""
    from crossprobe.storage.redis_conn import connect
    from crossprobe.models import checkpoint
    from crossprobe.models.data.flickr8k import Flickr8k

    ds = Flickr8k.load()
    paths = [ds.image_path(i) for i in range(len(ds.images))]
    fp = checkpoint.read_config(checkpoint.DEFAULT_CHECKPOINT)["fingerprint"]
    workdir.mkdir(parents=True, exist_ok=True)
    ixs = IndexerSettings(redis_url=None, index_root=workdir / "indexes", progress=False)
    return ds, paths, fp, ixs, connect(ixs)


def synthesize(ixs: IndexerSettings, total: int, seed: int = 0) -> str:
    """Index `flickr8k-<total>`: the flickr8k items plus generated neighbours (benchmarks/support/synthetic.py), with
    the selectivity tags sel-0.01 / sel-0.1 / sel-1.0; reused when a complete one of that size (with them) exists."""
    name = f"{NAME}-{total // 1000}k" if total % 1000 == 0 else f"{NAME}-{total}"
    base = open_index(NAME, None, ixs)
    if usable(name, base.fingerprint, ixs, total) and "selectivity_tags" in open_index(name, None, ixs).manifest:
        return name
    synthetic.grow(ixs, NAME, name, total, seed)
    return name


def server_env(ixs: IndexerSettings, redis_client, indexes: list[str], **settings) -> dict:
    """The environment of `crossprobe serve` for these indexes on the benchmark's embedded Redis (its unix socket):
    the shipped defaults except access log off and no reload polling, plus CROSSPROBE_<SETTING> for each of
    `settings` (None: left out)."""
    env = {**os.environ, "REDIS_URL": f"unix://{redis_client.socket_file}", "CROSSPROBE_INDEX_ROOT": str(ixs.index_root),
           "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning", "CROSSPROBE_RELOAD_INTERVAL_S": "0",
           "CROSSPROBE_INDEXES": ",".join(indexes), "HF_HUB_OFFLINE": "1"}
    env.update({f"CROSSPROBE_{k.upper()}": str(v) for k, v in settings.items() if v is not None})
    return env


def service_env(ixs, redis_client, ckpt: Path, names: dict, precision: str = "fp32", threads: int | None = None) -> dict:
    """server_env for the latency benchmarks: this checkpoint and query-tower precision, a deeper admission queue.
    int8: the committed checkpoint's MiniLM query tower holds a cosine of about 0.99 to fp32, not the default 0.999
    (docs/research/query_tower_quant.md), so these benchmarks accept 0.98 to measure it."""
    return server_env(ixs, redis_client, list(names.values()), ckpt=ckpt, queue_size=256, query_precision=precision,
                      threads=threads or None, int8_min_cosine=0.98 if precision == "int8" else None)


def start_server(env: dict, port: int, log: Path, timeout_s: float = 600.0) -> subprocess.Popen:
    """`crossprobe serve` on 127.0.0.1:port in a subprocess, its output in `log` -> the process, once /readyz says 200.
    A RuntimeError with the log's tail when it does not within timeout_s, or at once when start-up failed (/healthz
    503 startup_failed: e.g. CUDA missing)."""
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "crossprobe.cli", "serve", "--port", str(port)], env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115 - the child keeps it
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if http.get("/readyz").status_code == 200:
                    return proc
                if http.get("/healthz").status_code == 503:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"the service did not become ready; {log}:\n{log.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 30 s: a benchmark's server never outlives it."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def text_vectors(texts: list[str]) -> np.ndarray:
    """The served query tower's g_q (the service's own model: the committed checkpoint, int8 ONNX graph, the
    shipped settings) for these texts -> (N, d) float32: ANN queries as the service makes them."""
    from crossprobe.service.settings import Settings as ServiceSettings
    from crossprobe.service.state import load_model

    model = load_model(ServiceSettings(redis_url=None))
    return np.stack([v.g_q for v in model.encode_texts(list(texts))]).astype(np.float32)


def prepare(workdir: Path, ckpt: Path | None, limit: int | None, big: int):
    """Checkpoint, embedded Redis and the indexes (built when missing) under workdir, and the query captions
    -> (index settings, redis client, checkpoint dir, fingerprint, random weights, {size: index name}, queries).
    The caller stops the embedded Redis (close_embedded)."""
    from crossprobe.storage.redis_conn import connect
    from crossprobe.models.data.flickr8k import Flickr8k, dataset_root

    workdir.mkdir(parents=True, exist_ok=True)
    ckpt, random_weights = ensure_ckpt(ckpt, workdir)
    fp = json.loads((ckpt / "config.json").read_text())["fingerprint"]
    ixs = IndexerSettings(redis_url=None, index_root=workdir / "indexes", progress=True)
    redis_client = connect(ixs)  # embedded; the service reaches it through its unix socket
    n_small = ensure_flickr8k(ixs, fp, sorted((dataset_root() / "images").glob("*.jpg"))[:limit], ckpt)
    names = {str(n_small): NAME}
    if big and big > n_small:
        names[str(big)] = synthesize(ixs, big)
    captions = Flickr8k.load()
    test = set(captions.splits["test"])
    queries = [c for c, i in zip(captions.captions, captions.caption_image) if i in test][:1000]
    return ixs, redis_client, ckpt, fp, random_weights, names, queries


FEATURES_SECTION = "## Search features over the 100K-item index"


def features_section(docs: Path) -> list[str]:
    """docs/research/latency.md's section for benchmarks/filter_latency.py, from docs/research/results/
    search_features.json ([] before a run). service_bench.py writes the page with it, filter_latency.py rewrites
    the section: either benchmark leaves the page whole."""
    f = docs / "results" / "search_features.json"
    res = json.loads(f.read_text()) if f.exists() else {}
    lat = res.get("latency_100k")
    if not lat:
        return []
    ix, rec = lat["index"], lat.get("ann_recall", {})
    lines = ["", FEATURES_SECTION, "",
             f"`{lat['command']}` (issue 17). Machine: {lat['machine']}. Index: {ix['items']:,} items ({ix['base']}; "
             f"FAISS {ix['factory']}); the shipped defaults (rerank cp, shortlist {lat['shortlist']}, k {lat['k']}); "
             f"{lat['queries']} Flickr8k test captions, each sent in every mode in turn; one client over loopback, "
             "client-side latency. Filters: `{\"field\": \"tags\", \"eq\": \"sel-F\"}` on a seeded random 1% / 10% "
             "/ all of the items. Target: every filtered mode p99 <= 50 ms with cp; image query p50 <= 40 ms.", "",
             "| mode | rerank | p50 ms | p95 ms | p99 ms | max ms | filter / ann / rerank ms (median) | how the filtered ANN answered | ANN recall@100 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m, r in lat["modes"].items():
        st = r["stages_ms"]
        how = ", ".join(f"{k} {v}" for k, v in r.get("methods", {}).items()) or "-"
        recall = rec.get(m, {}).get("recall", rec.get("unfiltered", {}).get("recall") if m == "text" else None)
        lines.append(f"| {m} | {r['rerank']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['max_ms']} | "
                     f"{st.get('filter', '-')} / {st.get('ann', '-')} / {st.get('rerank', '-')} | {how} | "
                     f"{'-' if recall is None else recall} |")
    if rec:
        lines += ["", f"ANN recall@100: the filtered ANN stage alone (storage/filter_columns.py, offline, the test images' "
                  f"stored vectors as {rec['queries']} queries) against an exhaustive search of the matching rows; "
                  "\"exact-scan\": at most CROSSPROBE_FILTER_EXACT_MAX (20,000) items match, so their stored vectors "
                  "are scanned exactly; \"faiss-idselector\": HNSW searched with the filter's bitmap. Reading the 100K items' metadata into filter columns (done while a version "
                  f"loads, CROSSPROBE_FILTER_PRELOAD): {rec['preload_s']} s."]
    return lines
