"""schemathesis hooks for tests/service/test_fuzz.py (loaded by the schemathesis CLI through SCHEMATHESIS_HOOKS).

Two rules of the API that JSON Schema cannot state exactly are written in the OpenAPI document as a custom
format and a vendor extension (service/schemas.py's docstring). schemathesis reads neither, so it takes some
bodies that break them for valid ones, and its positive_data_acceptance check (ST202, "schema-valid request
rejected") would call the service's correct 422s failures. The hooks below, and nothing else, deal with that:

  format "visible-text"  a query must hold a visible character (schemas.QueryText, declared on every query text:
                         /v1/search's and /v1/explain's "query", /knn-service's "text", /v1/search/image's
                         `query` parameter). The strategy below makes fuzzed queries what the format means,
                         with the service's own predicate (schemas.is_invisible): one visible character,
                         anything around it (NUL, zero-width, spaces, private use). The coverage phase builds
                         its strings without format strategies, so filter_failure below also drops an ST202
                         whose 422 says exactly "this query is blank" for a query that is.
  x-constraints          the cross-field and index-dependent rules: /v1/search's "shortlist >= k", "not both
                         image and like" and "min_relevance only with a query alone", /knn-service's "embedding_input has the index's dimension and is not
                         all zeros", /v1/search/image's "filter is JSON text of /v1/search's filter", and a
                         filter condition's own rules (one test; values of the field's type).
                         filter_failure drops an ST202 whose 422 names only such a rule for a request that
                         breaks it, judged with the service's own parser where there is one (the filter); the
                         tests (test_api.py, test_search_features.py, test_filters.py) check those 422s themselves.

And one rule of every route that is not a schema's: a body longer than CROSSPROBE_MAX_BODY_BYTES (1 MiB by
default) is refused with 413 too_large before it is read (BodyGuard; declared as each route's 413). schemathesis
expects 4xx answers of its own list for schema-violating data (ST201), which has no 413, so filter_failure drops
an ST201 or ST202 whose answer is that 413 for a request whose body was, as sent, over the limit the answer
names (a generated filter of 3.6 MB, seed 2114795725).

Every other failure of every check is kept; no check is switched off and no status is added to a check's
expected ones.
"""
from __future__ import annotations

import json
import re

import schemathesis
from hypothesis import strategies as st

from crossprobe.service import query_image
from crossprobe.service.errors import STATUS
from crossprobe.service.exceptions import CrossprobeError
from crossprobe.storage.filter_model import filter_from_json
from crossprobe.service.schemas import is_invisible

_visible_char = st.characters().filter(lambda c: not is_invisible(c))
# <= 101 characters: inside every query field's maxLength (512)
schemathesis.openapi.format("visible-text", st.builds(lambda a, v, b: a + v + b, st.text(max_size=50),
                                                      _visible_char, st.text(max_size=50)))

QUERY_FIELD = {"/v1/search": "query", "/v1/explain": "query", "/knn-service": "text"}


def _int(v) -> int | None:
    # a JSON integer as the service reads it (schemas.JsonInt: 2.0 counts as 2; booleans are not integers)
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    return int(v) if isinstance(v, float) and v.is_integer() else None


def _bad_filter_text(text) -> bool:
    try:
        filter_from_json(text)
    except ValueError:  # pydantic's ValidationError is a ValueError
        return True
    return False


def _not_an_image(value, b64: bool) -> bool:
    """Whether the service's own decoder (query_image) refuses this as an image with a 422."""
    if isinstance(value, str) and not b64:
        value = value.encode("latin-1", "replace")
    try:
        data = query_image.b64_bytes(value, 1 << 30) if b64 else value
        query_image.pixels(data, 1 << 40)
    except CrossprobeError as e:
        return STATUS[e.code] == 422
    except Exception:  # noqa: BLE001 - a value the decoder cannot even take is not an image either
        return True
    return False


def _explained_422(path: str, body, error: dict, query: dict | None = None) -> bool:
    """Whether this 422 is one of the rules above, broken by this request, and nothing else."""
    message = error.get("message", "")
    if path == "/v1/search/image":
        details = error.get("details") or []
        text = (query or {}).get("query")  # the query parameter, QueryText as a JSON body's "query" is
        if details and isinstance(text, str) and is_invisible(text):
            return all(d.get("field") == "query.query" and "blank" in d.get("message", "") for d in details)
        text = (query or {}).get("filter")
        if message.startswith("invalid request: filter: "):
            return isinstance(text, str) and _bad_filter_text(text)
        image = body.get("image") if isinstance(body, dict) else body
        return error.get("code") == "invalid_image" and _not_an_image(image or b"", b64=False)
    if not isinstance(body, dict):
        return False
    if error.get("code") == "invalid_image" and path in ("/v1/search", "/knn-service"):
        return isinstance(body.get("image"), str) and _not_an_image(body["image"], b64=True)
    details = error.get("details") or []
    field = QUERY_FIELD.get(path)
    if field and isinstance(body.get(field), str) and is_invisible(body[field]):
        if path == "/knn-service":  # its own check, no details: "text: send a non-blank ..."
            return not details and "non-blank" in error.get("message", "")
        return bool(details) and all(d.get("field") == field and "blank" in d.get("message", "") for d in details)
    if path == "/knn-service" and all(body.get(f) is None for f in ("text", "image", "embedding_input")):
        return not details and "send a non-blank \"text\", an \"image\" or an \"embedding_input\"" in message
    if path == "/knn-service":
        vec = body.get("embedding_input")
        if isinstance(vec, list) and vec:
            # the numbers compared as numbers: "holds vectors of 64" contains "holds vectors of 6" (a 6-value
            # vector's 422 went unexplained, a failed check with 4 seeds of 5)
            m = re.fullmatch(r"invalid request: embedding_input has (\d+) values; index .+ holds vectors of (\d+)",
                             message)
            wrong_d = m is not None and int(m.group(1)) == len(vec) != int(m.group(2))
            zeros = "must be finite and not all zero" in message and not any(vec)
            return wrong_d or zeros
        return False
    if path == "/v1/search":  # the model's cross-field rules this body breaks, each by its message
        k, shortlist = _int(body.get("k", 10)), _int(body.get("shortlist"))
        broken = []
        if k is not None and shortlist is not None and shortlist < k:
            broken.append("must be >= k")
        if body.get("image") is not None and body.get("like") is not None:
            broken.append("send image or like, not both")
        if all(body.get(f) is None for f in ("query", "image", "like")):
            broken.append("send a query, an image or like (at least one)")
        if body.get("min_relevance") is not None and (body.get("query") is None or body.get("image") is not None
                                                      or body.get("like") is not None):
            broken.append("min_relevance needs a text query alone")
        # a filter condition's own rules (Condition._one_test: one test, values of the field's type, ISO dates)
        # are model validators: a schema-valid condition can break only those, each a "value_error" under filter
        in_filter = [d for d in details if str(d.get("field", "")).startswith("filter")]
        if in_filter and all(d.get("type") == "value_error" for d in in_filter):
            details = [d for d in details if d not in in_filter]
            if not details:
                return True
        return bool(broken) and bool(details) and all(any(b in d.get("message", "") for b in broken)
                                                      for d in details)
    return False


def over_body_limit(status: int, content: bytes, sent: bytes | str | None) -> bool:
    """Whether this answer is BodyGuard's 413 for a body that was, as sent, longer than the limit it names."""
    if status != 413:
        return False
    try:
        error = json.loads(content)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    m = re.fullmatch(r"body of (?:more than )?\d+ bytes; the limit is (\d+)", error.get("message", ""))
    size = len(sent.encode() if isinstance(sent, str) else sent or b"")
    return error.get("code") == "too_large" and m is not None and size > int(m.group(1))


@schemathesis.hook
def filter_failure(ctx, failure, case, response) -> bool:
    """False drops the failure: an ST202 (valid data rejected) that _explained_422 accounts for, or an ST201 /
    ST202 answered with the body limit's 413 for a body over it."""
    if failure.code in ("ST201", "ST202") and over_body_limit(response.status_code, response.content,
                                                                response.request.body):
        return False
    if failure.code != "ST202" or response.status_code != 422:
        return True
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return True
    return not _explained_422(case.operation.path, case.body, error, case.query)
