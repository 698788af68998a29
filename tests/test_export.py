"""ONNX Runtime matches PyTorch (max abs diff <= 1e-4, float32) for every exported graph."""
import pytest

from crossprobe import export as ex
from crossprobe.evaluation.timing import parity


@pytest.mark.parametrize("name", list(ex.GRAPHS))
def test_onnx_parity(small_model, tmp_path, name):
    paths = ex.export_all(small_model, tmp_path, "test", names=(name,))
    # fresh inputs with other shapes than the export example: dynamic axes must hold
    inputs = ex.example_inputs(small_model, K=13, T=11)[name]
    assert parity(small_model, name, paths[name], inputs) <= 1e-4


def test_committed_checkpoint_exports_with_parity(tmp_path):
    from crossprobe import checkpoint

    if not (checkpoint.DEFAULT_CHECKPOINT / "config.json").exists():
        pytest.fail("the committed checkpoint is missing")
    model, meta = checkpoint.load()
    paths = ex.export_all(model, tmp_path, meta["fingerprint"], names=("query_tower", "cp_scorer", "temde_scorer"))
    inputs = ex.example_inputs(model, K=100, T=16)
    for name, path in paths.items():
        assert parity(model, name, path, inputs[name]) <= 1e-4, name
