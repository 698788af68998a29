"""Model specs (core/inference/spec.py): what each form names, and the clear refusal of what names nothing."""
import pytest

from crossprobe.core.inference.spec import BadSpec, ModelSpec, parse


@pytest.mark.parametrize("text, family, ref", [
    (None, "crossprobe", ""), ("", "crossprobe", ""), ("crossprobe:", "crossprobe", ""),
    ("crossprobe:/ck/heads", "crossprobe", "/ck/heads"),
    ("/old/style/ckpt", "crossprobe", "/old/style/ckpt"),  # CROSSPROBE_CKPT's bare path
    ("open_clip:ViT-B-32/laion2b_s34b_b79k", "open_clip", "ViT-B-32/laion2b_s34b_b79k"),
    ("open_clip:ViT-B-16/weights/vit.safetensors", "open_clip", "ViT-B-16/weights/vit.safetensors"),
    ("hf:google/siglip-base-patch16-224", "hf", "google/siglip-base-patch16-224"),
    ("immich:/models/clip/ViT-B-32__openai", "immich", "/models/clip/ViT-B-32__openai"),
])
def test_each_form_names_its_family(text, family, ref):
    spec = parse(text)
    assert (spec.family, spec.ref) == (family, ref)
    assert parse(str(spec)) == spec  # a spec prints as it parses


def test_open_clip_splits_architecture_and_weights(tmp_path):
    assert parse("open_clip:ViT-B-32/laion2b_s34b_b79k").architecture == "ViT-B-32"
    assert parse("open_clip:ViT-B-32/laion2b_s34b_b79k").path is None  # a tag: no local file
    w = tmp_path / "w.pt"
    w.write_bytes(b"x")
    assert parse(f"open_clip:ViT-B-32/{w}").path == w
    assert parse("hf:openai/clip-vit-base-patch32").path is None  # a hub repo id
    assert parse(f"hf:{tmp_path}").path == tmp_path


@pytest.mark.parametrize("bad, says", [("open_clip:ViT-B-32", "architecture>/<pretrained"),
                                       ("clip:ViT-B-32", "unknown family 'clip'"), ("hf:", "repo id or local dir"),
                                       ("immich:", "immich:<folder>")])
def test_a_spec_that_names_nothing_is_refused_with_the_forms(bad, says):
    with pytest.raises(BadSpec, match=says):
        parse(bad)


def test_specs_compare_by_value():
    assert ModelSpec("hf", "x") == parse("hf:x")
