"""Random-weight reference models for issue 47's parity checks: each family built offline from its own library with a
fixed seed, saved in the folder layout a user of that library has, and run through that library's OWN preprocessing,
tokenizer and encoder (`reference_embeddings`). crossprobe's loaders and exported graphs are compared against these;
docs/research/model_choice.md ("The references") says exactly how each reference preprocesses and tokenizes.

Families (`build(family, dst, size)`; size "tiny" for tests, "base" for the real architecture's shapes):
- "open_clip": open_clip's own local folder (open_clip_config.json + open_clip_model.safetensors), loaded with
  `open_clip.create_model_and_transforms("local-dir:DIR")`; "base" is ViT-B-32 (arch="ViT-B-16" for its cost).
- "hf_clip": a Hugging Face CLIPModel folder (config.json, model.safetensors, vocab.json + merges.txt,
  preprocessor_config.json), loaded with `CLIPModel.from_pretrained` / `CLIPProcessor.from_pretrained`.
- "hf_siglip": a SiglipModel folder with a trained SentencePiece spiece.model.
- "mclip": M-CLIP (the XLM-RoBERTa-Large-ViT-B-32 that Immich exports): an XLM-R text tower + linear projection in
  the `multilingual-clip` package's folder layout (text/), paired with an open_clip ViT-B-32 image tower (visual/).

open_clip and M-CLIP need the export venv (scripts/openclip-env.sh: open_clip needs torchvision, absent from the main
.venv); the Hugging Face families run in either. Nothing here downloads: tokenizers are trained on reference_text's
captions (plus a caller's own, e.g. Flickr8k's), and HF_HUB_OFFLINE is set before transformers is imported.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from tests.support import reference_text  # noqa: E402

FAMILIES = ("open_clip", "hf_clip", "hf_siglip", "mclip")
META = "crossprobe_reference.json"  # what was built, read back by reference_embeddings (the libraries ignore it)

# A tiny open_clip architecture, registered with open_clip under this name: the real ViT-B-32 code path (224 px
# input, 32 px patches, 77-token context, the full CLIP vocabulary) at a width and depth that build in a second.
TINY_OPENCLIP = "crossprobe-tiny-ViT"
TINY_OPENCLIP_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 64, "head_width": 32, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
# XLM-RoBERTa shapes: "base" is xlm-roberta-large's config (M-CLIP's text tower)
XLMR_SHAPES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    "base": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                 vocab_size=250002),
}


@dataclass(frozen=True)
class Reference:
    """A built reference model: its family, size, seed and folder (see the module docstring for each layout)."""

    family: str
    size: str
    seed: int
    path: Path
    arch: str | None = None  # the open_clip architecture (open_clip; M-CLIP's image tower)
    details: dict = field(default_factory=dict, hash=False)  # e.g. where the tokenizer's vocabulary came from

    def save(self) -> Reference:
        meta = dict(family=self.family, size=self.size, seed=self.seed, arch=self.arch, details=self.details)
        (self.path / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        return self

    @classmethod
    def load(cls, path: Path) -> Reference:
        return cls(path=Path(path), **json.loads((Path(path) / META).read_text(encoding="utf-8")))


@dataclass
class Embeddings:
    """The reference's outputs for a list of images and texts: raw (as the encoder returns them) and unit-normalised
    float32 arrays, with the exact inputs the reference fed its encoders (to compare preprocessing and tokenization
    separately from the towers)."""

    image_raw: np.ndarray
    text_raw: np.ndarray
    pixel_values: np.ndarray
    input_ids: np.ndarray
    attention_mask: np.ndarray | None = None
    notes: dict = field(default_factory=dict)

    @property
    def image(self) -> np.ndarray:
        return self.image_raw / np.linalg.norm(self.image_raw, axis=-1, keepdims=True)

    @property
    def text(self) -> np.ndarray:
        return self.text_raw / np.linalg.norm(self.text_raw, axis=-1, keepdims=True)


def build(family: str, dst: Path, size: str = "tiny", seed: int = 0, texts: list[str] | None = None,
          **kwargs) -> Reference:
    """Build one family's random-weight model into `dst` (see the module docstring). `texts`: extra captions for the
    tokenizer training where the family trains one (HF CLIP without open_clip's vocabulary, SigLIP, M-CLIP)."""
    builders = {"open_clip": build_open_clip, "hf_clip": build_hf_clip, "hf_siglip": build_hf_siglip,
                "mclip": build_mclip}
    if family not in builders:
        raise ValueError(f"unknown family {family!r}; have {FAMILIES}")
    if family == "open_clip":
        if texts:
            raise ValueError("open_clip uses the CLIP vocabulary it ships: no tokenizer to train")
    else:
        if kwargs.get("arch"):
            raise ValueError(f"{family}: arch is for open_clip (an M-CLIP image tower is ViT-B-32 or the tiny one)")
        kwargs.pop("arch", None)
        kwargs["texts"] = texts
    return builders[family](Path(dst), size=size, seed=seed, **kwargs)


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)


# ---------------------------------------------------------------- open_clip

def register_tiny_open_clip(folder: Path) -> str:
    """Register TINY_OPENCLIP with open_clip (a config file in `folder`, added to its registry), so that
    `open_clip.create_model_and_transforms(TINY_OPENCLIP, pretrained=<weights file>)` works; returns the name."""
    import open_clip

    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / f"{TINY_OPENCLIP}.json"
    cfg.write_text(json.dumps(TINY_OPENCLIP_CFG, indent=1), encoding="utf-8")
    if TINY_OPENCLIP not in open_clip.list_models():
        open_clip.add_model_config(cfg)
    return TINY_OPENCLIP


def build_open_clip(dst: Path, size: str = "tiny", seed: int = 0, arch: str | None = None) -> Reference:
    """An open_clip model with random weights in open_clip's local folder layout (the layout of open_clip models on
    the Hugging Face hub): open_clip_config.json {model_cfg, preprocess_cfg} + open_clip_model.safetensors. Loads
    with `create_model_and_transforms("local-dir:" + dst)`, or with `(arch, pretrained=dst/open_clip_model.safetensors)`
    for a registered arch. size "tiny" is TINY_OPENCLIP; "base" is `arch` (default ViT-B-32)."""
    import open_clip
    from safetensors.torch import save_file

    arch = TINY_OPENCLIP if size == "tiny" else (arch or "ViT-B-32")
    if arch == TINY_OPENCLIP:
        register_tiny_open_clip(dst)
    _seeded(seed)
    model = open_clip.create_model(arch, pretrained=None)
    dst.mkdir(parents=True, exist_ok=True)
    config = {"model_cfg": open_clip.get_model_config(arch),
              "preprocess_cfg": _jsonable(open_clip.get_model_preprocess_cfg(model))}
    (dst / "open_clip_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, dst / "open_clip_model.safetensors")
    return Reference("open_clip", size, seed, dst, arch).save()


def _jsonable(cfg: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


def _open_clip_towers(path: Path):
    """(model, preprocess, tokenizer) exactly as an open_clip user loads a local folder."""
    import open_clip

    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{path}")
    return model.eval(), preprocess, open_clip.get_tokenizer(f"local-dir:{path}")


@torch.inference_mode()
def _open_clip_embeddings(ref: Reference, images: list[Image.Image], texts: list[str]) -> Embeddings:
    model, preprocess, tokenizer = _open_clip_towers(ref.path)
    pixels = torch.stack([preprocess(im) for im in images])
    ids = tokenizer(texts)
    return Embeddings(model.encode_image(pixels).numpy(), model.encode_text(ids).numpy(), pixels.numpy(), ids.numpy(),
                      notes={"preprocess": repr(preprocess), "tokenizer": type(tokenizer).__name__})


# ---------------------------------------------------------------- Hugging Face CLIP

def _clip_merges(size: str, texts: list[str] | None) -> tuple[list[tuple[str, str]], str]:
    """open_clip's real CLIP vocabulary where open_clip is installed and the model is full size; else a BPE trained
    in CLIP's layout on the reference captions (the main .venv has no open_clip)."""
    if size == "base":
        try:
            return reference_text.openclip_bpe_merges(), "open_clip bpe_simple_vocab_16e6"
        except ImportError:
            pass
    return _trained_clip_merges(tuple(texts or ())), "trained"


@functools.lru_cache(maxsize=4)
def _trained_clip_merges(extra: tuple[str, ...]) -> list[tuple[str, str]]:
    # cached: the learner is deterministic (tests/support/test_reference_text.py) and takes seconds on a busy machine
    return reference_text.train_clip_merges(reference_text.corpus(extra=list(extra)), vocab_size=4000)


CLIP_SHAPES = {
    "tiny": (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
             dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2), 16),
    "base": ({}, {}, 512),  # transformers' defaults are openai/clip-vit-base-patch32's shapes
}


def build_hf_clip(dst: Path, size: str = "tiny", seed: int = 0, texts: list[str] | None = None) -> Reference:
    """A Hugging Face CLIPModel folder with random weights: config.json + model.safetensors, the tokenizer files a CLIP
    folder has (vocab.json + merges.txt, plus what save_pretrained adds) and preprocessor_config.json with
    CLIPImageProcessor's settings (shortest side to 224 bicubic, centre crop 224, OpenAI mean/std)."""
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    merges, vocab_source = _clip_merges(size, texts)
    vocab = reference_text.write_clip_bpe(dst, merges)
    text_shape, vision_shape, proj = CLIP_SHAPES[size]
    vocab_size = max(max(vocab.values()) + 1, 49408 if size == "base" else 0)  # base: the real embedding table's size
    config = CLIPConfig(
        text_config=dict(vocab_size=vocab_size, max_position_embeddings=77,
                         bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
                         pad_token_id=vocab["<|endoftext|>"], **text_shape),
        vision_config=dict(image_size=224, patch_size=32, **vision_shape), projection_dim=proj)
    _seeded(seed)
    CLIPModel(config).eval().save_pretrained(dst)
    CLIPTokenizer.from_pretrained(dst, model_max_length=77).save_pretrained(dst)
    _write_json(dst / "preprocessor_config.json", {
        "image_processor_type": "CLIPImageProcessor", "processor_class": "CLIPProcessor",
        "do_resize": True, "size": {"shortest_edge": 224}, "resample": 3, "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True})
    _write_json(dst / "processor_config.json", {"processor_class": "CLIPProcessor"})
    return Reference("hf_clip", size, seed, dst, details={"vocab": vocab_source}).save()


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _hf_processor(path: Path, backend: str | None):
    """The folder's own processor as AutoProcessor gives it; `backend` ("pil" | "torchvision") pins the image
    processor's backend, None leaves transformers' choice (torchvision where installed, else PIL)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, **({"backend": backend} if backend else {}))


@torch.inference_mode()
def _hf_embeddings(ref: Reference, images: list[Image.Image], texts: list[str], backend: str | None,
                   siglip_attention_mask: bool = False) -> Embeddings:
    """get_image_features / get_text_features on the folder's own processor output. CLIP pads to the longest text
    (padding=True, truncation at 77); SigLIP pads to max_length 64, as it was trained, and its text tower gets the
    ids only (`siglip_attention_mask=True` passes the tokenizer's mask as well, as `model(**processor(...))` does)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(ref.path).eval()
    processor = _hf_processor(ref.path, backend)
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    if ref.family == "hf_siglip":
        tok = processor.tokenizer(texts, padding="max_length", max_length=64, truncation=True, return_tensors="pt")
        text_in = {"input_ids": tok["input_ids"]}
        if siglip_attention_mask:
            text_in["attention_mask"] = tok["attention_mask"]
    else:
        tok = processor.tokenizer(texts, padding=True, truncation=True, max_length=77, return_tensors="pt")
        text_in = {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}
    image = _features(model.get_image_features(pixel_values=pixels))
    text = _features(model.get_text_features(**text_in))
    return Embeddings(image.numpy(), text.numpy(), pixels.numpy(), tok["input_ids"].numpy(),
                      tok["attention_mask"].numpy() if "attention_mask" in text_in else None,
                      notes={"image_processor": type(processor.image_processor).__name__,
                             "tokenizer": type(processor.tokenizer).__name__})


def _features(out) -> torch.Tensor:
    """transformers 5 returns the projected features directly or as the output's pooler_output, by model."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


# ---------------------------------------------------------------- Hugging Face SigLIP

SIGLIP_SHAPES = {
    "tiny": (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
             dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)),
    "base": ({"vocab_size": 32000}, {}),  # transformers' defaults are google/siglip-base-patch16-224's shapes
}


def build_hf_siglip(dst: Path, size: str = "tiny", seed: int = 0, texts: list[str] | None = None) -> Reference:
    """A Hugging Face SiglipModel folder with random weights, a SentencePiece spiece.model trained here in SigLIP's
    (T5's) special-token layout (<pad>=0, </s>=1, <unk>=2; </s> is also the pad token), and
    preprocessor_config.json with SiglipImageProcessor's settings (squash to 224x224 bicubic, mean = std = 0.5)."""
    from transformers import SiglipConfig, SiglipModel, SiglipTokenizer

    dst.mkdir(parents=True, exist_ok=True)
    spm = reference_text.train_sentencepiece(dst / "spiece.model", reference_text.corpus(extra=texts),
                                             vocab_size=8000, layout="siglip")
    tokenizer = SiglipTokenizer(str(spm), model_max_length=64)
    text_shape, vision_shape = SIGLIP_SHAPES[size]
    text_shape = {"vocab_size": len(tokenizer), **text_shape}
    config = SiglipConfig(
        text_config=dict(max_position_embeddings=64, pad_token_id=1, eos_token_id=1, bos_token_id=None, **text_shape),
        vision_config=dict(image_size=224, patch_size=16, **vision_shape))
    _seeded(seed)
    SiglipModel(config).eval().save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    _write_json(dst / "preprocessor_config.json", {
        "image_processor_type": "SiglipImageProcessor", "processor_class": "SiglipProcessor",
        "do_resize": True, "size": {"height": 224, "width": 224}, "resample": 3, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True})
    _write_json(dst / "processor_config.json", {"processor_class": "SiglipProcessor"})
    return Reference("hf_siglip", size, seed, dst).save()


# ---------------------------------------------------------------- M-CLIP (multilingual)

def build_mclip(dst: Path, size: str = "tiny", seed: int = 0, texts: list[str] | None = None) -> Reference:
    """M-CLIP as Immich exports it (XLM-Roberta-Large-Vit-B-32): text/ is the `multilingual-clip` package's folder
    (config.json of model_type "M-CLIP", model.safetensors with transformer.* and LinearTransformation.*, the XLM-R
    tokenizer: sentencepiece.bpe.model trained here + tokenizer.json), whose `modelBase` names text/xlm-roberta (an
    XLM-R folder, as the hub name "xlm-roberta-large" is in the real one); visual/ is the open_clip image tower it is
    paired with (ViT-B-32; the tiny open_clip for size "tiny"), in open_clip's local folder layout."""
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizer

    visual = build_open_clip(dst / "visual", size=size, seed=seed)
    image_dim = json.loads((dst / "visual" / "open_clip_config.json").read_text())["model_cfg"]["embed_dim"]
    text, base = dst / "text", dst / "text" / "xlm-roberta"
    spm = reference_text.train_sentencepiece(base / "sentencepiece.bpe.model", reference_text.corpus(extra=texts),
                                             vocab_size=8000, layout="xlm_roberta")
    tokenizer = XLMRobertaTokenizer.from_pretrained(spm.parent)
    shape = {"vocab_size": len(tokenizer), **XLMR_SHAPES[size]}
    xlmr = XLMRobertaConfig(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                            bos_token_id=0, eos_token_id=2, **shape)
    _seeded(seed)
    XLMRobertaModel(xlmr, add_pooling_layer=True).eval().save_pretrained(base)
    tokenizer.save_pretrained(base)
    model = _mclip_class()(_mclip_config(base, xlmr.hidden_size, image_dim))
    torch.nn.init.normal_(model.LinearTransformation.weight, std=xlmr.hidden_size ** -0.5)
    model.eval().save_pretrained(text)
    tokenizer.save_pretrained(text)
    shutil.copyfile(spm, text / spm.name)  # the real folder has it beside tokenizer.json (save_pretrained drops it)
    return Reference("mclip", size, seed, dst, visual.arch).save()


def _mclip_class():
    from multilingual_clip.pt_multilingual_clip import MultilingualCLIP

    return MultilingualCLIP


def _mclip_config(base: Path, text_dim: int, image_dim: int):
    from multilingual_clip.Config_MCLIP import MCLIPConfig

    return MCLIPConfig(modelBase=str(base.resolve()), transformerDimSize=text_dim, imageDimSize=image_dim)


def _mclip_text_model(text: Path):
    """M-CLIP's own loading. `MultilingualCLIP.from_pretrained(folder)` (what Immich's exporter calls) fails under
    transformers 5 (its __init__ calls AutoModel.from_pretrained inside transformers' meta-device init), so this does
    what that call amounts to: the package's __init__ (XLM-R from `modelBase`, a fresh linear layer), then the
    folder's state dict loaded strictly (the package's own _load_state_dict_into_model is a plain load_state_dict)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from multilingual_clip.Config_MCLIP import MCLIPConfig

    AutoConfig.register("M-CLIP", MCLIPConfig, exist_ok=True)
    model = _mclip_class()(MCLIPConfig.from_pretrained(text))
    model.load_state_dict(load_file(text / "model.safetensors"), strict=True)
    return model.eval()


@torch.inference_mode()
def _mclip_embeddings(ref: Reference, images: list[Image.Image], texts: list[str]) -> Embeddings:
    """M-CLIP's own forward (its tokenizer with padding=True, masked mean over tokens, linear projection) for texts;
    open_clip's encode_image for images."""
    from transformers import AutoTokenizer

    text_model = _mclip_text_model(ref.path / "text")
    tokenizer = AutoTokenizer.from_pretrained(ref.path / "text")
    text = text_model.forward(texts, tokenizer)
    tok = tokenizer(texts, padding=True, return_tensors="pt")
    model, preprocess, _ = _open_clip_towers(ref.path / "visual")
    pixels = torch.stack([preprocess(im) for im in images])
    return Embeddings(model.encode_image(pixels).numpy(), text.numpy(), pixels.numpy(), tok["input_ids"].numpy(),
                      tok["attention_mask"].numpy(), notes={"preprocess": repr(preprocess),
                                                            "tokenizer": type(tokenizer).__name__})


# ---------------------------------------------------------------- the reference's own embeddings

def open_images(images: list) -> list[Image.Image]:
    """PIL images as the libraries receive them: files opened as they are (no mode conversion: each reference
    converts to RGB itself, at its own point in the pipeline)."""
    out = []
    for im in images:
        if isinstance(im, Image.Image):
            out.append(im)
        else:
            with Image.open(im) as f:
                f.load()
                out.append(f.copy())
    return out


def reference_embeddings(ref: Reference | Path, images: list, texts: list[str], backend: str | None = None,
                         siglip_attention_mask: bool = False) -> Embeddings:
    """The reference implementation's own embeddings of `images` (paths or PIL images) and `texts`, with its own
    preprocessing and tokenizer. `backend` applies to the Hugging Face families' image processors (see
    _hf_processor); `siglip_attention_mask` to SigLIP's text tower (see _hf_embeddings)."""
    ref = ref if isinstance(ref, Reference) else Reference.load(ref)
    pil = open_images(images)
    if ref.family == "open_clip":
        return _open_clip_embeddings(ref, pil, texts)
    if ref.family in ("hf_clip", "hf_siglip"):
        return _hf_embeddings(ref, pil, texts, backend, siglip_attention_mask)
    if ref.family == "mclip":
        return _mclip_embeddings(ref, pil, texts)
    raise ValueError(f"unknown family {ref.family!r}; have {FAMILIES}")


def sample_photos(dst: Path) -> list[Path]:
    """The 16 photographs that ship inside scikit-image's wheel (crossprobe's demo gallery), written as PNG in their
    own modes (grayscale ones stay grayscale, so each reference's RGB conversion is exercised), so that every reader
    decodes the same pixels."""
    import skimage.data

    from crossprobe.models.demo import SAMPLES

    dst.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fn in SAMPLES.items():
        paths.append(dst / f"{name}.png")
        if not paths[-1].exists():
            arr = getattr(skimage.data, fn)()
            Image.fromarray(arr[0] if isinstance(arr, tuple) else arr).save(paths[-1])  # stereo pairs: left view
    return paths


def main(argv: list[str] | None = None) -> None:
    """python -m tests.support.reference_models FAMILY DST [--size base] [--seed N] [--arch ViT-B-16] [--captions TSV]:
    build one reference folder (the parity benchmark's models; under artifacts/, never committed)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("family", choices=FAMILIES)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--size", choices=["tiny", "base"], default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", help="open_clip only: the architecture of a base model (default ViT-B-32)")
    ap.add_argument("--captions", type=Path, help="a TSV with a caption column (Flickr8k's captions.tsv) to add to "
                                                  "the tokenizer training text")
    args = ap.parse_args(argv)
    extra = {"arch": args.arch} if args.arch else {}
    texts = reference_text.caption_file_lines(args.captions) if args.captions else None
    ref = build(args.family, args.dst, size=args.size, seed=args.seed, texts=texts, **extra)
    print(json.dumps({"path": str(ref.path), "family": ref.family, "size": ref.size, "arch": ref.arch}))


if __name__ == "__main__":
    main()
