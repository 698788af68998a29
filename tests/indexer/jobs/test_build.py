"""Build against a real Redis: FAISS finds the right item, Redis holds the model's own outputs,
bad files are skipped by reason, another model's index is refused, activation is one switch."""
import json

import numpy as np
import pytest
import torch

from crossprobe.models import checkpoint
from crossprobe.indexer import FingerprintMismatch, add, build, open_index
from crossprobe.storage.store import Store
from crossprobe.core import inputs


def _model_outputs(model, models_dir, paths):
    """Reference: the checkpoint's own image tower in PyTorch on the same pixels."""
    from crossprobe.models.data.features import image_backbone_session
    from crossprobe.models.graphs import ImageGraph

    pixels = np.stack([inputs.load_image(p) for p in paths])
    grid = image_backbone_session(models_dir).run(None, {"pixels": pixels})[0]
    with torch.inference_mode():
        return [o.numpy() for o in ImageGraph(model)(torch.from_numpy(grid))]


def test_build_search_and_features_match_the_model(settings, gallery, ckpt, bert, small_model):
    res = build("photos", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
    assert res.count == 12 and res.skipped == {} and res.factory == "Flat"
    assert {"reader", "decode", "backbone", "head", "write_redis", "commit", "write_faiss", "activate"} <= set(res.stages_s)
    fp = checkpoint.read_config(ckpt)["fingerprint"]
    rd = open_index("photos", fp, settings)
    assert rd.version == res.version and len(rd) == 12
    assert sorted(rd.ids) == sorted(p.relative_to(gallery).as_posix() for p in gallery.rglob("*.*"))
    assert "sub/img_004.tiff" in rd.ids  # ids: posix paths relative to the folder
    man = rd.manifest
    assert man["fingerprint"] == fp and man["count"] == 12 and man["metric"] == "inner_product"
    assert man["dims"] == {"g": 64, "p_v": [4, 32], "b_bar": 32, "s_i": 16, "labels": 49}
    assert man["layout"]["format"] == 2 and man["layout"]["cells"] == 49

    g, p_v, b_bar, s_i, labels = _model_outputs(small_model, settings.models, [gallery / i for i in rd.ids])
    hits, scores = rd.search(g, 3)
    assert [h[0] for h in hits] == rd.ids  # every image's own vector finds it first
    assert np.allclose(scores[:, 0], 1.0, atol=1e-4)
    feats = rd.features(rd.ids)  # one MGET
    assert np.allclose(feats["p_v"], p_v, atol=2e-3, rtol=2e-3)  # float16 storage
    assert np.allclose(feats["b_bar"], b_bar, atol=2e-3, rtol=2e-3)
    assert np.allclose(feats["s_i"], s_i, atol=2e-3, rtol=2e-3)
    assert np.array_equal(feats["labels"], labels)  # region labels: exact class ids
    meta = rd.metadata(["img_001.gif"])[0]
    assert meta["uri"] == str(gallery / "img_001.gif") and meta["format"] == "GIF" and meta["width"] > 0


def test_int8_layout(settings, gallery, ckpt, bert, small_model):
    s = settings.model_copy(update={"quantization": "int8"})
    build("q8", images=gallery, settings=s, ckpt=ckpt, bert=bert, log=lambda *_: None)
    rd = open_index("q8", None, s)
    assert rd.layout.quantization == "int8"
    _, p_v, _, _, labels = _model_outputs(small_model, s.models, [gallery / i for i in rd.ids])
    scale = np.abs(p_v).max(-1, keepdims=True)
    feats = rd.features(rd.ids)
    assert (np.abs(feats["p_v"] - p_v) <= scale / 127 + 1e-3).all()
    assert np.array_equal(feats["labels"], labels)  # class ids are stored exactly in both layouts


def test_bad_files_are_skipped_and_counted(settings, tmp_path, ckpt, bert):
    from PIL import Image

    d = tmp_path / "bad"
    d.mkdir()
    rng = np.random.default_rng(1)
    Image.fromarray((rng.random((60, 80, 3)) * 255).astype(np.uint8)).save(d / "good.jpg")
    Image.fromarray((rng.random((50, 50, 3)) * 255).astype(np.uint8)).save(d / "good.png")
    Image.fromarray((rng.random((300, 300, 3)) * 255).astype(np.uint8)).save(d / "big.png")  # 90,000 px
    (d / "zero.jpg").write_bytes(b"")
    full = (d / "good.jpg").read_bytes()
    (d / "trunc.jpg").write_bytes(full[: len(full) // 2])
    (d / "text.jpg").write_text("this is not a jpeg")
    lines = [{"id": p, "uri": p, "caption": "c", "tags": ["t"]} for p in
             ("good.jpg", "good.png", "big.png", "zero.jpg", "trunc.jpg", "text.jpg", "nowhere.jpg")]
    lines.append({"id": "good.jpg", "uri": "good.png"})  # duplicate id: the first is kept
    text = "\n".join(json.dumps(x) for x in lines) + "\n{not json\n"
    (d / "m.jsonl").write_text(text)
    s = settings.model_copy(update={"max_pixels": 50_000})
    res = build("bad", manifest=d / "m.jsonl", settings=s, ckpt=ckpt, bert=bert, log=lambda *_: None)
    assert res.count == 2
    assert res.skipped == {"oversized": 1, "empty": 1, "truncated": 1, "not_image": 1, "missing": 1,
                           "duplicate_id": 1, "bad_manifest_line": 1}
    report = json.loads(res.report.read_text())
    assert {(x["id"], x["reason"]) for x in report["skipped"]} >= {("big.png", "oversized"), ("zero.jpg", "empty"),
                                                                   ("trunc.jpg", "truncated"), ("text.jpg", "not_image")}
    rd = open_index("bad", None, s)
    assert sorted(rd.ids) == ["good.jpg", "good.png"]
    assert rd.metadata(["good.jpg"])[0]["tags"] == ["t"]
    st = Store(s, rd.store.r)
    assert st.r.get(st.feat_key("bad", rd.version, "zero.jpg")) is None


def test_other_fingerprint_is_refused(settings, gallery, ckpt, bert, small_cfg, tmp_path):
    from crossprobe.models.model import SearchModel

    build("fp", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
    torch.manual_seed(1)
    other = tmp_path / "other"
    fp_other = checkpoint.save(SearchModel(small_cfg, bert).eval(), other)
    with pytest.raises(FingerprintMismatch, match="built with model"):
        open_index("fp", fp_other, settings)
    with pytest.raises(FingerprintMismatch, match=rf"crossprobe index reindex fp --model crossprobe:{other}; then add"):
        add("fp", images=gallery, settings=settings, ckpt=other, bert=bert, log=lambda *_: None)
    assert open_index("fp", checkpoint.read_config(ckpt)["fingerprint"], settings).version


def test_readers_keep_the_old_version_until_activation(settings, gallery, ckpt, bert, tmp_path, monkeypatch):
    from tests.indexer.conftest import make_images

    fp = checkpoint.read_config(ckpt)["fingerprint"]
    v1 = build("live", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None).version
    old = open_index("live", fp, settings)
    two = tmp_path / "two"
    make_images(two, 6, seed=7, prefix="new")
    seen = {}
    real_activate = Store.activate

    def checked_activate(self, name, version, **kw):  # the moment before the switch: v2 complete, v1 still live
        seen["v2"] = version
        assert self.active(name) == v1 and (self.version_dir(name, version) / "manifest.json").exists()
        assert open_index("live", fp, settings).version == v1
        assert old.features(old.ids[:3])["p_v"].shape[0] == 3
        real_activate(self, name, version, **kw)

    monkeypatch.setattr(Store, "activate", checked_activate)
    v2 = build("live", images=two, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None).version
    assert seen["v2"] == v2 != v1
    new = open_index("live", fp, settings)
    assert new.version == v2 and len(new) == 6
    assert old.features(old.ids)["p_v"].shape[0] == 12  # pinned reader still whole after the switch
    Store(settings, old.store.r).gc("live")
    with pytest.raises(KeyError, match="gc"):
        old.features(old.ids[:1])


def test_torch_head_matches_onnx_head(settings, gallery, ckpt, bert):
    build("ort", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
    s = settings.model_copy(update={"head": "torch"})
    build("pt", images=gallery, settings=s, ckpt=ckpt, bert=bert, log=lambda *_: None)
    a, b = open_index("ort", None, settings), open_index("pt", None, s)
    assert a.ids == b.ids
    va = np.load(a.store.version_dir("ort", a.version) / "vectors.npy")
    vb = np.load(b.store.version_dir("pt", b.version) / "vectors.npy")
    assert np.allclose(va, vb, atol=1e-5)
    assert np.allclose(a.features(a.ids)["p_v"], b.features(b.ids)["p_v"], atol=2e-3)
