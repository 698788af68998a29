"""Writes a model into the folder layout Immich publishes (what its exporter, immich_model_exporter, writes for open_clip
and M-CLIP models), for tests of core/inference/immich.py: graphs with a batch of one, int32 token inputs, unit-norm
embeddings out.

    config.json                 open_clip-style: embed_dim, vision_cfg.image_size, text_cfg.context_length
                                (+ tokenizer_kwargs)
    visual/model.onnx           "image" (1, 3, S, S) float32 -> "embedding" (1, d), normalised
    visual/preprocess_cfg.json  open_clip.get_model_preprocess_cfg's fields
    textual/model.onnx          "text" (1, T) int32, or "input_ids" + "attention_mask" (1, T) int32 -> "embedding"
    textual/tokenizer.json, textual/tokenizer_config.json   a transformers tokenizer's save_pretrained
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F


class _Normalised(torch.nn.Module):
    """A crossprobe family tower (families.base.FamilyModel: -> embedding, tokens) as Immich's graph: int32 ids in,
    the unit-norm embedding out."""

    def __init__(self, tower):
        super().__init__()
        self.tower = tower

    def forward(self, *inputs):
        inputs = [x.long() if not x.is_floating_point() else x for x in inputs]
        return F.normalize(self.tower(*inputs)[0], dim=-1)


def write(dst: Path, family_model, tokenizer, context_length: int, mclip: bool = False,
          tokenizer_kwargs: dict | None = None) -> Path:
    """`family_model`: crossprobe's families.load(spec) of the model (its towers and image settings);
    `tokenizer`: the transformers tokenizer whose files Immich ships."""
    m, img = family_model, family_model.image_cfg
    S, T = int(img["size"]), int(context_length)
    (dst / "visual").mkdir(parents=True, exist_ok=True)
    (dst / "textual").mkdir(parents=True, exist_ok=True)
    ids = torch.ones(1, T, dtype=torch.int32)
    text_args, text_names = ((ids, torch.ones(1, T, dtype=torch.int32)), ["input_ids", "attention_mask"]) if mclip \
        else ((ids,), ["text"])
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # open_clip's attention: a fused op ONNX cannot export
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            torch.onnx.export(_Normalised(m.image).eval(), (torch.randn(1, 3, S, S),),
                              str(dst / "visual" / "model.onnx"), input_names=["image"], output_names=["embedding"],
                              opset_version=17, dynamo=False)
            torch.onnx.export(_Normalised(m.text).eval(), text_args, str(dst / "textual" / "model.onnx"),
                              input_names=text_names, output_names=["embedding"], opset_version=17, dynamo=False)
            d = int(m.image(torch.zeros(1, 3, S, S))[0].shape[-1])
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    text_cfg = {"context_length": T, **({"tokenizer_kwargs": tokenizer_kwargs} if tokenizer_kwargs else {})}
    _json(dst / "config.json", {"embed_dim": d, "vision_cfg": {"image_size": S}, "text_cfg": text_cfg})
    _json(dst / "visual" / "preprocess_cfg.json", {
        "size": [S, S], "mode": "RGB", "mean": img["mean"], "std": img["std"], "interpolation": img["interpolation"],
        "resize_mode": img["resize"], "fill_color": 0})
    tokenizer.save_pretrained(dst / "textual")
    return dst


def _json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2), encoding="utf-8")


class ExportedTokenizer:
    """What write() needs of a tokenizer (save_pretrained) from a family model's own tokenizer.json (crossprobe's
    export of a SentencePiece tokenizer, as Immich's SigLIP folders ship one): for families whose transformers
    tokenizer has no fast form to save."""

    def __init__(self, tokenizer_json: str, pad_token: str):
        self.tokenizer_json, self.pad_token = tokenizer_json, pad_token

    def save_pretrained(self, dst: Path) -> None:
        dst.mkdir(parents=True, exist_ok=True)
        (dst / "tokenizer.json").write_text(self.tokenizer_json, encoding="utf-8")
        _json(dst / "tokenizer_config.json", {"pad_token": self.pad_token})
