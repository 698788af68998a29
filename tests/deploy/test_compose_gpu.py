"""docker-compose.gpu.yml over docker-compose.yml, rendered by the real docker-compose: every service that runs a
model (one built from the crossprobe image) gets a GPU, the GPU image and CROSSPROBE_DEVICE=cuda; nothing else
changes. On a machine with a GPU, scripts/gpu-check.sh runs the models there; this checks what compose is given."""
from __future__ import annotations

from tests.deploy.conftest import REPO, STACK_SECRETS, compose_config, load_yaml

GPU = REPO / "docker-compose.gpu.yml"
RESERVATION = {"devices": [{"capabilities": ["gpu"], "count": 1, "driver": "nvidia"}]}


def same(a: dict, b: dict) -> bool:
    """Two rendered services alike (docker-compose 1.29 may list a merged file's sets in another order)."""
    key = lambda s: {**s, **{k: sorted(map(str, s.get(k, []))) for k in ("volumes", "cap_add", "cap_drop")}}  # noqa: E731
    return key(a) == key(b)


def model_services(cfg: dict) -> set[str]:
    return {n for n, s in cfg["services"].items() if str(s.get("image", "")).startswith("crossprobe:")}


def test_every_model_service_gets_a_gpu_and_the_gpu_image(tmp_path):
    env = {"IMAGES": str(tmp_path), **STACK_SECRETS}
    p, base = compose_config(env, "--profile", "batch")
    assert p.returncode == 0 and base, p.stderr
    p, gpu = compose_config(env, "-f", str(GPU), "--profile", "batch")
    assert p.returncode == 0 and gpu, p.stderr
    assert "WARNING" not in p.stderr, p.stderr
    runs_models = model_services(base)
    assert {"api", "indexer", "reindex", "watcher"} <= runs_models
    assert set(load_yaml(GPU)["services"]) == runs_models  # a model service added to the base file needs one here
    for name in runs_models:
        s, b = gpu["services"][name], base["services"][name]
        assert s["deploy"]["resources"]["reservations"] == RESERVATION, name
        assert s["image"] == "crossprobe:gpu" and s["build"]["args"]["VARIANT"] == "gpu", name
        assert s["build"]["args"]["BASE_IMAGE"].startswith("nvidia/cuda:12"), name
        assert s["environment"]["CROSSPROBE_DEVICE"] == "cuda", name
        # the rest of the service is the base file's: its Redis, volumes, command, limits
        assert {k: v for k, v in s["environment"].items() if k != "CROSSPROBE_DEVICE"} == b["environment"], name
        gpu_part = ("deploy", "image", "build", "environment")
        assert same({k: v for k, v in s.items() if k not in gpu_part}, {k: v for k, v in b.items() if k not in gpu_part})
    for name in set(base["services"]) - runs_models:
        assert same(gpu["services"][name], base["services"][name]), name
