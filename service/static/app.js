// crossprobe's search page: plain browser JavaScript modules, no build step, no third-party code.
// It calls the service's own API with relative URLs: v1/indexes, v1/search, v1/search/image, v1/explain,
// v1/items/{id}/image. This module owns the form, the search and the status line; the others:
//   api.js      the search key (X-API-Key, when the service has keys) and every fetch
//   cards.js    one result card: the photo first, "More like this", the scores (shown under Details)
//   details.js  the "Details" panel: how the search ran, the reranker and match choices, the stage timings
//   query.js    an image or "More like this" item to search with, as chips, and the text / image weight
//   filters.js  filter chips from the results' metadata, a date range, the matching count
//   explain.js  the heat maps over the thumbnails
import { api, hasKey, isKeyError, keyChanged, ms, revokeImages, savedKey, sleep } from "./api.js";
import { card } from "./cards.js";
import { createDetails } from "./details.js";
import { explain, view } from "./explain.js";
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
const keyField = $("key-field");
const keyInput = $("api-key");

let searchSeq = 0; // answers of superseded requests are dropped
let searchAbort = null;
let loadSeq = 0; // a newer loadIndexes() ends an older one's polling
let imageLimit = 0; // the service's CROSSPROBE_QUERY_IMAGE_MAX_BYTES (v1/indexes "limits"); 0: not known
let focusResults = false; // a "More like this" click: its button goes with the old results, focus the new ones
let nextOffset = null; // the answer's next_offset: where "More results" goes on (null: the last page is shown)
let shown = 0; // results on screen (pages appended by "More results")

// ---- helpers ------------------------------------------------------------------------------------
function rerankValue() {
  return document.querySelector('input[name="rerank"]:checked').value;
}

function setStatus(text, kind) {
  statusEl.textContent = text;
  statusEl.className = "status" + (kind ? " " + kind : "");
}

const query = createQuery({ onChange: () => search(), message: (t) => setStatus(t, "error"), limit: () => imageLimit });
const filters = createFilters({ onChange: () => search(), message: (t) => setStatus(t, "error") });
const details = createDetails();

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
      details.offer(body.model);
      imageLimit = (body.limits && body.limits.query_image_bytes) || 0;
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
  $("index-field").hidden = body.indexes.length < 2; // one library: nothing to choose
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
  // the status line is for a person: what is shown, in which order, and whether something is missing; how the
  // order was made (index, reranker, time, the degraded parts' codes) is for "Details"
  let text = count + what + (ORDER[body.sort] ? ", " + ORDER[body.sort] : "") + ".";
  if (body.deduplicated) text += " " + body.deduplicated + " near duplicates left out.";
  if (body.degraded) {
    text += " Part of the search was unavailable, so these results may be incomplete (Details say why).";
  }
  view.summary = text;
  view.summaryKind = body.degraded ? "warn" : "";
  setStatus(text, view.summaryKind);
  details.how("Searched " + body.index.name + ", " + how + ", in " + ms(body.timings_ms.total) + " ms." +
    (body.degraded ? " Degraded: " + body.degraded_reason : ""));
  const ranking = body.mode === "keyword" ? "keyword" : body.rerank;
  const hooks = { onLike: like, onError: (t) => setStatus(t, "error") };
  body.results.forEach((hit, i) => results.appendChild(card(hit, first + i + 1, body.index.name, ranking, hooks)));
  filters.update(last.hits, body.filtered || null);
  $("timings-explain").hidden = true;
  $("explain-spread").hidden = true;
  details.showTimings($("timings-search"), "search", body.timings_ms);
  if (append && body.results.length) {
    const card1 = results.children[first];
    const link = card1 && card1.querySelector("a.thumb");
    if (link) link.focus(); // keyboard and screen reader users go on where the new page starts
  }
  if (focusResults) results.focus();
  focusResults = false;
}

// "More like this" on a card: the item's stored vector is the query (the item itself is left out of the answer)
function like(id, index) {
  query.setLike(id, index);
  focusResults = true;
  search();
}

Object.assign(view, { setStatus: setStatus, showTimings: details.showTimings, timingsSummary: details.timingsSummary });

// ---- wiring -------------------------------------------------------------------------------------
// the indexes, then the search when one is asked for. Again with every new key: a key can be limited to some
// libraries, so the list is the new key's own (docs/security.md)
function start(searchNow = false) {
  return loadIndexes().then((ok) => {
    if (ok && (searchNow || view.last || input.value.trim() || query.like())) search();
  });
}

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  if (keyChanged()) start(true);
  else search();
});
// a new key (Enter or leaving the field): load what it was needed for
keyInput.addEventListener("change", () => {
  if (keyChanged()) start();
});
// an option changed: show its effect at once for the query on screen
for (const el of document.querySelectorAll('input[name="rerank"]')) {
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

// restore a search from the URL (?q=...&like=...&rerank=...&k=...&sort=...&index=...&filter=...&explain=1)
const params = new URLSearchParams(location.search);
const r = params.get("rerank");
if (r) {
  const radio = document.querySelector('input[name="rerank"][value="' + CSS.escape(r) + '"]');
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
