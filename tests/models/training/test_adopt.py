"""training/adopt.py: a checkpoint with a chosen setting changes that setting and nothing else (the other stages'
stored weights stay byte for byte), records where it came from, and ranks as the setting says."""
import copy
import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from crossprobe.models import checkpoint
from crossprobe.models.evaluation.encode import PairScorer, encode_images, encode_texts
from crossprobe.models.region_labels import SCALE, RegionConfig, region_score
from crossprobe.models.temde import Temde, TemdeConfig
from crossprobe.models.training.adopt import load_trained_temde, set_region_labels, set_temde
from crossprobe.models.training.rerankers import set_fusion

TRAINING = {"train_config": {"model": {"temde": {}}, "epochs_by_method": {"cp": 6, "temde": 3},
                             "pretrain_by_method": {"temde": 5}, "members_by_method": {"temde": 3}},
            "timings_s": {"towers": 10.0, "temde": 99.0}, "cp": {"best_epoch": 4}}


@pytest.fixture()
def source(small_model, bert, tmp_path):
    """A tiny checkpoint on disk with a training record, loaded back as the CLI loads it."""
    checkpoint.save(small_model, tmp_path / "src", {"training": copy.deepcopy(TRAINING)})
    return checkpoint.load(tmp_path / "src", bert)


def _stored(path):
    return load_file(str(path / "model.safetensors"))


def _banks(model):
    rng = np.random.default_rng(0)
    states = rng.normal(size=(4, 8, 384)).astype(np.float16)
    text = encode_texts(model, states, np.ones((4, 8), np.uint8), np.arange(4))
    images = encode_images(model, (rng.random((6, 49, 1280)) * 6).astype(np.float16), np.arange(6))
    return text, images, torch.arange(4), torch.from_numpy(rng.integers(0, 6, (4, 5)))


def test_set_region_labels_changes_the_config_only_and_ranks_with_it(source, bert, tmp_path):
    model, meta = source
    fp = set_region_labels(model, meta, tmp_path / "out", {"cp": 0.5, "temde": 0.0}, pool=1, record={"note": "dev"})
    new, new_meta = checkpoint.load(tmp_path / "out", bert)
    assert fp == new_meta["fingerprint"] != meta["fingerprint"]
    assert new.cfg.region == RegionConfig(weights={"cp": 0.5}, pool=1)  # a 0 weight is no weight
    before, after = _stored(tmp_path / "src"), _stored(tmp_path / "out")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert new_meta["region_labels"] == {"source_checkpoint": meta["fingerprint"], "weights": {"cp": 0.5}, "pool": 1,
                                         "note": "dev"}
    assert new_meta["training"] == TRAINING  # the rest of config.json as it was
    # CP now adds 20 * 0.5 * the best single cell's class cosine; T-EMDE adds nothing
    text, images, q, cand = _banks(new)
    term = SCALE * 0.5 * region_score(new.bridge.class_sims(text.g[q]), images.labels[cand], 1)
    plain = PairScorer(new, "cp", text, images, region=False).fused(q, cand)
    assert torch.allclose(PairScorer(new, "cp", text, images).fused(q, cand), plain + term, atol=1e-5)
    assert torch.equal(PairScorer(new, "temde", text, images).fused(q, cand),
                       PairScorer(new, "temde", text, images, region=False).fused(q, cand))


def test_zero_weights_switch_region_labels_off(source, bert, tmp_path):
    model, meta = source
    assert model.cfg.region.enabled  # the tiny config weights both rerankers
    set_region_labels(model, meta, tmp_path / "off", {"cp": 0.0, "temde": 0.0})
    assert not checkpoint.load(tmp_path / "off", bert)[0].cfg.region.enabled


@pytest.mark.parametrize("weights, pool, match", [({"sm": 0.2}, 3, "not \\['sm'\\]"), ({"cp": -0.1}, 3, "region config"),
                                                  ({"cp": 0.2}, 0, "region config")])
def test_set_region_labels_refuses_what_the_service_cannot_run(source, tmp_path, weights, pool, match):
    model, meta = source
    with pytest.raises(ValueError, match=match):
        set_region_labels(model, meta, tmp_path / "out", weights, pool)
    assert not (tmp_path / "out").exists()


def test_region_labels_need_the_label_bridge(small_cfg, bert, tmp_path):
    from crossprobe.models.model import SearchModel

    cfg = dataclasses.replace(copy.deepcopy(small_cfg), bridge=dataclasses.replace(small_cfg.bridge, beta=0.0),
                              region=RegionConfig())
    checkpoint.save(SearchModel(cfg, bert), tmp_path / "nobridge")
    model, meta = checkpoint.load(tmp_path / "nobridge", bert)
    with pytest.raises(ValueError, match="label bridge"):
        set_region_labels(model, meta, tmp_path / "out", {"cp": 0.2})
    set_region_labels(model, meta, tmp_path / "out", {})  # off stays possible


def _saved_temde_cfg(meta):
    return TemdeConfig(**meta["model"]["temde"])


def _other_temde(model, w: float = 0.4) -> Temde:
    torch.manual_seed(3)
    t = Temde(dataclasses.replace(model.cfg.temde, N=6, K=2, inner=8))  # another shape than the checkpoint's
    with torch.no_grad():
        for p in t.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    set_fusion(t.fusion, w)
    return t.eval()


def test_set_temde_replaces_the_temde_and_keeps_every_other_stage(source, bert, tmp_path):
    model, meta = source
    other = _other_temde(model)
    report = {"best_epoch": 2, "history": [{"epoch": 1}, {"epoch": 2}], "from": "a sweep"}
    fp = set_temde(model, meta, tmp_path / "out", other.state_dict(), report,
                   recipe={"epochs": 6, "pretrain_epochs": 10, "captions_per_image": 5, "seed": 1}, train_s=12.5)
    new, new_meta = checkpoint.load(tmp_path / "out", bert)
    assert fp == new_meta["fingerprint"] != meta["fingerprint"]
    assert (new.cfg.temde.N, new.cfg.temde.K, new.cfg.temde.inner) == (6, 2, 8)
    assert dataclasses.replace(new.cfg.temde, N=4, K=4, inner=4) == _saved_temde_cfg(meta)  # the rest as it was
    for k, v in other.state_dict().items():  # stored in float16
        assert torch.allclose(new.temde.state_dict()[k], v, atol=1e-3, rtol=1e-3), k
    assert float(new.temde.fusion.beta.detach() / new.temde.fusion.alpha.detach()) == pytest.approx(0.4)
    before, after = _stored(tmp_path / "src"), _stored(tmp_path / "out")
    rest = [k for k in before if not k.startswith("temde.")]
    assert rest and all(torch.equal(before[k], after[k]) for k in rest)
    assert {k for k in after if not k.startswith("temde.")} == set(rest)
    training = new_meta["training"]
    assert training["temde"] == {**report, "source_checkpoint": meta["fingerprint"]}
    assert training["cp"] == TRAINING["cp"] and training["timings_s"] == {"towers": 10.0, "temde": 12.5}
    tc = training["train_config"]
    assert tc["model"]["temde"] == dataclasses.asdict(new.cfg.temde)
    assert (tc["epochs_by_method"], tc["pretrain_by_method"]) == ({"cp": 6, "temde": 6}, {"temde": 10})
    assert tc["captions_by_method"] == {"temde": 5} and tc["members_by_method"] == {"temde": 1}
    # it ranks as the T-EMDE it was given: the same fused logits as the source model with that module swapped in
    text, images, q, cand = _banks(new)
    ref = copy.deepcopy(model)
    ref.temde = Temde(new.cfg.temde)
    ref.temde.load_state_dict(new.temde.state_dict())
    ref.eval()
    assert torch.allclose(PairScorer(new, "temde", text, images).fused(q, cand),
                          PairScorer(ref, "temde", text, images).fused(q, cand), atol=1e-4)


def test_load_trained_temde_reads_a_train_stage_file_and_a_state_dict(source, tmp_path):
    model, _ = source
    other = _other_temde(model)
    torch.save(other.state_dict(), tmp_path / "v.weights.pt")
    torch.save({"weights": other.state_dict(), "report": {"best_epoch": 3}}, tmp_path / "temde.done.pt")
    for name, report in (("v.weights.pt", None), ("temde.done.pt", {"best_epoch": 3})):
        weights, got = load_trained_temde(tmp_path / name)
        assert got == report and weights.keys() == other.state_dict().keys()
        assert all(torch.equal(weights[k], v) for k, v in other.state_dict().items())
    torch.save({"module": {}}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="neither"):
        load_trained_temde(tmp_path / "bad.pt")


def test_set_temde_refuses_a_temde_of_other_inputs(source, tmp_path):
    model, meta = source
    inputs = "tower" if model.cfg.temde.inputs == "backbone" else "backbone"
    alien = Temde(dataclasses.replace(model.cfg.temde, inputs=inputs))
    with pytest.raises(ValueError, match="does not fit"):
        set_temde(model, meta, tmp_path / "out", alien.state_dict())
    with pytest.raises(ValueError, match="centroids"):
        set_temde(model, meta, tmp_path / "out", {"w": torch.zeros(1)})
    assert not (tmp_path / "out").exists()
