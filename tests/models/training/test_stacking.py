"""Dev stacking: bank subsets and concatenation keep every caption with its own image."""
import numpy as np
import pytest
import torch

from crossprobe.models.evaluation.encode import ImageBank, TextBank
from crossprobe.models.training.stacking import concat, stacked, subset


def _banks(n_img: int, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    gold = np.repeat(np.arange(n_img), 2)  # 2 captions per image
    C = len(gold)
    mask = torch.zeros(C, T, dtype=torch.bool)
    for c in range(C):
        mask[c, : 1 + c % T] = True
    text = TextBank(torch.randn(C, T, 4, generator=g), mask, torch.randn(C, 4, generator=g), torch.randn(C, T, 6, generator=g))
    images = ImageBank(torch.randn(n_img, 49, 4, generator=g), torch.randn(n_img, 4, generator=g), torch.randn(n_img, 49, 3, generator=g))
    return text, images, gold


def _pairs(banks):
    """(caption g vector, its gold image g vector) per caption, to compare identities across transforms."""
    text, images, gold = banks
    return [(tuple(text.g[c].tolist()), tuple(images.g[gold[c]].tolist())) for c in range(len(gold))]


def test_subset_keeps_captions_with_their_images_and_trims_padding():
    b = _banks(5, 4, 0)
    s = subset(b, [3, 1])
    assert len(s[1].g) == 2 and len(s[2]) == 4
    assert set(_pairs(s)) == {p for p, i in zip(_pairs(b), b[2]) if i in (1, 3)}
    assert s[0].mask.shape[1] == int(s[0].mask.sum(1).max())


def test_concat_shifts_gold_and_pads_tokens():
    a, b = _banks(3, 2, 1), _banks(4, 5, 2)
    c = concat(a, b)
    assert len(c[1].g) == 7 and c[0].tokens.shape[1] == 5
    assert _pairs(c) == _pairs(a) + _pairs(b)
    assert not c[0].mask[: len(a[2]), 2:].any()  # a's captions padded, not extended
    assert torch.equal(c[0].tokens[len(a[2]):], b[0].tokens)


def test_stacked_splits_dev_by_image():
    train, dev = _banks(6, 3, 3), _banks(10, 3, 4)
    tr, dv = stacked(train, dev, 0.8)
    assert len(tr[1].g) == 6 + 8 and len(dv[1].g) == 2
    assert set(_pairs(dv)) == {p for p, i in zip(_pairs(dev), dev[2]) if i >= 8}
    assert stacked(train, dev, 0.0) == (train, dev)
    with pytest.raises(ValueError):
        stacked(train, dev, 1.0)
