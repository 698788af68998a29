"""The label bridge: ImageNet class probabilities from the grid alone, class names through the text
tower, the fused g_I; off = nothing registered and g_I unchanged."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from crossprobe.models import backbones as bb
from crossprobe.core import inputs
from crossprobe.models.bridge import N_CLASSES, BridgeConfig, LabelBridge, class_lemmas, class_texts


def test_class_file_is_imagenet_in_logit_order():
    lem = class_lemmas()
    assert len(lem) == N_CLASSES
    assert lem[0][0] == "tench" and lem[967] == ["espresso"] and lem[504][0] == "coffee mug"
    assert lem[812][0] == "space shuttle" and lem[409][0] == "analog clock"
    texts = class_texts(BridgeConfig(beta=1, templates=["{}", "a photo of a {}."], lemmas=2))
    assert texts[1] == ["goldfish", "a photo of a goldfish.", "Carassius auratus", "a photo of a Carassius auratus."]


def test_probabilities_come_from_the_grid_alone():
    """fc(mean of the grid) is EfficientNet-Lite0's own classifier: the bridge needs no second backbone run."""
    from crossprobe.models.demo import sample_gallery

    backbone = bb.ImageBackbone()
    bridge = LabelBridge(BridgeConfig(beta=1.0), 8)
    pixels = torch.from_numpy(np.stack([inputs.load_image(sample_gallery()[n]) for n in ("coffee", "cat")]))
    with torch.no_grad():
        grid = backbone(pixels)
        p = bridge.probs(grid)
        full = backbone.net(pixels).softmax(-1)
    assert torch.allclose(p, full, atol=1e-5)
    assert class_lemmas()[int(p[0].argmax())][0] == "espresso"
    assert "cat" in class_lemmas()[int(p[1].argmax())][0]


def test_off_registers_nothing_and_keeps_g():
    b = LabelBridge(BridgeConfig.off(), 8)
    assert not list(b.state_dict()) and not list(b.parameters())
    g = F.normalize(torch.randn(3, 8), dim=-1)
    assert torch.equal(b(torch.randn(3, 49, inputs.IMAGE_FEAT_DIM), g), g)


def test_fused_vector_moves_towards_the_top_classes():
    torch.manual_seed(0)
    b = LabelBridge(BridgeConfig(beta=0.5, top_t=1), 16)
    b.class_emb.copy_(F.normalize(torch.randn(N_CLASSES, 16), dim=-1))
    grid = torch.rand(4, 49, inputs.IMAGE_FEAT_DIM)
    g = F.normalize(torch.randn(4, 16), dim=-1)
    out = b(grid, g)
    assert torch.allclose(out.norm(dim=-1), torch.ones(4), atol=1e-5)
    top = b.probs(grid).argmax(-1)
    e = b.class_emb[top]
    # c is the top class's embedding (T=1); the fused vector is closer to it than g was, by the formula
    assert ((out * e).sum(-1) > (g * e).sum(-1)).all()
    assert torch.allclose(out, F.normalize(g + 0.5 * e, dim=-1), atol=1e-5)
    cfg = BridgeConfig(beta=0.5, top_t=1, temperature=0.0001)
    assert cfg.temperature > 0
    with pytest.raises(ValueError):
        BridgeConfig(beta=1, temperature=0)
    with pytest.raises(ValueError):
        BridgeConfig(beta=1, mode="learned?")


def test_class_embeddings_are_the_text_towers_vectors(small_model):
    """E_c = g_q of the class name (one template, one lemma), computed by the model's own text tower."""
    m = copy.deepcopy(small_model)
    m.bridge.set_class_embeddings(m.text)
    tok = inputs.load_tokenizer()
    ids, mask = inputs.tokenize(tok, ["espresso", "goldfish"])
    with torch.no_grad():
        g = m.text(torch.from_numpy(ids), torch.from_numpy(mask)).g
    assert torch.allclose(m.bridge.class_emb[[967, 1]], g, atol=1e-5)


def test_checkpoint_stores_the_class_embeddings(small_model, bert, tmp_path):
    """The class table is in the checkpoint and its fingerprint: changing it changes the fingerprint;
    a checkpoint without a bridge (older ones) loads with the bridge off."""
    from crossprobe.models import checkpoint
    from crossprobe.models.model import ModelConfig

    assert small_model.cfg.bridge.enabled
    fp1 = checkpoint.save(small_model, tmp_path / "a")
    loaded, meta = checkpoint.load(tmp_path / "a", bert)
    assert torch.allclose(loaded.bridge.class_emb, small_model.bridge.class_emb.half().float())
    m2 = copy.deepcopy(small_model)
    m2.bridge.class_emb.mul_(-1)
    assert checkpoint.save(m2, tmp_path / "b") != fp1
    d = small_model.cfg.to_dict()
    with pytest.raises(ValueError, match="class table"):  # region labels match through the bridge's table
        ModelConfig.from_dict({k: v for k, v in d.items() if k != "bridge"})
    del d["bridge"], d["region"]  # a checkpoint saved before both
    old = ModelConfig.from_dict(d)
    assert not old.bridge.enabled and not old.region.enabled
