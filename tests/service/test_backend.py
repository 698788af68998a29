"""The service's Models: one shared ONNX Runtime pool by default (models/runtime.py)."""
import pytest

from tests.models.test_runtime import run_fresh

BODY = """
    from crossprobe.models import runtime
    from crossprobe.service.backend import Models
    from crossprobe.service.settings import Settings
    m = Models(Settings(query_precision="fp32", threads=2))
    print(runtime.shared_pool_threads(), m.query.get_session_options().use_per_session_threads,
          m.scorers["cp"].get_session_options().use_per_session_threads)
"""


@pytest.mark.parametrize("shared, expect", [("true", ["2", "False", "False"]), ("false", ["None", "True", "True"])])
def test_models_share_one_pool_unless_told_otherwise(svc_ckpt, artifacts, tmp_path, monkeypatch, shared, expect):
    monkeypatch.setenv("CROSSPROBE_CKPT", str(svc_ckpt))
    monkeypatch.setenv("CROSSPROBE_ARTIFACTS_DIR", str(artifacts))
    monkeypatch.setenv("CROSSPROBE_ORT_SHARED_POOL", shared)
    assert run_fresh(tmp_path, BODY).split() == expect
