"""Checkpoints: `model.safetensors` (only trained weights, float16 to stay small)
+ `config.json` (ModelConfig + fingerprint + training facts) + `MODEL_CARD.md`.

The fingerprint is a hash of the stored weights and the model config; every
index built with a checkpoint records it, and the service refuses an index whose
fingerprint differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from crossprobe.core import DEFAULT_CHECKPOINT, read_config  # noqa: F401  (checkpoint.X for callers)
from crossprobe.core.atomic import atomic_dir
from crossprobe.models.model import ModelConfig, SearchModel


def fingerprint(tensors: dict[str, torch.Tensor], cfg: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(cfg, sort_keys=True).encode())
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def stored(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors as the checkpoint stores them (floating point in float16)."""
    return {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in state.items()}


@torch.no_grad()
def round_to_stored(model: SearchModel, prefixes: tuple[str, ...]) -> None:
    """Round the weights under `prefixes` to what save() will keep (float16, back in float32), so that
    what is trained on top of them (the rerankers over the towers) sees the weights that will be served."""
    state = {k: v for k, v in model.trained_state_dict().items() if k.startswith(prefixes)}
    model.load_state_dict({k: v.to(state[k].dtype) for k, v in stored(state).items()}, strict=False)


def save(model: SearchModel, out: Path, meta: dict | None = None) -> str:
    """Write the checkpoint directory atomically (a temp dir renamed into place)."""
    tensors = stored(model.trained_state_dict())
    cfg = model.cfg.to_dict()
    fp = fingerprint(tensors, cfg)
    write(out, tensors, {"model": cfg, "fingerprint": fp, **(meta or {})})
    return fp


def write(out: Path, tensors: dict[str, torch.Tensor], config: dict, files: dict[str, str] | None = None) -> None:
    """A checkpoint directory (model.safetensors, config.json, and `files`: name -> text) written whole into a temp
    dir and renamed into place, replacing `out` if it exists: a reader sees the old directory or the new one
    (core/atomic.py)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # a checkpoint is for everyone to read (0755 / 0644, whatever the umask)
    with atomic_dir(out, mode=0o755, unique=True) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        os.chmod(tmp / "model.safetensors", 0o644)


REFERENCE_PREFIXES = ("sm.", "tv.")  # the research-only rerankers' weights (models/research/)


def load(path: Path | None = None, bert=None, *, references: bool = True) -> tuple[SearchModel, dict]:
    """-> (SearchModel in eval mode, float32), config.json contents. references=False (what export loads) leaves
    the research-only SM and TV rerankers out: their stored weights are still fingerprinted, not built."""
    path = Path(path or DEFAULT_CHECKPOINT)
    meta = read_config(path)
    model = SearchModel(ModelConfig.from_dict(meta["model"]), bert, references=references)
    tensors = load_file(str(path / "model.safetensors"))
    if fingerprint(tensors, meta["model"]) != meta["fingerprint"]:
        raise ValueError(f"checkpoint {path}: weights do not match the fingerprint in config.json")
    if not references:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(REFERENCE_PREFIXES)}
    missing, unexpected = model.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, strict=False
    )
    missing = [k for k in missing if not k.startswith("text.bottom.")]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path}: missing {missing[:5]} unexpected {unexpected[:5]}")
    return model.eval(), meta
