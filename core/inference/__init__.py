"""The inference seam (base.py): one interface through which the indexer, the service, the explainer and the
text gate reach a model, whatever its family and runtime; image decoding for it (decode.py), the one definition of
the features it gives (layout.py), and what names a model (spec.py). Implementations: crossprobe.py (a crossprobe
checkpoint's graphs over ONNX Runtime), exported.py (a model family's exported graphs: open_clip, Hugging Face),
immich.py (a folder in the layout Immich publishes), heads.py (reranker heads on a family model's backbone).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from crossprobe.core import runtime, torch_side
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

        return ExportedBackend(exported_folder(spec, opts.graphs), opts)
    if spec.family == "immich":
        from crossprobe.core.inference.immich import ImmichBackend

        if spec.path is None:
            raise BadSpec(
                f"model {spec}: an Immich model is a folder (immich:DIR; `crossprobe models pull` fetches one)"
            )
        return ImmichBackend(spec.path, opts)  # Immich's folder as it is: nothing to export
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


def exported_folder(spec: ModelSpec, root: Path | None) -> Path:
    """The folder of `spec`'s exported graphs under `root`, exporting them now where this environment can."""
    from crossprobe.core.inference.exported import find_exported

    if root is None:
        raise ModelUnavailable(f"model {spec}: no graphs folder given to find or export its graphs in")
    found = find_exported(root, str(spec))
    if found is not None:
        return found
    try:
        return torch_side.module("families", f"exporting {spec}").export(spec, Path(root))
    except (ImportError, torch_side.TorchUnavailable) as e:  # torch or the family's library is missing
        raise ModelUnavailable(
            f"model {spec} is not exported under {root}, and this environment cannot export it ({e}). Export it where "
            f"PyTorch and the family's library are installed ({torch_side.INSTALL}; open_clip models also "
            f"pip install open-clip-torch): `crossprobe models export {spec} --out DIR`, then point "
            "CROSSPROBE_ARTIFACTS_DIR (the "
            f"service) and CROSSPROBE_INDEX_MODEL_DIR (the batch jobs) at DIR"
        ) from None
