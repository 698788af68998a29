"""Hugging Face CLIP and SigLIP exported (models/families/hf.py, writer.py) and served torch-free
(core/inference/exported.py), against transformers' own processor, tokenizer and get_*_features: tiny random
models, fp32 (issue 47's parity must-show; the full-size numbers: benchmarks/model_parity.py)."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

from crossprobe.core import inference, int8, runtime
from crossprobe.models import families
from crossprobe.models.families import writer
from crossprobe.models.families.base import TokenizerMismatch
from crossprobe.core.inference import RuntimeOptions
from tests.models.families.parity import CAPTIONS, TOLERANCE, compare, generated_photos, real_photos
from tests.support import reference_models as rm

FAMILIES = ["hf_clip", "hf_siglip"]


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    root = tmp_path_factory.mktemp("refs")
    return {f: rm.build(f, root / f, size="tiny") for f in FAMILIES}


@pytest.fixture(scope="module")
def exported(refs, tmp_path_factory):
    """Each reference exported once: {family: (spec, graphs root)}."""
    root = tmp_path_factory.mktemp("graphs")
    return {f: (f"hf:{r.path}", root, families.export(f"hf:{r.path}", root)) for f, r in refs.items()}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return generated_photos(tmp_path_factory.mktemp("photos"))


def _backend(exported, family):
    spec, root, _ = exported[family]
    return inference.load(spec, RuntimeOptions(graphs=root, threads=1))


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_on_generated_photos_and_captions_in_eight_languages(family, refs, exported, photos):
    p = compare(_backend(exported, family), refs[family], photos, CAPTIONS)
    assert p.ids_equal and p.pixels == 0.0
    assert p.image <= TOLERANCE and p.text <= TOLERANCE, p


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_on_real_photos(family, refs, exported):
    photos = real_photos(16)
    if len(photos) < 16:
        pytest.skip("coco-mini-dev is not on this machine (COCO_MINI_DEV_DIR): the real-photo parity needs 16 of its "
                    "photos; the generated-photo test above still ran")
    p = compare(_backend(exported, family), refs[family], photos, CAPTIONS)
    assert p.ids_equal and p.pixels == 0.0 and p.max_abs_diff <= TOLERANCE, p


@pytest.mark.parametrize("family", FAMILIES)
def test_the_index_path_decodes_the_references_pixels(family, refs, exported, tmp_path):
    """issue 53: the indexer's decode stage, at its default settings, gives exactly the pixels the reference's own
    processor makes, on photos that reduced (draft) decoding shrinks: coco-mini-dev's 80 where the shared data is
    here, and a 12 MP and a 24 MP JPEG made here (always)."""
    from benchmarks import library_files
    from crossprobe.core import image_formats
    from crossprobe.indexer.jobs.decode import decode_one
    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.indexer.jobs.sources import Item

    made = []
    for name, (w, h) in {"12mp": (4000, 3000), "24mp": (4000, 6000)}.items():
        made.append(tmp_path / f"{name}.jpg")
        library_files.picture(w, h, seed=len(made), grain=8).save(made[-1], quality=90)
    photos = made + real_photos(80)
    b, settings = _backend(exported, family), IndexerSettings()
    reduce = settings.reduce_for(b.reduced_decoding)
    got = [decode_one(Item(p.name, str(p)), settings.max_pixels, b.preprocess, b.image_size, reduce) for p in photos]
    want = rm.reference_embeddings(refs[family], photos, CAPTIONS[:1]).pixel_values
    assert np.array_equal(np.stack([g[0] for g in got]), want)
    shrunk = 0
    for p in photos:
        with image_formats.open_path(p, b.image_size) as pic:
            shrunk += pic.image.size != (pic.width, pic.height)
    assert shrunk >= len(made), shrunk  # draft would have reduced these (every coco photo of 640 px too)


def test_batches_and_single_queries_agree(exported):
    """Padding to the batch's longest text changes nothing: one query alone gives its vector in a batch."""
    b = _backend(exported, "hf_clip")
    alone = np.stack([b.encode_texts([c])[0].g_q for c in CAPTIONS[:6]])
    together = np.stack([v.g_q for v in b.encode_texts(CAPTIONS[:6])])
    np.testing.assert_allclose(alone, together, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_token_states_are_the_trunks_final_ones(family, refs, exported, photos):
    """image_grid's cells and text_tokens' states (what rerankers read) are the towers' final normalised states."""
    from transformers import AutoModel

    b = _backend(exported, family)
    model = AutoModel.from_pretrained(refs[family].path).eval()
    pixels = np.stack([b.preprocess(im) for im in rm.open_images(photos[:3])])
    grid = b.image_grid(pixels)
    emb, tokens, mask = b.text_tokens(CAPTIONS[:4])
    ids, _ = b.tokenize(CAPTIONS[:4])
    with torch.inference_mode():
        vis = model.vision_model(pixel_values=torch.from_numpy(pixels)).last_hidden_state
        want_cells = vis if family == "hf_siglip" else model.vision_model.post_layernorm(vis[:, 1:])
        want_text = model.text_model(input_ids=torch.from_numpy(ids),
                                     attention_mask=None if family == "hf_siglip" else torch.from_numpy(mask))
    np.testing.assert_allclose(grid.cells, want_cells.numpy(), atol=1e-4)
    np.testing.assert_allclose(tokens, want_text.last_hidden_state.numpy(), atol=1e-4)
    meta = json.loads((exported[family][2] / "model.json").read_text())
    assert grid.cells.shape[1:] == tuple(meta["dims"]["grid"]) and tokens.shape[-1] == meta["dims"]["text_width"]
    assert grid.pooled.shape == (3, meta["dims"]["d"]) and emb.shape == (4, meta["dims"]["d"])


def test_the_same_weights_give_the_same_folder_from_anywhere(refs, exported, tmp_path):
    """The fingerprint hashes the weights and the architecture, not where they lie: a copy exports to the same
    folder, which then answers to both specs; other weights get another folder."""
    spec, root, folder = exported["hf_clip"]
    copy = shutil.copytree(refs["hf_clip"].path, tmp_path / "copy")
    assert families.export(f"hf:{copy}", root) == folder
    meta = json.loads((folder / "model.json").read_text())
    assert meta["spec"] == spec and f"hf:{copy}" in meta["aliases"]
    assert inference.exported_folder(inference.parse(f"hf:{copy}"), root) == folder
    other = rm.build("hf_clip", tmp_path / "seed1", size="tiny", seed=1)
    assert families.export(f"hf:{other.path}", root) != folder


def test_an_export_is_whole_or_absent(refs, tmp_path, monkeypatch):
    """A graph that fails its check leaves nothing behind (no folder, no temp folder); a good export leaves the
    four files, model.json last."""
    monkeypatch.setattr(writer, "GRAPH_TOLERANCE", -1.0)  # every graph now "differs"
    with pytest.raises(RuntimeError, match="differs from PyTorch"):
        families.export(f"hf:{refs['hf_siglip'].path}", tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    folder = families.export(f"hf:{refs['hf_siglip'].path}", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]
    assert sorted(p.name for p in folder.iterdir()) == ["image.onnx", "model.json", "text.onnx", "tokenizer.json"]


def test_a_tokenizer_that_disagrees_is_refused(refs, tmp_path):
    m = families.load(f"hf:{refs['hf_clip'].path}")
    own = m.reference_ids
    m.reference_ids = lambda t: own(t) if "dog" not in t else own(t)[:-1]  # a family that differs on some texts
    with pytest.raises(TokenizerMismatch, match="disagrees"):
        writer.write(m, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_spec_not_exported_is_exported_on_first_use(refs, tmp_path):
    b = inference.load(f"hf:{refs['hf_siglip'].path}", RuntimeOptions(graphs=tmp_path, threads=1))
    assert (tmp_path / b.fingerprint / "model.json").exists() and b.rerankers == () and b.dims.item.n == 0
    with pytest.raises(inference.RerankerUnavailable):
        b.require_reranker("cp")


def test_what_hf_does_not_serve_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(inference.BadSpec, match="model_type 'bert'"):
        families.load(f"hf:{tmp_path}")
    with pytest.raises(FileNotFoundError, match="pull"):
        families.load("hf:nobody/no-such-model-here")


def test_an_open_clip_spec_where_open_clip_is_missing_names_what_to_install(tmp_path):
    """The main .venv has no open_clip: a spec that needs it and has no folder yet is refused with what to do."""
    pytest.importorskip("torch")
    try:
        import open_clip  # noqa: F401
        pytest.skip("open_clip is installed here (the export venv): nothing to refuse")
    except ImportError:
        pass
    with pytest.raises(inference.ModelUnavailable, match=r"lacks .*open_clip.*pip install 'crossprobe\[open_clip\]'"):
        inference.load("open_clip:ViT-B-32/laion2b_s34b_b79k", RuntimeOptions(graphs=tmp_path))


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_queries_stay_close_to_fp32_and_do_not_depend_on_batch_mates(exported, family):
    """CROSSPROBE_QUERY_PRECISION=int8 on a family model: the text graph's MatMuls quantized once beside it; each
    query runs alone (dynamic quantization's activation range would otherwise depend on its batch-mates)."""
    spec, root, folder = exported[family]
    texts = ["a dog runs on the beach", "一只狗在海滩上奔跑", "two people ride bikes down a long road in the rain"]
    fp = inference.load(spec, RuntimeOptions(graphs=root, threads=1)).encode_texts(texts)
    q8 = inference.load(spec, RuntimeOptions(graphs=root, threads=1, query_precision="int8"))
    batch = q8.encode_texts(texts)
    alone = [q8.encode_texts([t])[0] for t in texts]
    check = q8.int8_check  # measured at load on the probe queries, on the kernel path this host takes
    assert check.kernel == int8.kernel_path() and check.weights == int8.weight_format(check.kernel)
    assert check.min_cosine >= int8.MIN_COSINE, check
    assert (folder / ("text.int8" if check.weights == "s8" else "text.int8-u8") / "text.onnx").exists()
    for a, b, c in zip(fp, batch, alone):
        np.testing.assert_array_equal(b.g_q, c.g_q)
        assert float(a.g_q @ b.g_q) >= int8.MIN_COSINE and not np.array_equal(a.g_q, b.g_q), check


@pytest.mark.parametrize("weights", ["s8", "u8"])
def test_int8_weight_formats_hold_the_stated_cosine_where_this_host_would_take_them(exported, weights):
    """Both formats measured on this host's kernels: "u8" (what AVX2 hosts without VNNI get) holds everywhere; "s8"
    holds wherever the kernel accumulates without saturating (int8.NO_SATURATION), which this host's name says."""
    from crossprobe.core.inference.exported import ExportedBackend, int8_graph

    spec, root, folder = exported["hf_siglip"]
    b = ExportedBackend(folder, RuntimeOptions(threads=1))
    q8 = runtime.session(int8_graph(folder / "text.onnx", weights), 1)
    low = int8.check(lambda ts: b._run_text(b._session("text"), ts)[0], lambda t: b._run_text(q8, [t])[0],
                     0.0, weights, "test").min_cosine
    if weights == "u8" or int8.weight_format() == "s8":
        assert low >= int8.MIN_COSINE, (int8.kernel_path(), weights, low)
    print(f"int8 {weights} on {int8.kernel_path()}: min cosine {low:.5f}")


def test_int8_is_refused_below_the_stated_cosine_naming_the_kernel_path(exported):
    spec, root, _ = exported["hf_clip"]
    q8 = inference.load(spec, RuntimeOptions(graphs=root, threads=1, query_precision="int8", int8_min_cosine=1.0))
    with pytest.raises(int8.Int8Refused, match=re.escape(int8.kernel_path())):
        q8.encode_texts(["a dog"])


def test_weights_written_again_serve_again_after_an_export(refs, tmp_path):
    """The same bytes with new file times (a new download, a copy over): the folder is not trusted until an export
    has seen them (the fingerprint matches), and then it serves them without exporting the graphs again."""
    import os

    from crossprobe.core.inference.exported import find_exported

    copy = shutil.copytree(refs["hf_clip"].path, tmp_path / "model")
    spec = f"hf:{copy}"
    folder = families.export(spec, tmp_path / "graphs")
    assert find_exported(tmp_path / "graphs", spec) == folder
    weights = next(p for p in copy.iterdir() if p.suffix == ".safetensors")
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert find_exported(tmp_path / "graphs", spec) is None  # changed as far as the file times say
    graph_mtime = (folder / "text.onnx").stat().st_mtime_ns
    assert families.export(spec, tmp_path / "graphs") == folder
    assert find_exported(tmp_path / "graphs", spec) == folder
    assert (folder / "text.onnx").stat().st_mtime_ns == graph_mtime  # not exported again
