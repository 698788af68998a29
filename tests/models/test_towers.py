import torch

from crossprobe.models import backbones as bb
from crossprobe.core import inputs


def _ids(tok, texts, pad_to):
    ids, mask = inputs.tokenize(tok, texts)
    T = ids.shape[1]
    pad = pad_to - T
    ids = torch.nn.functional.pad(torch.from_numpy(ids), (0, pad))
    mask = torch.nn.functional.pad(torch.from_numpy(mask), (0, pad))
    return ids, mask


def test_text_tower_shapes_and_unit_norm(small_model):
    tok = inputs.load_tokenizer()
    ids, mask = _ids(tok, ["a dog runs on the beach", "two kids"], 12)
    out = small_model.text(ids, mask)
    assert out.tokens.shape == (2, 12, 64)
    assert out.g.shape == (2, 64)
    assert torch.allclose(out.g.norm(dim=-1), torch.ones(2), atol=1e-5)


def test_padding_never_changes_the_query_vector(small_model):
    tok = inputs.load_tokenizer()
    a = small_model.text(*_ids(tok, ["a black dog jumps over a log"], 10))
    b = small_model.text(*_ids(tok, ["a black dog jumps over a log"], 30))
    assert torch.allclose(a.g, b.g, atol=1e-5)
    T = int(a.mask.sum())
    assert torch.allclose(a.tokens[:, :T], b.tokens[:, :T], atol=1e-5)


def test_vision_tower_shapes(small_model):
    out = small_model.vision(torch.randn(3, 49, inputs.IMAGE_FEAT_DIM))
    assert out.tokens.shape == (3, 49, 64)
    assert torch.allclose(out.g.norm(dim=-1), torch.ones(3), atol=1e-5)


def test_image_backbone_grid_and_a_real_photo():
    """The frozen Lite0 gives a 7x7x1280 grid; ImageNet head still classifies the cat."""
    import skimage.data as sd
    from PIL import Image

    net = bb.ImageBackbone()
    x = torch.from_numpy(inputs.load_image(Image.fromarray(sd.chelsea())))[None]
    with torch.no_grad():
        assert net(x).shape == (1, 49, 1280)
        top = net.net(x).argmax(-1).item()
    assert 281 <= top <= 285  # ImageNet's domestic cat classes: preprocessing is right


def test_minilm_bottom_plus_top_equals_huggingface(bert):
    """Our explicit BERT layer matches transformers' own forward on real tokens."""
    tok = inputs.load_tokenizer()
    ids, mask = inputs.tokenize(tok, ["a man rides a bike", "dogs"])
    ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
    with torch.no_grad():
        ref = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        x = bb.MiniLMBottom(bert, 6)(ids, mask)
    keep = mask.bool()
    assert torch.allclose(x[keep], ref[keep], atol=1e-4)
