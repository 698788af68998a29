"""The reader stage's manifest fields: what becomes filterable, what is refused (counted), what a reindex reads back."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime

import pytest

from crossprobe.indexer.jobs.sources import Item, item_metadata, manifest_fields, read_manifest, recorded_items


def test_scalar_fields_are_kept_and_reserved_keys_are_not_fields():
    d = {"id": "a", "uri": "a.jpg", "caption": "c", "tags": ["t"], "album": "x", "year": 2019, "rating": 4.5,
         "favourite": False, "taken": "2019-05-01"}
    assert manifest_fields(d) == {"album": "x", "year": 2019, "rating": 4.5, "favourite": False, "taken": "2019-05-01"}


@pytest.mark.parametrize("extra, why", [
    ({"album": {"a": 1}}, "nested"), ({"album": [1]}, "nested"), ({"album": None}, "null"),
    ({"bad name": 1}, "field name"), ({"1st": 1}, "field name"), ({"x": float("nan")}, "finite"),
    ({"x": "y" * 2000}, "longer"), ({f"f{i}": i for i in range(65)}, "at most"),
])
def test_unfilterable_fields_make_a_bad_manifest_line(tmp_path, extra, why):
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"id": "ok", "uri": "a.jpg"}) + "\n" + json.dumps({"id": "b", "uri": "b.jpg", **extra})
                 + "\n[1, 2]\n")
    items, bad = read_manifest(m)
    assert [i.id for i in items] == ["ok"]
    assert [b.reason for b in bad] == ["bad_manifest_line"] * 2 and why in bad[0].error


def test_metadata_value_and_reindex_round_trip():
    it = Item("a", "/x/a.jpg", "a cat", ["pets"], {"album": "home", "camera": "My Camera"})
    m = item_metadata(it, {"width": 4, "height": 3, "format": "JPEG", "camera": "EXIF Cam", "taken": "2020-01-01T00:00:00"})
    assert m["camera"] == "My Camera" and m["taken"] == "2020-01-01T00:00:00"  # the manifest's own wins
    assert m["fields"] == {"album": "home", "camera": "My Camera"}
    assert m["added"] and m["added"] == datetime.fromisoformat(m["added"]).isoformat()  # when it was indexed (UTC)
    items, skips = recorded_items(["a"], [json.dumps(m)])
    assert not skips and items[0] == replace(it, added=m["added"])  # a reindex reads back what the manifest said
    assert item_metadata(items[0], {})["added"] == m["added"]  # ... and keeps the date the item was added
