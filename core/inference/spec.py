"""A model is a spec: `<family>:<reference>`, set by CROSSPROBE_MODEL (the service and the jobs) or --model.

    crossprobe:<checkpoint dir>          crossprobe's own model (`crossprobe:` alone: the committed checkpoint), or
                                         reranker heads trained on another backbone (a checkpoint of kind "heads")
    open_clip:<architecture>/<weights>   an open_clip model: a pretrained tag (laion2b_s34b_b79k) or a weights file
    hf:<repo id or local dir>            a Hugging Face CLIPModel or SiglipModel
    immich:<folder>                      an ONNX folder in the layout Immich publishes (two-tower only)

A spec names weights; what runs is the graphs exported from them (core/inference/exported.py), found by the
spec in a graphs folder. Parsing here reads no file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("crossprobe", "open_clip", "hf", "immich")


class BadSpec(ValueError):
    """A model spec that cannot name a model (a usage error: the CLI exits 2, the service refuses to start)."""


@dataclass(frozen=True)
class ModelSpec:
    family: str
    ref: str  # what follows "<family>:" (may be empty for crossprobe: the committed checkpoint)

    def __str__(self) -> str:
        return f"{self.family}:{self.ref}"

    @property
    def architecture(self) -> str:
        """open_clip: the part before the first "/" (ViT-B-32)."""
        return self.ref.split("/", 1)[0]

    @property
    def weights(self) -> str:
        """open_clip: the part after the first "/" (a pretrained tag or a weights file's path)."""
        return self.ref.split("/", 1)[1] if "/" in self.ref else ""

    @property
    def path(self) -> Path | None:
        """The local file or folder the spec names, where it names one (None: a tag or a hub repo id)."""
        if self.family in ("crossprobe", "immich"):
            return Path(self.ref).expanduser() if self.ref else None
        candidate = Path(self.weights if self.family == "open_clip" else self.ref).expanduser()
        looks_local = candidate.is_absolute() or self.ref.startswith(".") or candidate.exists()
        return candidate if looks_local and str(candidate) not in ("", ".") else None


def parse(text: str | Path | None) -> ModelSpec:
    """ "open_clip:ViT-B-32/laion2b_s34b_b79k" -> ModelSpec; None or "" -> the committed checkpoint; a bare path
    (no known family prefix) -> a crossprobe checkpoint there (CROSSPROBE_CKPT's older form)."""
    if text is None or str(text).strip() == "":
        return ModelSpec("crossprobe", "")
    text = str(text).strip()
    family, sep, ref = text.partition(":")
    if not sep or family not in FAMILIES:
        if sep and len(family) > 1 and "/" not in family:  # "clip:..." - a typo of a family, not a path
            raise BadSpec(
                f"model {text!r}: unknown family {family!r}; a model is one of "
                + ", ".join(f"{f}:..." for f in FAMILIES)
            )
        return ModelSpec("crossprobe", text)  # a checkpoint folder's path
    ref = ref.strip()
    if family == "open_clip" and ("/" not in ref or not ref.split("/", 1)[0] or not ref.split("/", 1)[1]):
        raise BadSpec(
            f"model {text!r}: open_clip:<architecture>/<pretrained tag or weights file>, "
            f"e.g. open_clip:ViT-B-32/laion2b_s34b_b79k"
        )
    if family in ("hf", "immich") and not ref:
        raise BadSpec(f"model {text!r}: {family}:<{'repo id or local dir' if family == 'hf' else 'folder'}>")
    return ModelSpec(family, ref)
