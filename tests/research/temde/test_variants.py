"""research/temde/variants.py: its variants compute what their rows claim."""
from types import SimpleNamespace

import torch

from crossprobe.models import backbones as bb
from crossprobe.core import inputs
from crossprobe.models.temde import Temde, TemdeConfig

from research.temde import variants as temde_variants


@torch.inference_mode()
def test_final_states_are_minilms_own_last_layer():
    """Layers 5-6 run over the cached layer-4 states must give what the whole pretrained MiniLM gives for the same
    text (its last_hidden_state), padding included: the row then measures MiniLM's final layer, not something near it."""
    bert = bb.load_minilm()
    ids, mask = inputs.tokenize(inputs.load_tokenizer(), ["a dog runs on the beach", "two people sit on a red bench in a park"])
    ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
    layer4 = bb.MiniLMBottom(bert, 4)(ids, mask)
    bank = SimpleNamespace(states=layer4.half(), mask=mask.bool())
    temde_variants.lift_to_final(bank, bert, 4, 6)
    full = bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    real = mask.bool()
    # the bank holds float16 (as the feature cache does): compare at its precision, real tokens only
    assert torch.allclose(bank.states.float()[real], full[real], atol=0.05, rtol=0.02)
    assert not torch.allclose(layer4[real], full[real], atol=0.05)  # and it is not the layer-4 state it started from


def test_mlp_coder_is_a_nonlinear_temde_of_the_same_shape():
    cfg = TemdeConfig(d_in=32, N=4, K=4, inner=4, inputs="backbone")
    t = temde_variants.mlp_temde(cfg, hidden=16).eval()
    plain = Temde(cfg)
    assert isinstance(t.image_coder.lin[1], torch.nn.GELU)
    assert t.image_coder.lin[0].in_features == plain.image_coder.lin.in_features == inputs.IMAGE_FEAT_DIM
    assert t.text_coder.lin[0].in_features == inputs.TEXT_FEAT_DIM
    grid, states, mask = torch.randn(3, 49, inputs.IMAGE_FEAT_DIM), torch.randn(2, 7, inputs.TEXT_FEAT_DIM), torch.ones(2, 7)
    s_i, s_q = t.sketch_image(None, grid), t.sketch_text(None, mask, states)
    assert s_i.shape == (3, 16) and s_q.shape == (2, 16)
    # each partition of a sketch is unit length, so the score stays in [-1, 1]
    assert torch.allclose(s_i.view(3, 4, 4).norm(dim=-1), torch.ones(3, 4), atol=1e-5)
    assert t.score(s_q[:, None], s_i[None]).abs().max() <= 1 + 1e-5


def test_cell_label_vector_is_the_bridges_label_vector_of_that_cell():
    """A grid whose 49 cells are all one feature x: each cell's label vector must be the bridge's own c for the
    image (its head over the mean cell, the top-T classes' rows of E weighted), which bridge.fuse returns when
    g_I is 0. Cells that differ must get label vectors that differ."""
    from crossprobe.models.bridge import BridgeConfig, LabelBridge

    torch.manual_seed(0)
    bridge = LabelBridge(BridgeConfig(beta=0.5, top_t=20, temperature=1.0, templates=["{}"]), d=32)
    bridge.class_emb.copy_(torch.nn.functional.normalize(torch.randn(1000, 32), dim=-1))
    x = torch.rand(2, 1, inputs.IMAGE_FEAT_DIM) * 6  # ReLU6-like activations
    grid = x.expand(2, 49, -1).contiguous()
    cells = temde_variants.cell_label_vectors(bridge, grid)
    assert cells.shape == (2, 49, 32)
    c = bridge.fuse(bridge.probs(grid), torch.zeros(2, 32))  # normalize(0 + beta c) = c
    assert torch.allclose(cells.float(), c[:, None].expand(-1, 49, -1), atol=2e-3)
    other = grid.clone()
    other[:, 7] = torch.rand(2, inputs.IMAGE_FEAT_DIM) * 6
    moved = temde_variants.cell_label_vectors(bridge, other)
    assert not torch.allclose(moved[:, 7].float(), cells[:, 7].float(), atol=1e-2)
    assert torch.equal(moved[:, 8], cells[:, 8])


def test_region_inputs_widen_the_banks_and_the_coders_alike():
    from crossprobe.models.bridge import BridgeConfig, LabelBridge

    model = SimpleNamespace(bridge=LabelBridge(BridgeConfig(beta=0.5, top_t=5, templates=["{}"]), d=32))
    text = SimpleNamespace(states=torch.randn(3, 6, inputs.TEXT_FEAT_DIM).half(), g=torch.randn(3, 32))
    images = SimpleNamespace(grids=(torch.rand(4, 49, inputs.IMAGE_FEAT_DIM) * 6).half())
    temde_variants.add_region_inputs(model, text, images)
    assert text.states.shape == (3, 6, inputs.TEXT_FEAT_DIM + 32) and images.grids.shape == (4, 49, inputs.IMAGE_FEAT_DIM + 32)
    assert torch.equal(text.states[1, 4, inputs.TEXT_FEAT_DIM:], text.g[1].half())  # g_q on every token
    t = temde_variants.region_temde(TemdeConfig(d_in=32, N=4, K=4, inner=4, inputs="backbone"), d=32).eval()
    assert t.sketch_image(None, images.grids.float()).shape == (4, 16)
    assert t.sketch_text(None, torch.ones(3, 6), text.states.float()).shape == (3, 16)
