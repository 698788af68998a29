"""`crossprobe models pull SPEC`: fetch a model's files where a network exists, and say plainly where none does.

    hf:<repo id>          huggingface_hub.snapshot_download into the Hugging Face cache (an M-CLIP text tower also
                          gets its XLM-R configuration and, where open_clip imports, its paired image tower)
    open_clip:<arch>/<tag>  open_clip's own download of that pretrained tag (where open_clip imports: the export venv)
    immich:<repo id>      Immich's published folder (immich-app/ViT-B-32__openai...): its config, visual/ and textual/

The downloads themselves (their timeouts, HF_HUB_OFFLINE, what NoNetwork says) are crossprobe.core.hub's: the
torch-free core fetches a Hugging Face or Immich repo on first use too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from crossprobe.core import hub
from crossprobe.core.hub import NoNetwork
from crossprobe.core.inference import IMMICH_FILES
from crossprobe.core.inference.spec import BadSpec, ModelSpec, parse

__all__ = ["NoNetwork", "pull"]


def pull(spec: str | ModelSpec, timeout: float = 10.0, log: Callable[[str], None] = print) -> str:
    """Fetch the spec's files; -> the spec to use from now on (a local folder for immich:)."""
    spec = spec if isinstance(spec, ModelSpec) else parse(spec)
    if spec.family == "crossprobe":
        raise BadSpec(f"model {spec}: crossprobe's checkpoints ship with it; nothing to pull")
    if spec.path is not None and spec.path.exists():
        log(f"{spec}: a local {'folder' if spec.path.is_dir() else 'file'}, nothing to pull")
        return str(spec)
    if spec.family == "immich" and "/" not in spec.ref.strip("/"):
        raise FileNotFoundError(f"model {spec}: no folder {spec.ref}, and not a hub repo id (immich-app/<name>)")
    if spec.family == "open_clip":
        return _pull_open_clip(spec, timeout, log)
    patterns = IMMICH_FILES if spec.family == "immich" else None
    folder = hub.snapshot(spec.ref, patterns, timeout, log, what=str(spec))
    log(f"{spec.ref}: {folder}")
    if spec.family == "immich":
        return f"immich:{folder}"
    _pull_mclip_parts(folder, spec.ref, timeout, log)
    return str(spec)


def _pull_open_clip(spec: ModelSpec, timeout: float, log) -> str:
    try:
        import open_clip
    except ImportError:
        raise NoNetwork(
            f"{spec}: open_clip is not installed here (pip install 'crossprobe[open_clip]'), and it alone knows "
            f"where its pretrained tags live"
        ) from None
    cfg = open_clip.get_pretrained_cfg(spec.architecture, spec.weights)
    if not cfg:
        raise BadSpec(f"model {spec}: open_clip has no pretrained tag {spec.weights!r} for {spec.architecture!r}")
    endpoint = hub.allow_downloads(str(spec))
    hub.reachable(endpoint, timeout, str(spec))
    hub.bounded_client(timeout)
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(timeout)))
    log(f"{spec}: {open_clip.download_pretrained(cfg)}")
    return str(spec)


def _pull_mclip_parts(folder: Path, repo: str, timeout: float, log) -> None:
    """An M-CLIP text tower names XLM-R's configuration by repo (modelBase) and is paired with an open_clip image
    tower (mclip.PAIRED): fetch those too."""
    import json

    cfg = folder / "config.json"
    meta = json.loads(cfg.read_text(encoding="utf-8")) if cfg.exists() else {}
    if meta.get("model_type") != "M-CLIP":
        return
    from crossprobe.models.families.mclip import PAIRED

    base = meta.get("modelBase", "")
    if base and not Path(base).exists():
        log(f"{base}: {hub.snapshot(base, ['config.json'], timeout, log)}")
    image = PAIRED.get(repo)
    if image:
        try:
            log(pull(image, timeout, log=log))
        except NoNetwork as e:
            log(f"its image tower {image}: {e}")
