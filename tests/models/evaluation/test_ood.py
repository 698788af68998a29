"""Out-of-domain evaluation over a captioned folder (the layout of coco-mini-dev), on tiny real images."""
import json

import numpy as np
import pytest
from PIL import Image

from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation import ood
from crossprobe.models.evaluation.encode import encode_images, encode_texts


def _folder(root, n=4):
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["image\tcaption"]
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.jpg")
        lines += [f"im{i}.jpg\ta photo number {i}", f"im{i}.jpg\tanother view of thing {i}"]
    (root / "captions.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_captioned_folder_loads_and_refuses_bad_layouts(tmp_path):
    f = CaptionedFolder.load(_folder(tmp_path / "ok"))
    assert f.images == [f"im{i}.jpg" for i in range(4)] and f.caption_image == [0, 0, 1, 1, 2, 2, 3, 3]
    bad = _folder(tmp_path / "bad")
    (bad / "images" / "im2.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="missing"):
        CaptionedFolder.load(bad)
    (bad / "captions.tsv").write_text("file\ttext\nim0.jpg\tx\n")
    with pytest.raises(ValueError, match="header"):
        CaptionedFolder.load(bad)


def test_ood_evaluation_ranks_among_distractors(small_model, tmp_path):
    folder = CaptionedFolder.load(_folder(tmp_path / "coco"))
    distractors = np.random.default_rng(1).random((6, 49, 1280)).astype(np.float16)
    feats = ood.OodFeatures(folder, tmp_path / "cache", small_model.cfg.text.frozen_layers, distractors)
    assert feats.grids.shape == (4, 49, 1280) and feats.states.shape[0] == 8
    res = ood.evaluate(small_model, feats)
    assert set(res) == {ood.MIXED, ood.ALONE}
    for name in res:
        assert set(res[name]) == set(ood.METHODS) and all(set(r) == set(ood.KEYS) for r in res[name].values())
    # TT among the distractors is exactly the two-tower ranking of the 4 + 6 candidates
    text = encode_texts(small_model, feats.states, feats.masks, np.arange(8)).g
    g = encode_images(small_model, np.concatenate([feats.grids, distractors]), np.arange(10)).g
    want = M.summarize(M.t2i_ranks((text @ g.T).numpy(), feats.gold))
    assert res[ood.MIXED]["TT"]["R@1"] == round(want["R@1"], 2) and res[ood.MIXED]["TT"]["MRR"] == round(want["MRR"], 4)
    # the same features again come from the cache (resumable, no recompute)
    again = ood.OodFeatures(folder, tmp_path / "cache", small_model.cfg.text.frozen_layers, distractors)
    assert np.array_equal(again.grids, feats.grids)
    j = ood.to_json(res, res, "CP@100", {"baseline_top1": 1, "top1": 2, "queries": 3}, "cmd", "m", {"baseline": "a", "default": "b"})
    ood.write(j, tmp_path / "docs")
    assert json.loads((tmp_path / "docs" / "results" / "ood.json").read_text())[ood.MIXED]["served"] == "CP@100"
    assert "coco-mini-dev+f8k-dev" in (tmp_path / "docs" / "ood.md").read_text()
