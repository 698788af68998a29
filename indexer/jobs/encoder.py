"""Encode stage of a job: the model behind the inference seam (crossprobe.core.inference), as a job runs it.

The model is a spec (core/inference/spec.py): CROSSPROBE_MODEL / --model (IndexerSettings.model_spec), the
variable the service reads too, so an index and the service that serves it name one model.

A job reaches its model through one Backend: image_grid (the frozen backbone, timed as "backbone") and
image_features (the image tower, timed as "head"). The image tower runs in ONNX Runtime by default
(IndexerSettings.head = "onnx": faster than PyTorch eager, docs/research/indexer.md), and a build whose graphs are
exported for this fingerprint never builds the PyTorch model (a resumed build starts in about a second);
head = "torch" remains for checking. Graphs live in the models folder (IndexerSettings.models), written by
models/export.py: image_backbone.onnx (one for all checkpoints) and <fingerprint>/image_tower.onnx.
"""

from __future__ import annotations

from pathlib import Path

from crossprobe.core import inference
from crossprobe.core.inference import Backend, FeatureDims, ModelSpec, RuntimeOptions
from crossprobe.indexer.jobs.settings import IndexerSettings


def job_backend(
    settings: IndexerSettings,
    spec: ModelSpec | Path | None = None,
    model=None,
    bert=None,
    identity: tuple[str, FeatureDims] | None = None,
) -> Backend:
    """The job's model: `spec` (a ModelSpec, or a crossprobe checkpoint's path), else the settings' (CROSSPROBE_MODEL,
    CROSSPROBE_CKPT, the committed checkpoint); nothing is loaded until a part is used (identify a model cheaply by
    building one)."""
    # with OCR on, an OCR thread shares the cores: ONNX Runtime's spinning workers would take them from it while
    # they wait (measured: docs/research/text_search.md, "Indexing with OCR on")
    opts = RuntimeOptions(
        graphs=settings.models,
        download_timeout_s=settings.download_timeout,
        threads=settings.threads,
        spinning=False if settings.ocr else None,
        image_head=settings.head,
        model=model,
        bert=bert,
        device=settings.device,
        precision=settings.device_precision,
    )
    return inference.load(spec if spec is not None else settings.model_spec, opts, identity)


def identify(
    spec: ModelSpec | Path | None = None,
    model=None,
    graphs: Path | None = None,
    download_timeout_s: float | None = None,
    say=None,
) -> tuple[str, FeatureDims]:
    """(fingerprint, dims) of the model a job would run, without loading any part of it (a family model not exported
    yet is exported here, into `graphs`, where this environment can: its weights downloaded first where allowed)."""
    opts = RuntimeOptions(graphs=graphs, model=model, download_timeout_s=download_timeout_s, say=say)
    backend = inference.load(spec, opts)
    return backend.fingerprint, backend.dims
