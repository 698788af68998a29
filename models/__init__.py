"""The model stack: towers, rerankers, the label bridge, training, evaluation and ONNX export."""
import json
from pathlib import Path

# the committed checkpoint (defined here, not in checkpoint.py, so that knowing the path imports no torch)
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "default"
# the reranker a search runs when it names none: the service's default (CROSSPROBE_DEFAULT_RERANK), and what the
# demo and the out-of-domain rows of `crossprobe eval` report (docs/research/region_labels.md chose it)
SERVED_RERANK = "temde"


def read_config(path: Path) -> dict:
    """A checkpoint's config.json (fingerprint, model config, training meta); JSON only, no torch."""
    return json.loads((Path(path) / "config.json").read_text())
