"""schemathesis hooks for tests/service/test_fuzz.py (loaded by the schemathesis CLI through SCHEMATHESIS_HOOKS).

Two rules of the API that JSON Schema cannot state exactly are written in the OpenAPI document as a custom
format and a vendor extension (service/schemas.py's docstring). schemathesis reads neither, so it takes some
bodies that break them for valid ones, and its positive_data_acceptance check (ST202, "schema-valid request
rejected") would call the service's correct 422s failures. The hooks below, and nothing else, deal with that:

  format "visible-text"  a query must hold a visible character. The strategy below makes fuzzed queries
                         what the format means, with the service's own predicate (schemas.is_invisible):
                         one visible character, anything around it (NUL, zero-width, spaces). The coverage
                         phase builds its strings without format strategies, so filter_failure below also
                         drops an ST202 whose 422 says exactly "this query is blank" for a query that is.
  x-constraints          /v1/search's "shortlist >= k": filter_failure drops an ST202 whose 422 names only that
                         rule for a body that breaks it (tests/service/test_api.py checks that 422 itself).

Every other failure of every check is kept; no check is switched off and no status is added to a check's
expected ones.
"""
from __future__ import annotations

import json

import schemathesis
from hypothesis import strategies as st

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


def _explained_422(path: str, body, error: dict) -> bool:
    """Whether this 422 is one of the two rules above, broken by this body, and nothing else."""
    if not isinstance(body, dict):
        return False
    details = error.get("details") or []
    field = QUERY_FIELD.get(path)
    if field and isinstance(body.get(field), str) and is_invisible(body[field]):
        if path == "/knn-service":  # its own check, no details: "text: send a non-blank ..."
            return not details and "non-blank" in error.get("message", "")
        return bool(details) and all(d.get("field") == field and "blank" in d.get("message", "") for d in details)
    if path == "/v1/search":
        k, shortlist = _int(body.get("k", 10)), _int(body.get("shortlist"))
        if k is not None and shortlist is not None and shortlist < k:
            return bool(details) and all("shortlist" in d.get("message", "") and "must be >= k" in d["message"]
                                         for d in details)
    return False


@schemathesis.hook
def filter_failure(ctx, failure, case, response) -> bool:
    """False drops the failure: only an ST202 (valid data rejected) that _explained_422 accounts for."""
    if failure.code != "ST202" or response.status_code != 422:
        return True
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return True
    return not _explained_422(case.operation.path, case.body, error)
