"""ONNX Runtime matches PyTorch (max abs diff <= 1e-4, float32) for every exported graph."""
import pytest

from crossprobe.models import export as ex
from crossprobe.models.evaluation.timing import parity


@pytest.mark.parametrize("name", list(ex.GRAPHS))
def test_onnx_parity(small_model, tmp_path, name):
    paths = ex.export_all(small_model, tmp_path, "test", names=(name,))
    # fresh inputs with other shapes than the export example: dynamic axes must hold
    inputs = ex.example_inputs(small_model, K=13, T=11)[name]
    assert parity(small_model, name, paths[name], inputs) <= 1e-4


def test_committed_checkpoint_exports_with_parity(tmp_path):
    from crossprobe.models import checkpoint

    if not (checkpoint.DEFAULT_CHECKPOINT / "config.json").exists():
        pytest.fail("the committed checkpoint is missing")
    model, meta = checkpoint.load()
    paths = ex.export_all(model, tmp_path, meta["fingerprint"], names=("query_tower", "cp_scorer", "temde_scorer"))
    inputs = ex.example_inputs(model, K=100, T=16)
    for name, path in paths.items():
        assert parity(model, name, path, inputs[name]) <= 1e-4, name


@pytest.mark.parametrize("option", ["zodiac-cp", "zodiac-tv", "seam-fast", "temde-pool"])
def test_options_export_with_parity(small_cfg, bert, tmp_path, option):
    """The seed options that the service could run export like the default (ACE-RPE's graph search
    is PyTorch only: TV is a reference, not on the request path)."""
    import copy

    import torch

    from crossprobe.models.model import SearchModel
    from crossprobe.models.text_tower import TextTowerConfig
    from crossprobe.models.training.ablation import OPTIONS
    from crossprobe.models.training.towers import TowerTrainConfig

    cfg = copy.deepcopy(small_cfg)
    OPTIONS[option].apply(cfg, TowerTrainConfig())
    if option == "seam-fast":  # the small config's width, the option's layers
        cfg.text = TextTowerConfig(d=cfg.text.d, layers=0, finetune_layers=0, pool_hops=4)
    torch.manual_seed(0)
    model = SearchModel(cfg, bert).eval()
    names = {"zodiac-cp": ("cp_scorer",), "zodiac-tv": ("tv_scorer",)}.get(option, ("query_tower", "image_tower"))
    paths = ex.export_all(model, tmp_path, "test", names=names)
    inputs = ex.example_inputs(model, K=13, T=11)
    for name in names:
        assert parity(model, name, paths[name], inputs[name]) <= 1e-4, name


def test_rerankers_on_backbone_features_export_with_parity(small_cfg, bert, tmp_path):
    """CP and T-EMDE reading the frozen MiniLM states and the raw grid: the query and image graphs
    must hand them over, and ONNX Runtime must agree with PyTorch."""
    import copy
    import dataclasses

    import torch

    from crossprobe.models.model import SearchModel

    cfg = copy.deepcopy(small_cfg)
    cfg.cp = dataclasses.replace(cfg.cp, inputs="backbone")
    cfg.temde = dataclasses.replace(cfg.temde, inputs="backbone")
    torch.manual_seed(0)
    model = SearchModel(cfg, bert).eval()
    names = ("query_tower", "image_tower", "cp_scorer")
    paths = ex.export_all(model, tmp_path, "test", names=names)
    inputs = ex.example_inputs(model, K=13, T=11)
    for name in names:
        assert parity(model, name, paths[name], inputs[name]) <= 1e-4, name
