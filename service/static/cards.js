// crossprobe's page: one result card. The photo first (a link to the full-size image), its name, the words a
// keyword match found (marked), "More like this", and a "Strong match" marker when the calibrated relevance is high
// enough to mean something. The numbers (score, two-tower cosine, relevance) are built too, but shown only while
// "Details" is open (app.css: #results.show-scores). app.js puts the cards in the list.
import { hasKey, imageUrl, openWithKey, showImage } from "./api.js";
import { placeOverlay } from "./explain.js";

const THUMB = 320; // px, the longer side asked of v1/items/{id}/image (cards are at most ~240 css px wide)

// Relevance is the chance that a result is the one photo a caption was written for, among ~1,000 (the dev sets).
// Queries for things the library lacks almost never reach 0.3 (docs/research/calibration.md, "A cutoff"), so the
// marker rarely praises a wrong photo. Lower values say little to a person (a right first photo over a small
// gallery reads low, and no cutoff tells absent things apart): no number and no "weak match" notice is shown.
export const STRONG_MATCH = 0.3;

// ---- words: what a keyword match matched, and the text read in the photo ------------------------
const FIELD_LABELS = { name: "file", caption: "caption", tags: "tags", text: "text in photo", fields: "fields" };
const SHOWN_CHARS = 120;

// text with its [start, end) spans marked: DOM nodes only, so no text is ever read as HTML
function marked(text, spans) {
  const frag = document.createDocumentFragment();
  // a long text is shown from a little before its first match
  let at = spans.length && spans[0][0] > 40 ? spans[0][0] - 30 : 0;
  if (at) frag.appendChild(document.createTextNode("…"));
  const stop = at + SHOWN_CHARS;
  for (const [a, b] of spans) {
    if (a >= stop) break;
    if (a > at) frag.appendChild(document.createTextNode(text.slice(at, a)));
    const m = document.createElement("mark");
    m.textContent = text.slice(a, b);
    frag.appendChild(m);
    at = b;
  }
  const end = Math.max(at, Math.min(text.length, stop));
  if (end > at) frag.appendChild(document.createTextNode(text.slice(at, end)));
  if (text.length > end) frag.appendChild(document.createTextNode("…"));
  return frag;
}

// one line per field a keyword match matched, and the photo's own text (OCR) when it has some
function foundText(hit) {
  const lines = (hit.highlights || []).slice();
  const read = hit.metadata && hit.metadata.text;
  if (read && !lines.some((h) => h.field === "text")) lines.push({ field: "text", text: read, spans: [] });
  if (!lines.length) return null;
  const box = document.createElement("div");
  box.className = "found";
  for (const h of lines) {
    const p = document.createElement("p");
    p.className = "found-" + h.field;
    p.title = h.text; // the lines are cut to two on screen (app.css): the whole text on hover
    const label = document.createElement("span");
    label.className = "found-label";
    label.textContent = (FIELD_LABELS[h.field] || h.field) + ": ";
    p.appendChild(label);
    p.appendChild(marked(h.text, h.spans));
    box.appendChild(p);
  }
  return box;
}

// the numbers behind the order, for "Details": by words, how much of the query the photo holds (a BM25 score means
// little to a person, and is ~0 for a word found only inside one photo's text)
function scores(hit, rerank) {
  const p = document.createElement("p");
  p.className = "scores";
  const score = document.createElement("span");
  score.className = "score";
  const byWords = rerank === "keyword";
  const cov = hit.scores.keyword_coverage;
  score.textContent = !byWords ? "score " + hit.score.toFixed(3)
    : cov === 1 ? "holds every word" : "holds " + Math.round(100 * cov) + "% of the words";
  score.title = byWords ? "BM25 " + hit.score.toPrecision(3) : rerank === "none" ? "two-tower cosine"
    : rerank + " logit fused with the two-tower score";
  p.appendChild(score);
  if (hit.scores.rerank !== null) {
    const ann = document.createElement("span");
    ann.className = "ann";
    ann.textContent = "two-tower " + hit.scores.ann.toFixed(3);
    ann.title = "the first stage's cosine (before reranking)";
    p.appendChild(ann);
  }
  if (hit.relevance !== null && hit.relevance !== undefined) {
    const rel = document.createElement("span");
    rel.className = "relevance";
    rel.textContent = "relevance " + hit.relevance.toFixed(2);
    rel.title = "calibrated on the dev captions: how often a result with this relevance was the very photo a " +
      "caption described, among about 1,000 photos (min_relevance in the API cuts the list there)";
    p.appendChild(rel);
  }
  return p;
}

function strongMatch() {
  const el = document.createElement("span");
  el.className = "strong-match";
  el.textContent = "Strong match";
  el.title = "Its calibrated relevance is " + STRONG_MATCH + " or more: rare for a photo that does not show what " +
    "was asked (the numbers: Details)";
  return el;
}

// the photo, a link to the full-size image (with a key: fetched with it and shown in a new tab), with its heat map
function thumb(hit, rank, index, li, onError) {
  const link = document.createElement("a");
  link.className = "thumb";
  link.href = imageUrl(hit.id, index);
  link.target = "_blank";
  link.rel = "noopener";
  link.addEventListener("click", (ev) => {
    if (!hasKey()) return; // a plain link
    ev.preventDefault();
    openWithKey(link.href).catch((e) => onError("The image could not be opened: " + e.message + "."));
  });

  const img = document.createElement("img");
  const caption = hit.metadata && hit.metadata.caption;
  img.alt = "Result " + rank + ": " + (caption ? caption + " (" + hit.id + ")" : hit.id);
  img.decoding = "async";
  img.addEventListener("load", () => placeOverlay(li));
  showImage(img, imageUrl(hit.id, index, THUMB));
  link.appendChild(img);

  const heat = document.createElement("canvas");
  heat.className = "heat";
  heat.width = 7;
  heat.height = 7;
  heat.hidden = true;
  heat.setAttribute("role", "img");
  link.appendChild(heat);

  const newTab = document.createElement("span");
  newTab.className = "visually-hidden";
  newTab.textContent = " (full size, opens in a new tab)";
  link.appendChild(newTab);
  return link;
}

// hit: one of the answer's results; rank: its place (1-based, across pages); rerank: the answer's reranker, or
// "keyword" for a words-only answer; hooks: onLike(id, index) ("More like this"), onError(text) (for the status line)
export function card(hit, rank, index, rerank, hooks) {
  const li = document.createElement("li");
  li.className = "card";
  li.dataset.id = hit.id;
  li.appendChild(thumb(hit, rank, index, li, hooks.onError));

  const meta = document.createElement("div");
  meta.className = "meta";
  if (hit.relevance !== null && hit.relevance !== undefined && hit.relevance >= STRONG_MATCH) {
    meta.appendChild(strongMatch());
  }
  const name = document.createElement("p");
  name.className = "name";
  name.title = hit.id;
  name.textContent = hit.id;
  meta.appendChild(name);
  const words = foundText(hit);
  if (words) meta.appendChild(words);
  meta.appendChild(scores(hit, rerank));

  // more like this: the item's stored vector is the query (the item itself is left out of the answer)
  const more = document.createElement("button");
  more.type = "button";
  more.className = "secondary more-like";
  more.textContent = "More like this";
  more.setAttribute("aria-label", "More like this: " + hit.id);
  more.addEventListener("click", () => hooks.onLike(hit.id, index));
  meta.appendChild(more);

  const note = document.createElement("p");
  note.className = "explain-note";
  note.hidden = true;
  meta.appendChild(note);
  li.appendChild(meta);
  return li;
}
