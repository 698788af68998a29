"""Which crossprobe this is, and what earlier releases shipped: what a manifest records as its writer, and what
a refusal names when an index comes from another release.

The version has one source, pyproject.toml, read from the installed distribution's metadata (`make venv`
reinstalls when pyproject.toml changes, and so does the image's build).
"""

from __future__ import annotations

from functools import cache
from importlib import metadata


@cache
def version() -> str:
    """The installed crossprobe's version ("unknown" when run from a tree that was never installed)."""
    try:
        return metadata.version("crossprobe")
    except metadata.PackageNotFoundError:
        return "unknown"


# fingerprint -> the release whose committed checkpoint (`crossprobe:`, models/checkpoints/default) it is: an index
# built with an earlier default model is then named by its release, not by a hash its user never saw
RELEASED_CHECKPOINTS = {
    "af8bbd6b7043b70b": "0.1.0",
    "a38b96920f1adc57": "0.2.0",  # 0.1.0's weights with region labels in the reranker (each item stores 49 labels)
}


def checkpoint_release(fingerprint: str) -> str | None:
    return RELEASED_CHECKPOINTS.get(fingerprint)
