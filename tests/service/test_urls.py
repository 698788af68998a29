"""service/urls.py: the image URLs answers hand out, from the configured public URL only; the start-up hint."""
from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from crossprobe.service.settings import Settings
from crossprobe.service.urls import clip_front_hint, item_image_url


@pytest.mark.parametrize("public, expected", [
    (None, "/v1/items/a%20b/c%3F.jpg/image?index=my%2Findex"),  # root-relative without a public URL
    ("https://search.example.org", "https://search.example.org/v1/items/a%20b/c%3F.jpg/image?index=my%2Findex"),
    ("https://example.org/cp/", "https://example.org/cp/v1/items/a%20b/c%3F.jpg/image?index=my%2Findex"),
])
def test_item_image_url(public, expected):
    assert item_image_url(Settings(public_base_url=public), "my/index", "a b/c?.jpg") == expected


def test_public_url_names(monkeypatch):
    """CROSSPROBE_PUBLIC_URL, or its older name CROSSPROBE_PUBLIC_BASE_URL (the new one wins when both are set);
    only http(s) URLs without query or fragment."""
    monkeypatch.setenv("CROSSPROBE_PUBLIC_BASE_URL", "http://old.example")
    assert Settings().public_base_url == "http://old.example"
    monkeypatch.setenv("CROSSPROBE_PUBLIC_URL", "https://new.example/cp")
    assert Settings().public_base_url == "https://new.example/cp"
    for bad in ("search.example.org", "ftp://x", "https://x/?a=1", "https://x/#f", "https://a b"):
        monkeypatch.setenv("CROSSPROBE_PUBLIC_URL", bad)
        with pytest.raises(ValidationError):
            Settings()
    assert "urls_from_host_header" not in Settings.model_fields  # URLs never come from the request's Host


def test_start_up_hint_says_what_clip_front_needs():
    assert clip_front_hint(Settings()) is None  # same-origin only: nothing to say
    level, msg = clip_front_hint(Settings(cors_origins="http://front.example:1235"))
    assert level == logging.WARNING and "CROSSPROBE_PUBLIC_URL" in msg and "shows no images" in msg
    level, msg = clip_front_hint(Settings(public_base_url="https://search.example.org"))
    assert level == logging.INFO and "CROSSPROBE_CORS_ORIGINS" in msg
    level, msg = clip_front_hint(Settings(public_base_url="https://s.example", cors_origins="http://f.example"))
    assert level == logging.INFO and "https://s.example" in msg and "http://f.example" in msg


def test_the_hint_is_logged_at_start_up(caplog):
    from crossprobe.service.app import create_app

    with caplog.at_level(logging.INFO, logger="crossprobe.service"):
        create_app(Settings(cors_origins="http://front.example:1235"))
    assert any(r.levelno == logging.WARNING and "CROSSPROBE_PUBLIC_URL" in r.getMessage() for r in caplog.records)
