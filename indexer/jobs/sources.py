"""Reader stage: a folder, a JSONL manifest or an index version -> an ordered list of items with stable ids.

Manifest line: {"id": str, "uri": local path, "caption"?: str, "tags"?: [str], <field>?: scalar, ...}.
Any other key is a filterable field of the item (an album, a year, a rating: indexer/storage/filter_columns.py) when its
value is a string, number or boolean and its name a plain identifier; "taken" (an ISO date) and "camera"
override what the file's EXIF says. A nested value or an odd name makes the line a bad_manifest_line skip
(counted in the report), not a silently dropped field.
Relative uris are resolved against the manifest's folder. A folder is walked
recursively in sorted order; an item's id is its path relative to the folder,
posix style, so the same file keeps its id across machines and rebuilds.
Duplicate ids keep the first occurrence (an index holds exactly one entry per id).
An index version (reindex) gives back its items as it recorded them: each item's
metadata value (written when it was built or added) holds its id, uri, caption, tags, fields.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# keys the indexer writes itself: a manifest field of that name would shadow them (taken / camera may: a user's
# own date or camera beats a missing or wrong EXIF tag)
RESERVED = {"id", "uri", "caption", "tags", "fields", "width", "height", "format"}
MAX_FIELDS = 64
MAX_FIELD_CHARS = 1024


def manifest_fields(d: dict) -> dict:
    """A manifest line's extra keys -> {name: str | int | float | bool}; ValueError says what is wrong."""
    out = {}
    for k, v in d.items():
        if k in RESERVED:
            continue
        if not FIELD_RE.match(k):
            raise ValueError(f"field name {k[:80]!r}: use letters, digits and '_' (max 64, not starting with a digit)")
        if isinstance(v, float) and not math.isfinite(v):  # json.loads reads NaN / Infinity
            raise ValueError(f"field {k}: not a finite number")
        if not isinstance(v, (str, int, float, bool)):
            raise ValueError(f"field {k}: a string, number or boolean (nested values and null are not filterable)")
        if isinstance(v, str) and len(v) > MAX_FIELD_CHARS:
            raise ValueError(f"field {k}: longer than {MAX_FIELD_CHARS} characters")
        out[k] = v
    if len(out) > MAX_FIELDS:
        raise ValueError(f"{len(out)} fields: at most {MAX_FIELDS} per item")
    return out


@dataclass
class Item:
    id: str
    uri: str
    caption: str | None = None
    tags: list[str] = field(default_factory=list)
    fields: dict = field(default_factory=dict)  # the manifest's other scalar keys (manifest_fields)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> "Item":
        return cls(**json.loads(line))


@dataclass
class Skip:
    id: str
    uri: str
    reason: str  # missing | empty | not_image | oversized | truncated | corrupt | bad_manifest_line | duplicate_id
    #              | no_source (reindex: the old version has no metadata value for the item)
    error: str = ""


def walk_folder(folder: Path) -> list[Item]:
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} does not exist")
    items = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()  # deterministic walk: same order, same batches, on every run
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if p.suffix.lower() in IMAGE_EXTS:
                items.append(Item(id=p.relative_to(folder).as_posix(), uri=str(p)))
    return items


def item_metadata(item: Item, facts: dict) -> dict:
    """An item's metadata value in Redis: what the manifest said and what the decoder read off the file
    (width, height, format, and EXIF taken / camera where present). A manifest's own "taken" / "camera" win
    over EXIF's at the top level; every manifest field is also kept as given under "fields" (what a reindex
    reads back, and never shadowing the indexer's own keys)."""
    own = {k: item.fields[k] for k in ("taken", "camera") if k in item.fields}
    m = {"id": item.id, "uri": item.uri, **facts, **own, "caption": item.caption, "tags": item.tags}
    if item.fields:
        m["fields"] = dict(item.fields)
    return m


def read_manifest(path: Path) -> tuple[list[Item], list[Skip]]:
    path = Path(path).resolve()
    items, bad = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                uri = Path(d["uri"])
                tags = d.get("tags") or []
                if not isinstance(d["id"], str) or not d["id"] or not isinstance(tags, list):
                    raise ValueError("id must be a non-empty string and tags a list")
                items.append(Item(id=d["id"], uri=str(uri if uri.is_absolute() else path.parent / uri),
                                  caption=d.get("caption"), tags=[str(t) for t in tags], fields=manifest_fields(d)))
            except (ValueError, KeyError, TypeError, AttributeError) as e:  # AttributeError: a line that is not an object
                bad.append(Skip(id=f"{path.name}:{lineno}", uri="", reason="bad_manifest_line", error=str(e)[:200]))
    return items, bad


def dedupe(items: list[Item]) -> tuple[list[Item], list[Skip]]:
    seen: set[str] = set()
    out, dups = [], []
    for it in items:
        if it.id in seen:
            dups.append(Skip(it.id, it.uri, "duplicate_id", "id seen earlier in the input; first kept"))
        else:
            seen.add(it.id)
            out.append(it)
    return out, dups


def read_source(images: Path | None, manifest: Path | None) -> tuple[list[Item], list[Skip], dict]:
    """-> (items, reader-stage skips, a description of the source for the spec/manifest)."""
    if (images is None) == (manifest is None):
        raise ValueError("give exactly one of --images DIR or --manifest FILE.jsonl")
    if images is not None:
        items, bad = walk_folder(images), []
        desc = {"images": str(Path(images).resolve())}
    else:
        items, bad = read_manifest(manifest)
        desc = {"manifest": str(Path(manifest).resolve())}
    items, dups = dedupe(items)
    return items, bad + dups, desc


def recorded_items(ids: list[str], metadata: list[bytes | str | None]) -> tuple[list[Item], list[Skip]]:
    """An index version's items from their metadata values (same order as ids), in the version's row order.
    An item without a value (or without a uri in it) cannot be re-read: a `no_source` skip, not an error,
    so one lost key does not block a reindex; the reindex's loss check bounds how many may be lost."""
    items, skips = [], []
    for item_id, raw in zip(ids, metadata, strict=True):
        try:
            m = json.loads(raw) if raw is not None else None
            if not isinstance(m, dict) or not m.get("uri"):
                raise ValueError("no metadata value in Redis" if raw is None else "its metadata has no uri")
            items.append(Item(id=item_id, uri=str(m["uri"]), caption=m.get("caption"),
                              tags=[str(t) for t in m.get("tags") or []], fields=dict(m.get("fields") or {})))
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            skips.append(Skip(item_id, "", "no_source", str(e)[:200]))
    return items, skips
