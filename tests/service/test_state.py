"""The service's model (service/state.py load_model): one shared ONNX Runtime pool by default (core/runtime.py)."""
import pytest

from tests.core.test_runtime import run_fresh

BODY = """
    from crossprobe.core import runtime
    from crossprobe.service.settings import Settings
    from crossprobe.service.state import load_model
    m = load_model(Settings(query_precision="fp32", threads=2))
    s = m.sessions()
    print(runtime.shared_pool_threads(), s["query"].get_session_options().use_per_session_threads,
          s["cp"].get_session_options().use_per_session_threads)
"""


@pytest.mark.parametrize("shared, expect", [("true", ["2", "False", "False"]), ("false", ["None", "True", "True"])])
def test_models_share_one_pool_unless_told_otherwise(svc_ckpt, artifacts, tmp_path, monkeypatch, shared, expect):
    monkeypatch.setenv("CROSSPROBE_CKPT", str(svc_ckpt))
    monkeypatch.setenv("CROSSPROBE_MODELS_DIR", str(artifacts))
    monkeypatch.setenv("CROSSPROBE_ORT_SHARED_POOL", shared)
    assert run_fresh(tmp_path, BODY).split() == expect


DEFAULT_THREADS = """
    import faiss
    from crossprobe.core import runtime
    from crossprobe.service.registry import Registry
    from crossprobe.service.settings import Settings
    from crossprobe.service.state import load_model
    s = Settings(query_precision="fp32")
    m = load_model(s)
    Registry(s, m.fingerprint, str(s.model_spec))
    print(s.profile.threads, runtime.shared_pool_threads(), faiss.omp_get_max_threads())
"""


def test_one_thread_per_graph_and_for_faiss_by_default(svc_ckpt, artifacts, redis_url, tmp_path, monkeypatch):
    """Unset, CROSSPROBE_THREADS is the model's profile: 1 for crossprobe's own (docs/research/reliability.md: a pool
    per core spins on the cores that concurrent searches need), so the shared ONNX Runtime pool gets one thread;
    FAISS's OpenMP gets one whatever the model (a search is one query)."""
    monkeypatch.setenv("CROSSPROBE_CKPT", str(svc_ckpt))
    monkeypatch.setenv("CROSSPROBE_MODELS_DIR", str(artifacts))
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.delenv("CROSSPROBE_THREADS", raising=False)
    assert run_fresh(tmp_path, DEFAULT_THREADS).split() == ["1", "1", "1"]
