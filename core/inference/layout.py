"""The one definition of the features a model gives per image, and of their sizes.

A backend (base.py) turns an image into

    g       (d,)          unit norm: the two-tower vector the ANN index holds
    p_v     (n, dc)       the vision probes (Cross-probe)                  \
    b_bar   (dc,)         the mean projected region (Cross-probe)           |  the item's value in the feature
    s_i     (nk,)         the T-EMDE sketch (N * K)                         |  store (storage/codec.py
    labels  (cells,)      the head's class per grid cell (region labels)   /   lays these out in bytes)

FeatureDims holds those sizes; ItemDims the part the feature store keeps per item. An index version records
them in its manifest.json as "dims" (FeatureDims.manifest / from_manifest: the only code that writes or reads
that entry). A two-tower-only model (no trained rerankers) has n = dc = nk = cells = 0.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ItemDims:
    """Sizes of one item's reranker features (what the feature store keeps per item)."""

    n: int  # vision probes
    dc: int  # probe width
    nk: int  # T-EMDE sketch size N * K
    cells: int = 0  # region labels per item (49 grid cells) when the model has them

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each stored field's shape, in the stored order."""
        return {"p_v": (self.n, self.dc), "b_bar": (self.dc,), "s_i": (self.nk,)}


@dataclass(frozen=True)
class FeatureDims:
    """Sizes of everything a model gives per image: the two-tower width and the item's reranker features."""

    d: int  # two-tower width (g)
    item: ItemDims

    def manifest(self) -> dict:
        """The manifest's "dims" entry."""
        i = self.item
        return {"g": self.d, "p_v": [i.n, i.dc], "b_bar": i.dc, "s_i": i.nk, "labels": i.cells}

    @classmethod
    def from_manifest(cls, m: dict) -> "FeatureDims":
        """A manifest's "dims" entry (no "labels" before region labels: format 1) -> FeatureDims."""
        return cls(m["g"], ItemDims(m["p_v"][0], m["p_v"][1], m["s_i"], m.get("labels", 0)))
