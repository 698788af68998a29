"""crossprobe.core.image_formats: what a decode will hold is known, and bounded, before any pixel is decoded."""
from __future__ import annotations

import io

import pytest
from PIL import Image

from crossprobe.core import image_formats
from tests.support import hostile_files


def _jpeg(size: tuple[int, int], progressive: bool, subsampling: int = 2) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buf, "JPEG", progressive=progressive, subsampling=subsampling)
    return buf.getvalue()


@pytest.mark.parametrize("subsampling, per_pixel", [(2, 3), (0, 6)])  # 4:2:0 and 4:4:4: bytes of coefficients
def test_a_progressive_jpeg_counts_its_full_size_coefficients(subsampling, per_pixel):
    with image_formats.open_picture(io.BytesIO(_jpeg((1600, 800), True, subsampling)), size=224) as pic:
        assert pic.image.size == (800, 400)  # drafted to 1/2 (no side under 224)
        assert pic.decode_pixels() == 1600 * 800 * per_pixel // 3
        assert pic.over(10**9) is None and "full-size coefficients" in pic.over(1_000_000)
    with image_formats.open_picture(io.BytesIO(_jpeg((1600, 800), False)), size=224) as pic:
        assert pic.decode_pixels() == 800 * 400 and pic.over(1_000_000) is None  # baseline: the drafted size


def test_a_raw_declaring_huge_sizes_is_refused_before_libraw_decodes():
    """A crafted DNG that LibRaw reads as one, declaring 60000 x 60000 photosites in 4 KB: refused from the sizes
    LibRaw parsed, before it unpacks or demosaics anything (it would try: LibRaw's own cap is 2 GB)."""
    data = hostile_files.dng(60000, 60000)
    with pytest.raises(image_formats.Oversized, match="60000x60000 RAW"):
        image_formats.open_picture(io.BytesIO(data), "x.dng", max_pixels=100_000_000)
    with pytest.raises(image_formats.Oversized):  # by its first bytes, without the extension too
        image_formats.open_picture(io.BytesIO(data), None, max_pixels=100_000_000)


def test_declared_sizes_of_other_formats_are_what_the_callers_check():
    """PNG, TIFF and HEIF bombs: their header sizes, seen lazily (nothing decoded), are over any sane limit; an
    animated GIF's first frame is all a decode reads."""
    for data in (hostile_files.png_zeros(3000, 3000), hostile_files.tiff(50000, 50000),
                 hostile_files.heif_declaring(60000)):
        try:
            pic = image_formats.open_picture(io.BytesIO(data), size=224, reduce=False)
        except Image.DecompressionBombError:  # Pillow's own guard at open (over twice its limit): also a refusal
            continue
        with pic:
            assert pic.over(25_000_000) or pic.decode_pixels() == 3000 * 3000
    with image_formats.open_picture(io.BytesIO(hostile_files.gif_frames(300)), size=224) as pic:
        assert pic.decode_pixels() == 64 * 64
