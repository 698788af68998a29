"""What a family module hands the writer: one model loaded by its own library, and how its reference reads inputs."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch


class TokenizerMismatch(ValueError):
    """The tokenizer.json an export would write does not give the family tokenizer's own ids: nothing is written."""


@dataclass
class FamilyModel:
    """A model ready to export (writer.py). The two towers are torch modules in the graphs' own signature:

        image(pixels (B, 3, S, S))                  -> embedding (B, d), tokens (B, P, W)
        text(input_ids, attention_mask (B, T))      -> embedding (B, d), tokens (B, T, W_t)   (the inputs in
                                                       text_cfg["inputs"]: SigLIP's tower reads the ids only)

    embedding is the library's own image / text embedding (encode_image, get_text_features...), not normalised;
    tokens are the trunk's final token states (patch tokens without the class token), what rerankers read."""

    family: str  # model.json's "family": open_clip | hf_clip | hf_siglip | mclip
    spec: str  # the spec as given
    name: str  # a readable name (architecture / repo)
    source: dict  # what identifies the weights: {"path", "size", "mtime_ns"} of a file, or {"repo", "revision"}
    identity: dict  # the architecture's configuration: part of the fingerprint
    state: dict[str, torch.Tensor]  # every weight the towers use (the fingerprint hashes their bytes)
    image: torch.nn.Module
    text: torch.nn.Module
    image_cfg: dict  # model.json "image" (exported.ImagePreprocess.from_json reads it)
    text_cfg: dict  # model.json "text": context_length, pad_id, pad_token, pad_to_context, clean, lowercase, inputs
    tokenizer_json: str  # the `tokenizers` file
    reference_ids: Callable[[str], list[int]]  # one text -> the family tokenizer's own ids, padded as it pads one text
    versions: dict = field(default_factory=dict)  # the libraries it was exported with
    # the text embedding does not depend on padding past a batch's longest text (a causal tower pooling at its end
    # token): the text graph is exported with a free token axis and queries run at their own length
    # (model.json "trims_padding"; not in the fingerprint: the same weights give the same vectors either way)
    trims_padding: bool = False


@contextmanager
def captured(module: torch.nn.Module) -> Iterator[dict]:
    """{"out": module's output} of its forward calls while open: reads a tower's token states while the library's
    own encode function runs (a forward hook, which tracing for ONNX follows like any other op)."""
    box: dict = {}
    handle = module.register_forward_hook(lambda _m, _i, out: box.__setitem__("out", out))
    try:
        yield box
    finally:
        handle.remove()


def versions(*modules) -> dict:
    """{name: version} of torch and the given library modules."""
    return {m.__name__: getattr(m, "__version__", "?") for m in (torch, *modules)}
