"""Decoding a photo for a model (core/inference/decode.py): a model whose reference decodes the full picture gets the
full picture's pixels on the index path, even for photos that reduced (draft) decoding would shrink; reduced only
where a model's reference decodes so, or as far as the pixel limit needs."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from benchmarks import library_files
from crossprobe.core import image_formats
from crossprobe.core.inference.crossprobe import CrossprobeBackend
from crossprobe.core.inference.decode import decode_file
from crossprobe.core.inference.exported import ExportedBackend, ImagePreprocess
from crossprobe.core.inference.heads import HeadsBackend

CLIP = ImagePreprocess(224, (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


@pytest.fixture(scope="module")
def phone_jpeg(tmp_path_factory):
    """A 12 MP JPEG (4000 x 3000), as a phone writes: draft would decode it at 1/8 scale."""
    path = tmp_path_factory.mktemp("jpeg") / "12mp.jpg"
    library_files.picture(4000, 3000, grain=8).save(path, quality=90)
    return path


def full(path) -> np.ndarray:
    """The reference's way: Image.open, every pixel decoded, then the model's preprocessing."""
    with Image.open(path) as im:
        im.load()
        return CLIP(im)


def test_the_full_pictures_pixels_where_the_reference_decodes_it_in_full(phone_jpeg):
    x, facts = decode_file(str(phone_jpeg), 100_000_000, CLIP, 224, reduce=False)
    assert (facts["width"], facts["height"]) == (4000, 3000)
    assert np.array_equal(x, full(phone_jpeg))
    # what the index path gave before: draft decodes at 500 x 375 and the pixels move (the cause, kept measurable)
    drafted, _ = decode_file(str(phone_jpeg), 100_000_000, CLIP, 224, reduce=True)
    with image_formats.open_path(phone_jpeg, 224) as pic:
        assert pic.image.size == (500, 375)
    assert not np.array_equal(drafted, full(phone_jpeg))


def test_full_decoding_reduces_only_as_far_as_the_pixel_limit_needs(phone_jpeg, tmp_path):
    for limit, size in [(100_000_000, (4000, 3000)), (12_000_000, (4000, 3000)), (4_000_000, (2000, 1500)),
                        (1_000_000, (1000, 750)), (200_000, (500, 375))]:
        with image_formats.open_path(phone_jpeg, 224, reduce=False) as pic:
            pic.fit(limit)
            assert pic.image.size == size, limit
    x, facts = decode_file(str(phone_jpeg), 4_000_000, CLIP, 224, reduce=False)
    assert facts["width"] == 4000 and x.shape == (3, 224, 224)
    # nothing reduces a PNG: over the limit it stays an "oversized" skip, with or without reduced decoding
    library_files.picture(2000, 1500).save(tmp_path / "big.png")
    r = decode_file(str(tmp_path / "big.png"), 1_000_000, CLIP, 224, reduce=False)
    assert r.reason == "oversized" and "decodes at 2000x1500" in r.error


def test_a_small_photo_decodes_the_same_both_ways(tmp_path):
    """Below 2x the model's side draft changes nothing (Flickr8k's 500 px photos: the same pixels as before)."""
    library_files.picture(500, 375).save(tmp_path / "small.jpg", quality=90)
    a = decode_file(str(tmp_path / "small.jpg"), 10**8, CLIP, 224, reduce=False)[0]
    b = decode_file(str(tmp_path / "small.jpg"), 10**8, CLIP, 224, reduce=True)[0]
    assert np.array_equal(a, b)


def test_which_models_decode_reduced():
    """crossprobe's own checkpoint keeps its reference (inputs.load_image drafts); the exported families decode in
    full; reranker heads follow their backbone; IndexerSettings(decode="reduced") opts every model in."""
    from crossprobe.indexer.jobs.settings import IndexerSettings

    assert CrossprobeBackend.reduced_decoding is True
    assert ExportedBackend.reduced_decoding is False
    assert "self.reduced_decoding = backbone.reduced_decoding" in open(HeadsBackend.__init__.__code__.co_filename).read()
    assert IndexerSettings().decode == "reference"
    assert IndexerSettings().reduce_for(False) is False and IndexerSettings().reduce_for(True) is True
    assert IndexerSettings(decode="reduced").reduce_for(False) is True


def test_a_query_image_gets_the_same_pixels_as_the_index(phone_jpeg):
    from crossprobe.service import query_image

    data = phone_jpeg.read_bytes()
    q = query_image.pixels(data, 100_000_000, preprocess=CLIP, size=224, reduce=False)
    assert np.array_equal(q, decode_file(str(phone_jpeg), 100_000_000, CLIP, 224, reduce=False)[0])
    assert np.array_equal(query_image.pixels(data, 100_000_000, preprocess=CLIP, size=224),
                          decode_file(str(phone_jpeg), 100_000_000, CLIP, 224)[0])
