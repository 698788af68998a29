"""Fixed binary layout of one item's cached image features in Redis.

One value per item holds P_v (n, dc), b_bar (dc,), s_I (N*K,) and, when the model
has region labels, the head's class id of each of the 49 grid cells, so a shortlist
of K candidates is one MGET and `decode` turns the K values into three arrays
with one np.frombuffer (a numpy structured dtype *is* the layout).

  float16: p_v f2[n,dc] | b_bar f2[dc] | s_i f2[nk]                 (2*(n*dc+dc+nk) bytes)
  int8:    p_v_scale f4[n] | b_bar_scale f4 | s_i_scale f4 |
           p_v i1[n,dc] | b_bar i1[dc] | s_i i1[nk]                 (symmetric, one scale per vector:
                                                                     each probe row, b_bar, the sketch)
  both, with region labels (format 2): ... | labels u2[cells]       (class ids 0..999, exact; 98 bytes)
  a two-tower-only model (ItemDims all 0): no field, 0 bytes; the jobs store no such value (nothing to
  fetch: a search of that model never reranks), and a reader gives K empty arrays without asking Redis
Little-endian throughout. The header (manifest.json "layout") lets any reader,
in any language, decode without this module. Format 1 (no labels) still decodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from crossprobe.core.inference.layout import ItemDims

FORMAT = 2
FORMATS = (1, 2)  # 1: before region labels (cells = 0)
FIELDS = ("p_v", "b_bar", "s_i")


@dataclass(frozen=True)
class Layout:
    """The bytes of one item's value: the model's item features (ItemDims: the one definition of their sizes,
    crossprobe.core.inference.layout) stored in `quantization`."""

    quantization: str  # "float16" | "int8"
    item: ItemDims

    @property
    def cells(self) -> int:  # region labels per item (49 grid cells), 0 = none (format 1)
        return self.item.cells

    @property
    def empty(self) -> bool:
        """No item features at all (a two-tower-only model): values of 0 bytes, not stored."""
        return self.item == ItemDims(0, 0, 0, 0)

    def dtype(self) -> np.dtype:
        sh = self.item.shapes()
        if self.empty:  # int8's scales would be 8 bytes of nothing
            return np.dtype([])
        labels = [("labels", "<u2", (self.cells,))] if self.cells else []
        if self.quantization == "float16":
            return np.dtype([(f, "<f2", sh[f]) for f in FIELDS] + labels)
        if self.quantization == "int8":
            scales = [("p_v_scale", "<f4", (self.item.n,)), ("b_bar_scale", "<f4"), ("s_i_scale", "<f4")]
            return np.dtype(scales + [(f, "i1", sh[f]) for f in FIELDS] + labels)
        raise ValueError(f"unknown quantization {self.quantization!r} (float16 or int8)")

    @property
    def itemsize(self) -> int:
        return self.dtype().itemsize

    def header(self) -> dict:
        dt = self.dtype()
        dt_fields = dt.fields
        assert dt.names is not None and dt_fields is not None  # a structured dtype, empty or not
        fields = []
        for name in dt.names:
            sub, offset = dt_fields[name][:2]
            base, shape = sub.subdtype if sub.subdtype else (sub, ())
            fields.append({"name": name, "dtype": base.str, "shape": list(shape), "offset": offset})
        i = self.item
        head = {
            "format": FORMAT if self.cells else 1,
            "quantization": self.quantization,
            "n": i.n,
            "dc": i.dc,
            "nk": i.nk,
            "itemsize": dt.itemsize,
            "fields": fields,
        }
        return {**head, "cells": self.cells} if self.cells else head

    @classmethod
    def from_header(cls, h: dict) -> "Layout":
        if h.get("format") not in FORMATS:
            raise ValueError(f"feature layout format {h.get('format')} is not supported (expected one of {FORMATS})")
        lay = cls(h["quantization"], ItemDims(h["n"], h["dc"], h["nk"], int(h.get("cells", 0))))
        if lay.itemsize != h["itemsize"]:
            raise ValueError("feature layout header disagrees with its own field sizes")
        return lay


def _quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 over the last axis: (..., D) -> int8 (..., D), scale (...) with x ~ q * scale."""
    scale = np.abs(x).max(-1) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8)
    return q, scale


def encode(
    layout: Layout, p_v: np.ndarray, b_bar: np.ndarray, s_i: np.ndarray, labels: np.ndarray | None = None
) -> list[bytes]:
    """p_v (B, n, dc), b_bar (B, dc), s_i (B, nk) float32 [, labels (B, cells) ints] -> B values of
    layout.itemsize bytes."""
    B = len(p_v)
    if layout.empty:  # a two-tower-only model: nothing to store (and int8 has nothing to scale)
        return [b""] * B
    arr = np.zeros(B, layout.dtype())
    if layout.cells:
        lab = np.asarray(labels) if labels is not None else None
        if lab is None or lab.shape != (B, layout.cells) or lab.min(initial=0) < 0 or lab.max(initial=0) > 65535:
            raise ValueError(
                f"labels: the layout expects (B={B}, {layout.cells}) class ids, got "
                f"{None if lab is None else lab.shape}"
            )
        arr["labels"] = lab
    elif labels is not None:
        raise ValueError("labels given for a layout without region labels")
    vals = {"p_v": p_v, "b_bar": b_bar, "s_i": s_i}
    for f, shape in layout.item.shapes().items():
        v = np.asarray(vals[f], np.float32)
        if v.shape != (B, *shape):
            raise ValueError(f"{f}: shape {v.shape}, layout expects {(B, *shape)}")
        if layout.quantization == "int8":
            arr[f], arr[f + "_scale"] = _quantize(v)
        else:
            arr[f] = v
    return [arr[i].tobytes() for i in range(B)]


def decode(layout: Layout, values: Sequence[bytes | None]) -> dict[str, np.ndarray]:
    """K values (e.g. one MGET) -> {"p_v": (K, n, dc), "b_bar": (K, dc), "s_i": (K, nk)} float32
    [+ "labels": (K, cells) int64 with region labels]."""
    size = layout.itemsize
    if layout.empty:  # nothing stored: K items of empty fields
        return {f: np.zeros((len(values), *shape), np.float32) for f, shape in layout.item.shapes().items()}
    present: list[bytes] = []
    for i, v in enumerate(values):
        if v is None or len(v) != size:
            raise ValueError(f"value {i}: {None if v is None else len(v)} bytes, layout expects {size}")
        present.append(v)
    arr = np.frombuffer(b"".join(present), layout.dtype(), count=len(values))
    out = {}
    for f in FIELDS:
        x = arr[f].astype(np.float32)
        if layout.quantization == "int8":
            s = arr[f + "_scale"].astype(np.float32)
            x = x * s.reshape(s.shape + (1,))
        out[f] = x
    if layout.cells:
        out["labels"] = arr["labels"].astype(np.int64)
    return out
