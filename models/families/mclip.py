"""M-CLIP (multilingual-clip): a multilingual XLM-RoBERTa text tower with a linear projection, trained to land on an
open_clip image tower's embeddings; the multilingual model Immich serves (XLM-Roberta-Large-Vit-B-32...).

    hf:<folder>     with text/ (M-CLIP's own folder: config.json of model_type "M-CLIP", its weights and XLM-R
                    tokenizer) and visual/ (the open_clip image tower, in open_clip's local layout)
    hf:<M-CLIP folder or repo id>   the text tower alone; its image tower is the one M-CLIP's model card pairs it
                    with (PAIRED: an open_clip pretrained tag, from open_clip's cache)

Both towers need open_clip for the image side: export M-CLIP in the venv scripts/openclip-env.sh makes.

How the reference reads inputs: texts through the folder's own XLM-R tokenizer (a `tokenizers` file: SentencePiece
with NFKC-style normalisation, <s> ... </s>, no lower-casing, padding to the longest text with <pad>, the mask read
by the tower), M-CLIP's forward: the mean of XLM-R's last hidden states over the mask, then the linear layer. Images
as open_clip preprocesses them (open_clip.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch

from crossprobe.core.inference.spec import BadSpec, ModelSpec, parse
from crossprobe.models.families.base import FamilyModel, versions
from crossprobe.models.families.text import fast_tokenizer_settings

# M-CLIP's image towers, as its model cards (and Immich's exporter) pair them
PAIRED = {
    "M-CLIP/XLM-Roberta-Large-Vit-B-32": "open_clip:ViT-B-32/openai",
    "M-CLIP/XLM-Roberta-Large-Vit-B-16Plus": "open_clip:ViT-B-16-plus-240/laion400m_e32",
    "M-CLIP/XLM-Roberta-Large-Vit-L-14": "open_clip:ViT-L-14/openai",
    "M-CLIP/LABSE-Vit-L-14": "open_clip:ViT-L-14/openai",
}


def load(spec: ModelSpec, folder: Path, source: dict) -> FamilyModel:
    import transformers

    from crossprobe.models.families import hf, open_clip

    text_dir = folder / "text" if (folder / "text" / "config.json").exists() else folder
    towers = open_clip.load_towers(_image_spec(spec, folder))
    cfg = json.loads((text_dir / "config.json").read_text(encoding="utf-8"))
    text, base = _text_tower(text_dir, cfg)
    tok = transformers.AutoTokenizer.from_pretrained(text_dir)
    text_cfg, tokenizer_json, reference_ids = _text_settings(tok, base)
    state = {
        **{f"text.{k}": v for k, v in text.state_dict().items()},
        **{f"image.{k}": v for k, v in cast(torch.nn.Module, towers.model.visual).state_dict().items()},
    }
    identity = {
        "text": {k: v for k, v in cfg.items() if k not in ("modelBase", "transformers_version", "dtype")},
        "base": hf.config_identity(base),
        "image": towers.config.get("vision_cfg", towers.config),
    }
    return FamilyModel(
        family="mclip",
        spec=str(spec),
        name=spec.ref if spec.path is None else folder.name,
        source={**(hf.file_source(text_dir) if spec.path is not None else source), "image": towers.source},
        identity=identity,
        state=state,
        image=open_clip.Image(towers.model),
        text=text,
        image_cfg=towers.image_cfg,
        text_cfg=text_cfg,
        tokenizer_json=tokenizer_json,
        reference_ids=reference_ids,
        versions=versions(transformers, __import__("open_clip")),
    )


def _image_spec(spec: ModelSpec, folder: Path) -> ModelSpec:
    if (folder / "visual").is_dir():
        return parse(f"open_clip:visual/{(folder / 'visual').resolve()}")
    if spec.path is None and spec.ref in PAIRED:
        return parse(PAIRED[spec.ref])
    raise BadSpec(
        f"model {spec}: an M-CLIP text tower needs its image tower: put the open_clip folder it was trained "
        f"against beside it as visual/ (M-CLIP's hub repos pair them: {', '.join(PAIRED)})"
    )


class MClipText(torch.nn.Module):
    """M-CLIP's text tower (multilingual_clip.pt_multilingual_clip.MultilingualCLIP, the same parameter names):
    input_ids, attention_mask -> the masked mean of XLM-R's last hidden states, projected; and those states."""

    def __init__(self, transformer, dim_in: int, dim_out: int):
        super().__init__()
        self.transformer = transformer
        self.LinearTransformation = torch.nn.Linear(dim_in, dim_out)

    def forward(self, input_ids, attention_mask):
        states = self.transformer(input_ids=input_ids, attention_mask=attention_mask)[0]
        m = attention_mask.unsqueeze(2).to(states.dtype)
        return self.LinearTransformation((states * m).sum(dim=1) / m.sum(dim=1)), states


def _text_tower(text_dir: Path, cfg: dict):
    """MClipText with the folder's weights: XLM-R built from `modelBase`'s configuration (its weights are the
    folder's own, as MultilingualCLIP.from_pretrained ends up loading them)."""
    from transformers import AutoConfig, AutoModel

    base = AutoConfig.from_pretrained(cfg["modelBase"])
    text = MClipText(
        AutoModel.from_config(base, attn_implementation="eager"), int(cfg["transformerDimensions"]), int(cfg["numDims"])
    )
    missing, unexpected = text.load_state_dict(_weights(text_dir), strict=False)
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]  # a buffer older checkpoints saved
    if missing or unexpected:
        raise ValueError(
            f"{text_dir}: M-CLIP weights do not fit its configuration (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    return text.float().eval(), base


def _weights(folder: Path) -> dict:
    if (folder / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").exists():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin")


def _text_settings(tok, base):
    T = min(int(tok.model_max_length), int(base.max_position_embeddings) - 2)  # XLM-R: 514 positions, 2 offset
    return fast_tokenizer_settings(tok, T)
