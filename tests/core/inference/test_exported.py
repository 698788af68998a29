"""A family model's exported graphs (core/inference/exported.py): its preprocessing against the family's own, its
text cleaning, and how a spec finds its folder."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from PIL import Image

from crossprobe.core.inference.exported import ImagePreprocess, clean_text, find_exported


def _photos(seed: int = 0):
    rng = np.random.default_rng(seed)
    for w, h in [(500, 375), (375, 500), (333, 227), (640, 427), (225, 301), (224, 224)]:
        yield Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_shortest_side_and_centre_crop_match_hugging_face_clip():
    from transformers import CLIPImageProcessor

    ref = CLIPImageProcessor()  # OpenAI CLIP's: shortest side 224, bicubic, centre crop 224
    ours = ImagePreprocess(224, tuple(ref.image_mean), tuple(ref.image_std), "shortest", "bicubic", True, "floor")
    for img in _photos():
        want = ref(images=img, return_tensors="np")["pixel_values"][0]
        np.testing.assert_allclose(ours(img), want, atol=1e-6)


def test_squash_matches_hugging_face_siglip():
    from transformers import SiglipImageProcessor

    ref = SiglipImageProcessor()  # 224 x 224, bicubic, mean = std = 0.5
    ours = ImagePreprocess(224, tuple(ref.image_mean), tuple(ref.image_std), "squash", "bicubic", False)
    for img in _photos(1):
        np.testing.assert_allclose(ours(img), ref(images=img, return_tensors="np")["pixel_values"][0], atol=1e-6)


def test_torchvision_rounds_the_crop_where_hugging_face_floors_it():
    """An odd margin: torchvision's CenterCrop rounds (225 - 224) / 2 = 0.5 to 0 and 227's 1.5 to 2, HF floors both."""
    rnd = ImagePreprocess(224, (0, 0, 0), (1, 1, 1), crop_rounding="round")
    flr = ImagePreprocess(224, (0, 0, 0), (1, 1, 1), crop_rounding="floor")
    assert rnd._box(227, 224) == (2, 0, 226, 224) and flr._box(227, 224) == (1, 0, 225, 224)


def test_preprocessing_travels_to_other_processes():
    p = ImagePreprocess(224, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "squash")
    assert pickle.loads(pickle.dumps(p)) == p


def test_preprocessing_refuses_what_it_cannot_do():
    with pytest.raises(ValueError):
        ImagePreprocess(224, (0, 0, 0), (1, 1, 1), resize="letterbox")


@pytest.mark.parametrize("how, text, want", [
    ("none", "  A  Dog\\t", "  A  Dog\\t"), ("whitespace", "  a \\n dog  ", "a dog"),
    ("open_clip", "fish &amp;amp; chips", "fish & chips"), ("canonicalize", "A Dog, running!", "a dog running"),
    ("whitespace", "一只  狗", "一只 狗"),  # other scripts pass untouched
])
def test_text_cleaning(how, text, want):
    assert clean_text(text.replace("\\t", "\t").replace("\\n", "\n"), how) == want.replace("\\t", "\t")


def test_a_spec_finds_its_newest_export_and_ignores_stale_ones(tmp_path):
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"abc")
    st = weights.stat()

    def export(fp, spec, size=st.st_size):
        (tmp_path / "g" / fp).mkdir(parents=True)
        (tmp_path / "g" / fp / "model.json").write_text(json.dumps(
            {"format": 1, "spec": spec, "source": {"path": str(weights), "size": size, "mtime_ns": st.st_mtime_ns}}))

    export("a" * 16, "open_clip:ViT-B-32/x")
    export("b" * 16, "open_clip:ViT-B-32/y", size=999)  # its weights file has changed since: not this export
    assert find_exported(tmp_path / "g", "open_clip:ViT-B-32/x") == tmp_path / "g" / ("a" * 16)
    assert find_exported(tmp_path / "g", "open_clip:ViT-B-32/y") is None
    assert find_exported(tmp_path / "nowhere", "open_clip:ViT-B-32/x") is None
