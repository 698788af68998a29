"""The Hugging Face reference builders (tests/support/reference_models.py) run in the main .venv: tiny CLIP and SigLIP
models build offline, load through transformers' own classes, and give identical files and embeddings when rebuilt
with the same seed (and different ones with another seed, so the equality is not vacuous)."""
import socket

import numpy as np
import pytest

from tests.support import reference_models as rm
from tests.support import reference_text as rt


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: the builders and the references must not reach a hub."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return rm.sample_photos(tmp_path_factory.mktemp("photos"))[:6]  # RGB, L and mode-1 images among them


CAPTIONS = rt.sample_captions(16) + ["A Dog, runs!  on the BEACH."]


@pytest.mark.parametrize("family", ["hf_clip", "hf_siglip"])
def test_hf_reference_is_offline_and_deterministic(family, tmp_path, photos, no_network):
    a = rm.build(family, tmp_path / "a", size="tiny", seed=0)
    b = rm.build(family, tmp_path / "b", size="tiny", seed=0)
    for name in ["model.safetensors", "config.json", "preprocessor_config.json",
                 "vocab.json" if family == "hf_clip" else "spiece.model"]:
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes(), name

    ea, eb = rm.reference_embeddings(a.path, photos, CAPTIONS), rm.reference_embeddings(b.path, photos, CAPTIONS)
    assert ea.image.shape[0] == len(photos) and ea.text.shape[0] == len(CAPTIONS)
    np.testing.assert_array_equal(ea.image_raw, eb.image_raw)
    np.testing.assert_array_equal(ea.text_raw, eb.text_raw)
    np.testing.assert_allclose(np.linalg.norm(ea.image, axis=1), 1, atol=1e-6)
    assert ea.notes["image_processor"].endswith("Pil")  # the main .venv has no torchvision

    other = rm.reference_embeddings(rm.build(family, tmp_path / "c", size="tiny", seed=1).path, photos, CAPTIONS)
    assert np.abs(other.text - ea.text).max() > 1e-2 and np.abs(other.image - ea.image).max() > 1e-2


def test_hf_clip_tokenization(tmp_path, photos, no_network):
    """What crossprobe must match: CLIP lower-cases, wraps in <|startoftext|> ... <|endoftext|>, pads (to the
    longest text) with <|endoftext|>, and its pixels are 224x224 after resize + centre crop."""
    ref = rm.build("hf_clip", tmp_path, size="tiny")
    e = rm.reference_embeddings(ref, photos, ["a dog", "A DOG", "a dog runs on the beach"])
    bos, eot = e.input_ids[0, 0], e.input_ids[0, 3]
    assert (e.input_ids[:, 0] == bos).all() and e.input_ids[0].tolist() == e.input_ids[1].tolist()
    assert e.input_ids[0, 3:].tolist() == [eot] * (e.input_ids.shape[1] - 3)
    assert e.attention_mask[0].tolist() == [1, 1, 1, 1] + [0] * (e.input_ids.shape[1] - 4)
    assert e.pixel_values.shape == (len(photos), 3, 224, 224)


def test_hf_siglip_tokenization(tmp_path, photos, no_network):
    """SigLIP lower-cases and drops punctuation, ends with </s> (id 1), pads with </s> to 64 tokens; its text tower
    pools the last position, so the attention mask (not passed by default) changes the embedding."""
    ref = rm.build("hf_siglip", tmp_path, size="tiny")
    e = rm.reference_embeddings(ref, photos, ["a dog runs", "A Dog, runs!"])
    assert e.input_ids.shape == (2, 64) and e.attention_mask is None
    assert e.input_ids[0].tolist() == e.input_ids[1].tolist()
    assert 1 in e.input_ids[0] and (e.input_ids[0, e.input_ids[0].tolist().index(1):] == 1).all()
    masked = rm.reference_embeddings(ref, photos, ["a dog runs"], siglip_attention_mask=True)
    assert np.abs(masked.text[0] - e.text[0]).max() > 1e-3


def test_reference_without_metadata_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        rm.reference_embeddings(tmp_path, [], ["a dog"])
    with pytest.raises(ValueError, match="unknown family"):
        rm.build("nope", tmp_path)
