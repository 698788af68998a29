"""crossprobe beside clip-retrieval (issue 54): the same random open_clip ViT-B-32 weights, the same photos, the same
/knn-service requests, the two services alternated on one host.

    clip-retrieval 2.45.0 (PyPI), in a virtualenv of its own (scripts/clip-retrieval-env.sh): `clip-retrieval
        inference` + `index` over the photo folder, then `clip-retrieval back` (its Flask service) on the index;
    crossprobe: the weights exported in the export venv (scripts/openclip-env.sh: open_clip needs torchvision),
        `crossprobe index build --model open_clip:ViT-B-32/<file>`, then `crossprobe serve` with its defaults for that
        model, and each --crossprobe-threads variant measured beside them (what the per-model default is chosen from).

Each round starts each service afresh, warms it (20 requests of other captions), then measures: 1 client sending
--queries requests one after another (p50 / p99), and 4 clients sending 2 x --queries (queries/s). crossprobe's
query-vector cache is off (CROSSPROBE_QUERY_CACHE_MB=0): clip back has none, and the 4-client pass repeats each
query twice, which the cache would answer without the text tower (its own cost: benchmarks/query_cache_bench.py). Rounds alternate which service
goes first. The request is clip-retrieval's front-end's own (text, modality image, num_images 10, num_result_ids
100, deduplicate true, the safety / violence / aesthetic options off), sent by benchmarks/loadgen.py over keep-alive
loopback connections. clip back returns a "url" column (the photo's path; added to its metadata so that it does
not base64-encode the photos, which its image_path column would make it do) and crossprobe its item URLs: neither
ships image bytes. Indexing: wall time of each side's indexing commands over the same photos.

Photos: the first --photos Flickr8k dev photos (read from /work/shared, copied under artifacts/: never into the
repository); queries: the first caption of each of the first --queries dev photos (the warm-up: the second
caption of the first 20).

    .venv/bin/python -m benchmarks.peer_clip_retrieval [--photos 500] [--queries 100] [--rounds 3]
        -> docs/research/results/peer_clip_retrieval.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import stop_server
from benchmarks.loadgen import Generator, knn_requests
from benchmarks.model_end_to_end import _host
from crossprobe.core.atomic import atomic_write

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "artifacts" / "peer_clip_retrieval"
OUT = REPO / "docs" / "research" / "results" / "peer_clip_retrieval.json"
CLIPRET = REPO / "artifacts" / "clipret-venv" / "bin"
OPENCLIP = REPO / "artifacts" / "openclip-venv" / "bin" / "python"
INDICE = "bench"

EXPORT_SIDE = r"""
import json, sys
from pathlib import Path
from tests.support import reference_models as rm
from crossprobe.models import families
work, graphs = Path(sys.argv[1]), Path(sys.argv[2])
ref_dir = work / "model"
ref = rm.Reference.load(ref_dir) if (ref_dir / rm.META).exists() else rm.build("open_clip", ref_dir, size="base")
weights = ref.path / "open_clip_model.safetensors"
families.export(f"open_clip:ViT-B-32/{weights}", graphs)
print(json.dumps({"weights": str(weights)}))
"""

ADD_URL = r"""
import sys, glob
import pyarrow.parquet as pq, pyarrow.compute as pc
for f in glob.glob(sys.argv[1] + "/metadata/*.parquet"):
    t = pq.read_table(f)
    if "url" not in t.column_names:
        pq.write_table(t.append_column("url", pc.cast(t["image_path"], "string")), f)
"""


def run(cmd: list[str], log: Path, env: dict | None = None, timeout: float = 3600) -> float:
    """cmd to completion, its output appended to log -> wall seconds (a RuntimeError with the tail when it fails)."""
    t = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(map(str, cmd))}\n".encode())
        out.flush()
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=REPO)
    if p.returncode:
        raise RuntimeError(f"{' '.join(map(str, cmd[:3]))} exited {p.returncode}:\n{log.read_text()[-3000:]}")
    return time.monotonic() - t


def data(n_photos: int, n_queries: int, work: Path) -> tuple[Path, list[str], list[str]]:
    from crossprobe.models.data.flickr8k import Flickr8k

    ds = Flickr8k.load()
    dev = ds.splits["dev"]
    photos = work / "photos"
    if sorted(p.name for p in photos.glob("*.jpg")) != sorted(ds.images[i] for i in dev[:n_photos]):
        shutil.rmtree(photos, ignore_errors=True)
        photos.mkdir(parents=True)
        for i in dev[:n_photos]:
            shutil.copy(ds.image_path(i), photos / ds.images[i])
    by_image: dict[int, list[str]] = {}
    for c, i in zip(ds.captions, ds.caption_image):
        by_image.setdefault(i, []).append(c)
    return photos, [by_image[i][0] for i in dev[:n_queries]], [by_image[i][1] for i in dev[:20]]


def export_open_clip(work: Path, graphs: Path) -> str:
    """The random ViT-B-32 (built once under work) exported into graphs, in the export venv -> its weights file."""
    p = subprocess.run([str(OPENCLIP), "-c", EXPORT_SIDE, str(work), str(graphs)], cwd=REPO, capture_output=True,
                       text=True, timeout=3600, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    if p.returncode:
        raise SystemExit(f"the export venv's side failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["weights"]


def prepare(work: Path, photos: Path, log: Path) -> dict:
    """Both sides' indexes over the photos (built once per work folder) -> the spec, model file and indexing times."""
    graphs, done = work / "graphs", work / "prepared.json"
    if done.exists():
        return json.loads(done.read_text())
    weights = export_open_clip(work, graphs)
    spec = f"open_clip:ViT-B-32/{weights}"
    n = len(list(photos.glob("*.jpg")))
    cp_env = {**_clean_env(), "CROSSPROBE_INDEX_ROOT": str(work / "indexes"), "CROSSPROBE_MODELS_DIR": str(graphs),
              "CROSSPROBE_INDEX_PROGRESS": "false"}
    shutil.rmtree(work / "indexes", ignore_errors=True)
    cp_s = run([sys.executable, "-m", "crossprobe.cli", "index", "build", "--name", INDICE, "--images", str(photos),
                "--model", spec], log, cp_env)
    model = f"open_clip:ViT-B-32/{weights}"  # all_clip keeps every "/" after the architecture: an absolute path works
    cr_env = _clipret_env()
    for d in ("embeddings", "clip_index"):
        shutil.rmtree(work / d, ignore_errors=True)
    inf_s = run([str(CLIPRET / "clip-retrieval"), "inference", "--input_dataset", str(photos), "--output_folder",
                 str(work / "embeddings"), "--input_format", "files", "--clip_model", model, "--enable_text", "False",
                 "--enable_metadata", "False", "--batch_size", "64", "--num_prepro_workers", "2"], log, cr_env)
    idx_s = run([str(CLIPRET / "clip-retrieval"), "index", "--embeddings_folder", str(work / "embeddings"),
                 "--index_folder", str(work / "clip_index"), "--nb_cores", str(os.cpu_count() or 1)], log, cr_env)
    run([str(CLIPRET / "python"), "-c", ADD_URL, str(work / "clip_index")], log, cr_env)
    (work / "indices.json").write_text(json.dumps({INDICE: str(work / "clip_index")}))
    out = {"spec": spec, "clip_model": model, "photos": n,
           "indexing": {"crossprobe": {"command": "crossprobe index build --model open_clip:ViT-B-32/<file>",
                                       "wall_s": round(cp_s, 1), "images_per_s": round(n / cp_s, 1)},
                        "clip_retrieval": {"command": "clip-retrieval inference + clip-retrieval index",
                                           "inference_s": round(inf_s, 1), "index_s": round(idx_s, 1),
                                           "wall_s": round(inf_s + idx_s, 1),
                                           "images_per_s": round(n / (inf_s + idx_s), 1)}}}
    done.write_text(json.dumps(out, indent=1))
    return out


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("CROSSPROBE_", "REDIS_URL", "OMP_", "MKL_")) and k != "PYTHONPATH"}


def _clipret_env() -> dict:
    return {**_clean_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}


def start_clip_back(work: Path, model: str, port: int, log: Path) -> subprocess.Popen:
    import httpx

    cmd = [str(CLIPRET / "clip-retrieval"), "back", "--port", str(port), "--indices-paths", str(work / "indices.json"),
           "--clip_model", model, "--enable_mclip_option", "False", "--provide_aesthetic_embeddings", "False",
           "--provide_safety_model", "False", "--provide_violence_detector", "False", "--use_jit", "False",
           "--columns_to_return", '["url"]']
    proc = subprocess.Popen(cmd, env=_clipret_env(), cwd=work, stdout=open(log, "ab"),  # noqa: SIM115
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/indices-list", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"clip back did not start:\n{log.read_text()[-3000:]}")


def start_crossprobe(work: Path, spec: str, port: int, log: Path, extra: dict) -> subprocess.Popen:
    from benchmarks.harness import start_server

    env = {**_clean_env(), "CROSSPROBE_INDEX_ROOT": str(work / "indexes"), "CROSSPROBE_MODELS_DIR": str(work / "graphs"),
           "CROSSPROBE_MODEL": spec, "CROSSPROBE_INDEXES": INDICE, "CROSSPROBE_ACCESS_LOG": "false",
           "CROSSPROBE_LOG_LEVEL": "warning", "CROSSPROBE_RELOAD_INTERVAL_S": "0", "HF_HUB_OFFLINE": "1",
           "CROSSPROBE_QUERY_CACHE_MB": "0", **extra}
    return start_server(env, port, log)


def measure(port: int, queries: list[str], warm: list[str], requests=None) -> dict:
    """A warmed service: 1 client sending the queries one after another, then 4 clients sending twice as many.
    requests(host, port, texts) -> raw requests (default: /knn-service)."""
    make = requests or (lambda host, p, texts: knn_requests(host, p, texts, INDICE))

    async def go() -> dict:
        await Generator("127.0.0.1", port, make("127.0.0.1", port, warm), timeout_s=60).closed_loop(1, len(warm))
        reqs = make("127.0.0.1", port, queries)
        one = (await Generator("127.0.0.1", port, reqs, timeout_s=60).closed_loop(1, len(queries))).summary()
        four = (await Generator("127.0.0.1", port, reqs, timeout_s=60).closed_loop(4, 2 * len(queries))).summary()
        return {"one_client": one, "four_clients": four}

    return asyncio.run(go())


def summarize(rounds: list[dict], names: list[str]) -> dict:
    """Each name's medians over the rounds: p50 and p99 at 1 client, queries/s at 4, and its errors in all."""
    def med(name: str, part: str, key: str) -> float:
        return statistics.median(rd[name][part][key] for rd in rounds)

    return {name: {"p50_ms_1_client": med(name, "one_client", "p50_ms"),
                   "p99_ms_1_client": med(name, "one_client", "p99_ms"),
                   "qps_4_clients": med(name, "four_clients", "qps"),
                   "errors": sum(rd[name][p]["errors"] for rd in rounds for p in ("one_client", "four_clients"))}
            for name in names}


def parse_variants(text: str) -> dict[str, dict[str, str]]:
    """"threads2:CROSSPROBE_THREADS=2;enc1:CROSSPROBE_QUERY_ENCODERS=1" -> {name: {variable: value}}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, assigns = part.partition(":")
        out[f"crossprobe_{name}"] = dict(a.split("=", 1) for a in assigns.split(",") if a)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", type=int, default=500)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="", help="crossprobe variants measured beside its defaults, "
                    "NAME:VAR=VALUE[,VAR=VALUE];... (e.g. threads2:CROSSPROBE_THREADS=2)")
    ap.add_argument("--work", type=Path, default=WORK)
    args = ap.parse_args()
    for need in (CLIPRET / "clip-retrieval", OPENCLIP):
        if not need.exists():
            raise SystemExit(f"{need} missing: scripts/clip-retrieval-env.sh and scripts/openclip-env.sh make them")
    args.work = args.work.resolve()  # clip back runs in it; every path it is given must hold from there
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "run.log"
    photos, queries, warm = data(args.photos, args.queries, args.work)
    prep = prepare(args.work, photos, log)
    from crossprobe.service.server import free_port

    variants = {"crossprobe": {}, **parse_variants(args.variants)}
    rounds = []
    for r in range(args.rounds):
        order = ["clip_back", *variants] if r % 2 == 0 else [*variants, "clip_back"]
        got = {}
        for name in order:
            port = free_port()
            proc = (start_clip_back(args.work, prep["clip_model"], port, log) if name == "clip_back"
                    else start_crossprobe(args.work, prep["spec"], port, log, variants[name]))
            try:
                got[name] = measure(port, queries, warm)
            finally:
                stop_server(proc)
            print(f"round {r + 1} {name}: p50 {got[name]['one_client']['p50_ms']} ms, "
                  f"4 clients {got[name]['four_clients']['qps']} q/s", flush=True)
        rounds.append(got)

    summary = summarize(rounds, ["clip_back", *variants])
    per_round = [{"ratio_p50_1_client": round(rd["crossprobe"]["one_client"]["p50_ms"]
                                              / rd["clip_back"]["one_client"]["p50_ms"], 3),
                  "ratio_qps_4_clients": round(rd["crossprobe"]["four_clients"]["qps"]
                                               / rd["clip_back"]["four_clients"]["qps"], 2)} for rd in rounds]
    doc = {"command": "python -m benchmarks.peer_clip_retrieval " + " ".join(sys.argv[1:]), "host": _host(),
           "model": "random-weight open_clip ViT-B-32 (tests/support/reference_models.py, seed 0), fp32",
           "clip_retrieval": "clip-retrieval 2.45.0 from PyPI, open_clip_torch 2.32.0, torch 2.14.1 (CPU), "
                             "its own venv (scripts/clip-retrieval-env.sh)",
           "photos": f"the first {prep['photos']} Flickr8k dev photos", "queries": len(queries),
           "request": json.loads(knn_requests("127.0.0.1", 0, queries[:1], INDICE)[0].split(b"\r\n\r\n", 1)[1]),
           "rounds": args.rounds, "indexing": prep["indexing"], "summary": summary,
           "ratio_p50_1_client": round(summary["crossprobe"]["p50_ms_1_client"]
                                       / summary["clip_back"]["p50_ms_1_client"], 3),
           "ratio_qps_4_clients": round(summary["crossprobe"]["qps_4_clients"]
                                        / summary["clip_back"]["qps_4_clients"], 2),
           "per_round": per_round, "raw": rounds}
    atomic_write(OUT, json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("summary", "ratio_p50_1_client", "ratio_qps_4_clients", "indexing")},
                     indent=1))


if __name__ == "__main__":
    main()
