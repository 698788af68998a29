"""hf:<repo id or local dir>: a Hugging Face CLIPModel or SiglipModel (by config.json's model_type), or an M-CLIP
text tower (model_type "M-CLIP": mclip.py), loaded by transformers from files on this machine (a hub repo id: from
the local cache that `crossprobe models pull` fills; an export never downloads).

How the reference reads inputs, reproduced in model.json:
  CLIP    CLIPImageProcessor: RGB first, shortest side to `shortest_edge` (PIL, its resample), centre crop with the
          margin floored ((H - S) // 2), /255, mean/std. CLIPTokenizer (a `tokenizers` file already): lower case,
          <|startoftext|> ... <|endoftext|>, 77 tokens at most, padded to the longest text with the pad token; the
          text tower pools at the first <|endoftext|> (causal attention: padding after it changes nothing).
  SigLIP  SiglipImageProcessor: RGB first, squashed to size x size, /255, mean = std = 0.5. SiglipTokenizer
          (SentencePiece): lower case, punctuation removed, whitespace collapsed, </s> appended, padded with </s> to
          64 tokens, as SigLIP was trained: its text tower pools the LAST position and reads the ids only (no mask).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an export reads local files only: `crossprobe models pull` downloads
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from crossprobe.core.inference.spec import BadSpec, ModelSpec  # noqa: E402
from crossprobe.models.families.base import FamilyModel, versions  # noqa: E402
from crossprobe.models.families.text import fast_tokenizer_settings, with_eos  # noqa: E402

_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL's enum values, as HF configs store them


class ModelFilesMissing(FileNotFoundError):
    """A hub repo id whose files are not on this machine."""


def resolve(spec: ModelSpec) -> tuple[Path, dict]:
    """The local folder of an hf: spec and its source record: a local dir as it is; a repo id: its snapshot in the
    Hugging Face cache (never fetched here)."""
    if spec.path is not None:
        folder = spec.path
        if not folder.is_dir():
            raise FileNotFoundError(f"model {spec}: {folder} is not a folder")
        return folder, file_source(folder)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(spec.ref, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ModelFilesMissing(
            f"model {spec}: {spec.ref} is not in this machine's Hugging Face cache; fetch it "
            f"with `crossprobe models pull {spec}` (or download the repo elsewhere and use "
            f"hf:<its folder>)"
        ) from None
    return folder, {"repo": spec.ref, "revision": folder.name}


def file_source(folder: Path) -> dict:
    """{"path", "size", "mtime_ns"} of the folder's weights file (what exported.find_exported checks is unchanged)."""
    for name in (
        "model.safetensors",
        "pytorch_model.bin",
        "open_clip_model.safetensors",
        "open_clip_pytorch_model.bin",
    ):
        if (folder / name).exists():
            st = (folder / name).stat()
            return {"path": str((folder / name).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return {"dir": str(folder.resolve())}


def load(spec: ModelSpec) -> FamilyModel:
    folder, source = resolve(spec)
    model_type = _model_type(folder)
    if model_type == "M-CLIP":
        from crossprobe.models.families import mclip

        return mclip.load(spec, folder, source)
    if model_type not in ("clip", "siglip"):
        raise BadSpec(
            f"model {spec}: config model_type {model_type!r}; hf: serves CLIPModel (clip), SiglipModel "
            f"(siglip) and M-CLIP text towers"
        )
    import transformers
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder, attn_implementation="eager").float().eval()
    siglip = model_type == "siglip"
    tok = AutoTokenizer.from_pretrained(folder)
    image_cfg = image_settings(AutoImageProcessor.from_pretrained(folder), spec)
    text_cfg, tokenizer_json, reference_ids = (_siglip_text if siglip else _clip_text)(tok, model.config)
    return FamilyModel(
        family="hf_siglip" if siglip else "hf_clip",
        spec=str(spec),
        name=spec.ref if spec.path is None else folder.name,
        source=source,
        identity=config_identity(model.config),
        state=dict(model.state_dict()),
        image=_Image(model, siglip),
        text=_Text(model),
        image_cfg=image_cfg,
        text_cfg=text_cfg,
        tokenizer_json=tokenizer_json,
        reference_ids=reference_ids,
        versions=versions(transformers),
    )


def config_identity(config) -> dict:
    """The architecture's configuration without what names where or with what it was saved (so the same weights
    give the same fingerprint from any folder)."""

    def strip(d):
        return {
            k: strip(v) if isinstance(v, dict) else v
            for k, v in d.items()
            if not k.startswith("_") and k != "transformers_version"
        }

    return strip(config.to_diff_dict())


def _model_type(folder: Path) -> str | None:
    for cfg in (folder / "config.json", folder / "text" / "config.json"):  # M-CLIP: text/ beside visual/
        if cfg.exists():
            return json.loads(cfg.read_text(encoding="utf-8")).get("model_type")
    raise FileNotFoundError(f"{folder}: no config.json (a Hugging Face model folder has one)")


def image_settings(proc, spec) -> dict:
    """model.json's "image" from a CLIPImageProcessor / SiglipImageProcessor (PIL backend semantics)."""
    if not (proc.do_rescale and abs(proc.rescale_factor - 1 / 255) < 1e-12 and proc.do_normalize and proc.do_resize):
        raise BadSpec(
            f"model {spec}: image processor settings crossprobe does not reproduce "
            f"(rescale {proc.do_rescale} x{proc.rescale_factor}, normalize {proc.do_normalize})"
        )
    resample = _RESAMPLE[int(proc.resample)]
    common = {
        "interpolation": resample,
        "mean": [float(x) for x in proc.image_mean],
        "std": [float(x) for x in proc.image_std],
        "crop_rounding": "floor",
        "rgb_last": False,
        "alpha": "white" if getattr(proc, "do_convert_rgb", True) else "drop",
    }
    if getattr(proc, "do_center_crop", False):
        short, crop = proc.size.shortest_edge, proc.crop_size
        if not short or crop.height != crop.width or crop.height != short:
            raise BadSpec(
                f"model {spec}: resize to {proc.size} then crop {crop}: crossprobe crops the resized "
                f"image's own short side only"
            )
        return {"size": int(short), "resize": "shortest", "crop": True, **common}
    if proc.size.height and proc.size.height == proc.size.width:
        return {"size": int(proc.size.height), "resize": "squash", "crop": False, **common}
    raise BadSpec(f"model {spec}: image size {proc.size} is not square")


def _clip_text(tok, config):
    """CLIP's fast tokenizer as it is (its normalizer lowers the text)."""
    return fast_tokenizer_settings(tok, int(config.text_config.max_position_embeddings))


def _siglip_text(tok, config):
    """SentencePiece -> `tokenizers` (transformers' own converter), </s> appended; SigLIP's canonicalisation is
    model.json's clean "canonicalize" (exported.clean_text)."""
    from transformers.convert_slow_tokenizer import SpmConverter

    fast = with_eos(SpmConverter(tok).converted(), tok.eos_token, int(tok.eos_token_id))
    T = int(config.text_config.max_position_embeddings)
    cfg = {
        "context_length": T,
        "pad_id": int(tok.pad_token_id),
        "pad_token": tok.pad_token,
        "pad_to_context": True,
        "clean": "canonicalize",
        "lowercase": False,
        "inputs": ["input_ids"],
    }  # canonicalize lowers
    return cfg, fast.to_str(), lambda t: tok(t, padding="max_length", max_length=T, truncation=True)["input_ids"]


class _Image(torch.nn.Module):
    """pixels -> get_image_features (the projected embedding), the patch tokens after the trunk's final layer norm
    (CLIP's post_layernorm normalises only the class token in HF's forward: applied to the patches here, as
    open_clip's ln_post does; SigLIP's last_hidden_state is already normalised and has no class token)."""

    def __init__(self, model, siglip: bool):
        super().__init__()
        self.model, self.siglip = model, siglip

    def forward(self, pixels):
        out = self.model.get_image_features(pixel_values=pixels)
        h = out.last_hidden_state
        return out.pooler_output, h if self.siglip else self.model.vision_model.post_layernorm(h[:, 1:])


class _Text(torch.nn.Module):
    """input_ids[, attention_mask] -> get_text_features (the projected embedding), the final token states."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None):
        out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        return out.pooler_output, out.last_hidden_state
