// crossprobe's page: how it talks to the service. The search key (when the service has keys) and every fetch.
// When the service has search keys (a 401 / 403 says so) the "API key" field appears; its value goes in the
// X-API-Key header of every call, and images are then fetched with it too (an <img src> cannot send a header).
// A module (no build step): app.js, query.js and filters.js import from it.

const $ = (id) => document.getElementById(id);

// ---- the search key -----------------------------------------------------------------------------
// sessionStorage: this tab only, gone when it closes; never in the URL (history, server logs, shared links)
const KEY_ITEM = "crossprobe.apiKey";
let currentKey = "";
try {
  currentKey = sessionStorage.getItem(KEY_ITEM) || "";
} catch (e) {
  currentKey = ""; // storage blocked: the key lives in this variable until the page is left
}

export const hasKey = () => currentKey !== "";
export const savedKey = () => currentKey;

export function keyHeaders() {
  return currentKey ? { "X-API-Key": currentKey } : {};
}

// the field's value becomes the key in use -> whether it changed
export function keyChanged() {
  const value = $("api-key").value.trim();
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

export const isKeyError = (e) => e.code === "unauthorized" || e.code === "forbidden";

// ---- calls ------------------------------------------------------------------------------------
// -> the answer's JSON; an error answer throws an Error with the service's own message, code and status
export async function api(path, options) {
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
      $("key-field").hidden = false; // the service has search keys: let the user give one
      e.message = r.status === 401 ? "this service needs a search key: enter it under “API key”"
        : "the API key was refused: check it under “API key”";
    }
    throw e;
  }
  return body;
}

export function imageUrl(id, index, size) {
  const q = new URLSearchParams();
  if (index) q.set("index", index);
  if (size) q.set("size", String(size));
  return "v1/items/" + encodeURIComponent(id) + "/image?" + q.toString();
}

function fetchImage(url) {
  return fetch(url, { headers: keyHeaders() }).then((r) => (r.ok ? r.blob() : Promise.reject(new Error(
    r.status === 401 || r.status === 403 ? "the API key was refused" : "HTTP " + r.status))));
}

// blob: URLs of the result images on screen that were fetched with the key (revoked when they are replaced)
let objectUrls = [];

export function revokeImages() {
  for (const u of objectUrls) URL.revokeObjectURL(u);
  objectUrls = [];
}

// without a key, the plain URL (the browser caches it); with one, fetched with the header into a blob: URL,
// revoked with the results (revokeImages) unless `own` (a chip's picture outlives the results it came from)
export function showImage(img, url, own) {
  if (!currentKey) {
    img.src = url;
    return;
  }
  fetchImage(url).then((blob) => {
    if (!img.isConnected) return; // the results were replaced meanwhile
    const u = URL.createObjectURL(blob);
    if (own) img.addEventListener("load", () => URL.revokeObjectURL(u), { once: true });
    else objectUrls.push(u);
    img.src = u;
  }).catch(() => {
    img.alt += " (image unavailable)";
  });
}

// a new tab cannot send the header: with a key, fetch the image here and show it there as a blob: URL.
// The tab opens at once, inside the click, so popup blockers let it through. -> a promise (rejected: why)
export function openWithKey(url) {
  const tab = window.open("", "_blank");
  if (tab) tab.opener = null;
  return fetchImage(url).then((blob) => {
    const u = URL.createObjectURL(blob);
    if (tab) tab.location.href = u;
    setTimeout(() => URL.revokeObjectURL(u), 60000);
  }).catch((e) => {
    if (tab) tab.close();
    throw e;
  });
}

// the "x" of a removable chip (query.js's image and like chips, filters.js's filters in force)
export function removeButton(label, onRemove) {
  const x = document.createElement("button");
  x.type = "button";
  x.className = "chip-remove";
  x.setAttribute("aria-label", label);
  x.textContent = "\u00d7";
  x.addEventListener("click", onRemove);
  return x;
}

export const sleep = (t) => new Promise((res) => setTimeout(res, t));

export function ms(v) {
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

// 1234567 -> "1.2 MB", 5300 -> "5 KB" (1,000s: what a file manager shows)
export function size(bytes) {
  return bytes >= 1e6 ? (bytes / 1e6).toFixed(1) + " MB" : Math.max(1, Math.round(bytes / 1e3)) + " KB";
}
