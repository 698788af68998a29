"""Exporting a model family's weights into the folder crossprobe serves torch-free (core/inference/exported.py).

    export(spec, root) -> <root>/<fingerprint>/   model.json, image.onnx, text.onnx, tokenizer.json

One module per family loads the weights with the family's own library and says how its reference preprocesses and
tokenizes; writer.py does the rest the same way for all of them (the fingerprint, the graphs and their check against
PyTorch, the tokenizer's id-for-id check, the atomic write):

    hf.py         hf:<repo id or local dir>     Hugging Face CLIPModel / SiglipModel (by the config's model_type)
    mclip.py      hf:<M-CLIP folder or repo>    M-CLIP: a multilingual XLM-R text tower (config model_type
                                                "M-CLIP") with the open_clip image tower it was trained against
    open_clip.py  open_clip:<arch>/<weights>    open_clip (needs torchvision: only in scripts/openclip-env.sh's venv)

This package imports torch and the family libraries: nothing that serves (the service, the jobs, the container
image) imports it; inference.exported_folder imports it only to export a spec that has no folder yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from crossprobe.core.inference.spec import BadSpec, ModelSpec, parse

if TYPE_CHECKING:  # base imports torch: only for the annotation here, imported lazily at run time
    from crossprobe.models.families.base import FamilyModel

__all__ = ["export", "load"]


def load(spec: str | ModelSpec) -> FamilyModel:
    """The spec's model, loaded with its family's library, ready to export."""
    spec = spec if isinstance(spec, ModelSpec) else parse(spec)
    if spec.family == "hf":
        from crossprobe.models.families import hf

        return hf.load(spec)
    if spec.family == "open_clip":
        from crossprobe.models.families import open_clip

        return open_clip.load(spec)
    raise BadSpec(
        f"model {spec}: nothing to export for the {spec.family} family "
        + (
            "(an Immich folder is served as it is)"
            if spec.family == "immich"
            else "(crossprobe's own graphs: `crossprobe export`)"
        )
    )


def export(spec: str | ModelSpec, root: Path, log: Callable[[str], None] | None = None) -> Path:
    """<root>/<fingerprint>/ for the spec's weights, exported now unless that folder exists (then the spec is
    recorded in it, so a later lookup by this spec finds it)."""
    from crossprobe.models.families import writer

    return writer.write(load(spec), Path(root), log=log)
