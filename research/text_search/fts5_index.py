"""SQLite FTS5 as the keyword index: the design crossprobe served first, kept as the baseline that
research/text_search/engines.py measures storage/keyword.py (tantivy) against (docs/research/text_search.md).

The same fields, query rules and documents as crossprobe's index (keyword.py's parse and document); only the
engine differs:

    items   (row INTEGER PRIMARY KEY, id TEXT UNIQUE)      the item id behind each FTS5 rowid
    docs    FTS5 (name, caption, tags, text, fields)        rowid = items.row, tokenizer unicode61
    grams   FTS5 (text) with the trigram tokenizer          the image's text again, for words OCR ran together

An item's score is its BM25 over `docs` plus, for its image text, over `grams`. FTS5 computes BM25 for every
row that matches one of the query's words, which is what made it slow over 100K captioned items.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

from crossprobe.storage.keyword import BOOSTS, FIELDS, GRAM_MIN, KeywordQuery, document

FILE = "text.sqlite"
WEIGHTS = ", ".join(str(BOOSTS[f]) for f in FIELDS)  # bm25()'s column weights: keyword.py's field boosts


def _fts_string(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def match(q: KeywordQuery, grams: bool = False) -> str | None:
    """The FTS5 MATCH expression: every phrase AND (any phrase or word), each term an FTS5 string (no character
    of the user's text is FTS5 syntax). grams: for the trigram table, each term also without its spaces, terms
    under GRAM_MIN characters left out (None: nothing left)."""
    def one(t: str) -> str | None:
        if not grams:
            return _fts_string(t)
        forms = [f for f in dict.fromkeys((t, t.replace(" ", ""))) if len(f) >= GRAM_MIN]
        return "(" + " OR ".join(map(_fts_string, forms)) + ")" if forms else None
    if grams and any(one(p) is None for p in q.phrases):
        return None
    terms = [x for x in map(one, q.terms) if x]
    if not terms:
        return None
    anyof = "(" + " OR ".join(terms) + ")"
    return " AND ".join([one(p) for p in q.phrases] + [anyof]) if q.phrases else anyof


def write(folder: Path, ids: list[str], metas: Callable[[list[str]], list[dict | None]], chunk: int = 1000) -> int:
    """<folder>/text.sqlite from every id's metadata -> items indexed."""
    con = sqlite3.connect(folder / FILE)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute("CREATE TABLE items(row INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL)")
    con.execute(f"CREATE VIRTUAL TABLE docs USING fts5({', '.join(FIELDS)}, tokenize='unicode61 remove_diacritics 2')")
    con.execute("CREATE VIRTUAL TABLE grams USING fts5(text, tokenize='trigram')")
    for i in range(0, len(ids), chunk):
        part = ids[i:i + chunk]
        for item_id, meta in zip(part, metas(part)):
            doc = document(meta)
            if doc is None or not any(doc.values()):
                continue
            row = con.execute("INSERT INTO items(id) VALUES (?)", (item_id,)).lastrowid
            con.execute(f"INSERT INTO docs(rowid, {', '.join(FIELDS)}) VALUES (?, ?, ?, ?, ?, ?)",
                        (row, *(doc[f] for f in FIELDS)))
            if doc["text"]:
                con.execute("INSERT INTO grams(rowid, text) VALUES (?, ?)", (row, doc["text"]))
    con.commit()
    con.execute("INSERT INTO docs(docs) VALUES ('optimize')")  # one b-tree per term: faster queries, smaller file
    con.execute("INSERT INTO grams(grams) VALUES ('optimize')")
    con.commit()
    n = con.execute("SELECT count(*) FROM items").fetchone()[0]
    con.close()
    return n


class KeywordIndex:
    """A text.sqlite, read-only, searched like crossprobe's KeywordIndex.search."""

    def __init__(self, path: Path):
        self.con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)

    def search(self, q: KeywordQuery, limit: int) -> list[tuple[str, float]]:
        """The best `limit` items for q -> [(id, score)], best first."""
        scores: dict[str, float] = {}
        for sql, expr in ((f"SELECT items.id, -bm25(docs, {WEIGHTS}) FROM docs JOIN items ON items.row = docs.rowid "
                           f"WHERE docs MATCH ? ORDER BY bm25(docs, {WEIGHTS})", match(q)),
                          ("SELECT items.id, -bm25(grams) FROM grams JOIN items ON items.row = grams.rowid "
                           "WHERE grams MATCH ? ORDER BY bm25(grams)", match(q, grams=True))):
            if expr is None or limit <= 0:
                continue
            cur = self.con.execute(sql, (expr,))  # the first `limit` rows of each table, as the served version read them
            for taken, (item_id, score) in enumerate(cur, 1):
                scores[item_id] = scores.get(item_id, 0.0) + float(score)
                if taken >= limit:
                    break
            cur.close()
        return sorted(scores.items(), key=lambda kv: -kv[1])[:limit]
