"""StorageSettings: one declaration of the shared fields, read by the service and the batch jobs alike, with
each role's own variables and defaults for its Redis budget."""
from __future__ import annotations

import pytest

from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.settings import StorageSettings
from crossprobe.service.settings import Settings as ServiceSettings

SHARED = ("REDIS_URL", "CROSSPROBE_INDEX_ROOT", "CROSSPROBE_INDEX_KEY_PREFIX", "CROSSPROBE_MILVUS_URI",
          "CROSSPROBE_MILVUS_TIMEOUT_S", "CROSSPROBE_REDIS_SOCKET_TIMEOUT_S", "CROSSPROBE_INDEX_REDIS_SOCKET_TIMEOUT_S",
          "CROSSPROBE_THREADS", "CROSSPROBE_INDEX_THREADS", "CROSSPROBE_MODEL", "CROSSPROBE_CKPT")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in SHARED:
        monkeypatch.delenv(var, raising=False)


def test_no_field_is_declared_twice():
    base = set(StorageSettings.model_fields)
    for cls in (ServiceSettings, IndexerSettings):
        own = {n for n in cls.model_fields if n not in base}
        assert not {n for n in own for b in base if n.removeprefix("index_") == b.removeprefix("index_")}
        assert all(cls.model_fields[n] is not None for n in base)  # inherited, not redeclared
        assert not set(vars(cls).get("__annotations__", {})) & base, cls


def test_one_environment_configures_both_roles(monkeypatch, tmp_path):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("CROSSPROBE_INDEX_ROOT", str(tmp_path))
    monkeypatch.setenv("CROSSPROBE_INDEX_KEY_PREFIX", "photos-prod")
    monkeypatch.setenv("CROSSPROBE_MILVUS_URI", "http://milvus:19530")
    service, indexer = ServiceSettings(), IndexerSettings()
    for field in ("redis_url", "index_root", "index_key_prefix", "milvus_uri", "rdb"):
        assert getattr(service, field) == getattr(indexer, field), field
    assert service.index_root == tmp_path and service.rdb == tmp_path / "redis.db"


def test_each_role_has_its_own_redis_budget(monkeypatch):
    """A search gives up on Redis in ~200 ms, a batch job waits seconds; each role reads its own variable."""
    assert ServiceSettings().redis_socket_timeout_s == 0.2 and IndexerSettings().redis_socket_timeout_s == 10.0
    assert ServiceSettings().milvus_timeout_s == 1.0 and IndexerSettings().milvus_timeout_s == 10.0
    # threads: unset in both (the service's is its model's profile: service/profiles.py)
    assert ServiceSettings().profile.threads == 1 and IndexerSettings().threads is None
    monkeypatch.setenv("CROSSPROBE_REDIS_SOCKET_TIMEOUT_S", "0.5")
    monkeypatch.setenv("CROSSPROBE_INDEX_THREADS", "3")
    assert ServiceSettings().redis_socket_timeout_s == 0.5 and IndexerSettings().redis_socket_timeout_s == 10.0
    assert IndexerSettings().threads == 3 and ServiceSettings().threads is None
    assert ServiceSettings(redis_socket_timeout_s=2).redis_socket_timeout_s == 2  # a keyword wins over the role
    monkeypatch.setenv("CROSSPROBE_MILVUS_TIMEOUT_S", "4")  # one variable for both roles
    assert ServiceSettings().milvus_timeout_s == IndexerSettings().milvus_timeout_s == 4
    assert ServiceSettings.default_of("redis_retries") == 1 and IndexerSettings.default_of("redis_retries") == 3


def test_cluster_mode_needs_startup_nodes():
    with pytest.raises(ValueError, match="REDIS_URL"):
        ServiceSettings(redis_cluster=True)
    with pytest.raises(ValueError, match="REDIS_URL"):
        IndexerSettings(redis_cluster=True)


def test_the_service_store_has_what_the_store_reads(monkeypatch, tmp_path):
    """The service hands its own Settings to Store and IndexReader: the store's knobs (metadata read in chunks of
    redis_batch, the key layout of a version without a manifest) are storage settings, read from the indexer's
    variables by both roles."""
    import ast
    import inspect

    from crossprobe.storage import reader, store

    used = set()
    for module in (store, reader):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "settings"):
                used.add(node.attr)
    assert used and used <= set(ServiceSettings.model_fields) | {"rdb"}, used - set(ServiceSettings.model_fields)
    monkeypatch.setenv("CROSSPROBE_INDEX_REDIS_BATCH", "7")
    assert ServiceSettings().redis_batch == IndexerSettings().redis_batch == 7


def test_an_unknown_keyword_fails_loudly_and_unknown_variables_do_not(monkeypatch):
    """A renamed or misspelt keyword (root= for index_root=) is an error, never silently dropped; variables of the
    environment that name no field stay ignored."""
    from pydantic import ValidationError

    monkeypatch.setenv("CROSSPROBE_NO_SUCH_SETTING", "1")
    monkeypatch.setenv("CROSSPROBE_INDEX_NO_SUCH_SETTING", "1")
    assert ServiceSettings() and IndexerSettings()
    for cls in (ServiceSettings, IndexerSettings):
        with pytest.raises(ValidationError, match="root"):
            cls(root="/tmp/elsewhere")


def test_one_model_setting_for_both_roles(monkeypatch, tmp_path):
    """CROSSPROBE_MODEL names the model for the service and the jobs alike; CROSSPROBE_CKPT stays the older way
    to name a crossprobe checkpoint; set together they must agree, else the settings are refused."""
    from crossprobe.core import DEFAULT_CHECKPOINT
    from crossprobe.core.inference.spec import ModelSpec

    assert ServiceSettings().model_spec == IndexerSettings().model_spec == ModelSpec("crossprobe", "")
    monkeypatch.setenv("CROSSPROBE_MODEL", "hf:/models/clip")
    assert ServiceSettings().model_spec == IndexerSettings().model_spec == ModelSpec("hf", "/models/clip")
    monkeypatch.delenv("CROSSPROBE_MODEL")
    monkeypatch.setenv("CROSSPROBE_CKPT", str(tmp_path / "ck"))
    assert ServiceSettings().model_spec == IndexerSettings().model_spec == ModelSpec("crossprobe", str(tmp_path / "ck"))
    # both: the same checkpoint (however written) is fine ...
    monkeypatch.setenv("CROSSPROBE_MODEL", f"crossprobe:{tmp_path}/./ck")
    assert IndexerSettings().model_spec.path.resolve() == tmp_path / "ck"
    monkeypatch.setenv("CROSSPROBE_CKPT", str(DEFAULT_CHECKPOINT))
    monkeypatch.setenv("CROSSPROBE_MODEL", "crossprobe:")  # the committed checkpoint, named both ways
    assert ServiceSettings().model_spec == ModelSpec("crossprobe", "")
    # ... two different models are refused, naming both variables
    for other in ("hf:/models/clip", f"crossprobe:{tmp_path}/other"):
        monkeypatch.setenv("CROSSPROBE_MODEL", other)
        for cls in (ServiceSettings, IndexerSettings):
            with pytest.raises(ValueError, match=f"CROSSPROBE_MODEL={other} and CROSSPROBE_CKPT=.* name different"):
                cls()
    monkeypatch.delenv("CROSSPROBE_CKPT")
    monkeypatch.setenv("CROSSPROBE_MODEL", "clip:ViT-B-32")  # a typo of a family: refused at start, not at load
    with pytest.raises(ValueError, match="unknown family 'clip'"):
        ServiceSettings()
    assert ServiceSettings(model="open_clip:ViT-B-32/laion2b_s34b_b79k").model_spec.family == "open_clip"
