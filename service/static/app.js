// crossprobe's search page: plain browser JavaScript, no build step, no third-party code.
// It calls the service's own API with relative URLs: v1/indexes, v1/search, v1/explain, v1/items/{id}/image.
// When the service has search keys (a 401 / 403 says so) the "API key" field appears; its value goes in the
// X-API-Key header of every call, and images are then fetched with it too (an <img src> cannot send a header).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const form = $("search-form");
  const input = $("q");
  const indexSelect = $("index");
  const kSelect = $("k");
  const explainBox = $("explain");
  const statusEl = $("status");
  const results = $("results");
  const timingsBox = $("timings");
  const legend = $("legend");
  const keyField = $("key-field");
  const keyInput = $("api-key");

  const THUMB = 320; // px, the longer side asked of v1/items/{id}/image (cards are at most ~240 css px wide)
  const STAGES = ["queue", "encode", "ann", "fetch", "rerank", "metadata", "load", "decode", "backbone", "attention"];

  let last = null; // {query, index, rerank, hits: [...]} of the results on screen
  let summary = ""; // the status line that describes them
  let summaryKind = ""; // "" or "warn" (a degraded answer)
  let searchSeq = 0; // answers of superseded requests are dropped
  let explainSeq = 0;
  let searchAbort = null;
  let indexesLoaded = false;
  let loadSeq = 0; // a newer loadIndexes() ends an older one's polling
  let objectUrls = []; // blob: URLs of the images on screen that were fetched with the key

  // ---- the search key ---------------------------------------------------------------------------
  // sessionStorage: this tab only, gone when it closes; never in the URL (history, server logs, shared links)
  const KEY_ITEM = "crossprobe.apiKey";
  let currentKey = "";
  try {
    currentKey = sessionStorage.getItem(KEY_ITEM) || "";
  } catch (e) {
    currentKey = ""; // storage blocked: the key lives in this variable until the page is left
  }

  function keyHeaders() {
    return currentKey ? { "X-API-Key": currentKey } : {};
  }

  // the field's value becomes the key in use -> whether it changed
  function keyChanged() {
    const value = keyInput.value.trim();
    if (value === currentKey) return false;
    currentKey = value;
    try {
      if (value) sessionStorage.setItem(KEY_ITEM, value);
      else sessionStorage.removeItem(KEY_ITEM);
    } catch (e) {
      // storage blocked: kept in memory only
    }
    return true;
  }

  const isKeyError = (e) => e.code === "unauthorized" || e.code === "forbidden";

  // ---- helpers ----------------------------------------------------------------------------------
  function rerankValue() {
    return form.querySelector('input[name="rerank"]:checked').value;
  }

  function setStatus(text, kind) {
    statusEl.textContent = text;
    statusEl.className = "status" + (kind ? " " + kind : "");
  }

  function ms(v) {
    return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  }

  async function api(path, options) {
    const opts = Object.assign({}, options);
    opts.headers = Object.assign({}, opts.headers, keyHeaders());
    const r = await fetch(path, opts);
    let body = null;
    try {
      body = await r.json();
    } catch (e) {
      body = null;
    }
    if (!r.ok) {
      const err = body && body.error ? body.error : { code: "http_" + r.status, message: r.statusText };
      const e = new Error(err.message || ("HTTP " + r.status));
      e.code = err.code;
      e.status = r.status;
      if (isKeyError(e)) {
        keyField.hidden = false; // the service has search keys: let the user give one
        e.message = r.status === 401 ? "this service needs a search key: enter it under “API key”"
          : "the API key was refused: check it under “API key”";
      }
      throw e;
    }
    return body;
  }

  function imageUrl(id, index, size) {
    const q = new URLSearchParams();
    if (index) q.set("index", index);
    if (size) q.set("size", String(size));
    return "v1/items/" + encodeURIComponent(id) + "/image?" + q.toString();
  }

  function fetchImage(url) {
    return fetch(url, { headers: keyHeaders() }).then((r) => (r.ok ? r.blob() : Promise.reject(new Error(
      r.status === 401 || r.status === 403 ? "the API key was refused" : "HTTP " + r.status))));
  }

  // without a key, the plain URL (the browser caches it); with one, fetched with the header into a blob: URL
  function showImage(img, url) {
    if (!currentKey) {
      img.src = url;
      return;
    }
    fetchImage(url).then((blob) => {
      if (!img.isConnected) return; // the results were replaced meanwhile
      const u = URL.createObjectURL(blob);
      objectUrls.push(u);
      img.src = u;
    }).catch(() => {
      img.alt += " (image unavailable)";
    });
  }

  // a new tab cannot send the header: with a key, fetch the image here and show it there as a blob: URL.
  // The tab opens at once, inside the click, so popup blockers let it through.
  function openWithKey(url) {
    const tab = window.open("", "_blank");
    if (tab) tab.opener = null;
    fetchImage(url).then((blob) => {
      const u = URL.createObjectURL(blob);
      if (tab) tab.location.href = u;
      setTimeout(() => URL.revokeObjectURL(u), 60000);
    }).catch((e) => {
      if (tab) tab.close();
      setStatus("The image could not be opened: " + e.message + ".", "error");
    });
  }

  // ---- index picker -----------------------------------------------------------------------------
  const sleep = (t) => new Promise((res) => setTimeout(res, t));

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

  // ---- search -----------------------------------------------------------------------------------
  async function search() {
    const query = input.value.trim();
    if (!query) {
      setStatus("Type what the image should show, then press Enter.", "error");
      input.focus();
      return;
    }
    const req = { query: query, k: Number(kSelect.value), rerank: rerankValue() };
    if (indexSelect.value) req.index = indexSelect.value;
    const seq = ++searchSeq;
    if (searchAbort) searchAbort.abort();
    searchAbort = new AbortController();
    form.setAttribute("aria-busy", "true");
    setStatus("Searching…", "busy");
    remember(req);
    let body;
    try {
      body = await api("v1/search", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(req),
        signal: searchAbort.signal,
      });
    } catch (e) {
      if (e.name === "AbortError" || seq !== searchSeq) return;
      form.removeAttribute("aria-busy");
      setStatus("Search failed: " + e.message, "error");
      return;
    }
    if (seq !== searchSeq) return;
    form.removeAttribute("aria-busy");
    last = { query: query, index: body.index.name, rerank: body.rerank, hits: body.results };
    render(body);
    if (explainBox.checked) explain();
  }

  function remember(req) {
    // the URL says what is on screen: a search can be reloaded, bookmarked and shared
    const q = new URLSearchParams({ q: req.query, rerank: req.rerank, k: String(req.k) });
    if (req.index) q.set("index", req.index);
    if (explainBox.checked) q.set("explain", "1");
    history.replaceState(null, "", "?" + q.toString());
  }

  function render(body) {
    results.textContent = "";
    for (const u of objectUrls) URL.revokeObjectURL(u);
    objectUrls = [];
    const n = body.results.length;
    const how = body.rerank === "none" ? "ranked by the two-tower score" : "reranked by " + body.rerank;
    let text = n + (n === 1 ? " result" : " results") + " for “" + last.query + "” in " + body.index.name +
      ", " + how + ", in " + ms(body.timings_ms.total) + " ms.";
    if (body.degraded) text += " Degraded: " + body.degraded_reason;
    summary = text;
    summaryKind = body.degraded ? "warn" : "";
    setStatus(text, summaryKind);
    body.results.forEach((hit, i) => results.appendChild(card(hit, i + 1, body.index.name, body.rerank)));
    $("timings-explain").hidden = true;
    $("explain-spread").hidden = true;
    showTimings($("timings-search"), "search", body.timings_ms);
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
      if (!currentKey) return; // a plain link
      ev.preventDefault();
      openWithKey(link.href);
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
    score.textContent = "score " + hit.score.toFixed(3);
    score.title = rerank === "none" ? "two-tower cosine" : rerank + " logit fused with the two-tower score";
    scores.appendChild(score);
    if (hit.scores.rerank !== null) {
      const ann = document.createElement("span");
      ann.className = "ann";
      ann.textContent = "two-tower " + hit.scores.ann.toFixed(3);
      ann.title = "the first stage's cosine (before reranking)";
      scores.appendChild(ann);
    }
    meta.appendChild(scores);

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

  // ---- explain ----------------------------------------------------------------------------------
  async function explain() {
    legend.hidden = !explainBox.checked;
    results.classList.toggle("explaining", explainBox.checked);
    if (!explainBox.checked || !last || !last.hits.length) {
      for (const c of results.querySelectorAll("canvas.heat")) c.hidden = true;
      for (const n of results.querySelectorAll(".explain-note")) n.hidden = true;
      $("timings-explain").hidden = true;
      $("explain-spread").hidden = true;
      timingsSummary();
      return;
    }
    const seq = ++explainSeq;
    const shown = last;
    setStatus(summary + " Explaining…", "busy");
    let body;
    try {
      body = await api("v1/explain", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ query: shown.query, index: shown.index, ids: shown.hits.map((h) => h.id) }),
      });
    } catch (e) {
      if (seq === explainSeq) setStatus(summary + " Explain failed: " + e.message, "error");
      return;
    }
    if (seq !== explainSeq || shown !== last || !explainBox.checked) return;
    setStatus(summary, summaryKind);
    $("explain-help").textContent = body.mode === "query"
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
    showTimings($("timings-explain"), "explain", body.timings_ms);
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
  function placeOverlay(li) {
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

  // ---- wiring -----------------------------------------------------------------------------------
  function start() {
    return loadIndexes().then((ok) => {
      if (ok && input.value.trim()) search();
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
    else if (last) search();
  });
  // an option changed: show its effect at once for the query on screen
  for (const el of form.querySelectorAll('input[name="rerank"]')) {
    el.addEventListener("change", () => last && search());
  }
  indexSelect.addEventListener("change", () => last && search());
  kSelect.addEventListener("change", () => last && search());
  explainBox.addEventListener("change", () => {
    if (last) remember({ query: last.query, rerank: rerankValue(), k: Number(kSelect.value), index: indexSelect.value });
    explain();
  });

  timingsBox.open = window.matchMedia("(min-width: 700px)").matches;

  // restore a search from the URL (?q=...&rerank=...&k=...&index=...&explain=1)
  const params = new URLSearchParams(location.search);
  const r = params.get("rerank");
  if (r) {
    const radio = form.querySelector('input[name="rerank"][value="' + CSS.escape(r) + '"]');
    if (radio) radio.checked = true;
  }
  if (params.get("k") && kSelect.querySelector('option[value="' + CSS.escape(params.get("k")) + '"]')) {
    kSelect.value = params.get("k");
  }
  explainBox.checked = params.get("explain") === "1";
  legend.hidden = !explainBox.checked;
  if (params.get("q")) input.value = params.get("q");
  keyInput.value = currentKey;
  keyField.hidden = !currentKey; // a key given earlier in this tab stays visible, so it can be changed
  start();
})();
