"""The exported graphs' files: where each lives, which exist, and the int8 query tower quantized from the fp32 one
(ONNX only). A missing graph is exported by crossprobe.models.export (PyTorch), reached through torch_side.

A checkpoint's graphs live in a folder named by its fingerprint, so graphs of two
checkpoints never mix and an index built with one checkpoint is never searched
with another's graphs:

    <root>/image_backbone.onnx          the frozen EfficientNet-Lite0 (one for all checkpoints)
    <root>/<fingerprint>/<name>.onnx    query_tower, image_tower, cp_scorer, temde_scorer, explain, ...
    <root>/<fingerprint>/query_tower.int8.onnx   the int8 query tower, quantized from the fp32 one
    <root>/<fingerprint>/manifest.json  the fingerprint, opset and graphs present
    <root>/<heads fingerprint>/image_head.onnx, text_head.onnx, cp_scorer.onnx, temde_scorer.onnx
                                        reranker heads trained on another model's backbone (models/heads.py)

What each graph computes is models/graphs.py. When the wanted graphs exist, nothing imports torch or loads the
PyTorch model: a restart takes seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from crossprobe.core import DEFAULT_CHECKPOINT, int8, read_config, torch_side
from crossprobe.core.atomic import atomic_path

log = logging.getLogger("crossprobe.models")

BACKBONE = "image_backbone.onnx"
# the graphs the service needs to answer a search; explain and image_tower are exported beside them while the
# PyTorch model is loaded anyway, but a folder without them still counts as ready (they come on first use)
SEARCH_GRAPHS = ("query_tower", "cp_scorer", "temde_scorer")
SERVICE_GRAPHS = SEARCH_GRAPHS + ("explain", "image_tower")
# reranker heads on another model's backbone (models/heads.py; graphs.HEADS_GRAPHS says what each computes)
HEADS_GRAPHS = ("image_head", "text_head", "cp_scorer", "temde_scorer")


class GraphsUnavailable(RuntimeError):
    """Graphs are missing and this installation cannot export them: it has no PyTorch (the container image)."""


def checkpoint_fingerprint(ckpt: Path | None) -> str:
    """The fingerprint recorded in a checkpoint's config.json (reads JSON only: no torch)."""
    path = Path(ckpt or DEFAULT_CHECKPOINT)
    cfg = path / "config.json"
    if not cfg.exists():
        raise FileNotFoundError(f"no checkpoint at {path} (train one with `crossprobe train`, or set CROSSPROBE_CKPT)")
    return read_config(path)["fingerprint"]


def ensure_graphs(
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
    the model is loaded: models/export.py). The model is the in-memory `model` (with its `fingerprint`) or the
    checkpoint `ckpt` (default: the committed one), loaded only when something is missing."""
    names = tuple(names)
    if model is None or fingerprint is not None:
        final = Path(root) / (fingerprint or checkpoint_fingerprint(ckpt))
        if all((final / f"{n}.onnx").exists() for n in names):
            return final
    return _exporter(f"graphs {list(names)} of checkpoint {fingerprint or ckpt or 'default'}").export_graphs(
        root, names, ckpt, model=model, bert=bert, fingerprint=fingerprint, also=also
    )


def ensure_heads_graphs(root: Path, ckpt: Path | None = None, *, model=None, fingerprint: str | None = None) -> Path:
    """<root>/<fingerprint>/ holding the reranker heads' graphs (HEADS_GRAPHS), exporting the missing ones from the
    in-memory `model` or the heads checkpoint `ckpt` (models/heads.py)."""
    final = Path(root) / (fingerprint or checkpoint_fingerprint(ckpt))
    if all((final / f"{n}.onnx").exists() for n in HEADS_GRAPHS):
        return final
    return _exporter(f"the reranker heads' graphs of {final.name}").export_heads_graphs(
        root, ckpt, model=model, fingerprint=fingerprint
    )


def ensure_backbone(root: Path) -> Path:
    """<root>/image_backbone.onnx: the frozen image backbone (pixels (B, 3, 224, 224) -> grid (B, 49, 1280))."""
    path = Path(root) / BACKBONE
    return path if path.exists() else _exporter("the image backbone graph").export_backbone(root)


def _exporter(what: str):
    """models/export.py, or GraphsUnavailable naming what is missing and how to get it."""
    try:
        return torch_side.module("export", what)
    except torch_side.TorchUnavailable as e:
        raise GraphsUnavailable(str(e)) from None


def ensure_int8_query(graphs: Path, weights: str | None = None) -> Path:
    """<graphs>/query_tower.int8.onnx (int8 weights) or query_tower.int8-u8.onnx (uint8 weights), quantized from
    the fp32 graph once; weights None: the format this host's int8 kernels need (core/int8.py)."""
    fp32 = Path(graphs) / "query_tower.onnx"
    weights = weights or int8.weight_format()
    path = int8.graph_name(fp32, weights)
    if not path.exists():
        log.info("quantizing the query tower to int8 (%s weights) into %s", weights, path)
        try:
            quantize_query_tower(fp32, path, weights=weights)
        except OSError as e:  # a read-only graphs folder (a container image's) without this host's format
            raise GraphsUnavailable(
                f"{path.name} (int8 with {weights} weights, what this host's {int8.kernel_path()} kernels need) is not "
                f"in {path.parent}, and it cannot be written there ({e.strerror}): export it where the folder is "
                f"written (`crossprobe export --int8 {weights}` or --int8 both), or serve fp32"
            ) from None
    return path


# The query tower's MatMuls after the MiniLM layers: small (cheap in fp32) and
# feeding g_q directly, so int8 rounding there costs accuracy for no speed.
QUERY_HEAD_PREFIXES = ("/text/proj", "/text/pool", "/text_in", "/text_probes", "/text_coder")


def quantize_query_tower(src: Path, dst: Path, keep_heads_fp32: bool = True, weights: str = "s8") -> Path:
    """Dynamic int8 quantization of the query tower's MatMul weights (core/int8.py: which weight format a host
    needs). Written to a temp file and renamed."""
    import onnx

    src, dst = Path(src), Path(dst)
    matmuls = [n for n in onnx.load(str(src), load_external_data=False).graph.node if n.op_type == "MatMul"]
    # the head MatMuls, and the class-table MatMul that produces q_cls (region labels) directly
    exclude = (
        [n.name for n in matmuls if n.name.startswith(QUERY_HEAD_PREFIXES) or "q_cls" in n.output]
        if keep_heads_fp32
        else []
    )
    with atomic_path(dst, mode=0o644, unique=True) as tmp:  # as _export
        int8.quantize(src, tmp, weights, exclude)
    return dst
