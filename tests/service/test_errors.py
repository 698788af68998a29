"""errors.py without a server: the notice clip-retrieval's front-end gets for an error, and which requests get it."""
from __future__ import annotations

import urllib.parse
import xml.etree.ElementTree as ET

import pytest

from crossprobe.service.errors import clip_front_notice, from_clip_front


def _scope(path="/knn-service", method="POST", ctype: bytes | None = b"text/plain;charset=UTF-8") -> dict:
    return {"type": "http", "method": method, "path": path, "headers": [(b"content-type", ctype)] if ctype else []}


@pytest.mark.parametrize("scope, front", [
    (_scope(), True), (_scope(ctype=b"Text/Plain"), True),  # the front's fetch() of a string
    (_scope(ctype=b"application/json"), False), (_scope(ctype=None), False),  # JSON clients, ClipClient
    (_scope(path="/metadata"), False), (_scope(path="/v1/search"), False), (_scope(method="GET"), False),
])
def test_only_the_front_ends_requests_get_a_notice(scope, front):
    assert from_clip_front(scope) is front


def test_the_notice_is_a_result_whose_picture_says_the_message():
    message = 'no <text> index & "nothing" else ' + "word " * 80  # markup characters, and too long for the tile
    n = clip_front_notice("unsupported", message, {"x": 1}, 422)
    assert n["id"] == "crossprobe:unsupported" and n["similarity"] == 0.0
    assert n["caption"] == f"crossprobe: {message}"
    assert n["error"] == {"code": "unsupported", "message": message, "details": {"x": 1}}
    kind, svg = n["url"].split(",", 1)
    assert kind == "data:image/svg+xml"
    root = ET.fromstring(urllib.parse.unquote(svg))  # well-formed: the message is escaped, not markup
    lines = ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}tspan")]
    assert lines[0] == "no <text> index &" and len(lines) == 10 and lines[-1].endswith("\u2026")
    texts = ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert texts[:2] == ["crossprobe", "unsupported (422)"]
