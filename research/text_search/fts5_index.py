"""SQLite FTS5 as the keyword index of a version: the design crossprobe used first, kept here as the baseline that
research/text_search/engines.py measures indexer/storage/keyword.py (tantivy) against (docs/research/text_search.md).

One file per version, beside its vectors: <version dir>/text.sqlite, written before manifest.json (so a version
with a manifest has its text index whole) and never changed afterwards; a job derives the next version's file
from its base's (a copy, then deletes and inserts: add, delete and watch's sync pay for their changes only).

    items   (row INTEGER PRIMARY KEY, id TEXT UNIQUE)      the item id behind each FTS5 rowid
    docs    FTS5 (name, caption, tags, text, fields)        rowid = items.row

Per item (its metadata value in Redis, indexer/jobs/sources.py item_metadata):
    name     the file name (IMG_2291.jpg: unicode61 splits it into img, 2291, jpg)
    caption  the manifest's caption
    tags     the manifest's tags, joined by ", "
    text     the words found in the image (OCR at index time, indexer/jobs/ocr.py)
    fields   the manifest's other string fields (an album, a place), joined by " · "

Why FTS5 and not tantivy: both were measured over 100K items (docs/research/text_search.md); FTS5 is in the
standard library, its file is one immutable version-local file like ids and vectors.npy, and its query time at
this size is a few milliseconds.

Queries (parse): words are ORed (BM25 ranks items holding more, and rarer, of them higher); a "quoted phrase"
must appear as written, in any field; stop words and punctuation are dropped. A code such as K7-2291 is one
FTS5 string, which matches the tokens k7 2291 next to each other.
"""
from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

log = logging.getLogger("crossprobe.indexer")

FILE = "text.sqlite"
FIELDS = ("name", "caption", "tags", "text", "fields")
TEXT = FIELDS.index("text")
# BM25 weight per field (FTS5's bm25() column weights): a word in the file name or a tag is a deliberate label,
# a caption or the image's own text describes it
WEIGHTS = (2.0, 1.0, 2.0, 1.0, 1.0)
# a word is looked for inside the image's run-together tokens only from this length: "man" or "dog" inside any
# token would match spurious OCR output ("WOMAN", texture read as letters) too often
GRAM_MIN = 4
MAX_TERMS = 16  # words and phrases kept from one query (the rest are ignored, and the answer says so)
MAX_TERM_CHARS = 64  # a longer word cannot be in any index field anyone typed; it is cut to this
MAX_TEXT_CHARS = 2000  # per field and item: an image with 10,000 words keeps its first 2,000 characters
MARK_OPEN, MARK_CLOSE = "\x02", "\x03"  # highlight() markers: control characters no indexed text keeps

# English function words: they match nearly every caption, so they only add noise to BM25 and its highlights
STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers
him his how i if in into is it its just me more most my no nor not of off on once only or other our out over own
same she should so some such than that the their them then there these they this those through to too under
until up very was we were what when where which while who whom why will with you your yours shows showing photo
picture image
""".split())

QUOTED = re.compile(r'"([^"]*)"')
WORD = re.compile(r"\w", re.UNICODE)


class NoKeywords(ValueError):
    """A keyword-only search whose query keeps no word after stop words and punctuation are dropped."""


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

    def match(self, grams: bool = False) -> str | None:
        """The FTS5 MATCH expression: every phrase AND (any phrase or word). Each term is an FTS5 string
        ("..."), so no character of the user's text is read as FTS5 syntax. grams: for the trigram table, where
        a term matches as a substring, also without its spaces (OCR's "POSTOFFICE" for "post office"); terms
        under GRAM_MIN characters are left out (None: nothing left)."""
        def one(t: str) -> str | None:
            if not grams:
                return _fts_string(t)
            forms = [f for f in dict.fromkeys((t, t.replace(" ", ""))) if len(f) >= GRAM_MIN]
            return "(" + " OR ".join(map(_fts_string, forms)) + ")" if forms else None
        if grams and any(one(p) is None for p in self.phrases):
            return None
        q = [x for x in map(one, self.terms) if x]
        if not q:
            return None
        anyof = "(" + " OR ".join(q) + ")"
        return " AND ".join([one(p) for p in self.phrases] + [anyof]) if self.phrases else anyof


def _fts_string(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def parse(text: str) -> KeywordQuery:
    """A user's query -> words and phrases; stop words and what has no letter or digit are dropped. Control and
    format characters (NUL, zero-width spaces...) separate words: FTS5 would end a string at a NUL."""
    text = "".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in text)
    phrases = [p.strip() for p in QUOTED.findall(text) if WORD.search(p)]
    rest = QUOTED.sub(" ", text).replace('"', " ")
    words: list[str] = []
    for raw in rest.split():
        w = raw.strip(".,;:!?()[]{}'`*^+<>|\\/").lower()[:MAX_TERM_CHARS]
        if not WORD.search(w) or w in STOP_WORDS or w in words:
            continue
        words.append(w)
    phrases = [p[:MAX_TERM_CHARS * 4] for p in dict.fromkeys(phrases)]
    q = KeywordQuery(words, phrases)
    keep = MAX_TERMS
    q.dropped = max(0, len(q.phrases) + len(q.words) - keep)
    q.phrases = q.phrases[:keep]
    q.words = q.words[: max(0, keep - len(q.phrases))]
    return q


def document(meta: dict | None) -> tuple[str, ...] | None:
    """An item's metadata value -> its five field texts (None: nothing to index)."""
    if not isinstance(meta, dict):
        return None
    fields = meta.get("fields") if isinstance(meta.get("fields"), dict) else {}
    tags = meta.get("tags") if isinstance(meta.get("tags"), list) else []
    doc = (os.path.basename(str(meta.get("uri") or "")), str(meta.get("caption") or ""),
           ", ".join(str(t) for t in tags), str(meta.get("text") or ""),
           " · ".join(str(v) for v in fields.values() if isinstance(v, str)))
    return tuple(s[:MAX_TEXT_CHARS] for s in doc)


def _create(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=OFF")  # a temporary file until the rename: nothing to roll back to
    con.execute("PRAGMA synchronous=OFF")
    con.execute("CREATE TABLE IF NOT EXISTS items(row INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL)")
    con.execute("CREATE VIRTUAL TABLE IF NOT EXISTS docs USING fts5(" + ", ".join(FIELDS)
                + ", tokenize='unicode61 remove_diacritics 2')")
    # the image's text again, by trigrams: OCR runs the words of a sign together ("POSTOFFICE"), and a word
    # inside such a token is a substring match only
    con.execute("CREATE VIRTUAL TABLE IF NOT EXISTS grams USING fts5(text, tokenize='trigram')")
    return con


def _insert(con: sqlite3.Connection, ids: Iterable[str], metas: Iterable[dict | None]) -> int:
    n = 0
    for item_id, meta in zip(ids, metas):
        doc = document(meta)
        if doc is None or not any(doc):
            continue
        cur = con.execute("INSERT OR REPLACE INTO items(id) VALUES (?)", (item_id,))
        con.execute("INSERT INTO docs(rowid, " + ", ".join(FIELDS) + ") VALUES (?, ?, ?, ?, ?, ?)",
                    (cur.lastrowid, *doc))
        if doc[TEXT]:
            con.execute("INSERT INTO grams(rowid, text) VALUES (?, ?)", (cur.lastrowid, doc[TEXT]))
        n += 1
    return n


def _delete(con: sqlite3.Connection, ids: Iterable[str]) -> int:
    n = 0
    for item_id in ids:
        row = con.execute("SELECT row FROM items WHERE id = ?", (item_id,)).fetchone()
        if row is None:
            continue
        con.execute("DELETE FROM docs WHERE rowid = ?", row)
        con.execute("DELETE FROM grams WHERE rowid = ?", row)
        con.execute("DELETE FROM items WHERE row = ?", row)
        n += 1
    return n


def write(vdir: Path, ids: list[str], metas: Callable[[list[str]], list[dict | None]], chunk: int = 1000,
          base: Path | None = None, drop: Iterable[str] = ()) -> dict:
    """Write <vdir>/text.sqlite: from scratch (base None: every id), or from a base version's file (base: its
    version dir) minus `drop` plus `ids`. metas(ids) reads their metadata (chunks of `chunk`). Written to a
    temporary name and renamed, so the file is whole or absent; a rerun after a kill writes it again. The caller
    passes base only when the base has a text.sqlite (a base from before keyword indexes: write every id).
    -> {"indexed": items in the file, "inserted", "deleted"}"""
    path, tmp = vdir / FILE, vdir / (FILE + ".tmp")
    tmp.unlink(missing_ok=True)
    if base is not None:
        src = sqlite3.connect(f"file:{base / FILE}?mode=ro", uri=True)
        con = sqlite3.connect(tmp)
        with con:
            src.backup(con)  # a page copy: 100K items in well under a second
        src.close()
        con.close()
    con = _create(tmp)
    deleted = _delete(con, drop) if base is not None else 0
    inserted = 0
    for i in range(0, len(ids), chunk):
        part = ids[i:i + chunk]
        inserted += _insert(con, part, metas(part))
    con.commit()
    con.execute("INSERT INTO docs(docs) VALUES ('optimize')")  # one b-tree per term: faster queries, smaller file
    con.execute("INSERT INTO grams(grams) VALUES ('optimize')")
    con.commit()
    indexed = con.execute("SELECT count(*) FROM items").fetchone()[0]
    con.close()
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return {"indexed": indexed, "inserted": inserted, "deleted": deleted}


@dataclass
class Highlight:
    field: str
    text: str  # the field's indexed text
    spans: list[tuple[int, int]]  # [start, end) character offsets of the matched words in `text`


class KeywordIndex:
    """One version's text.sqlite, read-only. Thread-safe: one SQLite connection per thread."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(self.path)
        self._local = threading.local()
        self.count = self._con().execute("SELECT count(*) FROM items").fetchone()[0]

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(f"file:{self.path}?mode=ro&immutable=1", uri=True, check_same_thread=False)
            self._local.con = con
        return con

    def search(self, q: KeywordQuery, limit: int, allow: Callable[[str], bool] | None = None) -> list[tuple[str, float]]:
        """The best `limit` items for q by BM25 -> [(id, score)], score > 0, best first. allow(id) False: the item
        is passed over (a filter), and the next best is taken instead."""
        if q.empty or limit <= 0:
            return []
        weights = ", ".join(str(w) for w in WEIGHTS)
        scores: dict[str, float] = {}
        # an item's score: its BM25 over the word table plus, for its image text, over the trigram table (a word
        # found whole scores on both, one found inside a run-together token on the second only)
        for sql, expr in ((f"SELECT items.id, -bm25(docs, {weights}) FROM docs JOIN items ON items.row = docs.rowid "
                           f"WHERE docs MATCH ? ORDER BY bm25(docs, {weights})", q.match()),
                          ("SELECT items.id, -bm25(grams) FROM grams JOIN items ON items.row = grams.rowid "
                           "WHERE grams MATCH ? ORDER BY bm25(grams)", q.match(grams=True))):
            if expr is None:
                continue
            cur = self._con().execute(sql, (expr,))
            taken = 0
            for item_id, score in cur:
                if allow is None or allow(item_id):
                    scores[item_id] = scores.get(item_id, 0.0) + float(score)
                    taken += 1
                    if taken >= limit:
                        break
            cur.close()
        return sorted(scores.items(), key=lambda kv: -kv[1])[:limit]

    def coverage(self, q: KeywordQuery, ids: list[str]) -> dict[str, float]:
        """The share of q's words each of ids holds, 0..1 (1: all of them). A query with quoted phrases: 1 for
        every match, which holds every phrase by construction: the user said what must be there. Hybrid search
        weighs a keyword match by it (service/hybrid.py): a caption query whose one word sits in some photo's
        text is not a match of the query."""
        if not ids or q.phrases or not q.words:
            return {i: 1.0 for i in ids}
        marks = ",".join("?" * len(ids))
        held: dict[str, int] = {i: 0 for i in ids}
        for w in q.words:
            found: set[str] = set()
            for table, expr in (("docs", _fts_string(w)), ("grams", _fts_string(w) if len(w) >= GRAM_MIN else None)):
                if expr is None:
                    continue
                found |= {r[0] for r in self._con().execute(
                    f"SELECT items.id FROM {table} JOIN items ON items.row = {table}.rowid "
                    f"WHERE {table} MATCH ? AND items.id IN ({marks})", (expr, *ids))}
            for i in found:
                held[i] += 1
        return {i: held[i] / len(q.words) for i in ids}

    def highlights(self, q: KeywordQuery, ids: list[str]) -> dict[str, list[Highlight]]:
        """For each of ids that q matches: the fields holding a matched word, with the words' offsets."""
        if q.empty or not ids:
            return {}
        cols = ", ".join(f"highlight(docs, {i}, '{MARK_OPEN}', '{MARK_CLOSE}')" for i in range(len(FIELDS)))
        marks = ",".join("?" * len(ids))
        found: dict[str, dict[str, Highlight]] = {}
        for table, names, expr in (("docs", FIELDS, q.match()), ("grams", ("text",), q.match(grams=True))):
            if expr is None:
                continue
            sel = cols if table == "docs" else f"highlight(grams, 0, '{MARK_OPEN}', '{MARK_CLOSE}')"
            rows = self._con().execute(
                f"SELECT items.id, {sel} FROM {table} JOIN items ON items.row = {table}.rowid "
                f"WHERE {table} MATCH ? AND items.id IN ({marks})", (expr, *ids)).fetchall()
            for item_id, *texts in rows:
                for name, t in zip(names, texts):
                    if t and MARK_OPEN in t and (h := _spans(name, t)):
                        old = found.setdefault(item_id, {}).get(name)
                        if old is not None:  # the text field from both tables: one list of spans
                            h.spans = _merge(old.spans + h.spans)
                        found[item_id][name] = h
        return {i: [found[i][n] for n in FIELDS if n in found[i]] for i in found}


def _spans(name: str, marked: str) -> Highlight | None:
    text, spans, start = [], [], None
    n = 0
    for ch in marked:
        if ch == MARK_OPEN:
            start = n
        elif ch == MARK_CLOSE and start is not None:
            spans.append((start, n))
            start = None
        else:
            text.append(ch)
            n += 1
    return Highlight(name, "".join(text), spans) if spans else None


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def open_for(vdir: Path) -> KeywordIndex | None:
    """The version's keyword index, or None for a version built before them, or whose file cannot be read (logged:
    the version is still served, by vectors; answers say why in mode_note)."""
    p = Path(vdir) / FILE
    if not p.exists():
        return None
    try:
        return KeywordIndex(p)
    except sqlite3.Error as e:
        log.error("keyword index %s cannot be read (%s: %s); the version is served by vectors only", p,
                  type(e).__name__, e)
        return None
