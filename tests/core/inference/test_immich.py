"""immich:<folder> (core/inference/immich.py): a folder written here in exactly the layout Immich publishes, from
a random model, loads through inference.load and encodes photos and captions as the model's own library does
(issue 47's must-show "an Immich-layout folder loads and serves")."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from crossprobe.core import inference
from crossprobe.models import families
from crossprobe.core.inference import RuntimeOptions
from crossprobe.core.inference.exported import ImagePreprocess
from crossprobe.core.inference.immich import ImmichBackend, ImmichPreprocess
from tests.models.families.parity import CAPTIONS, TOLERANCE, generated_photos, real_photos
from tests.core.inference import immich_layout
from tests.support import reference_models as rm


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """A tiny random Hugging Face CLIP and its Immich folder (an open_clip-style text graph: "text", int32 ids)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("immich")
    ref = rm.build("hf_clip", root / "ref", size="tiny")
    m = families.load(f"hf:{ref.path}")
    folder = immich_layout.write(root / "ViT-tiny__random", m, AutoTokenizer.from_pretrained(ref.path), 77)
    return ref, folder


def _photos(tmp_path):
    """Generated photos without transparency (Hugging Face composites it onto white, Immich drops it) and real ones
    where the shared data is here."""
    return [p for p in generated_photos(tmp_path) if "rgba" not in p.name] + real_photos(16)


def test_an_immich_folder_loads_and_encodes_as_the_reference(clip, tmp_path):
    ref, folder = clip
    b = inference.load(f"immich:{folder}", RuntimeOptions(graphs=tmp_path / "graphs", threads=1))
    assert isinstance(b, ImmichBackend) and b.rerankers == () and b.dims.item.n == 0
    photos = _photos(tmp_path)
    want = rm.reference_embeddings(ref, photos, CAPTIONS)
    pixels = np.stack([b.preprocess(im) for im in rm.open_images(photos)])
    np.testing.assert_array_equal(pixels, want.pixel_values)  # Immich floors the crop, as Hugging Face does
    grid = b.image_grid(pixels)  # a graph with a batch of one: run item by item
    assert grid.cells.shape == (len(photos), 1, b.dims.d) and np.array_equal(grid.cells[:, 0], grid.pooled)
    assert np.abs(b.image_features(grid).g - want.image).max() <= TOLERANCE
    ids, mask = b.tokenize(CAPTIONS)
    T = want.input_ids.shape[1]
    assert ids.shape == (64, 77) and np.array_equal(ids[:, :T], want.input_ids)  # Immich pads to 77 with the pad
    assert (ids[:, T:] == b.meta["text"]["pad_id"]).all()
    q = np.stack([v.g_q for v in b.encode_texts(CAPTIONS)])
    assert np.abs(q - want.text).max() <= TOLERANCE


def test_the_fingerprint_covers_the_files_and_is_cached(clip, tmp_path):
    _, folder = clip
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(folder, copy)
    a = ImmichBackend(copy, RuntimeOptions(graphs=tmp_path / "g"))
    assert len(a.fingerprint) == 16 and ImmichBackend(folder, RuntimeOptions()).fingerprint == a.fingerprint
    cached = list((tmp_path / "g" / "immich").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["fingerprint"] == a.fingerprint
    cfg = copy / "visual" / "preprocess_cfg.json"
    cfg.write_text(cfg.read_text().replace('"shortest"', '"squash"'))
    os.utime(cfg, ns=(1, 1))
    b = ImmichBackend(copy, RuntimeOptions(graphs=tmp_path / "g"))
    assert b.fingerprint != a.fingerprint and b.preprocessor().resize == "squash"


def test_canonicalize_cleaning_comes_from_the_config(clip, tmp_path):
    """tokenizer_kwargs.clean = "canonicalize" (Immich's SigLIP folders): punctuation stripped and lower-cased;
    otherwise only whitespace collapsed. Other scripts pass untouched either way."""
    import shutil

    _, folder = clip
    copy = shutil.copytree(folder, tmp_path / "canon")
    cfg = json.loads((copy / "config.json").read_text())
    cfg["text_cfg"]["tokenizer_kwargs"] = {"clean": "canonicalize"}
    (copy / "config.json").write_text(json.dumps(cfg))
    plain, canon = ImmichBackend(folder, RuntimeOptions()), ImmichBackend(copy, RuntimeOptions())
    assert canon.meta["text"]["clean"] == "canonicalize" and plain.meta["text"]["clean"] == "whitespace"
    np.testing.assert_array_equal(canon.tokenize(["A Dog, runs!"])[0], plain.tokenize(["a dog runs"])[0])
    zh = ["一只狗在海滩上奔跑", "Собака бежит", "الكلب يجري", "कुत्ता दौड़ रहा है"]
    np.testing.assert_array_equal(canon.tokenize(zh)[0], plain.tokenize(zh)[0])


def test_immich_resizes_the_long_side_its_own_way(tmp_path):
    """Immich computes the long side as int(long / short * S): for a 224 x 230 photo that is 229 (floating point),
    where torchvision and Hugging Face make int(S * long / short) = 230."""
    args = (224, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "shortest", "bicubic", True, "floor")
    assert ImmichPreprocess(*args)._long_side(230, 224) == 229 and ImagePreprocess(*args)._long_side(230, 224) == 230
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (230, 224, 3), dtype=np.uint8))
    assert ImmichPreprocess(*args)(img).shape == (3, 224, 224)


def test_a_folder_not_in_immichs_layout_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="missing visual/preprocess_cfg.json, visual/model.onnx"):
        inference.load(f"immich:{tmp_path}", RuntimeOptions())


def test_a_siglip_folder_loads_and_encodes_as_the_reference(tmp_path):
    """Immich's SigLIP folders (ViT-B-16-SigLIP__webli, ...SigLIP2...): a SentencePiece tokenizer.json, "text" ids
    padded to the context with </s>, canonicalize cleaning, the photo squashed to S x S. Written here from the tiny
    random SigLIP, read as Immich would: the pixels, the ids and both embeddings equal transformers' SiglipModel's
    (for captions that canonicalizing leaves as they are)."""
    ref = rm.build("hf_siglip", tmp_path / "ref", size="tiny")
    m = families.load(f"hf:{ref.path}")
    tok = immich_layout.ExportedTokenizer(m.tokenizer_json, m.text_cfg["pad_token"])
    folder = immich_layout.write(tmp_path / "ViT-tiny-SigLIP__random", m, tok, m.text_cfg["context_length"],
                                 tokenizer_kwargs={"clean": "canonicalize"})
    b = inference.load(f"immich:{folder}", RuntimeOptions(threads=1))
    assert b.preprocessor().resize == "squash" and b.meta["text"]["clean"] == "canonicalize"
    photos = _photos(tmp_path)
    texts = ["a photo of a cat", "two dogs in the snow", "a red car on a street", "dwa psy na śniegu"]
    want = rm.reference_embeddings(ref, photos, texts)
    pixels = np.stack([b.preprocess(im) for im in rm.open_images(photos)])
    np.testing.assert_array_equal(pixels, want.pixel_values)
    assert np.abs(b.image_features(b.image_grid(pixels)).g - want.image).max() <= TOLERANCE
    np.testing.assert_array_equal(b.tokenize(texts)[0], want.input_ids)
    assert np.abs(np.stack([v.g_q for v in b.encode_texts(texts)]) - want.text).max() <= TOLERANCE


def _with_language_codes(folder, dst, codes: dict[str, int]):
    """A copy of an Immich folder whose tokenizer knows FLORES-200 codes as special tokens (as NLLB's does)."""
    import shutil

    copy = shutil.copytree(folder, dst)
    tj = copy / "textual" / "tokenizer.json"
    t = json.loads(tj.read_text())
    by_id = {i: tok for tok, i in t["model"]["vocab"].items()}
    for c, i in codes.items():  # the codes take two ids of the vocabulary, so the graph's embedding table has them
        del t["model"]["vocab"][by_id[i]]
        t["model"]["vocab"][c] = i
    t["added_tokens"] += [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                           "normalized": False, "special": True} for c, i in codes.items()]
    tj.write_text(json.dumps(t))
    return copy


def test_an_nllb_folder_gets_the_query_language_code_as_immich_writes_it(clip, tmp_path):
    """Immich's NLLB-CLIP folders (nllb-clip-base-siglip__v1): Immich writes the user's language as a FLORES-200 code
    before the cleaned query, no space between, and tokenizes that; crossprobe does the same with
    CROSSPROBE_QUERY_LANGUAGE, by the model's name as Immich tells NLLB models apart (a hub snapshot folder is named
    by its commit: the repo's name counts). Other models read the query as it is."""
    from tokenizers import Tokenizer

    from crossprobe.core.inference.exported import clean_text

    _, folder = clip
    codes = {"eng_Latn": 7, "pol_Latn": 8}
    nllb = _with_language_codes(folder, tmp_path / "nllb-clip-tiny__random", codes)
    plain = _with_language_codes(folder, tmp_path / "ViT-tiny__random", codes)
    q = "Kot   na kanapie"
    immich = Tokenizer.from_file(str(nllb / "textual" / "tokenizer.json"))
    pad = json.loads((nllb / "textual" / "tokenizer_config.json").read_text())["pad_token"]
    immich.enable_padding(length=77, pad_token=pad, pad_id=immich.token_to_id(pad))
    immich.enable_truncation(max_length=77)
    for language, code in (("pl", "pol_Latn"), ("pl-PL", "pol_Latn"), ("en", "eng_Latn"), ("pol_Latn", "pol_Latn")):
        b = ImmichBackend(nllb, RuntimeOptions(query_language=language))
        ids = b.tokenize([q])[0][0]
        assert ids.tolist() == immich.encode(code + clean_text(q, "whitespace")).ids, language
        assert codes[code] in ids.tolist()[:2]
    assert 8 not in ImmichBackend(plain, RuntimeOptions(query_language="pl")).tokenize([q])[0][0].tolist()
    by_repo = ImmichBackend(plain, RuntimeOptions(query_language="pl"), name="nllb-clip-base-siglip__v1")
    assert by_repo.meta["text"]["prefix"] == "pol_Latn"
    pl, en = (ImmichBackend(nllb, RuntimeOptions(query_language=lang)).encode_texts([q])[0].g_q for lang in ("pl", "en"))
    assert not np.allclose(pl, en)  # the code reaches the text tower


def test_an_unknown_query_language_is_refused_at_start():
    from pydantic import ValidationError

    from crossprobe.service.settings import Settings

    with pytest.raises(ValidationError, match="ISO 639-1"):
        Settings(query_language="klingon")
    assert Settings(query_language="pl").query_language == "pl"
