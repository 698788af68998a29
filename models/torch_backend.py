"""crossprobe's own model behind the inference seam, run by PyTorch on a device: the GPU path (CROSSPROBE_DEVICE=cuda).

The machines with a GPU that this project is lent carry torch with CUDA but not onnxruntime-gpu, so there the
query tower, the image encoder (backbone + image tower) and the rerankers run as the PyTorch modules the ONNX
graphs are exported from (models/graphs.py: QueryGraph, ImageGraph, CPScorer, TemdeScorer), in fp32, or in fp16 / bf16
(`precision`) by autocast: the weights stay fp32 and each operation runs in the precision autocast gives it (matrix
products and convolutions in half precision, reductions and softmax in fp32). Converting the modules to half instead
fails where the model upcasts on purpose (the label bridge's ImageNet logits: a float grid against half weights).
Where onnxruntime-gpu is installed, inference.load() keeps the ONNX graphs and runs them on ONNX Runtime's CUDA
provider instead (crossprobe.py). The explain maps and the text gate stay on the CPU path: the
first is rare, the second is one product over the grid.

Inputs and outputs are numpy on the host, as for every backend: a shortlist's features come from the feature
store per query, and the answers go back to the host for the response.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from crossprobe.core import inputs
from crossprobe.core.inference.base import ImageFeatures, ImageGrid, QueryVectors, RuntimeOptions
from crossprobe.core.inference.crossprobe import CrossprobeBackend
from crossprobe.core.inference.layout import FeatureDims

PRECISIONS = ("fp32", "fp16", "bf16")


class TorchCrossprobeBackend(CrossprobeBackend):
    def __init__(self, ckpt: Path | None, opts: RuntimeOptions, identity: tuple[str, FeatureDims] | None = None):
        import torch

        super().__init__(ckpt, opts, identity)
        self.device = torch.device(opts.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"CROSSPROBE_DEVICE={opts.device}: PyTorch sees no CUDA device "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})"
            )
        if opts.precision not in PRECISIONS:
            raise ValueError(f"precision {opts.precision!r}: one of {PRECISIONS}")
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[opts.precision]
        self.query_precision = opts.precision

    @property
    def providers(self) -> list[str]:
        return [f"torch:{self.device}"]

    def _session(self, path: Path):
        """The parts left to ONNX Runtime (the explain maps) run on its CPU provider: this path is for machines
        whose ONNX Runtime has no CUDA provider."""
        from crossprobe.core import runtime

        return runtime.session(path, self.opts.threads, self.opts.spinning, "cpu")

    def device_name(self) -> str:
        import torch

        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"

    def warm(self, *parts: str) -> None:
        for p in parts:
            if p in ("search", "image"):
                self._modules()
                if p == "image":
                    self._backbone_module()
            elif p == "explain":
                self.explainer()
            else:
                raise ValueError(f"unknown part {p!r} (search, image, explain)")

    def _modules(self) -> dict:
        """The graphs' modules of the checkpoint, on the device in the chosen precision (loaded once)."""

        def make():
            from crossprobe.models import checkpoint
            from crossprobe.models.graphs import CPScorer, ImageGraph, QueryGraph, TemdeScorer

            model = self.opts.model or checkpoint.load(self.ckpt, self.opts.bert, references=False)[0]
            model = model.eval().to(self.device)  # fp32 weights: fp16 / bf16 by autocast (_run)
            return {
                "query": QueryGraph(model),
                "image": ImageGraph(model),
                "cp": CPScorer(model),
                "temde": TemdeScorer(model),
                "tokenizer": inputs.load_tokenizer(),
            }

        return self._part("torch", make)

    def _backbone_module(self):
        def make():
            from crossprobe.models import backbones

            return (self.opts.extra.get("backbone") or backbones.ImageBackbone()).eval().to(self.device)

        return self._part("torch_backbone", make)

    def _run(self, module, *arrays):
        """Host arrays in, host float32 (or integer) arrays out."""
        import torch

        half = self.dtype != torch.float32
        with torch.inference_mode(), torch.autocast(self.device.type, self.dtype, enabled=half):
            args = [self._tensor(a) for a in arrays]
            out = module(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [o.float().cpu().numpy() if o.is_floating_point() else o.cpu().numpy() for o in out]

    def _tensor(self, a):
        import torch

        if a is None:
            return None
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)  # autocast casts where it computes

    # ---- the three paths ---------------------------------------------------------------------------------
    def image_grid(self, pixels: np.ndarray) -> ImageGrid:
        return ImageGrid(self._run(self._backbone_module(), np.asarray(pixels, np.float32))[0])

    def image_features(self, grid: ImageGrid) -> ImageFeatures:
        g, p_v, b_bar, s_i, *labels = self._run(self._modules()["image"], grid.cells)
        g = g / np.linalg.norm(g, axis=1, keepdims=True)  # unit norm in fp32 whatever the precision ran in
        return ImageFeatures(g.astype(np.float32), p_v, b_bar, s_i, labels[0] if labels else None)

    def encode_texts(self, texts: list[str]) -> list[QueryVectors]:
        m = self._modules()
        ids, mask = inputs.tokenize(m["tokenizer"], texts)
        g, p_t, w_bar, s_q, *q_cls = self._run(m["query"], ids, mask)
        g = g / np.linalg.norm(g, axis=1, keepdims=True)
        return [QueryVectors(g[i], p_t[i], w_bar[i], s_q[i], q_cls[0][i] if q_cls else None) for i in range(len(texts))]

    def rerank(self, kind: str, q: QueryVectors, feats: dict[str, np.ndarray], s_tt: np.ndarray) -> np.ndarray:
        m = self._modules()
        region = m[kind].on
        extra: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
        if region:
            assert q.q_cls is not None, "a query tower with region labels gives q_cls"
            extra = (q.q_cls[None], feats["labels"])
        args: tuple[np.ndarray | None, ...]
        if kind == "cp":
            assert q.p_t is not None and q.w_bar is not None, "the query tower gives Cross-probe's p_t and w_bar"
            args = (q.p_t[None], q.w_bar[None], feats["p_v"], feats["b_bar"], np.asarray(s_tt, np.float32), *extra)
        elif kind == "temde":
            assert q.s_q is not None, "the query tower gives T-EMDE's s_q"
            args = (q.s_q[None], feats["s_i"], np.asarray(s_tt, np.float32), *extra)
        else:
            raise ValueError(f"unknown reranker {kind!r}")
        return self._run(m[kind], *args)[0]


@functools.lru_cache(maxsize=1)
def numpy_module(module):
    """A PyTorch module as a function of numpy arrays (in eval mode, without autograd): float32 in, numpy out."""
    import torch

    module.eval()

    def run(*arrays):
        with torch.inference_mode():
            out = module(*(torch.from_numpy(np.asarray(a, np.float32)) for a in arrays))
        return [o.numpy() for o in out] if isinstance(out, (tuple, list)) else out.numpy()

    return run
