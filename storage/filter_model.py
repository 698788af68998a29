"""The metadata filter's condition tree: what /v1/search's "filter" holds, what the ANN backends translate
(storage/ann/: a FAISS row bitmap through storage/filter_columns.py, a Milvus expression through
milvus_filter.py).

It lives in the storage layer, below both the service (which validates requests with it) and the backends
(which read it), so neither depends on the other.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, model_validator

EPOCH = datetime(1970, 1, 1)


def parse_date(v: Any) -> float | None:
    """An ISO 8601 date or datetime -> seconds since 1970 (wall clock: a zone, when given, is dropped, as EXIF
    dates have none); anything else -> None."""
    if not isinstance(v, str) or not 8 <= len(v) <= 40:
        return None
    try:
        d = datetime.fromisoformat(v)
    except ValueError:
        return None
    return (d.replace(tzinfo=None) - EPOCH).total_seconds()


Finite = Annotated[float, Field(allow_inf_nan=False)]
FilterValue = Annotated[str, Field(max_length=1024)] | bool | Finite
Bound = Finite | Annotated[str, Field(min_length=8, max_length=40)]  # a number, or an ISO 8601 date / datetime
FieldName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
MAX_FILTER_CONDITIONS = 64  # conditions in one filter tree, all levels together
FILTER_NUMERIC = ("width", "height")
FILTER_STRINGS = ("tags", "format", "camera", "caption")


class Condition(BaseModel):
    """One field's test. Exactly one of: eq, in, or a range (gt / gte / lt / lte, combinable). Fields: tags (eq =
    has the tag, in = has any), format and camera (case-insensitive), caption, width, height, taken and added
    (ranges of ISO dates), or any scalar field of the index's manifest (strings, numbers, true / false; ranges of
    numbers or
    of ISO dates). A field that no item of the index has: 422."""

    model_config = ConfigDict(extra="forbid", strict=True)

    field: FieldName
    eq: FilterValue | None = None
    in_: list[FilterValue] | None = Field(None, alias="in", min_length=1, max_length=256)
    gt: Bound | None = None
    gte: Bound | None = None
    lt: Bound | None = None
    lte: Bound | None = None

    @model_validator(mode="after")
    def _one_test(self) -> "Condition":
        bounds = [v for v in (self.gt, self.gte, self.lt, self.lte) if v is not None]
        given = (self.eq is not None) + (self.in_ is not None) + bool(bounds)
        if given != 1:
            raise ValueError("a condition needs exactly one of eq, in, or a range (gt / gte / lt / lte)")
        values = [self.eq] if self.eq is not None else (self.in_ or [])
        dated = [b for b in bounds if isinstance(b, str)]
        f = self.field
        if f in FILTER_STRINGS and bounds:
            raise ValueError(f"{f}: ranges are for numbers (width, height) and dates (taken)")
        if f in FILTER_STRINGS and any(not isinstance(v, str) for v in values):
            raise ValueError(f"{f}: compare with strings")
        if f in FILTER_NUMERIC and (dated or any(isinstance(v, (str, bool)) for v in values)):
            raise ValueError(f"{f}: compare with numbers")
        if f in ("taken", "added") and (values or len(dated) != len(bounds)):
            raise ValueError(f'{f}: a range (gt / gte / lt / lte) of ISO dates, e.g. {{"gte": "2019-05-01"}}')
        if dated and len(dated) != len(bounds):
            raise ValueError(f"{f}: a range's bounds are all numbers or all ISO dates")
        if any(parse_date(b) is None for b in dated):
            raise ValueError(
                f"{f}: {next(b for b in dated if parse_date(b) is None)!r} is not an ISO 8601 date "
                "(YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS)"
            )
        return self


class AllOf(BaseModel):
    """Every child holds (AND)."""

    model_config = ConfigDict(extra="forbid")
    and_: list["FilterNode"] = Field(alias="and", min_length=1, max_length=MAX_FILTER_CONDITIONS)


class AnyOf(BaseModel):
    """At least one child holds (OR)."""

    model_config = ConfigDict(extra="forbid")
    or_: list["FilterNode"] = Field(alias="or", min_length=1, max_length=MAX_FILTER_CONDITIONS)


def _filter_kind(v: Any) -> str:
    """Which of the three a filter node is, so a bad node gets the errors of its own kind only."""
    keys = set(v) if isinstance(v, dict) else set(vars(v)) if isinstance(v, BaseModel) else set()
    return "and" if keys & {"and", "and_"} else "or" if keys & {"or", "or_"} else "condition"


FilterNode = Annotated[
    Annotated[Condition, Tag("condition")] | Annotated[AllOf, Tag("and")] | Annotated[AnyOf, Tag("or")],
    Discriminator(_filter_kind),
]
AllOf.model_rebuild()
AnyOf.model_rebuild()


def count_conditions(node) -> int:
    children = getattr(node, "and_", None) or getattr(node, "or_", None)
    return 1 if children is None else sum(count_conditions(c) for c in children)


_FILTER = TypeAdapter(FilterNode)


def filter_from_json(text: str):
    """A filter tree sent as JSON text (POST /v1/search/image's `filter` parameter) -> the typed tree, with the
    same rules as /v1/search's body; ValueError (pydantic's ValidationError is one) when it breaks one."""
    node = _FILTER.validate_json(text)
    if count_conditions(node) > MAX_FILTER_CONDITIONS:
        raise ValueError(f"more than {MAX_FILTER_CONDITIONS} conditions")
    return node
