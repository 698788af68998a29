"""What the parity tests share (issue 47's must-show): the photos and captions, and one comparison of a crossprobe
backend with the reference implementation's own preprocessing + tokenizer + encoders (tests/support).

Photos: real ones from coco-mini-dev (COCO photos at their original sizes, so resize and crop are exercised; read
from /work/shared at test time, never copied), or, where the shared data is missing, none: the tests that need them
skip saying so. Generated ones always: scikit-image's 16 photos in their own modes (RGB, L, 1-bit) plus odd sizes,
a palette and an RGBA image."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from tests.support import reference_models as rm
from tests.support import reference_text as rt

TOLERANCE = 1e-4  # issue 47: max |crossprobe - reference| of the unit-norm embeddings
CAPTIONS = rt.sample_captions(64)  # round-robin over English, Spanish, Russian, Chinese, Japanese, Korean, Arabic, Hindi


def real_photos(n: int = 16) -> list[Path]:
    """The first n coco-mini-dev photos ([] where the shared data is missing)."""
    from crossprobe.models.data.captioned import coco_root

    return sorted((coco_root() / "images").glob("*.jpg"))[:n]


def generated_photos(dst: Path) -> list[Path]:
    """scikit-image's sample photos (tests/support) and a few made here: odd margins after the resize (where
    torchvision rounds the crop and Hugging Face floors it), a palette image, an RGBA one, a tall one."""
    paths = rm.sample_photos(dst)
    rng = np.random.default_rng(0)
    for name, (w, h), mode in [("odd", (333, 227), "RGB"), ("tall", (225, 301), "RGB"), ("palette", (300, 241), "P"),
                               ("rgba", (241, 300), "RGBA"), ("wide", (741, 500), "RGB")]:
        path = dst / f"gen_{name}.png"
        if not path.exists():
            img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            img = img.convert("P", palette=Image.Palette.ADAPTIVE) if mode == "P" else img.convert(mode)
            if mode == "RGBA":
                img.putalpha(Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)))
            img.save(path)
        paths.append(path)
    return paths


@dataclass
class Parity:
    image: float  # max |crossprobe - reference| over the unit-norm image embeddings
    text: float
    pixels: float  # max |crossprobe's pixels - the reference's|
    ids_equal: bool

    @property
    def max_abs_diff(self) -> float:
        return max(self.image, self.text)


def compare(model, ref, photos: list, texts: list[str], **reference_kw) -> Parity:
    """crossprobe's backend `model` (its preprocessor, tokenizer, graphs) against the reference's own pipeline
    (reference_kw: reference_embeddings' options, e.g. the Hugging Face image processor's backend)."""
    want = rm.reference_embeddings(ref, photos, texts, **reference_kw)
    pixels = np.stack([model.preprocess(im) for im in rm.open_images(photos)])
    g = model.encode_images(pixels).g
    q = np.stack([v.g_q for v in model.encode_texts(texts)])
    ids, _ = model.tokenize(texts)
    same = ids.shape == want.input_ids.shape and bool((ids == want.input_ids).all())
    return Parity(float(np.abs(g - want.image).max()), float(np.abs(q - want.text).max()),
                  float(np.abs(pixels - want.pixel_values).max()), same)
