// crossprobe's page: the "explain" view. Heat maps over the result thumbnails: where the Cross-probe reranker
// looked for the query's text (POST v1/explain), with a legend that says how flat the maps really are.
// app.js owns the results on screen and shares them through `view`.
import { api } from "./api.js";

const $ = (id) => document.getElementById(id);
const legend = () => $("legend");

// what app.js shares: last ({query (null: no text), index, hits} of the results on screen), summary and
// summaryKind (the status line), and its setStatus, showTimings, timingsSummary
export const view = { last: null, summary: "", summaryKind: "" };
let explainSeq = 0;

const MAX_IDS = 32; // ids in one v1/explain request (service/schemas.py MAX_EXPLAIN_IDS)

export async function explain() {
  const results = $("results");
  const explainBox = $("explain");
  legend().hidden = !explainBox.checked;
  results.classList.toggle("explaining", explainBox.checked);
  const last = view.last;
  if (!explainBox.checked || !last || !last.hits.length || !last.query) {
    for (const c of results.querySelectorAll("canvas.heat")) c.hidden = true;
    for (const n of results.querySelectorAll(".explain-note")) n.hidden = true;
    $("timings-explain").hidden = true;
    $("explain-spread").hidden = true;
    view.timingsSummary();
    // the maps are where a text looked: a search by image alone or by "like" has none
    if (explainBox.checked && last && last.hits.length && !last.query) {
      view.setStatus(view.summary + " Explain needs a text in the search box: heat maps show where a text looked.",
        "warn");
    }
    return;
  }
  const seq = ++explainSeq;
  const shown = last;
  view.setStatus(view.summary + " Explaining…", "busy");
  let body;
  try {
    // at most MAX_IDS ids a request (the service's bound): pages added by "More results" go in further requests
    const ids = shown.hits.map((h) => h.id);
    const parts = [];
    for (let i = 0; i < ids.length; i += MAX_IDS) {
      parts.push(api("v1/explain", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ query: shown.query, index: shown.index, ids: ids.slice(i, i + MAX_IDS) }),
      }));
    }
    const answers = await Promise.all(parts);
    body = answers[0];
    for (const more of answers.slice(1)) {
      Object.assign(body.maps, more.maps);
      Object.assign(body.unavailable, more.unavailable);
    }
  } catch (e) {
    if (seq === explainSeq) view.setStatus(view.summary + " Explain failed: " + e.message, "error");
    return;
  }
  if (seq !== explainSeq || shown !== view.last || !explainBox.checked) return;
  view.setStatus(view.summary, view.summaryKind);
  $("explain-help").textContent = body.mode === "labels"
    ? "How well what the ImageNet head sees in each region of a 7×7 grid matches the query (the region " +
      "labels the rerankers add to their score)."
    : body.mode === "query"
    ? "Where this query looked: its text probes attend to the image's vision probes, which attend to a 7×7 " +
      "grid of regions (Cross-probe's attention, whichever reranker ordered the results)."
    : "Regions the image's probes attend to, averaged over probes and heads (this checkpoint's Cross-probe " +
      "has no cross layers, so the query does not change them).";
  const peaks = [];
  for (const li of results.children) {
    const id = li.dataset.id;
    const canvas = li.querySelector("canvas.heat");
    const noteEl = li.querySelector(".explain-note");
    const map = body.maps[id];
    if (!map) {
      canvas.hidden = true;
      noteEl.textContent = "No heat map: " + (body.unavailable[id] || "unavailable");
      noteEl.hidden = false;
      continue;
    }
    const peak = paint(canvas, map);
    peaks.push(peak.ratio);
    const side = map.length;
    canvas.setAttribute("aria-label", "Heat map for " + id + ": most attention at " +
      where(peak.row, peak.col, side) + ", " + peak.ratio.toFixed(1) + " times an even share");
    canvas.hidden = false;
    placeOverlay(li);
    noteEl.textContent = "peak " + peak.ratio.toFixed(1) + "× an even share, " + where(peak.row, peak.col, side);
    noteEl.hidden = false;
  }
  view.showTimings($("timings-explain"), "explain", body.timings_ms);
  spread(peaks);
}

// Colours are stretched per image, which makes any map look decisive. Say how flat the maps really are.
function spread(peaks) {
  const el = $("explain-spread");
  if (!peaks.length) {
    el.hidden = true;
    return;
  }
  const lo = Math.min(...peaks).toFixed(1);
  const hi = Math.max(...peaks).toFixed(1);
  const range = lo === hi ? lo + "×" : lo + "–" + hi + "×";
  el.textContent = "Colours are stretched per image. " + (Math.max(...peaks) < 2
    ? "These maps are nearly flat (top region " + range + " an even share of 1/49): slight preferences, " +
      "not where an object is."
    : "The top region gets " + range + " an even share (1/49).");
  el.hidden = false;
}

function where(row, col, side) {
  const third = (i) => (i < side / 3 ? 0 : i < (2 * side) / 3 ? 1 : 2);
  const v = ["top", "middle", "bottom"][third(row)];
  const h = ["left", "centre", "right"][third(col)];
  return v === "middle" && h === "centre" ? "the centre" : v + " " + h;
}

// map: side x side weights summing to 1 -> a side x side canvas the browser scales up smoothly
function paint(canvas, map) {
  const side = map.length;
  canvas.width = side;
  canvas.height = side;
  const flat = map.flat();
  const lo = Math.min(...flat);
  const hi = Math.max(...flat);
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(side, side);
  let best = 0;
  flat.forEach((w, i) => {
    const t = hi > lo ? (w - lo) / (hi - lo) : 0;
    const [r, g, b] = ramp(t);
    img.data[4 * i] = r;
    img.data[4 * i + 1] = g;
    img.data[4 * i + 2] = b;
    img.data[4 * i + 3] = Math.round(255 * (0.05 + 0.6 * t)); // the photo stays readable under the peak
    if (w > flat[best]) best = i;
  });
  ctx.putImageData(img, 0, 0);
  return { row: Math.floor(best / side), col: best % side, ratio: hi * side * side };
}

// dark blue (little attention) -> yellow -> red (most); the same stops as the legend's CSS gradient
const STOPS = [[0, [40, 60, 190]], [0.5, [250, 210, 40]], [1, [225, 20, 20]]];
function ramp(t) {
  for (let i = 1; i < STOPS.length; i++) {
    const [t1, c1] = STOPS[i];
    const [t0, c0] = STOPS[i - 1];
    if (t <= t1) {
      const u = (t - t0) / (t1 - t0);
      return c0.map((c, j) => Math.round(c + (c1[j] - c) * u));
    }
  }
  return STOPS[STOPS.length - 1][1];
}

// The thumbnail keeps its aspect ratio inside a square (object-fit: contain); the 7x7 grid covers the whole
// picture (the model sees the image squashed to a square), so the overlay goes exactly over the picture.
export function placeOverlay(li) {
  const img = li.querySelector("img");
  const canvas = li.querySelector("canvas.heat");
  if (!img.naturalWidth || !img.naturalHeight) return;
  const aspect = img.naturalWidth / img.naturalHeight;
  const w = aspect >= 1 ? 100 : 100 * aspect;
  const h = aspect >= 1 ? 100 / aspect : 100;
  canvas.style.width = w + "%";
  canvas.style.height = h + "%";
  canvas.style.left = (100 - w) / 2 + "%";
  canvas.style.top = (100 - h) / 2 + "%";
}

