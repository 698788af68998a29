"""The Ray Data engine of build / add / reindex (IndexerSettings.engine = "ray", `--engine ray`): read -> decode ->
encode as Ray Data map_batches, the encoder in an actor pool (one actor per GPU when the cluster has GPUs,
CPU actors otherwise); the driver (this process) writes every encoded batch exactly as the single-process
engine does (sink.BatchWriter: Redis values, then the journal commit) and jobs._finalize writes FAISS.

    read    ray.data.from_items: one row per journal batch not yet committed (its number and its items, from
            the journal's frozen item list), one block each, so decode tasks run in parallel
    decode  map_batches(_decode), stateless tasks: decode.decode_batch, the same code and the same skips
    encode  map_batches(_EncodeActor, compute=ActorPoolStrategy(size=N)): the ONNX backbone + head and the
            codec values, per journal batch
    write   the driver iterates the result (in any order) and hands each batch to sink.BatchWriter

Why a journal batch is the unit of every stage: the journal commits whole batches, and an encoder fed the
same pixels in the same batch with the same ONNX Runtime threads computes the same bits, so a version built
here equals the single-process build of the same folder (ids, vectors, Redis values) and a job killed under
one engine resumes under either (the job's spec does not name the engine: same journal, same batches).
Why the driver writes: the journal lives on the driver's disk, and a batch may only be committed once its
Redis values exist; the writes are a small share of the work (measured in docs/research/scaling-ray.md).

Ray itself: RAY_ADDRESS (IndexerSettings.ray_address) connects to that cluster, whose workers must have crossprobe
installed and see the same paths (images, the models dir); nothing is uploaded or downloaded (no
runtime_env). Without it, a local Ray instance starts here with a bounded CPU count and object store, no
dashboard, usage stats off, every server on loopback, and stops when the job ends. A Ray already
initialised in this process (a test module, a notebook) is used as it is and left running.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from crossprobe.core.inference import FeatureDims
from crossprobe.core.runtime import StageTimer
from crossprobe.indexer.jobs import ocr
from crossprobe.indexer.jobs.decode import decode_batch
from crossprobe.indexer.jobs.encoder import job_backend
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.indexer.jobs.sink import EncodedBatch
from crossprobe.indexer.jobs.sources import Item, Skip
from crossprobe.storage import codec

log = logging.getLogger(__name__)

# A fresh local instance whose raylet never registered with its GCS (Ray waits a fixed 30 s; seen in 2 of 19
# runs of tests/indexer's Ray tests on a 2-core machine, never twice in a row) is torn down and started
# again once: a transient start-up failure must not fail a reindex.
LOCAL_START_TRIES = 2


def start(settings: IndexerSettings) -> bool:
    """Connect to RAY_ADDRESS's cluster, or start a local Ray instance -> True when this call initialised Ray
    (the caller then shuts it down), False when this process already had Ray running."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report to the usage server (no network here)
    if not settings.ray_address:
        # A local instance is one node: Ray's single-machine mode (its default on macOS / Windows) takes the
        # loopback address as the node's, so every server binds 127.0.0.1 only. On Linux Ray would use the
        # machine's address (it turns an explicit 127.0.0.1 into it) and listen on it. Read when ray is
        # imported; the Ray processes started below inherit it.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return False
    if settings.ray_address:
        ray.init(address=settings.ray_address, log_to_driver=False, namespace="crossprobe")
        return True
    from ray._private import ray_constants

    if ray_constants.ENABLE_RAY_CLUSTER and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":
        ray_constants.ENABLE_RAY_CLUSTER = False  # ray was imported before the variable was set (a notebook)
    for attempt in range(LOCAL_START_TRIES):
        try:
            ray.init(
                address="local",
                num_cpus=settings.ray_num_cpus or len(os.sched_getaffinity(0)),
                include_dashboard=False,
                log_to_driver=False,
                namespace="crossprobe",
                object_store_memory=settings.ray_object_store_mb << 20,
                _temp_dir=str(Path(settings.ray_temp_dir).resolve()) if settings.ray_temp_dir else None,
            )
            break
        except Exception as e:  # Ray raises a bare Exception when its raylet has not registered within 30 s
            if "timed out during startup" not in str(e) or attempt + 1 == LOCAL_START_TRIES:
                raise
            _stop_half_started(e)
    return True


def _stop_half_started(err: Exception) -> None:
    """Kill what a failed ray.init may have left running (its GCS and raylet are this process's children, and
    Ray's Node raised before the driver recorded them, so ray.shutdown may not know them) and log why."""
    import psutil
    import ray

    left = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name() in ("gcs_server", "raylet") or "/ray/" in " ".join(p.cmdline()):
                p.kill()
                left.append(p)
        except psutil.Error:  # gone already
            pass
    psutil.wait_procs(left, timeout=10)
    ray.shutdown()
    log.warning("local Ray did not start (%s); killed %d of its processes, starting it again", err, len(left))


def plan_resources(settings: IndexerSettings, cluster: dict) -> dict:
    """-> decode tasks, encoder actors, each actor's resources and ONNX Runtime threads, from the cluster's
    resources (ray.cluster_resources()). Decode tasks: a quarter of the CPUs (at least IndexerSettings.workers, the
    single engine's decode threads; at most half), one CPU each (half of the only one on a 1-CPU node).
    GPUs: one actor each. CPUs only: the CPUs left, shared equally by the actors (one per CPU unless
    IndexerSettings.ray_actors says; fractions are fine: Ray only counts them). Never more than the cluster has: a
    pool that cannot be placed would wait for ever."""
    cpus, gpus = max(1.0, float(cluster.get("CPU", 1))), int(cluster.get("GPU", 0))
    decoders = min(max(1, settings.decode_workers, int(cpus) // 4), max(1, int(cpus) // 2))
    dec_cpu = 1.0 if cpus >= 2 else 0.5
    left = cpus - decoders * dec_cpu
    if gpus:
        actors = min(settings.ray_actors or gpus, gpus)
        return {
            "decoders": decoders,
            "decode_cpus": dec_cpu,
            "actors": actors,
            "num_gpus": 1,
            "num_cpus": min(1.0, left / actors),
            "threads": settings.threads,
        }
    actors = settings.ray_actors or max(1, int(left))
    # ONNX Runtime threads: the actor's share of ALL the CPUs, decode's included: decode is light (about an
    # eighth of the work on Flickr8k) and mostly waits, as in the single engine, whose encoder also runs
    # ORT's default (every core) beside its decode thread: faster than one thread per actor
    # (docs/research/scaling-ray.md)
    return {
        "decoders": decoders,
        "decode_cpus": dec_cpu,
        "actors": actors,
        "num_gpus": 0,
        "num_cpus": left / actors,
        "threads": settings.threads or max(1, round(cpus / actors)),
    }


def encode(
    items: list[Item],
    todo: list[int],
    layout: codec.Layout,
    settings: IndexerSettings,
    times: StageTimer,
    spec,
    model,
    bert,
    write: Callable[[EncodedBatch], None],
    say: Callable[[str], None] = print,
) -> None:
    """Decode and encode the journal batches `todo` of `items` on Ray, write(...) each as it arrives."""
    import ray
    from ray.exceptions import RayError

    with times.stage("ray_start"):
        started = start(settings)
    try:
        with times.stage("load_model"):
            backend = job_backend(settings, spec, model, bert)
            backend.prepare()  # graphs exported once, here, before any actor loads them
            identity = (backend.fingerprint, backend.dims)
        res = plan_resources(settings, ray.cluster_resources())
        where = "1 GPU" if res["num_gpus"] else f"{res['num_cpus']:g} CPU"
        say(
            f"engine ray: {'cluster ' + settings.ray_address if settings.ray_address else 'local Ray'}, {len(todo)} "
            "batches, "
            f"{res['decoders']} decode tasks, {res['actors']} encoder actor(s) ({where} and "
            f"{res['threads'] or 'default'} ONNX threads each)"
        )
        ds = _dataset(
            items,
            todo,
            layout,
            settings,
            res,
            identity,
            (backend.preprocessor(), backend.image_size, settings.reduce_for(backend.reduced_decoding)),
            spec,
            model,
            bert,
        )
        d = identity[1].d
        t = time.perf_counter()
        for row in ds.iter_rows():
            times.add("ray_wait", time.perf_counter() - t)  # the driver idle, waiting for an encoded batch
            info = json.loads(row["info"])
            for stage in ("decode", "backbone", "head", "codec", "ocr"):
                times.add(stage, info["seconds"][stage])
            n = len(info["rows"])
            values = row["values"][:n]
            write(
                EncodedBatch(
                    int(row["b"]),
                    info["rows"],
                    info["meta"],
                    [(r, Skip(**sk)) for r, sk in info["skips"]],
                    [values[i].tobytes() for i in range(n)],
                    np.ascontiguousarray(row["g"][:n], np.float32).reshape(n, d),
                )
            )
            t = time.perf_counter()
    except RayError as e:  # a task or actor failed for good: the job fails, its committed batches stay
        raise RuntimeError(f"the Ray engine failed: {e}") from e
    finally:
        if started:
            with times.stage("ray_stop"):
                ray.shutdown()


def _dataset(
    items: list[Item],
    todo: list[int],
    layout: codec.Layout,
    settings: IndexerSettings,
    res: dict,
    identity: tuple[str, FeatureDims],
    pixels: tuple,  # (preprocess, size, reduce): how the model's pixels are made (decode.decode_file)
    spec,
    model,
    bert,
):
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy, DataContext, TaskPoolStrategy

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False  # the job has its own bar (items, skips, rate)
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    bs = settings.batch_size
    rows = [
        {"b": b, "items": json.dumps([asdict(it) for it in items[b * bs : (b + 1) * bs]], ensure_ascii=False)}
        for b in todo
    ]
    ds: ray.data.Dataset = ray.data.from_items(rows, override_num_blocks=len(rows))
    ds = ds.map_batches(
        # Ray types a function map as batch -> batch: it has no place for the parameters fn_kwargs fills
        _decode,  # type: ignore[arg-type]
        batch_size=1,
        fn_kwargs={"bs": bs, "max_pixels": settings.max_pixels, "pixels": pixels},
        compute=TaskPoolStrategy(size=res["decoders"]),
        num_cpus=res["decode_cpus"],
        # Ray Data retries a task whose worker died for ever by default; a file that crashes
        # the decoder itself (not a Python error: those are skips) must fail the job instead.
        # Also, these args differ from the actors', which keeps Ray Data from fusing decode
        # into the encoder actors (it fuses a task map into the next actor map when sizes and
        # args match: 1 and 1 on 2 CPUs), where one actor would decode and encode in turn
        max_retries=3,
    )
    actor_settings = settings.model_copy(update={"threads": res["threads"]})
    torch_head = settings.head == "torch"  # the actors then need the model (PyTorch); else prepare() exported the graph
    return ds.map_batches(
        _EncodeActor,
        batch_size=1,
        compute=ActorPoolStrategy(size=res["actors"]),
        num_cpus=res["num_cpus"],
        num_gpus=res["num_gpus"],
        fn_constructor_kwargs={
            "settings": actor_settings,
            "layout": layout,
            "identity": identity,
            "spec": spec,
            "model": model if torch_head else None,
            "bert": bert if torch_head else None,
        },
    )


def _decode(batch: dict, bs: int, max_pixels: int, pixels: tuple) -> dict:
    """Ray task: journal batches -> pixels padded to (bs, 3, 224, 224) (one shape for every row, so Ray keeps
    them as one tensor column) + a JSON column with the decoded rows, their metadata and the skips."""
    out: dict[str, list] = {"b": [], "pixels": [], "info": []}
    for b, items_json in zip(batch["b"], batch["items"]):
        t = time.perf_counter()
        its = [Item(**d) for d in json.loads(items_json)]
        preprocess, size, reduce = pixels
        dec = decode_batch(its, int(b) * bs, max_pixels, preprocess, size, reduce)
        padded = np.zeros((bs, 3, size, size), np.float32)
        padded[: len(dec.rows)] = dec.pixels
        out["b"].append(int(b))
        out["pixels"].append(padded)
        out["info"].append(
            json.dumps(
                {
                    "rows": dec.rows,
                    "meta": dec.meta,
                    "uris": [its[r - int(b) * bs].uri for r in dec.rows],
                    "skips": [[r, asdict(sk)] for r, sk in dec.skips],
                    "decode_s": time.perf_counter() - t,
                },
                ensure_ascii=False,
            )
        )
    return {"b": np.asarray(out["b"], np.int64), "pixels": np.stack(out["pixels"]), "info": np.asarray(out["info"])}


class _EncodeActor:
    """Ray actor: the job's model (its image parts loaded once per actor) -> per journal batch g padded to (bs, d) and
    the codec values padded to (bs, itemsize) bytes, and the stage times."""

    def __init__(
        self, settings: IndexerSettings, layout: codec.Layout, identity: tuple[str, FeatureDims], spec, model, bert
    ):
        self.enc = job_backend(settings, spec, model, bert, identity=identity)
        self.enc.warm("image")
        # index-time OCR where the text gate, on the grid the actor computes, sees writing (ocr.py)
        self.ocr = ocr.Reader(settings.ocr_gate_threshold, settings.threads or -1, self.enc) if settings.ocr else None
        self.layout, self.bs, self.d = layout, settings.batch_size, identity[1].d
        self.itemsize = layout.dtype().itemsize

    def __call__(self, batch: dict) -> dict:
        gs, values, infos = [], [], []
        for pixels, info_json in zip(batch["pixels"], batch["info"]):
            info = json.loads(info_json)
            n = len(info["rows"])
            g = np.zeros((self.bs, self.d), np.float32)
            v = np.zeros((self.bs, self.itemsize), np.uint8)
            sec = {"decode": info.pop("decode_s"), "backbone": 0.0, "head": 0.0, "codec": 0.0, "ocr": 0.0}
            uris = info.pop("uris")
            if n:
                t0 = time.perf_counter()
                grid = self.enc.image_grid(np.ascontiguousarray(pixels[:n]))
                t1 = time.perf_counter()
                e = self.enc.image_features(grid)
                t2 = time.perf_counter()
                vals = codec.encode(self.layout, e.p_v, e.b_bar, e.s_i, e.labels)
                t3 = time.perf_counter()
                info["meta"] = ocr.read_batch(self.ocr, uris, grid.cells, info["meta"])
                sec.update(backbone=t1 - t0, head=t2 - t1, codec=t3 - t2, ocr=time.perf_counter() - t3)
                g[:n] = e.g
                v[:n] = np.frombuffer(b"".join(vals), np.uint8).reshape(n, self.itemsize)
            info["seconds"] = sec
            gs.append(g)
            values.append(v)
            infos.append(json.dumps(info, ensure_ascii=False))
        return {"b": batch["b"], "g": np.stack(gs), "values": np.stack(values), "info": np.asarray(infos)}
