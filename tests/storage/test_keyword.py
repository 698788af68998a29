"""The keyword index of a version (storage/keyword.py): query parsing, BM25 order, phrases, highlights,
the trigram side for run-together OCR words, and deriving a version's file from its base's."""
from __future__ import annotations

import pytest

from crossprobe.storage import keyword

METAS = {
    "a": {"uri": "/p/IMG_2291.jpg", "caption": "a dog on the beach", "tags": ["holiday", "dog"]},
    "b": {"uri": "/p/b.jpg", "caption": "a cat asleep", "text": "PHARMACY OPEN 24H"},
    "c": {"uri": "/p/c.jpg", "caption": "street at night", "text": "POSTOFFICE K7-2291", "fields": {"album": "Lisbon trip"}},
    "d": {"uri": "/p/d.jpg", "caption": "a dog and a dog and another dog"},
}


def _write(tmp_path, metas=METAS, **kw):
    ids = list(metas)
    return keyword.write(tmp_path, ids, lambda part: [metas[i] for i in part], **kw)


@pytest.fixture()
def ix(tmp_path):
    _write(tmp_path)
    return keyword.KeywordIndex(tmp_path / keyword.DIR)


def _ids(hits):
    return [i for i, _ in hits]


def test_parse_drops_stop_words_and_punctuation_and_keeps_phrases():
    q = keyword.parse('a photo of the "Post Office", with   K7-2291!!')
    assert q.phrases == ["Post Office"] and q.words == ["k7-2291"]
    assert keyword.parse("the of and ... ?!").empty
    assert keyword.parse("a\u200bdog\x00cat").words == ["dog", "cat"]  # NUL and zero-width: separators
    assert keyword.parse("x" * 512).words == ["x" * keyword.MAX_TERM_CHARS]  # a long word is cut, not an error
    many = keyword.parse(" ".join(f"w{i}" for i in range(40)))
    assert len(many.terms) == keyword.MAX_TERMS and many.dropped == 40 - keyword.MAX_TERMS


def test_user_text_is_never_query_syntax(ix):
    """tantivy's query language (AND / OR / NOT, -, +, *, field:, (), ^, quotes) in the user's text is searched as
    words or dropped: it never raises and never changes what the query means."""
    def found(text):
        return sorted(_ids(ix.search(keyword.parse(text), 10)))

    dog, cat = found("dog"), found("cat")
    assert dog == ["a", "d"] and cat == ["b"]
    assert found("dog AND") == dog and found("dog OR NOT cat") == found("dog cat") == sorted(dog + cat)  # words
    assert found("dog -cat") == found("+dog cat") == sorted(dog + cat)  # no exclusion, no requirement
    assert found("dog*") == found("^dog") == found("(dog)") == found("dog\\") == dog  # stripped, not operators
    assert found("ca*") == []  # no wildcard: "ca" is not a prefix of cat
    assert found("caption:dog") == [] and found("tags:holiday") == []  # no field selector: the words side by side
    assert found("NEAR(dog cat)") == cat  # no operator: the phrase "near dog" (nowhere) or cat
    assert found('"dog') == dog and found('"unbalanced') == []  # a lone quote opens no phrase
    for text in ["'; DROP TABLE", "dog:", ":", "*", "(", ")", "-", "AND", "dog^2", "[a TO z]", "{ }", "\\", "dog~2",
                 "/regex/", '"" ""', 'dog" OR "cat', "title:(a OR b)"]:
        assert set(found(text)) <= set(METAS), text  # answers without a parser error


def test_bm25_ranks_more_matches_higher(ix):
    assert set(_ids(ix.search(keyword.parse("dog"), 10))) == {"a", "d"}
    assert _ids(ix.search(keyword.parse("holiday dog beach"), 10))[0] == "a"  # three words of a's beat d's one


def test_each_field_is_searched(ix):
    assert _ids(ix.search(keyword.parse("img_2291"), 10)) == ["a"]  # the file name
    assert _ids(ix.search(keyword.parse("holiday"), 10)) == ["a"]  # a tag
    assert _ids(ix.search(keyword.parse("pharmacy"), 10)) == ["b"]  # the image's text
    assert _ids(ix.search(keyword.parse("lisbon"), 10)) == ["c"]  # a manifest field


def test_phrases_must_match_as_written(ix):
    assert _ids(ix.search(keyword.parse('"dog on the beach"'), 10)) == ["a"]
    assert ix.search(keyword.parse('"beach on the dog"'), 10) == []
    assert _ids(ix.search(keyword.parse('"K7-2291"'), 10)) == ["c"]  # a code: the tokens k7 2291 side by side


def test_words_run_together_by_ocr_are_found_inside_the_token(ix):
    assert _ids(ix.search(keyword.parse("office"), 10)) == ["c"]  # "POSTOFFICE"
    assert _ids(ix.search(keyword.parse('"post office"'), 10)) == ["c"]  # the phrase without its space


def test_allow_passes_over_filtered_items(ix):
    assert _ids(ix.search(keyword.parse("dog"), 10, allow=lambda i: i != "d")) == ["a"]
    assert _ids(ix.search(keyword.parse("dog"), 1)) and len(ix.search(keyword.parse("dog"), 1)) == 1


def test_highlights_give_offsets_into_the_fields(ix):
    hs = ix.highlights(keyword.parse("holiday beach"), ["a", "b"])
    assert set(hs) == {"a"}
    by = {h.field: h for h in hs["a"]}
    assert by["caption"].text[slice(*by["caption"].spans[0])] == "beach"
    assert by["tags"].text[slice(*by["tags"].spans[0])] == "holiday"
    t = ix.highlights(keyword.parse("office"), ["c"])["c"][0]
    assert t.field == "text" and t.text[slice(*t.spans[0])].lower() == "office"


def test_bounded_text_per_field(tmp_path):
    huge = " ".join(["word"] * 10_000)
    _write(tmp_path, {"x": {"uri": "/x.jpg", "text": huge}})
    ix = keyword.KeywordIndex(tmp_path / keyword.DIR)
    assert len(ix.documents(["x"])["x"]["text"]) == keyword.MAX_TEXT_CHARS


def test_derived_index_applies_deletes_and_inserts_and_leaves_the_base_alone(tmp_path):
    base, new = tmp_path / "v1", tmp_path / "v2"
    base.mkdir(), new.mkdir()
    _write(base)
    before = {p.name: p.read_bytes() for p in (base / keyword.DIR).iterdir()}
    more = {"e": {"uri": "/p/e.jpg", "caption": "a red bicycle"}, "a": {"uri": "/p/a2.jpg", "caption": "a horse"}}
    stats = keyword.write(new, list(more), lambda part: [more[i] for i in part], base=base, drop={"a", "b"})
    assert stats == {"indexed": 4, "inserted": 2, "deleted": 2, "ocr_failed": 0}
    ix = keyword.KeywordIndex(new / keyword.DIR)
    assert _ids(ix.search(keyword.parse("bicycle"), 10)) == ["e"]
    assert _ids(ix.search(keyword.parse("horse"), 10)) == ["a"]  # a replaced item: its new text only
    assert ix.search(keyword.parse("holiday"), 10) == [] and ix.search(keyword.parse("pharmacy"), 10) == []
    assert {p.name: p.read_bytes() for p in (base / keyword.DIR).iterdir()} == before  # a version's index never changes
    assert not list(new.glob("*.tmp"))


def test_coverage_is_the_share_of_the_query_words_an_item_holds(ix):
    cov = ix.coverage(keyword.parse("dog beach holiday cat"), ["a", "b", "d"])
    assert cov == {"a": 0.75, "b": 0.25, "d": 0.25}
    assert ix.coverage(keyword.parse('"K7-2291" street'), ["c"]) == {"c": 1.0}  # a quoted phrase: required, so 1
    # a short word is not looked for inside OCR's run-together tokens; a longer one is
    assert ix.coverage(keyword.parse("office"), ["c"]) == {"c": 1.0}
    assert ix.search(keyword.parse("ice"), 10) == []


def test_a_filtered_search_reads_at_most_max_depth_hits(tmp_path):
    """A common word under a filter that passes one item, the last by BM25: without a bound the search walks the
    whole posting list (each item's id read and tested); with max_depth it stops there, with what it found."""
    metas = {f"i{n:04d}": {"uri": f"/p/{n}.jpg", "caption": "dog " * (1 + (n % 7))} for n in range(2000)}
    _write(tmp_path, metas)
    ix = keyword.KeywordIndex(tmp_path / keyword.DIR)
    q = keyword.parse("dog")
    last = _ids(ix.search(q, 2000))[-1]
    asked = []

    def allow(i):
        asked.append(i)
        return i == last

    assert _ids(ix.search(q, 5, allow)) == [last] and len(asked) >= 1999  # unbounded: every hit was read
    asked.clear()
    assert ix.search(q, 5, allow, max_depth=320) == [] and len(asked) <= 320  # bounded
