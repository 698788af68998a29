"""immich:<folder>: a CLIP model in the layout Immich publishes (its machine-learning service's ONNX exports), read
as it is: nothing to export. Two-tower only: Immich's graphs give the pooled embedding and nothing else.

    config.json                   open_clip's model config (embed_dim, vision_cfg, text_cfg: context_length,
                                  tokenizer_kwargs.clean)
    visual/model.onnx             "image" (1, 3, S, S) float32 -> embedding (1, d) at unit norm
    visual/preprocess_cfg.json    size, mean, std, interpolation, resize_mode (shortest | squash)
    textual/model.onnx            "text" (1, T) int32 ids (open_clip models), or "input_ids" + "attention_mask"
                                  (M-CLIP) -> embedding (1, d) at unit norm
    textual/tokenizer.json, textual/tokenizer_config.json (its pad_token)

Inputs are made as Immich's own service makes them (immich_ml/models/clip/{visual,textual}.py and
models/transforms.py): the photo in RGB first, the shorter side resized to S with the long side int(long / short *
S), the centre crop's offset int(W / 2 - S / 2) (floored); the text whitespace-collapsed (and for
tokenizer_kwargs.clean "canonicalize" punctuation-stripped and lower-cased: exported.clean_text), then tokenized,
truncated and padded to the context length with the pad token. Immich exports its graphs with a batch of one:
batches run item by item where the graph's batch axis is fixed.

The fingerprint: SHA-256 over the config files and the graphs' bytes (first 16 hex), cached by their sizes and
mtimes under the graphs folder (a large folder is hashed once).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crossprobe.core.atomic import atomic_path
from crossprobe.core.inference.base import ImageGrid, RuntimeOptions
from crossprobe.core.inference.exported import ExportedBackend, ImagePreprocess
from crossprobe.core.inference.languages import flores

FILES = (
    "config.json",
    "visual/preprocess_cfg.json",
    "visual/model.onnx",
    "textual/model.onnx",
    "textual/tokenizer.json",
    "textual/tokenizer_config.json",
)


@dataclass(frozen=True)
class ImmichPreprocess(ImagePreprocess):
    """ImagePreprocess with Immich's long side: int(long / short * S), which floating point puts one pixel below
    int(S * long / short) for some sizes (a 224 x 230 photo: 229)."""

    def _long_side(self, long: int, short: int) -> int:
        return int((long / short) * self.size)


class ImmichBackend(ExportedBackend):
    """An Immich folder (module docstring) run by ONNX Runtime."""

    def __init__(self, folder: Path, opts: RuntimeOptions, name: str | None = None):
        """name: the model's name as Immich knows it (the repo's or the folder's; a hub snapshot folder is named by
        its commit): NLLB models ("nllb-...") get the query language's code in front of each query."""
        folder = Path(folder)
        meta = describe(folder, opts.graphs)
        if (name or folder.name).startswith("nllb"):
            meta["text"]["prefix"] = flores(opts.query_language)
        super().__init__(folder, opts, meta)
        self._preprocess = ImmichPreprocess.from_json(self.meta["image"])

    def image_grid(self, pixels: np.ndarray) -> ImageGrid:
        session = self._session("image")
        x = np.ascontiguousarray(pixels, np.float32)
        if session.get_inputs()[0].type == "tensor(uint8)":  # newer exports take the RGB photo and normalise inside
            x = self._rgb(x)
        emb = _run(
            session, [{"image": x[i : i + 1]} for i in range(len(x))] if _fixed_batch(session) else [{"image": x}]
        )
        return ImageGrid(emb[:, None, :], emb)  # a one-cell grid: these graphs give the pooled embedding only

    def _rgb(self, pixels: np.ndarray) -> np.ndarray:
        """Normalised (B, 3, S, S) back to the (B, S, S, 3) uint8 photo it was made from (k / 255 steps: exact)."""
        mean, std = (np.asarray(self.meta["image"][k], np.float32)[:, None, None] for k in ("mean", "std"))
        return np.clip(np.rint((pixels * std + mean) * 255), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)

    def text_tokens(self, texts: list[str], own_length: bool = False):
        """-> embedding (B, d) (unit norm, as the graph gives it), tokens None (Immich's graphs give none), mask.
        Immich's graphs run at the full context their config names: whether a tower may be cut short is not known
        from Immich's files, so own_length changes nothing here."""
        ids, mask = self.tokenize(texts)
        session = self._session("text")
        names = [i.name for i in session.get_inputs()]
        dtype = np.int32 if session.get_inputs()[0].type == "tensor(int32)" else np.int64
        feed = {"text": ids, "input_ids": ids, "attention_mask": mask}
        rows = range(len(ids)) if _fixed_batch(session) else [slice(None)]
        emb = _run(session, [{n: np.atleast_2d(feed[n][r]).astype(dtype) for n in names} for r in rows])
        return emb, None, mask


def _fixed_batch(session) -> bool:
    return session.get_inputs()[0].shape[0] == 1


def _run(session, feeds: list[dict]) -> np.ndarray:
    return np.concatenate([session.run(None, f)[0] for f in feeds]).astype(np.float32)


def describe(folder: Path, cache_root: Path | None) -> dict:
    """An Immich folder as model.json would say it (exported.py's fields), from its own files."""
    missing = [f for f in FILES if not (folder / f).exists()]
    if missing:
        raise FileNotFoundError(f"immich:{folder}: not a folder in Immich's layout (missing {', '.join(missing)})")
    cfg = _json(folder / "config.json")
    pre = _json(folder / "visual" / "preprocess_cfg.json")
    text_cfg = cfg.get("text_cfg", {})
    pad = _json(folder / "textual" / "tokenizer_config.json")["pad_token"]
    pad = pad["content"] if isinstance(pad, dict) else pad
    from tokenizers import Tokenizer

    pad_id = Tokenizer.from_file(str(folder / "textual" / "tokenizer.json")).token_to_id(pad)
    size = pre["size"][0] if isinstance(pre["size"], list) else pre["size"]
    resize = pre.get("resize_mode", "shortest")  # open_clip's default for older configs, as Immich reads them
    canonical = (text_cfg.get("tokenizer_kwargs") or {}).get("clean") == "canonicalize"
    return {
        "family": "immich",
        "spec": f"immich:{folder}",
        "fingerprint": fingerprint(folder, cache_root),
        "dims": {"d": int(cfg["embed_dim"]), "grid": [1, int(cfg["embed_dim"])]},
        "image": {
            "size": int(size),
            "resize": resize,
            "crop": resize == "shortest",
            "interpolation": pre.get("interpolation", "bicubic"),
            "mean": pre["mean"],
            "std": pre["std"],
            "crop_rounding": "floor",
        },
        "text": {
            "context_length": int(text_cfg.get("context_length", 77)),
            "pad_id": pad_id,
            "pad_token": pad,
            "pad_to_context": True,
            "clean": "canonicalize" if canonical else "whitespace",
            "lowercase": False,
        },
        "graphs": {"image": "visual/model.onnx", "text": "textual/model.onnx"},
        "tokenizer": "textual/tokenizer.json",
    }


def fingerprint(folder: Path, cache_root: Path | None) -> str:
    stamp = {f: [(folder / f).stat().st_size, (folder / f).stat().st_mtime_ns] for f in FILES}
    cache = (
        Path(cache_root) / "immich" / (hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16] + ".json")
        if cache_root
        else None
    )
    try:
        if cache and (hit := json.loads(cache.read_text()))["files"] == stamp:
            return hit["fingerprint"]
    except (OSError, ValueError, KeyError):
        pass
    h = hashlib.sha256(b"immich")
    for f in FILES:
        h.update(f.encode())
        with open(folder / f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    fp = h.hexdigest()[:16]
    if cache:
        _write_cache(cache, {"folder": str(folder.resolve()), "files": stamp, "fingerprint": fp})
    return fp


def _write_cache(path: Path, obj: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, unique=True) as tmp:  # unique: two processes may hash one folder at once
            tmp.write_text(json.dumps(obj))
    except OSError:
        pass  # a read-only graphs folder: hashed again next time


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))
