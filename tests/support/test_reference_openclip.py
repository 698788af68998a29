"""The references that need open_clip (tests/support/reference_models.py): they run only in the export venv
(`make test-openclip`: scripts/openclip-env.sh's torch 2.14.1 + torchvision; the main .venv has no torchvision), so
`make test` deselects them by their marker. Each imports open_clip inside the test, so that run in the wrong venv
they fail rather than skip."""
import socket

import numpy as np
import pytest

from tests.support import reference_models as rm
from tests.support import reference_text as rt

pytestmark = pytest.mark.openclip

CAPTIONS = rt.sample_captions(16)


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return rm.sample_photos(tmp_path_factory.mktemp("photos"))[:6]


@pytest.mark.parametrize("family", ["open_clip", "mclip"])
def test_reference_is_offline_and_deterministic(family, tmp_path, photos, no_network):
    a = rm.build(family, tmp_path / "a", size="tiny", seed=0)
    b = rm.build(family, tmp_path / "b", size="tiny", seed=0)
    weights = ["open_clip_model.safetensors"] if family == "open_clip" else [
        "visual/open_clip_model.safetensors", "text/model.safetensors", "text/xlm-roberta/sentencepiece.bpe.model"]
    for name in weights:
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes(), name

    ea, eb = rm.reference_embeddings(a, photos, CAPTIONS), rm.reference_embeddings(b, photos, CAPTIONS)
    np.testing.assert_array_equal(ea.image_raw, eb.image_raw)
    np.testing.assert_array_equal(ea.text_raw, eb.text_raw)
    assert ea.image.shape == (len(photos), 32) and ea.text.shape == (len(CAPTIONS), 32)
    other = rm.reference_embeddings(rm.build(family, tmp_path / "c", size="tiny", seed=1), photos, CAPTIONS)
    assert np.abs(other.text - ea.text).max() > 1e-2 and np.abs(other.image - ea.image).max() > 1e-2


def test_open_clip_weights_file_route_matches_local_dir(tmp_path, photos, no_network):
    """`create_model_and_transforms(arch, pretrained=<weights file>)` (the spec open_clip:<arch>/<file>) loads the
    same model as the local-dir folder, and open_clip's tokenizer is CLIP's: 77 ids, <sot>=49406 ... <eot>=49407,
    zero-padded, lower-cased."""
    import open_clip
    import torch

    ref = rm.build("open_clip", tmp_path, size="tiny")
    e = rm.reference_embeddings(ref, photos, ["a dog", "A DOG!"])
    model, _, preprocess = open_clip.create_model_and_transforms(
        rm.TINY_OPENCLIP, pretrained=str(tmp_path / "open_clip_model.safetensors"))
    with torch.inference_mode():
        image = model.eval().encode_image(torch.stack([preprocess(im) for im in rm.open_images(photos)]))
    np.testing.assert_array_equal(image.numpy(), e.image_raw)
    assert e.input_ids.shape == (2, 77)
    assert e.input_ids[0, :4].tolist() == [49406, 320, 1929, 49407] and not e.input_ids[0, 4:].any()
    assert e.input_ids[1, :3].tolist() == [49406, 320, 1929]  # "A DOG!": lower-cased, "!" its own token


def test_clip_vocab_conversion_matches_open_clip(tmp_path):
    """vocab.json + merges.txt converted from open_clip's shipped BPE tokenize every caption exactly as open_clip's
    SimpleTokenizer does (up to the padding id: open_clip pads with 0, transformers with <|endoftext|>)."""
    import open_clip
    from transformers import CLIPTokenizer

    vocab = rt.write_clip_bpe(tmp_path, rt.openclip_bpe_merges())
    assert len(vocab) == 49408 and vocab["<|endoftext|>"] == 49407
    texts = rt.corpus() + ["Two dogs; one's   jumping over 3 logs...", "café  naïve  ÉCOLE"]
    ours = CLIPTokenizer.from_pretrained(tmp_path)(texts, padding="max_length", max_length=77, truncation=True)
    theirs = open_clip.get_tokenizer("ViT-B-32")(texts).numpy()
    for mine, ref in zip(ours["input_ids"], theirs):
        n = mine.index(49407) + 1
        assert mine[:n] == ref[:n].tolist() and not ref[n:].any()


def test_mclip_text_is_masked_mean_then_linear(tmp_path, no_network):
    """M-CLIP's text embedding is the projection of the attention-masked mean of XLM-R's last hidden states, so
    padding does not change it (Immich's export pads to 77)."""
    import torch
    from transformers import AutoTokenizer

    ref = rm.build("mclip", tmp_path, size="tiny")
    model = rm._mclip_text_model(tmp_path / "text")
    tok = AutoTokenizer.from_pretrained(tmp_path / "text")
    with torch.inference_mode():
        own = model.forward(CAPTIONS[:4], tok)
        padded = tok(CAPTIONS[:4], padding="max_length", max_length=77, return_tensors="pt")
        states = model.transformer(**padded)[0]
        mask = padded["attention_mask"].unsqueeze(2)
        by_hand = model.LinearTransformation((states * mask).sum(1) / mask.sum(1))
    np.testing.assert_allclose(own.numpy(), by_hand.numpy(), atol=1e-5)


def test_clip_benchmark_runs_offline_and_agrees_with_the_reference(tmp_path, photos):
    """clip-benchmark's own CLI (zero-shot retrieval, its flickr8k loader over a local folder and annotation file)
    on the tiny open_clip model gives the recalls computed from the reference's embeddings, up to near-tied queries."""
    from PIL import Image

    from tests.support import clip_benchmark_run as cb

    ref = rm.build("open_clip", tmp_path / "model", size="tiny")
    images = tmp_path / "images"
    images.mkdir()
    captions = {}
    pool = rt.sample_captions(2 * len(photos), seed=5)
    for i, p in enumerate(photos):  # JPEG copies: its Flickr loader reads <name>.jpg only
        Image.open(p).convert("RGB").save(images / f"{p.stem}.jpg", quality=95)
        captions[f"{p.stem}.jpg"] = pool[2 * i:2 * i + 2]
    ann = cb.write_annotation(tmp_path / "ann.txt", captions)
    theirs = cb.run_cli(ref.path, images, ann, tmp_path / "out.json")

    texts = [c for caps in captions.values() for c in caps]
    text_image = np.repeat(np.arange(len(captions)), 2)
    e = rm.reference_embeddings(ref, [images / n for n in captions], texts)
    ours = cb.recalls(e.text, e.image, text_image)
    ties = {k: cb.near_tie_queries(e.text, e.image, k, 1e-6) for k in (1, 5)}
    for name, value in ours.items():
        k = int(name.rsplit("@", 1)[1])
        assert abs(theirs[name] - value) <= ties[k] / len(texts) + 1e-6, (name, theirs[name], value, ties)
