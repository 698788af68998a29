"""The GPU check's pieces (benchmarks/gpu_inputs.py, benchmarks/gpu_check.py) on the CPU: the random backbones load
where the real ones would (a stand-in package, CROSSPROBE_MINILM_DIR) with the served shapes, the synthetic photos
are Flickr8k-sized JPEGs, the fast large version serves as a version (every item's values in Redis, its own ids),
and the ratios are computed the right way up. The whole check's dry run is `scripts/gpu-check.sh --device cpu
--small` (minutes: not in make test)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks import gpu_check, gpu_inputs
from tests.indexer.conftest import models_dir, redis_server, redis_url  # noqa: F401 (fixtures)
from tests.service.conftest import built, svc_ckpt  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]


def test_random_backbones_load_where_the_real_ones_do(tmp_path):
    info = gpu_inputs.make_backbones(tmp_path)
    assert "random weights" in info["text_backbone"] and "random weights" in info["image_backbone"]
    code = ("import numpy as np, torch; from crossprobe.models import backbones; from crossprobe.core import inputs; "
            "from benchmarks.gpu_inputs import backbones_active; "
            "g = backbones.ImageBackbone()(torch.zeros(1, 3, 224, 224)); bert = backbones.load_minilm(); "
            "ids, mask = inputs.tokenize(inputs.load_tokenizer(), ['a dog']); "
            "print(float(g.abs().mean()) > 0.01, backbones_active(), tuple(g.shape), bert.config.hidden_size, "
            "int(ids.shape[1]))")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "CROSSPROBE_MINILM_DIR": str(tmp_path / "minilm")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # a grid of a trained backbone's magnitude (calibrated batch norms), the served shapes, the random backbones on
    assert out.stdout.split()[-7:] == ["True", "True", "(1,", "49,", "1280)", "384", "4"]


def test_photos_are_flickr8k_sized_jpegs(tmp_path):
    info = gpu_inputs.make_photos(tmp_path, 6, 2)
    files = sorted(tmp_path.glob("p*.jpg"))
    assert len(files) == 6 and info["count"] == 6 and info["mean_kb"] > 20
    with Image.open(files[0]) as im:
        assert im.format == "JPEG" and im.size == (500, 375)
    assert gpu_inputs.make_photos(tmp_path, 6, 2)["count"] == 6  # kept, not made again


def test_a_grown_version_serves_every_item(built):
    from crossprobe.indexer import open_index

    info = gpu_inputs.grow(built.ixs, "photos", "grown", 300, factory="IVF4,Flat", chunk=64)
    assert info["items"] == 300 and info["factory"] == "IVF4,Flat"
    base, rd = open_index("photos", None, built.ixs), open_index("grown", None, built.ixs)
    assert len(rd) == 300 and rd.ids[:12] == base.ids and rd.manifest["kind"] == "synthetic" and "text" not in rd.manifest
    gen = rd.ids[12 + 13]  # the 14th copy: of base item 1
    assert gen == "gen/0000013"
    np.testing.assert_array_equal(rd.features([gen])["p_v"], base.features([base.ids[1]])["p_v"])
    assert rd.metadata([gen])[0]["id"] == gen and rd.metadata([rd.ids[0]])[0]["id"] == base.ids[0]
    ids, scores = rd.search(rd.vectors([gen]), 5)
    assert gen in ids[0] and scores[0][0] > 0.9


def test_ratios_are_cpu_over_device_for_latency_and_device_over_cpu_for_throughput():
    row = lambda p50, qps, enc: {"p50_ms": p50, "p99_ms": 2 * p50, "max_qps": qps, "stages_ms": {"encode": enc,  # noqa: E731
                                                                                                    "ann": 0.0}}
    cpu = {"8091": {m: row(20.0, 100.0, 10.0) for m in gpu_check.RERANKS}, "readyz": {}, "start_s": 3}
    dev = {"8091": {m: row(5.0, 400.0, 2.5) for m in gpu_check.RERANKS}}
    r = gpu_check.ratios({"cpu": cpu, "device_fp32": dev}, "device_fp32")
    assert r["8091"]["cp"] == {"p50_speedup": 4.0, "p99_speedup": 4.0, "qps_ratio": 4.0, "stage_speedup": {"encode": 4.0}}


def test_parity_rows_fail_past_the_tolerance_and_on_nan():
    assert gpu_check._diff([1.0, 2.0], [1.0, 2.00005], 1e-4)["ok"]
    assert not gpu_check._diff([1.0, 2.0], [1.0, 2.001], 1e-4)["ok"]
    assert not gpu_check._diff([np.nan, 2.0], [1.0, 2.0], 1.0)["ok"]


def test_queries_read_like_captions():
    q = gpu_check.query_texts(20)
    assert len(set(q)) == 20 and all(4 <= len(t.split()) <= 20 for t in q)


def test_the_check_refuses_to_run_without_its_random_backbones(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CROSSPROBE_MINILM_DIR"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--workdir", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "run this through scripts/gpu-check.sh" in out.stderr
