"""The one place that writes ONNX graphs from PyTorch (`crossprobe export`, and the indexer and the service
through crossprobe.core.graph_files, which find graphs and call these only for the missing ones).

Where they go (<root>/<fingerprint>/<name>.onnx, the shared backbone, the manifest) is core/graph_files.py; what
each graph computes is models/graphs.py. Every file is written under a temp name and renamed into place, so a
reader (another process, a killed export's next run) never sees half a graph. The ensure_* names imported here
are the core's: torch-side callers keep calling export.ensure_graphs.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from crossprobe.core import torch_side
from crossprobe.core.atomic import atomic_path, atomic_write
from crossprobe.core.graph_files import (
    BACKBONE,
    HEADS_GRAPHS,
    SEARCH_GRAPHS,
    SERVICE_GRAPHS,
    GraphsUnavailable,
    checkpoint_fingerprint,
    ensure_backbone,
    ensure_graphs,
    ensure_heads_graphs,
    ensure_int8_query,
    quantize_query_tower,
)

# the core's names, re-exported: torch-side callers (crossprobe export, training, tests) call export.ensure_graphs
__all__ = [
    "BACKBONE",
    "HEADS_GRAPHS",
    "SEARCH_GRAPHS",
    "SERVICE_GRAPHS",
    "GraphsUnavailable",
    "checkpoint_fingerprint",
    "ensure_backbone",
    "ensure_graphs",
    "ensure_heads_graphs",
    "ensure_int8_query",
    "quantize_query_tower",
    "export_graphs",
    "export_heads_graphs",
    "export_backbone",
    "export_all",
]

log = logging.getLogger("crossprobe.models")

OPSET = 17


def _torch_for_export(what: str, folder: Path) -> None:
    """Refuse, with what to do, where a missing graph would need PyTorch that is not installed."""
    try:
        importlib.import_module("torch")
    except ImportError:
        raise GraphsUnavailable(
            f"{what} not exported in {folder}, and this installation has no PyTorch to export it (the container "
            f"image ships without torch: it holds the graphs of its own checkpoint only). Export them where PyTorch "
            f"is installed: `crossprobe export --ckpt CKPT --out DIR` (for instance in the image's builder stage, "
            f"`docker build --target builder`), then point CROSSPROBE_MODELS_DIR (the models folder "
            f"of the service and the batch jobs) at DIR; or install it here: {torch_side.INSTALL}"
        ) from None


def export_graphs(
    root: Path,
    names: Iterable[str],
    ckpt: Path | None = None,
    *,
    model=None,
    bert=None,
    fingerprint: str | None = None,
    also: Iterable[str] = (),
) -> Path:
    """<root>/<fingerprint>/ holding every graph in `names`, exporting the missing ones now (with `also`, while
    the model is loaded). The model is the in-memory `model` (with its `fingerprint`) or the checkpoint `ckpt`
    (default: the committed one), loaded only when something is missing."""
    if model is not None and fingerprint is None:
        raise ValueError("an in-memory model needs its fingerprint (the folder its graphs go to)")
    fingerprint = fingerprint or checkpoint_fingerprint(ckpt)
    final = Path(root) / fingerprint
    missing = [n for n in names if not (final / f"{n}.onnx").exists()]
    if not missing:
        return final
    wanted = missing + [n for n in also if n not in missing and not (final / f"{n}.onnx").exists()]
    if model is None:
        _torch_for_export(f"graphs {wanted} of checkpoint {fingerprint}", final)
        from crossprobe.models import checkpoint, graphs

        # the research-only SM / TV rerankers are built only when one of their graphs is asked for (timing)
        references = any(n in graphs.REFERENCE_GRAPHS for n in wanted)
        model, meta = checkpoint.load(ckpt, bert, references=references)
        if meta["fingerprint"] != fingerprint:
            raise ValueError(f"checkpoint {ckpt} has fingerprint {meta['fingerprint']}, not {fingerprint}")
    log.info("exporting ONNX graphs %s of checkpoint %s into %s", wanted, fingerprint, final)
    _publish(final, wanted, fingerprint, lambda tmp: export_all(model, tmp, fingerprint, names=wanted))
    return final


def export_heads_graphs(root: Path, ckpt: Path | None = None, *, model=None, fingerprint: str | None = None) -> Path:
    """<root>/<fingerprint>/ holding the reranker heads' graphs (graphs.HEADS_GRAPHS: image_head, text_head,
    cp_scorer, temde_scorer), exporting the missing ones from the in-memory `model` (with its `fingerprint`) or
    from the heads checkpoint `ckpt` (models/heads.py), loaded only when something is missing."""
    fingerprint = fingerprint or checkpoint_fingerprint(ckpt)
    final = Path(root) / fingerprint
    missing = [n for n in HEADS_GRAPHS if not (final / f"{n}.onnx").exists()]
    if not missing:
        return final
    if model is None:
        _torch_for_export(f"graphs {missing} of the reranker heads {fingerprint}", final)
        from crossprobe.models import heads

        assert ckpt is not None, "export_heads_graphs needs the in-memory model or its checkpoint"
        model, meta = heads.load(ckpt)
        if meta["fingerprint"] != fingerprint:
            raise ValueError(f"heads checkpoint {ckpt} has fingerprint {meta['fingerprint']}, not {fingerprint}")
    log.info("exporting ONNX graphs %s of the reranker heads %s into %s", missing, fingerprint, final)

    def write(tmp: Path) -> None:
        from crossprobe.models import graphs

        model.eval()
        ex = graphs.heads_example_inputs(model)
        for name in missing:
            make, inputs, outputs, dynamic = graphs.HEADS_GRAPHS[name]
            _export(make(model), ex[name], tmp / f"{name}.onnx", inputs, outputs, dynamic)

    _publish(final, missing, fingerprint, write)
    return final


def _publish(final: Path, names: list[str], fingerprint: str, write) -> None:
    """write(tmp) the graphs `names` into a temp folder beside `final`, then move each into `final` by one rename
    (a reader never sees half a graph) and rewrite its manifest."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".export-"))
    try:
        write(tmp)
        final.mkdir(exist_ok=True)
        for name in names:  # each graph appears whole, by one rename
            os.chmod(tmp / f"{name}.onnx", 0o644)  # mkdtemp's 0600 would hide it from another uid (the image's)
            os.replace(tmp / f"{name}.onnx", final / f"{name}.onnx")
        _write_manifest(final, fingerprint)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_backbone(root: Path) -> Path:
    """<root>/image_backbone.onnx: the frozen image backbone (pixels (B, 3, 224, 224) -> grid (B, 49, 1280))."""
    path = Path(root) / BACKBONE
    if path.exists():
        return path
    _torch_for_export("the image backbone graph", path.parent)
    import torch

    from crossprobe.core import inputs
    from crossprobe.models import backbones as bb

    path.parent.mkdir(parents=True, exist_ok=True)
    dummy = torch.zeros(1, 3, inputs.IMAGE_SIZE, inputs.IMAGE_SIZE)
    _export(bb.ImageBackbone(), (dummy,), path, ["pixels"], ["grid"], {"pixels": {0: "batch"}, "grid": {0: "batch"}})
    return path


def export_all(model, out_dir: Path, fingerprint: str, names: Iterable[str] | None = None) -> dict[str, Path]:
    """Write `names` (default: every graph of models/graphs.py that the model has: the SM / TV scorers only for a
    model built with its references) of an in-memory model into out_dir, with a manifest.json naming its
    fingerprint."""
    from crossprobe.models import graphs

    model.eval()
    out_dir = Path(out_dir)
    paths = {}
    ex = graphs.example_inputs(model)
    for name in names or graphs.available(model):
        inputs, outputs, dynamic = graphs.io_names(model, name)
        paths[name] = out_dir / f"{name}.onnx"
        _export(graphs.GRAPHS[name][0](model), ex[name], paths[name], inputs, outputs, dynamic)
    _write_manifest(out_dir, fingerprint)
    return paths


def _write_manifest(folder: Path, fingerprint: str) -> None:
    manifest = {"fingerprint": fingerprint, "opset": OPSET, "graphs": sorted(p.name for p in folder.glob("*.onnx"))}
    atomic_write(folder / "manifest.json", json.dumps(manifest, indent=2))


def _export(module, args: tuple, path: Path, inputs: list[str], outputs: list[str], dynamic: dict) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    # a unique temp name: the service and the indexer may export the same graph at once; 0644 as in ensure_graphs
    with atomic_path(path, mode=0o644, unique=True) as tmp, torch.no_grad():
        torch.onnx.export(
            module.eval(),
            args,
            str(tmp),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,
        )
