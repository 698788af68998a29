"""crossprobe eval --data (models/evaluation/captioned.py): its R@K are clip-benchmark's zero-shot retrieval
definitions, on a stand-in backend with known vectors."""
from __future__ import annotations

import numpy as np
from PIL import Image

from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.models.evaluation.captioned import evaluate
from crossprobe.core.inference.base import Backend, ImageFeatures, ImageGrid, QueryVectors
from crossprobe.core.inference.layout import FeatureDims, ItemDims

D = 8


class Pixel:
    """A photo -> its red value as a (3, 2, 2) array: the row of the stand-in's image table."""

    def __call__(self, img):
        return np.full((3, 2, 2), img.convert("RGB").getpixel((0, 0))[0], np.float32)


class TableBackend(Backend):
    """g of image i = images[i], g_q of caption "c<j>" = texts[j]: scores as chosen."""
    fingerprint, rerankers, calibration, image_size = "0" * 16, (), None, 2
    dims = FeatureDims(D, ItemDims(0, 0, 0, 0))

    def __init__(self, images, texts):
        super().__init__()
        self.images, self.texts = images, texts

    def preprocessor(self):
        return Pixel()

    def image_grid(self, pixels):
        return ImageGrid(pixels.reshape(len(pixels), 1, -1), self.images[pixels[:, 0, 0, 0].astype(int)])

    def image_features(self, grid):
        return ImageFeatures(grid.pooled, *(np.zeros((len(grid), 0)),) * 3)

    def encode_texts(self, texts):
        return [QueryVectors(self.texts[int(t[1:])], None, None, None) for t in texts]

    def rerank(self, kind, q, feats, s_tt):
        raise AssertionError("two-tower only")


def clip_benchmark_recall(scores: np.ndarray, positive: np.ndarray, k: int) -> float:
    """clip_benchmark.metrics.zeroshot_retrieval's recall_at_k > 0, averaged (torch.topk: best k, ties by position),
    in percent."""
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return 100 * float((np.take_along_axis(positive, top, 1).sum(1) > 0).mean())


def _folder(root, n_images, caption_image):
    (root / "images").mkdir(parents=True)
    for i in range(n_images):
        Image.new("RGB", (5, 4), (i, 0, 0)).save(root / "images" / f"{i:03d}.png")
    lines = ["image\tcaption\tsplit"] + [f"{i:03d}.png\tc{j}\ttest" for j, i in enumerate(caption_image)]
    (root / "captions.tsv").write_text("\n".join(lines) + "\n")
    return CaptionedFolder.load(root)


def test_recall_at_k_is_clip_benchmarks_definition(tmp_path):
    rng = np.random.default_rng(0)
    n_img, caption_image = 40, np.repeat(np.arange(40), 3)[rng.permutation(120)][:100]  # 1 to 3 captions per image
    images, texts = rng.normal(size=(n_img, D)).astype(np.float32), rng.normal(size=(100, D)).astype(np.float32)
    folder = _folder(tmp_path, n_img, caption_image)
    res = evaluate(TableBackend(images, texts), folder, "test")
    kept = sorted(set(caption_image.tolist()))  # images without a caption are not in the split's table
    gold = np.searchsorted(kept, caption_image)
    scores = texts @ images[kept].T
    positive = np.zeros(scores.shape, bool)
    positive[np.arange(len(gold)), gold] = True
    for k in (1, 5, 10):
        assert res["TT"]["t2i"][f"R@{k}"] == clip_benchmark_recall(scores, positive, k)  # text -> image
        assert res["TT"]["i2t"][f"R@{k}"] == clip_benchmark_recall(scores.T, positive.T, k)  # image -> text: any caption
    assert res["exact_ties"] == {"t2i": 0, "i2t": 0} and (res["images"], res["captions"]) == (len(kept), 100)
    assert "shortlist_recall@100" not in res and not any("@" in key for key in res if key != "TT")


def test_exact_ties_are_counted(tmp_path):
    images = np.eye(D, dtype=np.float32)[:3]
    images[2] = images[1]  # images 1 and 2 look the same to the model
    texts = np.eye(D, dtype=np.float32)[[0, 1, 1]]
    res = evaluate(TableBackend(images, texts), _folder(tmp_path, 3, [0, 1, 2]), "test")
    assert res["exact_ties"] == {"t2i": 2, "i2t": 2}
    assert round(res["TT"]["t2i"]["R@1"], 6) == round(100 / 3, 6)  # a tie counts against the gold: only caption 0 is a sure hit
