"""A model family's exported graphs behind the inference seam (open_clip, Hugging Face CLIP / SigLIP), torch-free.

`crossprobe models export SPEC` (models/families/) writes a folder <root>/<fingerprint>/ once, where torch and the
family's library are installed; serving it needs ONNX Runtime, Pillow and `tokenizers` only:

    model.json       what the model is and how it reads its inputs (family, spec, dims, "image", "text" below)
    image.onnx       pixels (B, 3, S, S) -> embedding (B, d), tokens (B, P, W)    the library's own image embedding
                                                                                  and the trunk's final token states
    text.onnx        input_ids, attention_mask (B, T) -> embedding (B, d), tokens (B, T, W_t)
    tokenizer.json   a `tokenizers` file giving the family tokenizer's own ids (checked id for id at export)

image_grid gives ImageGrid(cells = the patch tokens, pooled = the embedding); g is the embedding at unit norm. Such
a model is two-tower only: rerankers are trained for it separately (heads.py), so dims.item is all zeros here.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from crossprobe.core import int8, runtime
from crossprobe.core.inference.base import Backend, ImageFeatures, ImageGrid, QueryVectors, RuntimeOptions
from crossprobe.core.inference.layout import FeatureDims, ItemDims

MODEL_JSON = "model.json"
FORMAT = 1
_FILTERS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
}


@dataclass(frozen=True)
class ImagePreprocess:
    """A PIL image -> (3, size, size) float32, as the family's own preprocessing makes it. Picklable (Ray's decode
    tasks get it). The two resize modes are torchvision's / HF's: "shortest" scales the shorter side to `size`
    (the longer to int(size * long / short)) and crops the centre; "squash" resizes to size x size."""

    size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize: str = "shortest"  # shortest | squash
    interpolation: str = "bicubic"
    crop: bool = True
    crop_rounding: str = "round"  # torchvision: round((H - S) / 2); Hugging Face: (H - S) // 2
    # torchvision's transforms (open_clip) convert to RGB after resize and crop, Hugging Face and Immich before: the
    # same pixels for RGB and L photos, not for palette and 1-bit ones (PIL resizes those nearest-neighbour)
    rgb_last: bool = False
    # transparency: "drop" (PIL's convert("RGB"): open_clip, Immich) or "white" (composited onto white: Hugging Face's
    # convert_to_rgb)
    alpha: str = "drop"

    def __post_init__(self):
        if (
            self.resize not in ("shortest", "squash")
            or self.interpolation not in _FILTERS
            or self.crop_rounding not in ("round", "floor")
            or self.alpha not in ("drop", "white")
        ):
            raise ValueError(f"unsupported image preprocessing {self}")

    def __call__(self, img: Image.Image) -> np.ndarray:
        img = ImageOps.exif_transpose(img)
        img = img if self.rgb_last else self._rgb(img)
        s, flt = self.size, _FILTERS[self.interpolation]
        if self.resize == "squash":
            img = img.resize((s, s), flt)
        else:
            w, h = img.size
            short, long = (w, h) if w <= h else (h, w)
            new_long = self._long_side(long, short)
            img = img.resize((s, new_long) if w <= h else (new_long, s), flt)
            if self.crop:
                img = img.crop(self._box(*img.size))
        x = np.asarray(self._rgb(img), np.float32) / 255.0
        return ((x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)).transpose(2, 0, 1)

    def _rgb(self, img: Image.Image) -> Image.Image:
        if self.alpha == "white" and ("A" in img.getbands() or img.info.get("transparency") is not None):
            img = img.convert("RGBA")
            return Image.alpha_composite(Image.new("RGBA", img.size, (255, 255, 255, 255)), img).convert("RGB")
        return img if img.mode == "RGB" else img.convert("RGB")

    def _long_side(self, long: int, short: int) -> int:
        return int(self.size * long / short)

    def _box(self, w: int, h: int) -> tuple[int, int, int, int]:
        s = self.size
        off = (lambda d: int(round(d / 2.0))) if self.crop_rounding == "round" else (lambda d: d // 2)
        left, top = off(w - s), off(h - s)
        return left, top, left + s, top + s

    @classmethod
    def from_json(cls, d: dict) -> "ImagePreprocess":
        return cls(
            int(d["size"]),
            tuple(d["mean"]),
            tuple(d["std"]),
            d.get("resize", "shortest"),
            d.get("interpolation", "bicubic"),
            bool(d.get("crop", True)),
            d.get("crop_rounding", "round"),
            bool(d.get("rgb_last", False)),
            d.get("alpha", "drop"),
        )


_WHITESPACE = re.compile(r"\s+")
_PUNCTUATION = str.maketrans("", "", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def clean_text(text: str, how: str) -> str:
    """The family tokenizer's own text cleaning, before `tokenizers` sees the text:
    none; whitespace (runs of whitespace -> one space, stripped); open_clip (its basic_clean's HTML unescaping, then
    whitespace); canonicalize (whitespace, then punctuation removed and lower case: open_clip's SigLIP)."""
    if how == "none":
        return text
    if how == "open_clip":
        text = html.unescape(html.unescape(text))
    text = _WHITESPACE.sub(" ", text).strip()
    if how == "canonicalize":
        text = text.translate(_PUNCTUATION).lower()
    return text


class ExportedBackend(Backend):
    """An exported folder (module docstring) run by ONNX Runtime."""

    def __init__(self, folder: Path, opts: RuntimeOptions, meta: dict | None = None):
        super().__init__()
        self.folder, self.opts = Path(folder), opts
        self.meta = meta or read_model_json(self.folder)  # meta: a folder described otherwise (immich.py)
        self.family, self.fingerprint = self.meta["family"], self.meta["fingerprint"]
        self.spec = self.meta.get("spec")
        self._preprocess = ImagePreprocess.from_json(self.meta["image"])
        self.image_size = self._preprocess.size
        self.dims = FeatureDims(int(self.meta["dims"]["d"]), ItemDims(0, 0, 0, 0))
        self.rerankers = ()
        self.calibration = None  # relevance curves are fitted per model: none for a family model yet
        self.query_precision = opts.query_precision

    def _session(self, name: str):
        def make():
            path = self.folder / self.meta["graphs"][name]
            if name == "text" and self.query_precision == "int8":
                return self._int8_text(path)
            return runtime.session(path, self.opts.threads, self.opts.spinning, self.opts.device)

        return self._part(name, make)

    def _int8_text(self, fp32: Path):
        """The int8 text session, checked against the fp32 graph on the probe queries first (int8.check)."""
        weights = int8.weight_format()
        q8 = runtime.session(int8_graph(fp32, weights), self.opts.threads, self.opts.spinning, self.opts.device)
        ref = runtime.session(fp32, self.opts.threads, self.opts.spinning, self.opts.device)
        self.int8_check = int8.check(
            lambda ts: self._run_text(ref, ts, True)[0],  # as encode_texts runs them
            lambda t: self._run_text(q8, [t], True)[0],
            self.opts.int8_min_cosine,
            weights,
            f"model {self.spec or self.fingerprint}",
        )
        return q8

    def warm(self, *parts: str) -> None:
        for p in parts:
            if p in ("search", "text"):
                self._session("text"), self._tokenizer()
            elif p == "image":
                self._session("image")
            elif p != "explain":  # no explain maps for a family model
                raise ValueError(f"unknown part {p!r} (search, image)")

    def sessions(self) -> dict[str, Any]:
        return {k: v for k, v in self._parts.items() if hasattr(v, "get_providers")}

    @property
    def providers(self) -> list[str]:
        s = next(iter(self.sessions().values()), None)
        return s.get_providers() if s is not None else []

    # ---- images ----------------------------------------------------------------------------------------
    def preprocessor(self) -> ImagePreprocess:
        return self._preprocess

    def image_grid(self, pixels: np.ndarray) -> ImageGrid:
        emb, tokens = self._session("image").run(
            ["embedding", "tokens"], {"pixels": np.ascontiguousarray(pixels, np.float32)}
        )
        return ImageGrid(tokens, emb)

    def image_features(self, grid: ImageGrid) -> ImageFeatures:
        assert grid.pooled is not None, "a family model's image graph gives its pooled embedding"
        g = unit(grid.pooled)
        B = len(g)
        return ImageFeatures(
            g, np.zeros((B, 0, 0), np.float32), np.zeros((B, 0), np.float32), np.zeros((B, 0), np.float32), None
        )

    # ---- texts -----------------------------------------------------------------------------------------
    def _tokenizer(self):
        file = self.folder / self.meta.get("tokenizer", "tokenizer.json")
        return self._part("tokenizer", lambda: text_tokenizer(file, self.meta["text"]))

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """-> input_ids, attention_mask (B, T) int64, as the family's tokenizer gives them."""
        return tokenize(self._tokenizer(), self.meta["text"], texts)

    def text_tokens(self, texts: list[str], own_length: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """-> embedding (B, d) (not unit norm), tokens (B, T, W_t), attention_mask (B, T): what heads read (at the
        tokenizer's length; own_length: cut to the longest text where the tower allows it, for the embedding)."""
        emb, tokens, mask = self._run_text(self._session("text"), texts, own_length)
        return emb, tokens, mask

    def _run_text(
        self, session, texts: list[str], own_length: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, mask = self.tokenize(texts)
        if own_length and self._trims(session):  # the padding past the longest text changes no embedding: cut it
            T = int(mask.sum(1).max())
            ids, mask = ids[:, :T], mask[:, :T]
        feed = {"input_ids": ids, "attention_mask": mask}
        emb, tokens = session.run(["embedding", "tokens"], {i.name: feed[i.name] for i in session.get_inputs()})
        return emb, tokens, mask

    def _trims(self, session) -> bool:
        """Whether queries run at their own length: the export says the tower allows it (model.json
        "trims_padding": a causal tower pooling at its end token) and its text graph has a free token axis (a folder
        exported before that keeps its fixed one, and its padding)."""
        return bool(self.meta.get("trims_padding")) and not isinstance(session.get_inputs()[0].shape[1], int)

    def encode_texts(self, texts: list[str]) -> list[QueryVectors]:
        """fp32: one run for the batch. int8: one run per text, because dynamic quantization scales activations by
        the whole input tensor's range, so batch-mates and padding would change a query's vector. Each run cut to
        its longest text where the tower allows it (_trims)."""
        groups = [texts] if self.query_precision != "int8" else [[t] for t in texts]
        return [
            QueryVectors(g, None, None, None)
            for group in groups
            for g in unit(self.text_tokens(group, own_length=True)[0])
        ]

    # ---- scoring ---------------------------------------------------------------------------------------
    def rerank(self, kind: str, q: QueryVectors, feats: dict[str, np.ndarray], s_tt: np.ndarray) -> np.ndarray:
        self.require_reranker(kind)  # raises: a family model has no trained reranker
        raise AssertionError("unreachable")


def text_tokenizer(file: Path | str, text: dict):
    """tokenizer.json (a path, or its JSON text) set up as model.json's "text" says: truncated to the context length,
    padded with pad_id (to the context length, or to the batch's longest text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(file)) if isinstance(file, Path) else Tokenizer.from_str(file)
    tok.enable_truncation(max_length=int(text["context_length"]))
    tok.enable_padding(
        pad_id=int(text["pad_id"]),
        pad_token=text.get("pad_token", "<pad>"),
        length=int(text["context_length"]) if text.get("pad_to_context") else None,
    )
    return tok


def tokenize(tok, text: dict, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """texts -> input_ids, attention_mask (B, T) int64 through `text_tokenizer`'s tokenizer, cleaned first and
    lower-cased where "lowercase" says so (Python's str.lower, as open_clip does: Greek's final sigma is a rule of
    it that a tokenizer's own Lowercase step lacks)."""
    how, lower, prefix = text.get("clean", "none"), bool(text.get("lowercase")), text.get("prefix", "")
    # "prefix": written before each cleaned text (a language code: core/inference/languages.py)
    enc = tok.encode_batch([prefix + (clean_text(t, how).lower() if lower else clean_text(t, how)) for t in texts])
    return np.asarray([e.ids for e in enc], np.int64), np.asarray([e.attention_mask for e in enc], np.int64)


def int8_graph(src: Path, weights: str) -> Path:
    """<stem>.int8/<graph> (int8 weights) or <stem>.int8-u8/<graph> (uint8 weights) beside an exported graph: its
    MatMul weights quantized once (int8.quantize), written whole under a temp name and renamed. Measured per family
    (query encode time and the int8 vector's cosine to fp32): docs/models.md, "Choose a model"."""
    from crossprobe.core.atomic import atomic_dir

    dst = int8.graph_name(src, weights).with_suffix("")  # a folder: the graph and, over 2 GiB, its external weights
    graph = dst / src.name
    if not graph.exists():
        with atomic_dir(dst, mode=0o755, unique=True) as tmp:  # two processes at once: each its own temp
            int8.quantize(src, Path(tmp) / src.name, weights, external_data=True)
    return graph


def unit(x: np.ndarray) -> np.ndarray:
    """Rows at unit norm, float32 (an all-zero row stays zero)."""
    x = np.asarray(x, np.float32)
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def read_model_json(folder: Path) -> dict:
    meta = json.loads((Path(folder) / MODEL_JSON).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder / MODEL_JSON}: format {meta.get('format')} (this crossprobe reads {FORMAT})")
    return meta


def find_exported(root: Path, spec: str) -> Path | None:
    """The folder under `root` exported from `spec` (model.json's "spec"), newest first; None: not exported."""
    root = Path(root)
    found = []
    for mj in root.glob(f"*/{MODEL_JSON}") if root.is_dir() else []:
        try:
            meta = json.loads(mj.read_text())
        except (OSError, ValueError):
            continue  # a folder being written (its model.json appears last) or a foreign one
        if meta.get("format") != FORMAT:
            continue
        # "aliases": other specs that named the same weights (the same fingerprint) when they were exported
        sources = {meta.get("spec"): meta.get("source"), **(meta.get("aliases") or {})}
        if spec in sources and _source_unchanged(sources[spec] or {}):
            found.append((mj.stat().st_mtime_ns, mj.parent))
    return max(found)[1] if found else None


def _source_unchanged(source: dict) -> bool:
    """A spec naming a weights file still names the bytes that were exported (same size and mtime)."""
    path = source.get("path")
    if not path:
        return True
    try:
        st = Path(path).stat()
    except OSError:
        return True  # the weights moved away after export: the exported graphs still serve what they were made of
    return st.st_size == source.get("size") and st.st_mtime_ns == source.get("mtime_ns")
