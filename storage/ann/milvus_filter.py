"""storage/filter_columns.py's condition tree -> a Milvus boolean expression over the collection's scalar
fields.

The same meaning as the FAISS path's columns (storage/filter_columns.py Columns), field by field:
  tags     ARRAY<VARCHAR>, [] when none   eq: ARRAY_CONTAINS(tags, "t")   in: ARRAY_CONTAINS_ANY(tags, [...])
  format   VARCHAR, lower-cased, nullable eq / in, compared lower-cased (case-insensitive)
  caption  VARCHAR, nullable              eq / in, exact text
  width, height  DOUBLE, nullable         ==, in, >, >=, <, <= (null matches nothing, as NaN does there)
"Nullable" is how the collection says "not recorded", in one of two ways (milvus_backend.py's SCHEMA):
  flags (schema 2, every collection written since 0.1.0): each of format, caption, width, height is a plain field
        with a BOOL has_<field> beside it, and a condition on it reads (has_<field> == true and ...). Milvus
        servers before 2.5 have no nullable fields (a 2.3 server takes the schema and refuses the rows), and
        2.3's parser takes a BOOL field only in a comparison (`has_width` alone: "not a boolean expression").
  nulls (schema 1, collections of 0.1.0): nullable fields (Milvus 2.5+, milvus-lite); a null fails every test.
Tags are compared as str(tag) on both sides, as Columns does. A value that cannot match anything stored
(NaN or infinity for a number) becomes NOTHING, an expression no row passes.

String literals are written by `literal`, not by a JSON encoder: Milvus's parser knows \\ \" \n \r \t but no
\\u or \\x escapes (milvus-lite 3.2 answers "unknown escape sequence"), so other characters go in raw.
"""

from __future__ import annotations

import math

from crossprobe.storage.ann.base import UnsupportedFilter

NOTHING = "row < 0"  # rows are >= 0: no row passes (Milvus has no false literal in every version)
NUMERIC = ("width", "height")
OPTIONAL = ("format", "caption", *NUMERIC)  # fields an item may lack: a has_<field> flag each (schema 2)
_ESC = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(s: str) -> str:
    return '"' + "".join(_ESC.get(ch, ch) for ch in s) + '"'


def number(x: float) -> str:
    """A finite number as Milvus reads it (repr would give '1e+20', which its parser takes too; keep it plain)."""
    x = float(x)
    return repr(int(x)) + ".0" if x.is_integer() and abs(x) < 1e15 else repr(x)


def _list(items: list[str]) -> str:
    return "[" + ", ".join(items) + "]"


def expression(node, flags: bool = True) -> str:
    """A filter tree (filter_model.Condition / AllOf / AnyOf, or any object with the same attributes) -> expr.
    flags: the collection marks missing values with has_<field> flags (schema 2), else with nulls (schema 1)."""
    if getattr(node, "and_", None) is not None:
        return "(" + " and ".join(expression(c, flags) for c in node.and_) + ")"
    if getattr(node, "or_", None) is not None:
        return "(" + " or ".join(expression(c, flags) for c in node.or_) + ")"
    out = _condition(node)
    if flags and node.field in OPTIONAL and out != NOTHING:
        return f"(has_{node.field} == true and {out})"
    return out


def _condition(c) -> str:
    f = c.field
    values = [c.eq] if c.eq is not None else list(c.in_) if c.in_ is not None else None
    if f == "tags":
        assert values is not None  # strings are compared with eq or in (Condition's validator: no ranges)
        tags = [literal(str(t)) for t in values]
        return f"ARRAY_CONTAINS(tags, {tags[0]})" if len(tags) == 1 else f"ARRAY_CONTAINS_ANY(tags, {_list(tags)})"
    if f in ("format", "caption"):
        assert values is not None  # as tags
        vals = [str(v).lower() if f == "format" else str(v) for v in values]
        return f"{f} in {_list([literal(v) for v in dict.fromkeys(vals)])}"
    if f not in NUMERIC:  # camera, taken and manifest fields live only in Redis metadata, not in the collection
        raise UnsupportedFilter(
            f"field {f!r} is not filterable on this index version: it is held by Milvus, "
            "whose collection stores tags, format, caption, width and height"
        )
    if values is not None:
        nums = [number(v) for v in values if math.isfinite(float(v))]
        if not nums:
            return NOTHING
        return f"{f} == {nums[0]}" if len(nums) == 1 else f"{f} in {_list(nums)}"
    parts = [
        f"{f} {op} {number(b)}" for b, op in ((c.gt, ">"), (c.gte, ">="), (c.lt, "<"), (c.lte, "<=")) if b is not None
    ]
    return "(" + " and ".join(parts) + ")"


def exclude(expr: str, rows: list[int]) -> str:
    """expr and not one of these rows (the "like" items, never results)."""
    if not rows:
        return expr
    out = f"row not in {_list([str(int(r)) for r in rows])}"
    return out if not expr else f"({expr}) and {out}"
