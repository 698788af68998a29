"""ONNX Runtime matches PyTorch (max abs diff <= 1e-4, float32) for every exported graph."""
import pytest

from crossprobe.models import export as ex
from crossprobe.models import graphs
from crossprobe.models.evaluation.timing import parity


@pytest.mark.parametrize("name", list(graphs.GRAPHS))
def test_onnx_parity(small_model, tmp_path, name):
    paths = ex.export_all(small_model, tmp_path, "test", names=(name,))
    # fresh inputs with other shapes than the export example: dynamic axes must hold
    inputs = graphs.example_inputs(small_model, K=13, T=11)[name]
    assert parity(small_model, name, paths[name], inputs) <= 1e-4


def test_committed_checkpoint_exports_with_parity(tmp_path):
    from crossprobe.models import checkpoint

    if not (checkpoint.DEFAULT_CHECKPOINT / "config.json").exists():
        pytest.fail("the committed checkpoint is missing")
    model, meta = checkpoint.load()
    paths = ex.export_all(model, tmp_path, meta["fingerprint"],
                          names=("query_tower", "cp_scorer", "temde_scorer", "explain"))
    inputs = graphs.example_inputs(model, K=100, T=16)
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
    from crossprobe.models.research.ablation import OPTIONS
    from crossprobe.models.training.towers import TowerTrainConfig

    cfg = copy.deepcopy(small_cfg)
    OPTIONS[option].apply(cfg, TowerTrainConfig())
    if option == "seam-fast":  # the small config's width, the option's layers
        cfg.text = TextTowerConfig(d=cfg.text.d, layers=0, finetune_layers=0, pool_hops=4)
    torch.manual_seed(0)
    model = SearchModel(cfg, bert).eval()
    names = {"zodiac-cp": ("cp_scorer", "explain"), "zodiac-tv": ("tv_scorer",)}.get(option, ("query_tower", "image_tower"))
    paths = ex.export_all(model, tmp_path, "test", names=names)
    inputs = graphs.example_inputs(model, K=13, T=11)
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
    names = ("query_tower", "image_tower", "cp_scorer", "explain")
    paths = ex.export_all(model, tmp_path, "test", names=names)
    inputs = graphs.example_inputs(model, K=13, T=11)
    for name in names:
        assert parity(model, name, paths[name], inputs[name]) <= 1e-4, name


def test_attention_probs_are_the_ones_attention_uses(small_model):
    """export.attention_probs recomputes what the fused kernel never shows: weighting the values with them
    must give the module's own output."""
    import torch

    attn = small_model.cp.vision_probes.attn
    x, ctx = torch.randn(3, 4, attn.h * attn.hd), torch.randn(3, 49, attn.h * attn.hd)
    with torch.inference_mode():
        a = graphs.attention_probs(attn, x, ctx)  # (3, h, 4, 49)
        v = attn.kv(ctx).view(3, 49, 2, attn.h, attn.hd)[:, :, 1].transpose(1, 2)
        out = attn.out((a @ v).transpose(1, 2).reshape(3, 4, -1))
        assert torch.allclose(out, attn(x, ctx), atol=1e-5)
    assert torch.allclose(a.sum(-1), torch.ones(()), atol=1e-5)


def test_explain_maps_are_distributions_that_follow_the_query(small_model):
    """Per image a weight per region, summing to 1; `regions` changes with the query's text probes,
    `probe_regions` (the image's probes averaged) does not."""
    import torch

    grid, p_t, q_cls = graphs.example_inputs(small_model, K=5)["explain"]  # the test model has region labels
    graph = graphs.ExplainGraph(small_model).eval()
    with torch.inference_mode():
        regions, probes, labels = graph(grid, p_t, q_cls)
        regions2, probes2, labels2 = graph(grid, torch.randn_like(p_t) * 3, q_cls.roll(1, -1))
    assert regions.shape == probes.shape == labels.shape == (5, 49)
    for w in (regions, probes, labels):
        assert (w >= 0).all() and torch.allclose(w.sum(-1), torch.ones(5), atol=1e-5)
    assert torch.equal(probes, probes2)
    assert (regions - regions2).abs().max() > 1e-6  # small for a random model, whose probes are near-identical
    assert (labels - labels2).abs().max() > 1e-6  # the label map follows the query's class cosines


def test_explain_without_cross_layers_is_the_probe_map(small_cfg, bert):
    """A CP with no cross layers never lets the query meet the image: both maps are the probes' map."""
    import copy
    import dataclasses

    import torch

    from crossprobe.models.model import SearchModel

    cfg = copy.deepcopy(small_cfg)
    cfg.cp = dataclasses.replace(cfg.cp, layers=0)
    torch.manual_seed(0)
    model = SearchModel(cfg, bert).eval()
    grid, p_t, *_ = graphs.example_inputs(model, K=3)["explain"]
    with torch.inference_mode():
        regions, probes = graphs.ExplainGraph(model)(grid, p_t)
    assert torch.equal(regions, probes)


def test_ensure_graphs_writes_into_the_fingerprint_folder_and_only_what_is_missing(small_model, tmp_path, monkeypatch):
    """The one export path the indexer, the service and the CLI share: <root>/<fingerprint>/<name>.onnx, the
    wanted graphs only once, a manifest naming every graph present, no temp file left behind."""
    import json

    folder = ex.ensure_graphs(tmp_path, ["image_tower"], model=small_model, fingerprint="fp1")
    assert folder == tmp_path / "fp1" and (folder / "image_tower.onnx").exists()
    first = (folder / "image_tower.onnx").stat().st_mtime_ns

    calls = []
    real = ex.export_all
    monkeypatch.setattr(ex, "export_all", lambda *a, **k: calls.append(k.get("names")) or real(*a, **k))
    assert ex.ensure_graphs(tmp_path, ["image_tower"], model=small_model, fingerprint="fp1") == folder
    assert calls == []  # present: nothing exported, no model needed
    ex.ensure_graphs(tmp_path, ["image_tower", "query_tower"], model=small_model, fingerprint="fp1", also=["explain"])
    assert calls == [["query_tower", "explain"]]
    assert (folder / "image_tower.onnx").stat().st_mtime_ns == first
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["fingerprint"] == "fp1"
    assert manifest["graphs"] == ["explain.onnx", "image_tower.onnx", "query_tower.onnx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp1"]  # the temp export folder is gone


def test_ensure_graphs_refuses_a_checkpoint_of_another_fingerprint(tmp_path):
    from crossprobe.core import DEFAULT_CHECKPOINT

    with pytest.raises(ValueError, match="fingerprint"):
        ex.ensure_graphs(tmp_path, ["query_tower"], DEFAULT_CHECKPOINT, fingerprint="not-this-one")
    assert ex.checkpoint_fingerprint(None) == ex.checkpoint_fingerprint(DEFAULT_CHECKPOINT)
