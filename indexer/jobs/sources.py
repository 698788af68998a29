"""Reader stage: a folder, a JSONL manifest or an index version -> an ordered list of items with stable ids.

Manifest line: {"id": str, "uri": local path, "caption"?: str, "tags"?: [str], <field>?: scalar, ...}.
Any other key is a filterable field of the item (an album, a year, a rating: storage/filter_columns.py) when its
value is a string, number or boolean and its name a plain identifier; "taken" (an ISO date) and "camera"
override what the file's EXIF says, "added" (an ISO date: another library's date added) the indexing time. A nested
value or an odd name makes the line a bad_manifest_line skip
(counted in the report), not a silently dropped field.
Relative uris are resolved against the manifest's folder. A folder is walked
recursively in sorted order; an item's id is its path relative to the folder,
posix style, so the same file keeps its id across machines and rebuilds.
Duplicate ids keep the first occurrence (an index holds exactly one entry per id).
An index version (reindex) gives back its items as it recorded them: each item's
metadata value (written when it was built or added) holds its id, uri, caption, tags, fields.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from crossprobe.core import image_formats

# what the folder walk indexes and what it counts as videos (crossprobe.core.image_formats: HEIC, AVIF, RAW...)
IMAGE_EXTS, VIDEO_EXTS = image_formats.IMAGE_EXTS, image_formats.VIDEO_EXTS
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
    added: str | None = None  # when the item first entered the index (a reindex keeps it); None: now, when written

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> "Item":
        return cls(**json.loads(line))


@dataclass
class Skip:
    id: str
    uri: str
    reason: str  # missing | empty | not_image | video | unreadable | symlink_loop | oversized | truncated | corrupt
    #              | bad_manifest_line | duplicate_id | no_source (reindex: the old version has no metadata value)
    error: str = ""


def walk_folder(folder: Path) -> list[Item]:
    return scan_folder(folder)[0]


def image_roots(items: list[Item], source: dict, base: list[str] | None = None) -> list[str]:
    """The folders a version's files lie under, resolved (symbolic links followed): what the service checks an
    item's recorded path against before it opens it (storage.store.within_roots). The source folder, the real
    folders of the items whose files lie elsewhere (a manifest's; links followed with follow_links="all"), and the
    base version's roots; none inside another."""
    roots = set(base or [])
    if source.get("images"):
        roots.add(os.path.realpath(source["images"]))
    seen: dict[str, str] = {}
    for it in items:
        d = os.path.dirname(it.uri)
        real = seen.get(d)
        if real is None:
            real = seen[d] = os.path.realpath(d)
        roots.add(os.path.dirname(os.path.realpath(it.uri)) if os.path.islink(it.uri) else real)
    kept: list[str] = []
    for r in sorted(roots, key=len):
        if not any(r == k or r.startswith(k.rstrip(os.sep) + os.sep) for k in kept):
            kept.append(r)
    return sorted(kept)


def scan_folder(folder: Path, follow_links: str = "inside") -> tuple[list[Item], list[Skip]]:
    """A folder, recursively, in sorted order -> (its image files as items, a Skip for each thing it holds that
    is not indexed): nothing in it is dropped without a count. Skip reasons: video (a .mp4, .mov... file),
    not_image (any other file that is not of an image format; hidden files, named ".*", are not counted),
    unreadable (a folder that cannot be listed: permission denied), symlink_loop (a link to a folder already
    on the walk's path, or one that leads back to itself), link_outside (a symbolic link, to a file or a folder,
    whose target lies outside the folder: whoever may write into the folder must not make the service read and
    show any file its user can). Symbolic links inside the folder are followed, each real folder at most once per
    path; follow_links="all" (CROSSPROBE_INDEX_FOLLOW_LINKS) follows those that leave it too (an album linked in
    from another disk), and the version records their targets as its image roots."""
    folder = Path(folder).resolve()
    inside = str(folder).rstrip(os.sep) + os.sep

    def leaves(p: Path) -> str | None:
        """The target of a link that leaves the folder (None: not a link, or one that stays inside)."""
        if follow_links == "all" or not p.is_symlink():
            return None
        real = os.path.realpath(p)
        return None if real == str(folder) or real.startswith(inside) else real

    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} does not exist")
    items: list[Item] = []
    skips: list[Skip] = []

    def rel(p: Path) -> str:
        return p.relative_to(folder).as_posix()

    def unlisted(e: OSError) -> None:  # os.walk's onerror: a folder it could not list
        p = Path(e.filename or folder)
        reason = "symlink_loop" if e.errno == errno.ELOOP else "unreadable"
        skips.append(Skip(rel(p) + "/" if p != folder else "./", str(p), reason, f"{type(e).__name__}: {e}"[:200]))

    seen_on_path: dict[str, set[tuple[int, int]]] = {}  # dirpath -> the (device, inode) of it and its parents
    for dirpath, dirnames, filenames in os.walk(folder, onerror=unlisted, followlinks=True):
        dirnames.sort()  # deterministic walk: same order, same batches, on every run
        try:
            st = os.stat(dirpath)
            ancestors = seen_on_path.get(os.path.dirname(dirpath), set()) | {(st.st_dev, st.st_ino)}
        except OSError:
            ancestors = set()
        seen_on_path[dirpath] = ancestors
        for d in list(dirnames):
            p = Path(dirpath) / d
            if (target := leaves(p)) is not None:
                dirnames.remove(d)
                skips.append(Skip(rel(p) + "/", str(p), "link_outside", f"links to {target}, outside {folder}"))
                continue
            try:
                dst = os.stat(p)
            except OSError as e:  # a dangling link, or one that loops on itself
                dirnames.remove(d)
                if p.is_symlink():  # (a dangling link named like a folder is not one: os.walk lists it as a folder)
                    why = "symlink_loop" if e.errno == errno.ELOOP else "missing"
                    skips.append(Skip(rel(p) + "/", str(p), why, f"{type(e).__name__}: {e}"[:200]))
                continue
            if (dst.st_dev, dst.st_ino) in ancestors:  # a link back to a folder on this path: a loop
                dirnames.remove(d)
                skips.append(
                    Skip(
                        rel(p) + "/",
                        str(p),
                        "symlink_loop",
                        f"links to {os.path.realpath(p)}, a folder this walk is already inside",
                    )
                )
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            ext = p.suffix.lower()
            if (target := leaves(p)) is not None and (ext in IMAGE_EXTS or ext in VIDEO_EXTS or p.exists()):
                skips.append(Skip(rel(p), str(p), "link_outside", f"links to {target}, outside {folder}"))
            elif ext in IMAGE_EXTS:
                items.append(Item(id=rel(p), uri=str(p)))
            elif ext in VIDEO_EXTS:
                skips.append(Skip(rel(p), str(p), "video", f"a {ext} file is a video: only still images are indexed"))
            elif p.is_symlink() and not p.exists():
                try:
                    os.stat(p)
                    why, err = "missing", "a link to nothing"
                except OSError as e:
                    why, err = ("symlink_loop" if e.errno == errno.ELOOP else "missing"), f"{type(e).__name__}: {e}"
                skips.append(Skip(rel(p), str(p), why, err[:200]))
            elif not fn.startswith("."):
                skips.append(
                    Skip(
                        rel(p),
                        str(p),
                        "not_image",
                        f"{ext or 'a file without extension'}: not an image format this indexer reads",
                    )
                )
    return items, skips


def item_metadata(item: Item, facts: dict) -> dict:
    """An item's metadata value in Redis: what the manifest said and what the decoder read off the file
    (width, height, format, and EXIF taken / camera where present), and "added": when the item entered the
    index (UTC, ISO 8601 without a zone; build or add time, kept by a reindex; an add that replaces an id
    gives it the new time). A manifest's own "taken" / "camera" / "added" win over the indexer's at the top
    level; every manifest field is also kept as given under "fields" (what a reindex reads back, and never
    shadowing the indexer's own keys)."""
    own = {k: item.fields[k] for k in ("taken", "camera", "added") if k in item.fields}
    added = item.added or datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds")
    m = {"id": item.id, "uri": item.uri, **facts, "added": added, **own, "caption": item.caption, "tags": item.tags}
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
                items.append(
                    Item(
                        id=d["id"],
                        uri=str(uri if uri.is_absolute() else path.parent / uri),
                        caption=d.get("caption"),
                        tags=[str(t) for t in tags],
                        fields=manifest_fields(d),
                    )
                )
            except (
                ValueError,
                KeyError,
                TypeError,
                AttributeError,
            ) as e:  # AttributeError: a line that is not an object
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


def read_source(
    images: Path | None, manifest: Path | None, follow_links: str = "inside"
) -> tuple[list[Item], list[Skip], dict]:
    """-> (items, reader-stage skips, a description of the source for the spec/manifest)."""
    if (images is None) == (manifest is None):
        raise ValueError("give exactly one of --images DIR or --manifest FILE.jsonl")
    if images is not None:
        items, bad = scan_folder(images, follow_links)
        desc = {"images": str(Path(images).resolve())}
    else:
        assert manifest is not None  # exactly one of the two, checked above
        items, bad = read_manifest(manifest)
        desc = {"manifest": str(Path(manifest).resolve())}
    items, dups = dedupe(items)
    return items, bad + dups, desc


def recorded_items(ids: list[str], metadata: Sequence[bytes | str | None]) -> tuple[list[Item], list[Skip]]:
    """An index version's items from their metadata values (same order as ids), in the version's row order.
    An item without a value (or without a uri in it) cannot be re-read: a `no_source` skip, not an error,
    so one lost key does not block a reindex; the reindex's loss check bounds how many may be lost."""
    items, skips = [], []
    for item_id, raw in zip(ids, metadata, strict=True):
        try:
            m = json.loads(raw) if raw is not None else None
            if not isinstance(m, dict) or not m.get("uri"):
                raise ValueError("no metadata value in Redis" if raw is None else "its metadata has no uri")
            added = m.get("added")
            items.append(
                Item(
                    id=item_id,
                    uri=str(m["uri"]),
                    caption=m.get("caption"),
                    tags=[str(t) for t in m.get("tags") or []],
                    fields=dict(m.get("fields") or {}),
                    added=added if isinstance(added, str) else None,
                )
            )
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            skips.append(Skip(item_id, "", "no_source", str(e)[:200]))
    return items, skips
