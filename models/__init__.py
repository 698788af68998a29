"""The model stack: towers, rerankers, the label bridge, training, evaluation and ONNX export."""
from pathlib import Path

# the committed checkpoint (defined here, not in checkpoint.py, so that knowing the path imports no torch)
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "default"
