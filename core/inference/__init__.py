"""The inference seam (base.py): one interface through which the indexer, the service, the explainer and the
text gate reach a model, whatever its family and runtime; image decoding for it (decode.py), the one definition of
the features it gives (layout.py), and what names a model (spec.py). Implementations: crossprobe.py (a crossprobe
checkpoint's graphs over ONNX Runtime), exported.py (a model family's exported graphs: open_clip, Hugging Face),
immich.py (a folder in the layout Immich publishes), heads.py (reranker heads on a family model's backbone).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import replace
from pathlib import Path

from crossprobe.core import hub, runtime, torch_side
from crossprobe.core.inference.base import (
    Backend,
    ImageFeatures,
    ImageGrid,
    QueryVectors,
    RerankerUnavailable,
    RuntimeOptions,
)
from crossprobe.core.inference.layout import FeatureDims, ItemDims
from crossprobe.core.inference.spec import BadSpec, ModelSpec, parse

__all__ = [
    "Backend",
    "BadSpec",
    "FeatureDims",
    "ImageFeatures",
    "ImageGrid",
    "ItemDims",
    "ModelSpec",
    "QueryVectors",
    "RerankerUnavailable",
    "RuntimeOptions",
    "load",
    "parse",
]


class ModelUnavailable(RuntimeError):
    """The spec names a model whose graphs are not exported here, and this environment cannot export them."""


def load(
    model: str | Path | ModelSpec | None, opts: RuntimeOptions, identity: tuple[str, FeatureDims] | None = None
) -> Backend:
    """The model a spec names (spec.py; a bare path or None: a crossprobe checkpoint, None the committed one), its
    parts loaded on first use. identity: its (fingerprint, dims) where the caller knows them (crossprobe.py)."""
    spec = model if isinstance(model, ModelSpec) else parse(model)
    opts = replace(opts, device=resolve_device(opts.device))
    if spec.family == "crossprobe":
        from crossprobe.core.inference.exported import ExportedBackend
        from crossprobe.core.inference.heads import HeadsBackend, backbone_spec

        if spec.path is not None and (backbone := backbone_spec(spec.path)) is not None:  # heads on a backbone
            trunk = load(backbone, opts)
            if not isinstance(trunk, ExportedBackend):
                raise BadSpec(f"model {spec}: reranker heads train on a family model's backbone, not on {backbone}")
            return HeadsBackend(spec.path, opts, trunk)
        from crossprobe.core.inference.crossprobe import CrossprobeBackend

        if opts.device.startswith("cuda") and not runtime.onnxruntime_has_cuda():  # the GPU machines: torch, CUDA
            return torch_side.module(
                "torch_backend", f"device {opts.device} without onnxruntime-gpu"
            ).TorchCrossprobeBackend(spec.path, opts, identity)
        return CrossprobeBackend(spec.path, opts, identity)
    if spec.family in ("open_clip", "hf"):
        from crossprobe.core.inference.exported import ExportedBackend

        return ExportedBackend(exported_folder(spec, opts.graphs, opts), opts)
    if spec.family == "immich":
        from crossprobe.core.inference.immich import ImmichBackend

        # Immich's folder as it is: nothing to export
        return ImmichBackend(immich_folder(spec, opts), opts, name=Path(spec.ref.rstrip("/")).name)
    raise BadSpec(f"model {spec}: the {spec.family} family is not served by this version")


def resolve_device(device: str | None) -> str:
    """cpu | cuda[:N] as asked; auto (or unset): cuda where ONNX Runtime has its CUDA provider (onnxruntime-gpu),
    else cpu (PyTorch is not probed: a torch-free installation never imports it to choose)."""
    device = (device or "auto").strip().lower()
    if device == "auto":
        return "cuda" if runtime.onnxruntime_has_cuda() else "cpu"
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device {device!r}: cpu, cuda, cuda:N or auto")
    return device


# what exporting a family needs installed beside crossprobe (import names), and the one command that installs it
EXPORT_NEEDS = {
    "hf": (("torch", "transformers"), "pip install 'crossprobe[torch,export]'"),
    "open_clip": (("torch", "torchvision", "open_clip"), "pip install 'crossprobe[open_clip]'"),
}
IMMICH_FILES = ["config.json", "visual/*", "textual/*"]  # what of an Immich repo is served


def _say(opts: RuntimeOptions):
    return opts.say or logging.getLogger("crossprobe.models").info


def export_lacks(family: str) -> tuple[list[str], str]:
    """The libraries missing here to export a model of `family`, and the pip command that installs them."""
    needs, install = EXPORT_NEEDS[family]
    return [n for n in needs if importlib.util.find_spec(n) is None], install


def exported_folder(spec: ModelSpec, root: Path | None, opts: RuntimeOptions | None = None) -> Path:
    """The folder of `spec`'s exported graphs under `root` (the models folder). Missing: exported now where this
    environment has the family's library, its weights downloaded first where they are not on this machine and
    opts allows downloads; else ModelUnavailable naming what is missing and the command that fixes it."""
    from crossprobe.core.inference.exported import find_exported

    opts = opts or RuntimeOptions()
    if root is None:
        raise ModelUnavailable(f"model {spec}: no models folder given to find or export its graphs in")
    found = find_exported(root, str(spec))
    if found is not None:
        return found
    lacking, install = export_lacks(spec.family)
    if lacking:
        raise ModelUnavailable(
            f"model {spec} is not exported under {root}, and this environment cannot export it: it lacks "
            f"{', '.join(lacking)}. Install them here ({install}; PyTorch's CPU build first where the default is "
            "the CUDA one: pip install torch --index-url https://download.pytorch.org/whl/cpu), or export it on a "
            f"machine that has them (`crossprobe models export {spec} --out DIR`) and copy DIR here as the models "
            "folder (CROSSPROBE_MODELS_DIR=DIR)"
        )
    say = _say(opts)
    families = torch_side.module("families", f"exporting {spec}")
    try:
        return families.export(spec, Path(root), log=say)
    except FileNotFoundError:  # hub weights not on this machine (a weights file or folder that is not there: raise)
        if spec.path is not None or opts.download_timeout_s is None:
            raise
    pull = torch_side.module("families.pull", f"downloading {spec}")
    try:
        pull.pull(spec, opts.download_timeout_s, log=say)
    except hub.NoNetwork as e:
        raise ModelUnavailable(str(e)) from None
    return families.export(spec, Path(root), log=say)


def immich_folder(spec: ModelSpec, opts: RuntimeOptions) -> Path:
    """The folder of an immich: spec: a local folder as it is; a hub repo id (immich-app/ViT-B-32__openai): its files
    in the Hugging Face cache, downloaded first where they are not there and opts allows it (no PyTorch needed)."""
    path = spec.path
    if path is not None and path.is_dir():
        return path
    repo = spec.ref.strip("/")
    if repo.count("/") != 1 or spec.ref.startswith((".", "/", "~")):
        raise BadSpec(
            f"model {spec}: an Immich model is a folder or a hub repo id (immich:DIR, immich:immich-app/<name>); "
            f"{spec.ref} is neither"
        )
    folder = hub.cached(repo, IMMICH_FILES)
    if folder is not None:
        return folder
    if opts.download_timeout_s is None:
        raise ModelUnavailable(
            f"model {spec}: {repo} is not on this machine (its Hugging Face cache), and downloads are off here; "
            f"`crossprobe models pull {spec}` fetches it. " + hub.ELSEWHERE
        )
    try:
        return hub.snapshot(repo, IMMICH_FILES, opts.download_timeout_s, _say(opts), what=str(spec))
    except hub.NoNetwork as e:
        raise ModelUnavailable(str(e)) from None
