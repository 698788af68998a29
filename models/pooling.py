"""The towers' pooling choice for the two-tower vector: SEAM self-attentive
pooling ("sap", multi-hop when hops > 1) or T-EMDE sketch pooling ("temde")."""

from __future__ import annotations

from crossprobe.models.layers import SelfAttentivePooling
from crossprobe.models.temde import TemdePool

POOLS = ("sap", "temde")


def make_pool(kind: str, d: int, hops: int = 1) -> SelfAttentivePooling | TemdePool:
    """-> a module mapping (B, T, d), (B, T) mask to (B, d), with a `.penalty` attribute."""
    if kind == "sap":
        return SelfAttentivePooling(d, hops)
    if kind == "temde":
        return TemdePool(d)
    raise ValueError(f"pool must be one of {POOLS}, not {kind!r}")
