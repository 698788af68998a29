"""open_clip and M-CLIP exported (models/families/open_clip.py, mclip.py) and served torch-free, against open_clip's
own transforms, tokenizer and encode_image / encode_text, and multilingual_clip's own forward: tiny random models,
fp32. They need open_clip (torchvision): they run in the export venv (`make test-openclip`), never in `make test`;
each imports open_clip, so run in the wrong venv they fail rather than skip."""
from __future__ import annotations

import numpy as np
import pytest

from crossprobe.core import inference
from crossprobe.models import families
from crossprobe.core.inference import RuntimeOptions
from tests.models.families.parity import CAPTIONS, TOLERANCE, compare, generated_photos, real_photos
from tests.models.families.test_multilingual import SCRIPTS
from tests.support import reference_models as rm

pytestmark = pytest.mark.openclip


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    import open_clip  # noqa: F401 (fail, not skip, outside the export venv)

    root = tmp_path_factory.mktemp("refs")
    return {f: rm.build(f, root / f, size="tiny") for f in ("open_clip", "mclip")}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return generated_photos(tmp_path_factory.mktemp("photos")) + real_photos(16)


def _spec(ref) -> str:
    return f"open_clip:{rm.TINY_OPENCLIP}/{ref.path / 'open_clip_model.safetensors'}" if ref.family == "open_clip" \
        else f"hf:{ref.path}"


@pytest.mark.parametrize("family", ["open_clip", "mclip"])
def test_parity_with_the_library_on_photos_and_captions(family, refs, photos, tmp_path):
    """Pixels equal (torchvision's rounded crop, RGB after the resize: 1-bit, palette and RGBA photos included),
    ids equal, unit-norm embeddings within 1e-4, on generated and (where the shared data is here) 16 real photos
    and 64 captions in eight languages."""
    backend = inference.load(_spec(refs[family]), RuntimeOptions(graphs=tmp_path, threads=1))
    p = compare(backend, refs[family], photos, CAPTIONS)
    assert p.ids_equal and p.pixels == 0.0 and p.max_abs_diff <= TOLERANCE, p


def test_multilingual_queries_reach_mclip_untouched(refs, tmp_path):
    """M-CLIP's ids and embeddings equal multilingual_clip's own for Chinese, Arabic, Hindi, Russian, Japanese and
    Korean queries, one at a time as queries come and in a batch."""
    ref = refs["mclip"]
    backend = inference.load(_spec(ref), RuntimeOptions(graphs=tmp_path, threads=1))
    texts = list(SCRIPTS.values())
    want = rm.reference_embeddings(ref, _one_photo(tmp_path), texts)
    ids, mask = backend.tokenize(texts)
    np.testing.assert_array_equal(ids, want.input_ids)
    np.testing.assert_array_equal(mask, want.attention_mask)
    batch = np.stack([v.g_q for v in backend.encode_texts(texts)])
    alone = np.stack([backend.encode_texts([t])[0].g_q for t in texts])
    assert np.abs(batch - want.text).max() <= TOLERANCE and np.abs(alone - want.text).max() <= TOLERANCE


def test_queries_run_at_their_own_length_with_the_full_contexts_embedding(refs, tmp_path):
    """issue 54: the causal tower's padding never reaches its end token, so the text graph has a free token axis and
    a query runs at its own length: each query's embedding equals the graph's at the full 77 (within 1e-6), and
    open_clip's own encode_text at 77 (within the parity tolerance)."""
    backend = inference.load(_spec(refs["open_clip"]), RuntimeOptions(graphs=tmp_path, threads=1))
    session = backend._session("text")
    assert backend.meta["trims_padding"] is True and not isinstance(session.get_inputs()[0].shape[1], int)
    texts = CAPTIONS[:16]
    ids, mask = backend.tokenize(texts)
    assert ids.shape[1] == 77  # tokenized as open_clip pads
    full = session.run(["embedding"], {"input_ids": ids})[0]
    full /= np.linalg.norm(full, axis=1, keepdims=True)
    for t, want in zip(texts, full):
        _, _, cut = backend._run_text(session, [t], own_length=True)
        assert cut.shape == (1, int(backend.tokenize([t])[1].sum()))  # its own tokens, no padding
        np.testing.assert_allclose(backend.encode_texts([t])[0].g_q, want, atol=1e-6)
    ref = rm.reference_embeddings(refs["open_clip"], _one_photo(tmp_path), texts)
    assert np.abs(np.stack([v.g_q for v in backend.encode_texts(texts)]) - ref.text).max() <= TOLERANCE


def _one_photo(tmp_path):
    return rm.sample_photos(tmp_path / "one")[:1]


def test_both_open_clip_routes_name_one_export(refs, tmp_path):
    """open_clip:<registered arch>/<weights file> and the same file in open_clip's local folder layout load the same
    model: one fingerprint, one folder, both specs recorded."""
    ref = refs["open_clip"]
    rm.register_tiny_open_clip(tmp_path / "cfg")
    a = families.export(_spec(ref), tmp_path / "g")
    b = families.export(f"open_clip:any-label/{ref.path}", tmp_path / "g")  # the folder: local-dir
    assert a == b
    assert inference.exported_folder(inference.parse(f"open_clip:any-label/{ref.path}"), tmp_path / "g") == a


def test_an_immich_mclip_folder_serves_multilingual_queries(refs, tmp_path):
    """Immich's M-CLIP layout (textual/model.onnx with input_ids + attention_mask, int32, padded to 77) through
    ImmichBackend: texts equal M-CLIP's own embeddings; images equal open_clip's where Immich's floored crop and
    torchvision's rounded one agree, and Immich's own geometry elsewhere."""
    from transformers import AutoTokenizer

    from tests.core.inference import immich_layout

    ref = refs["mclip"]
    m = families.load(_spec(ref))
    folder = immich_layout.write(tmp_path / "XLM-Roberta-tiny", m, AutoTokenizer.from_pretrained(ref.path / "text"),
                                 77, mclip=True)
    b = inference.load(f"immich:{folder}", RuntimeOptions(threads=1))
    photos = rm.sample_photos(tmp_path / "photos")
    want = rm.reference_embeddings(ref, photos, CAPTIONS)
    assert np.abs(np.stack([v.g_q for v in b.encode_texts(CAPTIONS)]) - want.text).max() <= TOLERANCE
    pil = rm.open_images(photos)
    pixels = np.stack([b.preprocess(im) for im in pil])
    same = [i for i in range(len(pil)) if np.array_equal(pixels[i], want.pixel_values[i])]
    assert len(same) >= 8  # the photos whose crop offsets agree (and that are not 1-bit: Immich converts first)
    g = b.encode_images(pixels).g
    assert np.abs(g[same] - want.image[same]).max() <= TOLERANCE
