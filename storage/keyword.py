"""The keyword side of an index version: a tantivy index (BM25), one folder per version, beside its vectors.

<version dir>/text/ is written before manifest.json (so a version with a manifest has its keyword index whole)
and never changed afterwards; a job derives the next version's from its base's (a copy, then its deletes and
inserts: add, delete and watch's sync pay for their changes only). Written under a temporary name and renamed.

Per item (its metadata value in Redis, indexer/jobs/sources.py item_metadata), stored and indexed:
    id       the item id (raw: one token, for deletes)
    name     the file name (IMG_2291.jpg: the tokens img, 2291, jpg)
    caption  the manifest's caption
    tags     the manifest's tags, joined by ", "
    text     the words found in the image (OCR at index time, indexer/jobs/ocr.py)
    fields   the manifest's other string fields (an album, a place), joined by " · "
    grams    the image's text again, as character trigrams (not stored): OCR runs the words of a sign
             together ("POSTOFFICE"), and a word inside such a token matches only as a substring

Why tantivy and not SQLite FTS5: both were measured over 100K captioned items (docs/research/text_search.md):
FTS5 scores every matching row and was 20x to 30x slower at the median and p99, and hybrid search on it missed
its p99 target; tantivy's top-k skips the rows that cannot reach the top.

Queries (parse): words are ORed (BM25 ranks items holding more, and rarer, of them higher); a "quoted phrase"
must appear as written, in any field; stop words and punctuation are dropped. Every term goes to tantivy's own
query parser as a quoted phrase, so no character of the user's text is read as query syntax, and the term is
cut into tokens by the same analyzer as the indexed text (a code such as K7-2291: k7 2291 side by side).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from crossprobe.core.atomic import atomic_dir, sync_tree
from crossprobe.storage import layout

log = logging.getLogger("crossprobe.indexer")

DIR = layout.KEYWORDS
FIELDS = ("name", "caption", "tags", "text", "fields")
# BM25 boost per field: a word in the file name or a tag is a deliberate label, a caption or the image's own
# text describes it
BOOSTS = {"name": 2.0, "caption": 1.0, "tags": 2.0, "text": 1.0, "fields": 1.0}
# a word is looked for inside the image's run-together tokens only from this length: "man" or "dog" inside any
# token would match spurious OCR output ("WOMAN", texture read as letters) too often
GRAM_MIN = 4
MAX_TERMS = 16  # words and phrases kept from one query (the rest are ignored, and the answer says so)
MAX_TERM_CHARS = 64  # a longer word cannot be in any index field anyone typed; it is cut to this
MAX_TEXT_CHARS = 2000  # per field and item: an image with 10,000 words keeps its first 2,000 characters
WRITER_HEAP = 64_000_000  # bytes tantivy buffers before it writes a segment

# English function words: they match nearly every caption, so they only add noise to BM25 and its highlights
STOP_WORDS = frozenset(
    """
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers
him his how i if in into is it its just me more most my no nor not of off on once only or other our out over own
same she should so some such than that the their them then there these they this those through to too under
until up very was we were what when where which while who whom why will with you your yours shows showing photo
picture image
""".split()
)

QUOTED = re.compile(r'"([^"]*)"')
WORD = re.compile(r"\w", re.UNICODE)
TOKEN = re.compile(r"[^\W_]+", re.UNICODE)  # the analyzer's tokens: runs of letters and digits


@dataclass
class KeywordQuery:
    words: list[str] = field(default_factory=list)  # optional words (ORed)
    phrases: list[str] = field(default_factory=list)  # quoted: each must match
    dropped: int = 0  # words and phrases past MAX_TERMS

    @property
    def empty(self) -> bool:
        return not self.words and not self.phrases

    @property
    def terms(self) -> list[str]:
        return self.phrases + self.words


def parse(text: str) -> KeywordQuery:
    """A user's query -> words and phrases; stop words and what has no letter or digit are dropped. Control and
    format characters (NUL, zero-width spaces...) separate words."""
    text = "".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in text)
    phrases = [p.strip() for p in QUOTED.findall(text) if WORD.search(p)]
    rest = QUOTED.sub(" ", text).replace('"', " ")
    words: list[str] = []
    for raw in rest.split():
        w = raw.strip(".,;:!?()[]{}'`*^+<>|\\/").lower()[:MAX_TERM_CHARS]
        if not WORD.search(w) or w in STOP_WORDS or w in words:
            continue
        words.append(w)
    phrases = [p[: MAX_TERM_CHARS * 4] for p in dict.fromkeys(phrases)]
    q = KeywordQuery(words, phrases)
    q.dropped = max(0, len(q.phrases) + len(q.words) - MAX_TERMS)
    q.phrases = q.phrases[:MAX_TERMS]
    q.words = q.words[: max(0, MAX_TERMS - len(q.phrases))]
    return q


def document(meta: dict | None) -> dict[str, str] | None:
    """An item's metadata value -> its five field texts (None: nothing to index)."""
    if not isinstance(meta, dict):
        return None
    fields = meta.get("fields")
    if not isinstance(fields, dict):
        fields = {}
    tags = meta.get("tags")
    if not isinstance(tags, list):
        tags = []
    doc = (
        os.path.basename(str(meta.get("uri") or "")),
        str(meta.get("caption") or ""),
        ", ".join(str(t) for t in tags),
        str(meta.get("text") or ""),
        " · ".join(str(v) for v in fields.values() if isinstance(v, str)),
    )
    return {f: s[:MAX_TEXT_CHARS] for f, s in zip(FIELDS, doc)}


def _fold(s: str) -> str:
    """Lower case without accents: what the analyzer makes of a text (tantivy's lowercase + ascii_fold)."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", s.lower()) if not unicodedata.combining(ch))


def _schema():
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("id", stored=True, tokenizer_name="raw")
    for f in FIELDS:
        sb.add_text_field(f, stored=True, tokenizer_name="words")
    sb.add_text_field("grams", stored=False, tokenizer_name="grams")
    return sb.build()


def _analyzers(index) -> None:
    """Custom analyzers are not stored in the index: every open registers them again, the same way."""
    import tantivy

    index.register_tokenizer(
        "words",
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(MAX_TERM_CHARS))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.ascii_fold())
        .build(),
    )
    index.register_tokenizer(
        "grams",
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.ngram(3, 3, False)).filter(tantivy.Filter.lowercase()).build(),
    )


def _open(path: Path):
    import tantivy

    index = tantivy.Index(_schema(), path=str(path), reuse=True)
    _analyzers(index)
    return index


def write(
    vdir: Path,
    ids: list[str],
    metas: Callable[[list[str]], list[dict | None]],
    chunk: int = 1000,
    base: Path | None = None,
    drop: Iterable[str] = (),
) -> dict:
    """Write <vdir>/text/: from scratch (base None: every id), or from a base version's (base: its version dir)
    minus `drop` plus `ids`. metas(ids) reads their metadata (chunks of `chunk`). Written under a temporary
    name and renamed, so the folder is whole or absent; a rerun after a kill writes it again. The caller passes
    base only when the base has a keyword index (a base from before them: write every id).
    -> {"indexed": items in the index, "inserted", "deleted", "ocr_failed": inserted items whose OCR failed
    (their metadata's "text_error": the item is indexed, its words are not)}"""
    import tantivy

    with atomic_dir(vdir / DIR) as tmp:  # a leftover of a killed run is removed first
        if base is not None:
            shutil.copytree(base / DIR, tmp, dirs_exist_ok=True)
        index = _open(tmp)
        writer = index.writer(heap_size=WRITER_HEAP, num_threads=1)
        deleted = 0
        if base is not None:
            index.reload()
            held = index.searcher()
            for item_id in drop:
                if held.search(tantivy.Query.term_query(index.schema, "id", item_id), 1).count:
                    writer.delete_documents_by_term("id", item_id)
                    deleted += 1
        inserted = ocr_failed = 0
        for i in range(0, len(ids), chunk):
            part = ids[i : i + chunk]
            for item_id, meta in zip(part, metas(part)):
                ocr_failed += bool(isinstance(meta, dict) and meta.get("text_error"))
                doc = document(meta)
                if doc is None or not any(doc.values()):
                    continue
                if base is not None:  # an item added again (add replaces it): one document per id
                    writer.delete_documents_by_term("id", item_id)
                writer.add_document(tantivy.Document(id=item_id, grams=doc["text"], **doc))
                inserted += 1
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        indexed = index.searcher().num_docs
        sync_tree(tmp)
    return {"indexed": indexed, "inserted": inserted, "deleted": deleted, "ocr_failed": ocr_failed}


@dataclass
class Highlight:
    field: str
    text: str  # the field's indexed text
    spans: list[tuple[int, int]]  # [start, end) character offsets of the matched words in `text`


class KeywordIndex:
    """One version's keyword index, read-only (its searcher is thread-safe)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not (self.path / "meta.json").exists():
            raise FileNotFoundError(self.path)
        self._index = _open(self.path)
        self._index.reload()
        self._searcher = self._index.searcher()
        self.count = self._searcher.num_docs
        self._lock = threading.Lock()  # the query parser is shared

    def _query(self, q: KeywordQuery):
        """Every phrase (must) and every term (should): each term a quoted phrase over the five fields (boosted),
        and, from GRAM_MIN letters, its trigrams in the image's text (all of them: a substring)."""
        import tantivy

        def term(t: str):
            quoted = '"' + t.replace("\\", " ").replace('"', " ") + '"'
            parts = [(tantivy.Occur.Should, self._index.parse_query(quoted, list(FIELDS), field_boosts=BOOSTS))]
            folded = _fold(t).replace(" ", "")
            if len(folded) >= GRAM_MIN:  # also inside OCR's run-together tokens (without the phrase's spaces)
                grams = [folded[i : i + 3] for i in range(len(folded) - 2)]
                parts.append(
                    (
                        tantivy.Occur.Should,
                        tantivy.Query.boolean_query(
                            [
                                (tantivy.Occur.Must, tantivy.Query.term_query(self._index.schema, "grams", g))
                                for g in grams
                            ]
                        ),
                    )
                )
            return tantivy.Query.boolean_query(parts)

        with self._lock:
            should = [(tantivy.Occur.Should, term(t)) for t in q.terms]
            must = [(tantivy.Occur.Must, term(p)) for p in q.phrases]
        return tantivy.Query.boolean_query(must + should)

    def _stored(self, addr) -> dict[str, str]:
        d = self._searcher.doc(addr).to_dict()
        return {k: (v[0] if v else "") for k, v in d.items()}

    def search(
        self, q: KeywordQuery, limit: int, allow: Callable[[str], bool] | None = None, max_depth: int | None = None
    ) -> list[tuple[str, float]]:
        """The best `limit` items for q by BM25 -> [(id, score)], best first. allow(id) False: the item is
        passed over (a filter), and the next best taken instead (the search is repeated deeper until `limit`
        pass, none is left, or max_depth hits were read: a filter that passes almost nothing of a common word must
        not walk its whole posting list per search; the best of those read are returned)."""
        if q.empty or limit <= 0:
            return []
        query = self._query(q)
        want, checked, out = limit, 0, []
        while True:
            res = self._searcher.search(query, want)
            for score, addr in res.hits[checked:]:  # a deeper search's first hits are the last one's: read once
                item_id = self._searcher.doc(addr)["id"][0]
                if allow is None or allow(item_id):
                    out.append((item_id, float(score)))
                    if len(out) >= limit:
                        return out
            checked = len(res.hits)
            cap = self.count if max_depth is None else min(self.count, max(max_depth, limit))
            if len(res.hits) < want or want >= cap:
                return out
            want = min(want * 8, cap)

    def documents(self, ids: list[str]) -> dict[str, dict[str, str]]:
        """The stored fields of these ids."""
        import tantivy

        if not ids:
            return {}
        query = tantivy.Query.term_set_query(self._index.schema, "id", list(ids))
        res = self._searcher.search(query, len(ids))
        docs = [self._stored(addr) for _, addr in res.hits]
        return {d["id"]: d for d in docs}

    def coverage(self, q: KeywordQuery, ids: list[str], docs: dict[str, dict] | None = None) -> dict[str, float]:
        """The share of q's words each of ids holds, 0..1 (1: all of them). A query with quoted phrases: 1 for
        every match, which holds every phrase by construction: the user said what must be there. Hybrid search
        weighs a keyword match by it (service/hybrid.py): a caption query whose one word sits in some photo's
        text is not a match of the query. docs: their stored fields, when the caller has read them already."""
        if not ids or q.phrases or not q.words:
            return {i: 1.0 for i in ids}
        docs = self.documents(ids) if docs is None else docs
        out = {}
        for i in ids:
            d = docs.get(i, {})
            held = sum(1 for w in q.words if any(_find(w, f, d.get(f, "")) for f in FIELDS))
            out[i] = held / len(q.words)
        return out

    def highlights(
        self, q: KeywordQuery, ids: list[str], docs: dict[str, dict] | None = None
    ) -> dict[str, list[Highlight]]:
        """For each of ids that q matches: the fields holding a matched word, with the words' offsets. docs: their
        stored fields, when the caller has read them already."""
        if q.empty or not ids:
            return {}
        out: dict[str, list[Highlight]] = {}
        docs = self.documents(ids) if docs is None else {i: docs[i] for i in ids if i in docs}
        for i, d in docs.items():
            hs = []
            for f in FIELDS:
                spans = _merge([s for t in q.terms for s in _find(t, f, d.get(f, ""))])
                if spans:
                    hs.append(Highlight(f, d[f], spans))
            if hs:
                out[i] = hs
        return out


def _find(term: str, field_name: str, text: str) -> list[tuple[int, int]]:
    """Where a term occurs in a field's text: its tokens side by side (any separators between them, whole
    tokens), case and accents ignored; in the image's text also inside a longer token (from GRAM_MIN letters,
    spaces of the term ignored: OCR's "POSTOFFICE")."""
    if not text:
        return []
    toks = [_fold(t) for t in TOKEN.findall(term)]
    if not toks:
        return []
    spans = []
    found = [(m.start(), m.end(), _fold(m.group())) for m in TOKEN.finditer(text)]
    for k in range(len(found) - len(toks) + 1):
        if all(found[k + j][2] == toks[j] for j in range(len(toks))):
            spans.append((found[k][0], found[k + len(toks) - 1][1]))
    joined = "".join(toks)
    if field_name == "text" and len(joined) >= GRAM_MIN and not spans:
        folded = _fold(text)
        if len(folded) == len(text):  # offsets stay valid when folding keeps the length
            spans += [(m.start(), m.end()) for m in re.finditer(re.escape(joined), folded)]
    return spans


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def open_for(vdir: Path) -> KeywordIndex | None:
    """The version's keyword index, or None for a version built before them, or whose index cannot be read
    (logged: the version is still served, by vectors; answers say why in mode_note)."""
    p = Path(vdir) / DIR
    if not p.exists():
        return None
    try:
        return KeywordIndex(p)
    except (OSError, ValueError, json.JSONDecodeError) as e:
        log.error(
            "keyword index %s cannot be read (%s: %s); the version is served by vectors only", p, type(e).__name__, e
        )
        return None
