"""open_clip:<architecture>/<pretrained tag or weights file>: an open_clip model, loaded by open_clip itself.

Runs only where open_clip imports: it needs torchvision, and no CPU torchvision exists for the main .venv's torch
2.13 CPU wheel (issue 47), so open_clip models are exported in the venv scripts/openclip-env.sh makes and served
torch-free from the folder. The weights:
  - a pretrained tag (laion2b_s34b_b79k): open_clip's own cache, filled by `crossprobe models pull` (an export
    never downloads);
  - a weights file (.pt / .bin / .safetensors) of a registered architecture;
  - a folder in open_clip's local layout (open_clip_config.json + open_clip_model.safetensors, what open_clip saves
    and what its hub repos hold), or a weights file inside one: loaded as `local-dir:` (the architecture name in the
    spec is then only a label).

How the reference reads inputs, reproduced in model.json (taken from the transforms open_clip builds):
  torchvision Resize(S) on the PIL image (shortest side to S, long side int(S * long / short)), CenterCrop(S)
  (margin rounded: round((H - S) / 2)), then RGB (after the resize: palette and 1-bit photos resize nearest), /255,
  Normalize; `resize_mode` squash: Resize((S, S)).
  SimpleTokenizer: ftfy.fix_text, HTML unescaped twice, whitespace collapsed, lower case; CLIP's byte-level BPE;
  <start_of_text> ... <end_of_text>, cut to 77 with <end_of_text> last, padded with 0 to 77 (the text tower pools at
  argmax(ids), the end token, behind a causal mask: the padding never reaches it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # pretrained tags come from the cache: `crossprobe models pull` fetches

import torch  # noqa: E402

from crossprobe.core.inference.spec import BadSpec, ModelSpec  # noqa: E402
from crossprobe.models.families.base import FamilyModel, captured, versions  # noqa: E402
from crossprobe.models.families.text import clip_bpe_tokenizer  # noqa: E402

LOCAL_CONFIG = "open_clip_config.json"


def load(spec: ModelSpec) -> FamilyModel:
    import open_clip

    t = load_towers(spec)
    text_cfg, tokenizer_json, reference_ids = simple_tokenizer_text(open_clip.get_tokenizer(t.name), spec)
    text = Text(t.model)
    return FamilyModel(
        family="open_clip",
        spec=str(spec),
        name=f"{spec.architecture}/{Path(spec.weights).name}",
        source=t.source,
        identity={"architecture": t.config},
        state=dict(t.model.state_dict()),
        image=Image(t.model),
        text=text,
        image_cfg=t.image_cfg,
        text_cfg=text_cfg,
        tokenizer_json=tokenizer_json,
        reference_ids=reference_ids,
        versions=versions(open_clip),
        trims_padding=text.at_own_length,
    )


@dataclass
class Towers:
    """An open_clip model as open_clip loads it (M-CLIP takes its image tower from here: mclip.py)."""

    name: str  # what open_clip was given: an architecture, or local-dir:<folder>
    model: torch.nn.Module
    config: dict  # the architecture's model config
    image_cfg: dict  # model.json's "image"
    source: dict


def load_towers(spec: ModelSpec) -> Towers:
    import open_clip

    name, pretrained, source = _locate(spec)
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained)
    config = open_clip.get_model_config(name) if not name.startswith("local-dir:") else _local_config(name)
    return Towers(name, model.float().eval(), config, image_settings(preprocess, spec), source)


def _locate(spec: ModelSpec) -> tuple[str, str | None, dict]:
    """-> (the model name open_clip takes, its `pretrained` argument, the source record)."""
    import open_clip

    from crossprobe.models.families.hf import file_source

    path = spec.path
    if path is None:  # a pretrained tag
        if spec.weights not in open_clip.list_pretrained_tags_by_model(spec.architecture):
            raise BadSpec(
                f"model {spec}: open_clip has no pretrained tag {spec.weights!r} for {spec.architecture!r} "
                f"(its tags: {', '.join(open_clip.list_pretrained_tags_by_model(spec.architecture)) or 'none'})"
            )
        return spec.architecture, spec.weights, {"architecture": spec.architecture, "tag": spec.weights}
    if not path.exists():
        raise FileNotFoundError(f"model {spec}: no weights at {path}")
    folder = path if path.is_dir() else path.parent
    if spec.architecture not in open_clip.list_models() and (folder / LOCAL_CONFIG).exists():
        return f"local-dir:{folder}", None, file_source(folder)
    if path.is_dir():
        raise FileNotFoundError(f"model {spec}: {path} is a folder without {LOCAL_CONFIG}; name the weights file")
    if spec.architecture not in open_clip.list_models():
        raise BadSpec(f"model {spec}: open_clip has no architecture {spec.architecture!r}")
    st = path.stat()
    return spec.architecture, str(path), {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _local_config(name: str) -> dict:
    import json

    return json.loads((Path(name.split(":", 1)[1]) / LOCAL_CONFIG).read_text(encoding="utf-8"))["model_cfg"]


def image_settings(preprocess, spec) -> dict:
    """model.json's "image" read off the transforms open_clip built (refused where they hold anything else)."""
    from torchvision import transforms as T

    steps = {type(t).__name__: t for t in preprocess.transforms}
    resize, norm = steps.get("Resize"), steps.get("Normalize")
    known = {"Resize", "CenterCrop", "MaybeConvertMode", "MaybeToTensor", "ToTensor", "Normalize", "function"}
    if resize is None or norm is None or set(steps) - known or resize.max_size is not None:
        raise BadSpec(f"model {spec}: open_clip preprocessing crossprobe does not reproduce: {preprocess}")
    squash = not isinstance(resize.size, int) and len(resize.size) == 2
    size = resize.size[0] if squash else (resize.size if isinstance(resize.size, int) else resize.size[0])
    crop = steps.get("CenterCrop")
    if crop is not None and tuple(crop.size) != (size, size):
        raise BadSpec(f"model {spec}: resize to {size} then crop {crop.size}: not reproduced")
    interp = {
        T.InterpolationMode.BICUBIC: "bicubic",
        T.InterpolationMode.BILINEAR: "bilinear",
        T.InterpolationMode.NEAREST: "nearest",
        T.InterpolationMode.LANCZOS: "lanczos",
    }[resize.interpolation]
    return {
        "size": int(size),
        "resize": "squash" if squash else "shortest",
        "crop": crop is not None,
        "interpolation": interp,
        "mean": [float(x) for x in norm.mean],
        "std": [float(x) for x in norm.std],
        "crop_rounding": "round",
        "rgb_last": True,
    }


def simple_tokenizer_text(tok, spec):
    """open_clip's SimpleTokenizer as tokenizer.json (text.clip_bpe_tokenizer) and model.json's "text"."""
    import ftfy.chardata as chardata

    if (
        type(tok).__name__ != "SimpleTokenizer"
        or tok.reduction_fn is not None
        or tok.clean_fn.__name__ != "_clean_lower"
    ):
        raise BadSpec(
            f"model {spec}: its tokenizer ({type(tok).__name__}) is not the CLIP BPE crossprobe converts; "
            f"export the model through hf: or serve Immich's export of it (immich:)"
        )
    merges = sorted(tok.bpe_ranks, key=tok.bpe_ranks.get)
    bos, eos = tok.decoder[tok.sot_token_id], tok.decoder[tok.eot_token_id]
    built = clip_bpe_tokenizer(tok.encoder, merges, ftfy_replacements(chardata), special=(bos, eos))
    T = int(tok.context_length)
    cfg = {
        "context_length": T,
        "pad_id": 0,
        "pad_token": tok.decoder[0],
        "pad_to_context": True,
        "clean": "open_clip",
        "lowercase": True,
        "inputs": ["input_ids"],
    }
    return cfg, built.to_str(), lambda t: tok([t])[0].tolist()


def ftfy_replacements(chardata) -> dict[str, str]:
    """The single characters ftfy.fix_text replaces before open_clip tokenizes: full- and half-width forms, Latin
    ligatures, curly quotes, and the control characters it removes (its own tables)."""
    out = {chr(k): v for k, v in chardata.WIDTH_MAP.items()}
    out.update({chr(k): v for k, v in chardata.LIGATURES.items()})
    out.update({c: "'" for c in "\u02bc\u2018\u2019\u201a\u201b"})
    out.update({c: '"' for c in "\u201c\u201d\u201e\u201f"})
    out.update({chr(k): "" for k, v in chardata.CONTROL_CHARS.items() if v is None})
    return out


class Image(torch.nn.Module):
    """pixels -> encode_image (the visual tower's own output), and its patch tokens (the tower's output_tokens:
    after its final layer norm, class token dropped)."""

    def __init__(self, model):
        super().__init__()
        if not hasattr(model.visual, "output_tokens"):
            raise BadSpec(f"open_clip's {type(model.visual).__name__} image tower gives no token states")
        self.model = model

    def forward(self, pixels):
        self.model.visual.output_tokens = True
        try:
            return self.model.visual(pixels)  # what encode_image returns, with the tokens beside it
        finally:
            self.model.visual.output_tokens = False


class _FreeLengthAttention(torch.nn.Module):
    """nn.MultiheadAttention's self-attention from its own weights, with reshapes that keep the token axis free:
    torch's own bakes the traced length into its reshapes, so its graph would take 77 tokens only."""

    def __init__(self, mha: torch.nn.MultiheadAttention):
        super().__init__()
        self.mha = mha

    def forward(self, q, k=None, v=None, need_weights=False, attn_mask=None):
        import torch.nn.functional as F

        m = self.mha
        x = q if m.batch_first else q.transpose(0, 1)  # (B, T, D)
        qkv = F.linear(x, m.in_proj_weight, m.in_proj_bias).unflatten(-1, (3, m.num_heads, m.head_dim))
        q_, k_, v_ = qkv.permute(2, 0, 3, 1, 4)  # each (B, h, T, hd)
        out = m.out_proj(F.scaled_dot_product_attention(q_, k_, v_, attn_mask=attn_mask).transpose(1, 2).flatten(2))
        return (out if m.batch_first else out.transpose(0, 1)), None


class Text(torch.nn.Module):
    """input_ids -> encode_text, and the final token states (ln_final's output, read while encode_text runs).

    encode_text adds all 77 positions and the 77 x 77 causal mask, so it takes only full-context inputs. Where the
    tower is causal and pools at the end token (CLIP's argmax / eos pooling), the padding after that token never
    reaches it: forward then runs encode_text's own steps on the first T positions and the T x T mask (each block's
    attention as _FreeLengthAttention), and a query of 10 tokens costs 10, not 77 (the same embedding:
    tests/models/families/test_open_clip.py checks it against encode_text at full context)."""

    def __init__(self, model):
        super().__init__()
        if not hasattr(model, "ln_final"):
            raise BadSpec(f"open_clip's {type(model).__name__} (a custom text tower) is not exported by this version")
        self.model = model
        blocks = list(getattr(getattr(model, "transformer", None), "resblocks", []))
        self.at_own_length = (
            type(model).__name__ == "CLIP"
            and getattr(model, "attn_mask", None) is not None
            and getattr(model, "text_pool_type", "argmax") in ("argmax", "eos")
            and bool(blocks)
            and all(
                isinstance(getattr(b, "attn", None), torch.nn.MultiheadAttention)
                and b.attn._qkv_same_embed_dim
                and b.attn.bias_k is None
                for b in blocks
            )
        )

    def forward(self, input_ids):
        if not self.at_own_length:
            with captured(self.model.ln_final) as box:
                emb = self.model.encode_text(input_ids)
            return emb, box["out"]
        from open_clip.transformer import text_global_pool

        m, T = self.model, input_ids.shape[1]
        blocks = list(m.transformer.resblocks)
        own = [b.attn for b in blocks]
        try:
            for b in blocks:
                b.attn = _FreeLengthAttention(b.attn)
            cast = m.transformer.get_cast_dtype()
            x = m.token_embedding(input_ids).to(cast) + m.positional_embedding[:T].to(cast)
            x = m.ln_final(m.transformer(x, attn_mask=m.attn_mask[:T, :T]))
        finally:
            for b, a in zip(blocks, own):
                b.attn = a
        pooled = text_global_pool(x, input_ids, m.text_pool_type, eos_token_id=getattr(m, "text_eos_id", None))
        if m.text_projection is not None:
            proj = m.text_projection
            pooled = proj(pooled) if isinstance(proj, torch.nn.Linear) else pooled @ proj
        return pooled, x
