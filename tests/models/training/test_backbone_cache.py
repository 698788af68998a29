"""The backbone's outputs over a captioned folder, cached once through the seam (models/training/backbone_cache.py):
unreadable photos counted and left out with their captions, a second run reads the cache."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from crossprobe.core import inference
from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.core.inference import RuntimeOptions
from crossprobe.models.training import backbone_cache
from crossprobe.models.training.backbone_cache import NoTokenStates, cache_outputs
from crossprobe.models.training.backbone_heads import split_banks


def _folder(root):
    (root / "images").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (40, 30), (60 * i, 90, 200 - 50 * i)).save(root / "images" / f"{i}.png")
    (root / "images" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)  # a PNG header, then nothing
    (root / "captions.tsv").write_text("image\tcaption\tsplit\n0.png\ta red field\ttrain\n0.png\tred again\ttrain\n"
                                       "1.png\ta green field\ttrain\nbroken.png\tlost\ttrain\n2.png\tblue\ttest\n")
    return CaptionedFolder.load(root)


def test_outputs_are_the_backbones_own_and_bad_photos_are_counted(tiny_heads, tmp_path, monkeypatch):
    backend = inference.load(tiny_heads.backbone, RuntimeOptions(graphs=tiny_heads.graphs))
    folder = _folder(tmp_path / "d")
    outs = cache_outputs(backend, folder, tmp_path / "cache", batch=2)
    assert outs.readable.tolist() == [True, True, True, False] and outs.skipped == {"not_image": 1}
    grid = backend.image_grid(np.stack([backend.preprocess(Image.open(folder.image_path(1)))]))
    np.testing.assert_allclose(outs.cells[1], grid.cells[0].astype(np.float16))
    np.testing.assert_allclose(outs.pooled[1], grid.pooled[0], rtol=1e-6)
    emb, tokens, mask = backend.text_tokens([folder.captions[2]])
    T = int(mask.sum())
    np.testing.assert_allclose(outs.tokens[2, :T], tokens[0, :T].astype(np.float16))
    assert outs.mask[2].sum() == T and outs.mask.shape[1] == max(outs.mask.sum(1))  # padded to the longest caption
    train = split_banks(outs, folder, "train")
    assert train.gold.tolist() == [0, 0, 1] and len(train.images.g) == 2  # the broken photo and its caption left out
    np.testing.assert_allclose(np.linalg.norm(train.images.g.numpy(), axis=1), 1, atol=1e-5)
    monkeypatch.setattr(backbone_cache, "decode_file", lambda *a: pytest.fail("decoded again"))
    again = cache_outputs(backend, folder, tmp_path / "cache", batch=2)
    np.testing.assert_array_equal(again.cells, outs.cells)
    assert again.skipped == {"unreadable (an earlier run)": 1}


def test_a_backbone_without_token_states_is_refused(tiny_heads):
    backend = inference.load(tiny_heads.backbone, RuntimeOptions(graphs=tiny_heads.graphs))

    class PooledOnly:  # what an Immich folder's graphs give: the embedding, no token states
        image_size = backend.image_size
        fingerprint = backend.fingerprint
        image_grid = backend.image_grid

        def text_tokens(self, texts):
            emb, _, mask = backend.text_tokens(texts)
            return emb, None, mask

    with pytest.raises(NoTokenStates, match="no patch tokens or text token states"):
        backbone_cache.shapes(PooledOnly())
