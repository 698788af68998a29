"""The torch-free core: what `crossprobe serve` and `crossprobe index` run. The inference backends over ONNX
Runtime and their sessions (inference/, runtime.py), image decoding and preprocessing (image_formats.py,
inputs.py), tokenization, int8 query graphs (int8.py), relevance curves (calibration.py), the text gate, the
exported graphs' files (graph_files.py) and atomic writes. Nothing here imports PyTorch or crossprobe.models (the
torch part: towers, training, evaluation, the exporters); torch_side.py is the one door to it, opened only where a
graph is missing or an in-memory model is handed in, and it names the extra to install where torch is absent.
The import-linter contract in .importlinter holds this (tests/test_layers.py)."""

import importlib.util
import json
from pathlib import Path


def _models_folder() -> Path:
    """Where the crossprobe.models package is installed, found without running any of its code."""
    spec = importlib.util.find_spec("crossprobe.models")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("crossprobe.models is not installed beside crossprobe.core (a broken installation)")
    return Path(next(iter(spec.submodule_search_locations)))


# the committed checkpoint: package data of crossprobe.models (its weights and config), read here as files
DEFAULT_CHECKPOINT = _models_folder() / "checkpoints" / "default"
# the reranker a search runs when it names none: the service's default (CROSSPROBE_DEFAULT_RERANK), and what the
# demo and the out-of-domain rows of `crossprobe eval` report (docs/research/region_labels.md chose it)
SERVED_RERANK = "temde"


def read_config(path: Path) -> dict:
    """A checkpoint's config.json (fingerprint, model config, training meta); JSON only, no torch."""
    return json.loads((Path(path) / "config.json").read_text())
