// crossprobe's search page: plain browser JavaScript modules, no build step, no third-party code.
// It calls the service's own API with relative URLs: v1/indexes, v1/search, v1/search/image, v1/explain,
// v1/items/{id}/image. This module owns the form, the search and the result cards; the others:
//   api.js      the search key (X-API-Key, when the service has keys) and every fetch
//   query.js    an image or "More like this" item to search with, as chips, and the text / image weight
//   filters.js  filter chips from the results' metadata, a date range, the matching count
//   explain.js  the heat maps over the thumbnails
import { api, hasKey, imageUrl, isKeyError, keyChanged, ms, openWithKey, revokeImages, savedKey, showImage, sleep }
  from "./api.js";
import { explain, placeOverlay, view } from "./explain.js";
import { createFilters } from "./filters.js";
import { createQuery } from "./query.js";

const $ = (id) => document.getElementById(id);
const form = $("search-form");
const input = $("q");
const indexSelect = $("index");
const kSelect = $("k");
const sortSelect = $("sort");
const modeSelect = $("mode");
const moreButton = $("more-results");
const explainBox = $("explain");
const statusEl = $("status");
const results = $("results");
const timingsBox = $("timings");
const keyField = $("key-field");
const keyInput = $("api-key");

const THUMB = 320; // px, the longer side asked of v1/items/{id}/image (cards are at most ~240 css px wide)
const STAGES = ["queue", "encode", "decode_image", "encode_image", "like", "ann", "keyword", "fetch", "rerank", "dedup",
  "metadata", "highlight", "load", "decode", "backbone", "attention"];

let searchSeq = 0; // answers of superseded requests are dropped
let searchAbort = null;
let indexesLoaded = false;
let loadSeq = 0; // a newer loadIndexes() ends an older one's polling
let imageLimit = 0; // the service's CROSSPROBE_QUERY_IMAGE_MAX_BYTES (v1/indexes "limits"); 0: not known
let focusResults = false; // a "More like this" click: its button goes with the old results, focus the new ones
let nextOffset = null; // the answer's next_offset: where "More results" goes on (null: the last page is shown)
let shown = 0; // results on screen (pages appended by "More results")

// ---- helpers ------------------------------------------------------------------------------------
function rerankValue() {
  return form.querySelector('input[name="rerank"]:checked').value;
}

function setStatus(text, kind) {
  statusEl.textContent = text;
  statusEl.className = "status" + (kind ? " " + kind : "");
}

const query = createQuery({ onChange: () => search(), message: (t) => setStatus(t, "error"), limit: () => imageLimit });
const filters = createFilters({ onChange: () => search(), message: (t) => setStatus(t, "error") });

// ---- index picker -------------------------------------------------------------------------------
async function loadIndexes() {
  const seq = ++loadSeq;
  // the service answers while it is still loading its models and indexes: ask again for up to two minutes
  for (let attempt = 0; attempt < 120; attempt++) {
    let body = null;
    try {
      body = await api("v1/indexes");
    } catch (e) {
      if (isKeyError(e)) {
        // asking again will not help: a new key in the field starts this again
        if (seq === loadSeq) setStatus(e.message.charAt(0).toUpperCase() + e.message.slice(1) + ".", "error");
        return false;
      }
      body = null;
    }
    if (seq !== loadSeq) return false;
    if (body && body.indexes.length) {
      fillIndexes(body);
      imageLimit = (body.limits && body.limits.query_image_bytes) || 0;
      indexesLoaded = true;
      if (statusEl.classList.contains("busy")) setStatus("");
      return true;
    }
    setStatus("The service is still loading its indexes…", "busy");
    await sleep(1000);
  }
  setStatus("No index is being served.", "error");
  return false;
}

function fillIndexes(body) {
  const wanted = new URLSearchParams(location.search).get("index");
  indexSelect.textContent = "";
  for (const ix of body.indexes) {
    const opt = document.createElement("option");
    opt.value = ix.name;
    opt.textContent = ix.name + " (" + ix.count.toLocaleString("en") + " images)";
    opt.selected = wanted ? ix.name === wanted : ix.default;
    indexSelect.appendChild(opt);
  }
}

// ---- search -------------------------------------------------------------------------------------
// -> [path, fetch options] of the search the form describes: an image goes as a multipart upload to
// v1/search/image (no base64: the whole CROSSPROBE_QUERY_IMAGE_MAX_BYTES fits the body limit), the rest as JSON.
// offset: the page (0, or the previous answer's next_offset for "More results"); the order: the "Order" select
function request(text, image, like, offset) {
  const k = Number(kSelect.value);
  const flt = filters.filter();
  const sort = sortSelect.value;
  if (image) {
    const q = new URLSearchParams({ k: String(k) });
    if (offset) q.set("offset", String(offset));
    if (sort !== "relevance") q.set("sort", sort);
    if (text) {
      q.set("query", text);
      q.set("rerank", rerankValue());
      q.set("weight", String(query.weight()));
    }
    if (indexSelect.value) q.set("index", indexSelect.value);
    if (flt) q.set("filter", JSON.stringify(flt));
    const data = new FormData();
    data.append("image", image.blob, image.name);
    return ["v1/search/image?" + q.toString(), { method: "POST", body: data }];
  }
  const req = { k: k };
  if (offset) req.offset = offset;
  if (sort !== "relevance") req.sort = sort;
  if (text) {
    req.query = text;
    req.rerank = rerankValue(); // without a text there is nothing to rerank with: the server's default says so
    req.mode = modeSelect.value; // words and meaning (hybrid), meaning only (vector), words only (keyword)
  }
  if (like) req.like = like;
  if (text && like) req.weight = query.weight();
  if (indexSelect.value) req.index = indexSelect.value;
  if (flt) req.filter = flt;
  return ["v1/search", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(req) }];
}

// more: the next page of the search on screen, appended below it ("More results")
async function search(more) {
  const text = input.value.trim();
  const image = query.image();
  const like = query.like();
  query.syncWeight();
  if (!text && !image && !like) {
    setStatus("Type what the image should show, or drop an image here, then press Enter.", "error");
    input.focus();
    return;
  }
  const append = more === true && nextOffset !== null && view.last !== null;
  const [path, init] = request(text, image, like, append ? nextOffset : 0);
  const seq = ++searchSeq;
  if (searchAbort) searchAbort.abort();
  searchAbort = new AbortController();
  init.signal = searchAbort.signal;
  form.setAttribute("aria-busy", "true");
  moreButton.disabled = append;
  setStatus(append ? "Loading more results…" : image ? "Searching with the image…" : "Searching…", "busy");
  remember(text, like);
  let body;
  try {
    body = await api(path, init);
  } catch (e) {
    if (e.name === "AbortError" || seq !== searchSeq) return;
    form.removeAttribute("aria-busy");
    moreButton.disabled = false;
    setStatus("Search failed: " + e.message, "error"); // the service's own words (413 / 422 / 404 ...)
    filters.keep();
    return;
  }
  if (seq !== searchSeq) return;
  form.removeAttribute("aria-busy");
  moreButton.disabled = false;
  const before = append ? view.last.hits : [];
  view.last = { query: text || null, what: describe(text, image, like), index: body.index.name, rerank: body.rerank,
    hits: before.concat(body.results) };
  render(body, append);
  if (explainBox.checked) explain();
}

// the address says what is on screen: a search can be reloaded, bookmarked and shared (an image cannot be)
function remember(text, like) {
  const q = new URLSearchParams();
  if (text) q.set("q", text);
  if (like) q.set("like", like);
  q.set("rerank", rerankValue());
  q.set("k", kSelect.value);
  if (sortSelect.value !== "relevance") q.set("sort", sortSelect.value);
  if (indexSelect.value) q.set("index", indexSelect.value);
  const f = filters.state();
  if (f) q.set("filter", JSON.stringify(f));
  if (explainBox.checked) q.set("explain", "1");
  history.replaceState(null, "", "?" + q.toString());
}

function describe(text, image, like) {
  const other = image ? "the image “" + image.name + "”" : like ? "items like “" + like + "”" : "";
  if (!text) return image ? "the image “" + image.name + "”" : "more like “" + like + "”";
  return other ? "“" + text + "” and " + other + " (weight " + query.weight().toFixed(1) + ")" : "“" + text + "”";
}

const ORDER = { "date_taken": "oldest taken first", "-date_taken": "newest taken first",
  "date_added": "oldest added first", "-date_added": "newest added first" };

// append: a further page ("More results"): its cards go below the ones on screen, numbered on
function render(body, append) {
  if (!append) {
    results.textContent = "";
    revokeImages();
    shown = 0;
  }
  const first = shown;
  shown += body.results.length;
  nextOffset = body.next_offset;
  moreButton.hidden = nextOffset === null;
  const last = view.last;
  const how = body.mode === "keyword" ? "ranked by its words"
    : (body.rerank !== "none" ? "reranked by " + body.rerank
      : last.query ? "ranked by the two-tower score" : "ranked by similarity (no text to rerank with)") +
      (body.mode === "hybrid" && body.keyword && body.keyword.hits ? ", photos holding the words first" : "");
  const what = last.what.startsWith("more like") ? ", " + last.what : " for " + last.what;
  const count = shown < body.total ? shown + " of " + body.total + " results"
    : body.total + (body.total === 1 ? " result" : " results");
  let text = count + what + " in " + body.index.name + ", " + how + (ORDER[body.sort] ? ", " + ORDER[body.sort] : "") +
    ", in " + ms(body.timings_ms.total) + " ms.";
  if (body.deduplicated) text += " " + body.deduplicated + " near duplicates left out.";
  if (body.degraded) text += " Degraded: " + body.degraded_reason;
  view.summary = text;
  view.summaryKind = body.degraded ? "warn" : "";
  setStatus(text, view.summaryKind);
  body.results.forEach((hit, i) => results.appendChild(card(hit, first + i + 1, body.index.name, body.mode === "keyword" ? "keyword" : body.rerank)));
  filters.update(last.hits, body.filtered || null);
  $("timings-explain").hidden = true;
  $("explain-spread").hidden = true;
  showTimings($("timings-search"), "search", body.timings_ms);
  if (append && body.results.length) {
    const card1 = results.children[first];
    const link = card1 && card1.querySelector("a.thumb");
    if (link) link.focus(); // keyboard and screen reader users go on where the new page starts
  }
  if (focusResults) results.focus();
  focusResults = false;
}

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
    const label = document.createElement("span");
    label.className = "found-label";
    label.textContent = (FIELD_LABELS[h.field] || h.field) + ": ";
    p.appendChild(label);
    p.appendChild(marked(h.text, h.spans));
    box.appendChild(p);
  }
  return box;
}

function card(hit, rank, index, rerank) {
  const li = document.createElement("li");
  li.className = "card";
  li.dataset.id = hit.id;

  const link = document.createElement("a");
  link.className = "thumb";
  link.href = imageUrl(hit.id, index);
  link.target = "_blank";
  link.rel = "noopener";
  link.addEventListener("click", (ev) => {
    if (!hasKey()) return; // a plain link
    ev.preventDefault();
    openWithKey(link.href).catch((e) => setStatus("The image could not be opened: " + e.message + ".", "error"));
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
  li.appendChild(link);

  const meta = document.createElement("div");
  meta.className = "meta";
  const name = document.createElement("p");
  name.className = "name";
  name.title = hit.id;
  name.textContent = rank + ". " + hit.id;
  meta.appendChild(name);

  const scores = document.createElement("p");
  scores.className = "scores";
  const score = document.createElement("span");
  score.className = "score";
  const byWords = rerank === "keyword";
  // by words: how much of the query the photo holds (a BM25 score means little to a person, and is ~0 for a word
  // found only inside one photo's text)
  const cov = hit.scores.keyword_coverage;
  score.textContent = !byWords ? "score " + hit.score.toFixed(3)
    : cov === 1 ? "holds every word" : "holds " + Math.round(100 * cov) + "% of the words";
  score.title = byWords ? "BM25 " + hit.score.toPrecision(3) : rerank === "none" ? "two-tower cosine"
    : rerank + " logit fused with the two-tower score";
  scores.appendChild(score);
  if (hit.scores.rerank !== null) {
    const ann = document.createElement("span");
    ann.className = "ann";
    ann.textContent = "two-tower " + hit.scores.ann.toFixed(3);
    ann.title = "the first stage's cosine (before reranking)";
    scores.appendChild(ann);
  }
  if (hit.relevance !== null && hit.relevance !== undefined) {
    // muted, beside the scores: it is the chance this is the one photo a caption describes among ~1,000
    // (docs/research/calibration.md), which reads low on small or unfamiliar galleries even when the order is right
    const rel = document.createElement("span");
    rel.className = "relevance";
    rel.textContent = "relevance " + hit.relevance.toFixed(2);
    rel.title = "calibrated on the dev captions: how often a result with this relevance was the very photo a " +
      "caption described, among about 1,000 photos (min_relevance in the API cuts the list there)";
    scores.appendChild(rel);
  }
  meta.appendChild(scores);
  const words = foundText(hit);
  if (words) meta.appendChild(words);

  // more like this: the item's stored vector is the query (the item itself is left out of the answer)
  const more = document.createElement("button");
  more.type = "button";
  more.className = "secondary more-like";
  more.textContent = "More like this";
  more.setAttribute("aria-label", "More like this: " + hit.id);
  more.addEventListener("click", () => {
    query.setLike(hit.id, index);
    focusResults = true;
    search();
  });
  meta.appendChild(more);

  const note = document.createElement("p");
  note.className = "explain-note";
  note.hidden = true;
  meta.appendChild(note);
  li.appendChild(meta);
  return li;
}

function showTimings(dl, title, timings) {
  dl.textContent = "";
  dl.dataset.total = ms(timings.total);
  const dt0 = document.createElement("dt");
  dt0.className = "group";
  dt0.textContent = title;
  const dd0 = document.createElement("dd");
  dd0.className = "group";
  dd0.textContent = ms(timings.total) + " ms in all";
  dl.append(dt0, dd0);
  const total = Math.max(timings.total || 0, 1e-9);
  for (const stage of STAGES) {
    if (!(stage in timings)) continue;
    const dt = document.createElement("dt");
    dt.textContent = stage;
    const dd = document.createElement("dd");
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = Math.max(1, Math.round((100 * timings[stage]) / total)) + "%";
    const val = document.createElement("span");
    val.className = "ms";
    val.textContent = ms(timings[stage]) + " ms";
    dd.append(bar, val);
    dl.append(dt, dd);
  }
  dl.hidden = false;
  timingsBox.hidden = false;
  timingsSummary();
}

// the disclosure's one line: each request's total
function timingsSummary() {
  const parts = [];
  for (const [id, name] of [["timings-search", "search"], ["timings-explain", "explain"]]) {
    const el = $(id);
    if (!el.hidden && el.dataset.total) parts.push(name + " " + el.dataset.total + "\u00a0ms"); // no break inside "424 ms"
  }
  $("timings-summary").textContent = parts.length ? ": " + parts.join(", ") : "";
}

Object.assign(view, { setStatus: setStatus, showTimings: showTimings, timingsSummary: timingsSummary });

// ---- wiring -------------------------------------------------------------------------------------
function start() {
  return loadIndexes().then((ok) => {
    if (ok && (input.value.trim() || query.like())) search();
  });
}

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  if (keyChanged() && !indexesLoaded) {
    start(); // it searches once the indexes are in
    return;
  }
  search();
});
// a new key (Enter or leaving the field): load what it was needed for
keyInput.addEventListener("change", () => {
  if (!keyChanged()) return;
  if (!indexesLoaded) start();
  else if (view.last) search();
});
// an option changed: show its effect at once for the query on screen
for (const el of form.querySelectorAll('input[name="rerank"]')) {
  el.addEventListener("change", () => view.last && search());
}
indexSelect.addEventListener("change", () => view.last && search());
kSelect.addEventListener("change", () => view.last && search());
sortSelect.addEventListener("change", () => view.last && search());
modeSelect.addEventListener("change", () => view.last && search());
moreButton.addEventListener("click", () => search(true));
explainBox.addEventListener("change", () => {
  if (view.last) remember(input.value.trim(), query.like());
  explain();
});

timingsBox.open = window.matchMedia("(min-width: 700px)").matches;

// restore a search from the URL (?q=...&like=...&rerank=...&k=...&sort=...&index=...&filter=...&explain=1)
const params = new URLSearchParams(location.search);
const r = params.get("rerank");
if (r) {
  const radio = form.querySelector('input[name="rerank"][value="' + CSS.escape(r) + '"]');
  if (radio) radio.checked = true;
}
if (params.get("k") && kSelect.querySelector('option[value="' + CSS.escape(params.get("k")) + '"]')) {
  kSelect.value = params.get("k");
}
if (params.get("sort") && sortSelect.querySelector('option[value="' + CSS.escape(params.get("sort")) + '"]')) {
  sortSelect.value = params.get("sort");
}
explainBox.checked = params.get("explain") === "1";
$("legend").hidden = !explainBox.checked;
if (params.get("q")) input.value = params.get("q");
if (params.get("like")) query.restoreLike(params.get("like"), params.get("index"));
if (params.get("filter")) {
  try {
    filters.restore(JSON.parse(params.get("filter")));
  } catch (e) {
    // a mangled address: no filters
  }
}
keyInput.value = savedKey();
keyField.hidden = !hasKey(); // a key given earlier in this tab stays visible, so it can be changed
start();
