"""Domain exceptions: what went wrong, in the service's terms, with no HTTP in them.

Code below the HTTP layer (the pipeline, the registry, the model runners, security's checks, the
query-image reader) raises these; service/errors.py is the one place that maps them, and the storage
layer's own exceptions (AnnUnavailable, FeatureStoreUnavailable, a Redis failure), to HTTP answers.
Each carries the stable `code` clients branch on (docs/api.md lists them).
"""

from __future__ import annotations

from typing import Any


class CrossprobeError(Exception):
    code = "internal"

    def __init__(self, message: str, details: Any = None, retry_after_s: int | None = None):
        super().__init__(message)
        self.message, self.details, self.retry_after_s = message, details, retry_after_s


# -- the request is wrong ------------------------------------------------------------------------------------
class InvalidRequest(CrossprobeError):
    """A body or parameter fails validation."""

    code = "invalid_request"


class Unsupported(CrossprobeError):
    """A valid request for something this service does not offer (image_url, a text index)."""

    code = "unsupported"


class InvalidImage(CrossprobeError):
    """A query image that is not base64 or not a readable image."""

    code = "invalid_image"


class TooLarge(CrossprobeError):
    """A body or query image over its limit."""

    code = "too_large"


class NoReranker(CrossprobeError):
    """The request names a reranker the served model has no trained head for (a two-tower-only model)."""

    code = "reranker_unavailable"


class NoExplainMaps(CrossprobeError):
    """/v1/explain on a model that has no explain maps (a family model: no Cross-probe attention to show)."""

    code = "explain_unavailable"


# -- what it names does not exist ---------------------------------------------------------------------------
class IndexNotFound(CrossprobeError):
    code = "index_not_found"


class ItemNotFound(CrossprobeError):
    code = "item_not_found"


class ImageUnavailable(CrossprobeError):
    """The indexed file is gone or unreadable."""

    code = "image_unavailable"


# -- who may ask ----------------------------------------------------------------------------------------------
class Unauthorized(CrossprobeError):
    """The route's key header is missing; `scheme` is the challenge a client should answer."""

    code = "unauthorized"

    def __init__(self, message: str, scheme: str):
        super().__init__(message)
        self.scheme = scheme


class Forbidden(CrossprobeError):
    code = "forbidden"


class AdminDisabled(CrossprobeError):
    code = "admin_disabled"


class RateLimited(CrossprobeError):
    code = "rate_limited"


class Overloaded(CrossprobeError):
    """The admission queue is full."""

    code = "overloaded"


# -- the service cannot answer now ---------------------------------------------------------------------------
class NotReady(CrossprobeError):
    """Models or indexes are still loading."""

    code = "not_ready"

    def __init__(self, message: str):
        super().__init__(message, retry_after_s=1)


class IndexUnavailable(CrossprobeError):
    """The index's active version was refused (fingerprint, a failed load)."""

    code = "index_unavailable"
