// crossprobe's page: metadata filters. Chips made from the results on screen (each tag, format and camera they
// carry, with how many of them carry it) toggle a filter; a "taken" date range; the filters in force as
// removable chips, and how many items of the index pass them (the answer's "filtered.matching").
// Several chips: AND across fields, OR within one ({"and": [{"field": "tags", "in": [...]}, ...]}), the
// service's filter tree (docs/research/search_features.md). app.js sends filter() with each search and hands every
// answer to update(). The chips and dates sit in a panel the "Filters" button opens (closed at first: the photos
// come first); the filters in force and the count stay in sight above the results while it is closed.

import { removeButton } from "./api.js";
import { disclosure } from "./details.js";

const $ = (id) => document.getElementById(id);

// fields offered as chips, in this order: the metadata key and its heading
const FIELDS = [["tags", "Tags"], ["format", "Format"], ["camera", "Camera"]];
const MAX_CHIPS = 24; // per field: the most frequent values among the results (a chosen one is always shown)

// hooks: onChange() (the filters changed: search again), message(text) (a problem, for the status line)
export function createFilters(hooks) {
  const panel = $("refine");
  const button = $("filters-button");
  const inForce = $("filters-in-force");
  const facets = $("facets");
  const active = $("active-filters");
  const count = $("filter-count");
  const from = $("taken-from");
  const to = $("taken-to");
  const chosen = Object.fromEntries(FIELDS.map(([f]) => [f, new Set()]));
  let lastHits = [];

  const dates = () => ({ from: from.value, to: to.value });

  // "2019-12-31" -> "2020-01-01": "to" includes its whole day (taken values carry a time of day)
  function dayAfter(day) {
    const d = new Date(day + "T00:00:00Z");
    d.setUTCDate(d.getUTCDate() + 1);
    return d.toISOString().slice(0, 10);
  }

  // -> the request's "filter", or null when none is set
  function filter() {
    const conds = [];
    for (const [field] of FIELDS) {
      const values = Array.from(chosen[field]);
      if (values.length === 1) conds.push({ field: field, eq: values[0] });
      else if (values.length > 1) conds.push({ field: field, in: values });
    }
    const { from: a, to: b } = dates();
    if (a || b) {
      const range = { field: "taken" };
      if (a) range.gte = a;
      if (b) range.lt = dayAfter(b);
      conds.push(range);
    }
    return conds.length === 0 ? null : conds.length === 1 ? conds[0] : { and: conds };
  }

  // what the address keeps (?filter=...): the chosen values and dates, or null
  function state() {
    const s = {};
    for (const [field] of FIELDS) if (chosen[field].size) s[field] = Array.from(chosen[field]);
    if (from.value) s.from = from.value;
    if (to.value) s.to = to.value;
    return Object.keys(s).length ? s : null;
  }

  function restore(s) {
    for (const [field] of FIELDS) {
      chosen[field].clear();
      for (const v of (s && Array.isArray(s[field]) ? s[field] : [])) chosen[field].add(String(v));
    }
    from.value = s && s.from ? String(s.from) : "";
    to.value = s && s.to ? String(s.to) : "";
  }

  function toggle(field, value) {
    if (chosen[field].has(value)) chosen[field].delete(value);
    else chosen[field].add(value);
    hooks.onChange();
  }

  // field -> [[value, how many of the hits carry it], ...], most frequent first; chosen values included
  function counts(hits) {
    const out = {};
    for (const [field] of FIELDS) {
      const n = new Map();
      for (const hit of hits) {
        const m = hit.metadata || {};
        const vals = field === "tags" ? (Array.isArray(m.tags) ? m.tags : []) : m[field] ? [m[field]] : [];
        for (const v of new Set(vals.map(String))) n.set(v, (n.get(v) || 0) + 1);
      }
      for (const v of chosen[field]) if (!n.has(v)) n.set(v, 0);
      const sorted = Array.from(n).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
      out[field] = sorted.filter(([v], i) => i < MAX_CHIPS || chosen[field].has(v));
    }
    return out;
  }

  function renderFacets(hits) {
    facets.textContent = "";
    const all = counts(hits);
    for (const [field, heading] of FIELDS) {
      if (!all[field].length) continue;
      const group = document.createElement("div");
      group.className = "facet";
      group.setAttribute("role", "group");
      group.setAttribute("aria-labelledby", "facet-" + field);
      group.setAttribute("aria-describedby", "facets-help");
      const name = document.createElement("span");
      name.className = "facet-name";
      name.id = "facet-" + field;
      name.textContent = heading;
      group.appendChild(name);
      for (const [value, n] of all[field]) {
        const b = document.createElement("button");
        b.type = "button";
        b.className = "chip facet-chip";
        b.dataset.field = field;
        b.dataset.value = value;
        b.setAttribute("aria-pressed", String(chosen[field].has(value)));
        b.title = (chosen[field].has(value) ? "Remove the filter " : "Only items with ") + field + " " + value;
        const c = document.createElement("span");
        c.className = "count";
        c.textContent = String(n);
        const of = document.createElement("span");
        of.className = "visually-hidden";
        of.textContent = " of " + hits.length + " results";
        c.appendChild(of);
        b.append(value + " ", c);
        b.addEventListener("click", () => toggle(field, value));
        group.appendChild(b);
      }
      facets.appendChild(group);
    }
  }

  function activeChip(text, removeLabel, remove) {
    const el = document.createElement("li");
    el.className = "chip active-chip";
    const words = document.createElement("span");
    words.textContent = text;
    const x = removeButton(removeLabel, () => {
      remove();
      hooks.onChange();
    });
    el.append(words, x);
    return el;
  }

  function renderActive() {
    active.textContent = "";
    for (const [field] of FIELDS) {
      for (const v of chosen[field]) {
        active.appendChild(activeChip(field + ": " + v, "Remove the filter " + field + ": " + v,
          () => chosen[field].delete(v)));
      }
    }
    const { from: a, to: b } = dates();
    if (a || b) {
      const text = "taken: " + (a && b ? a + " – " + b : a ? "from " + a : "until " + b);
      active.appendChild(activeChip(text, "Remove the filter " + text, () => {
        from.value = "";
        to.value = "";
      }));
    }
    active.hidden = !active.children.length;
    inForce.hidden = active.hidden;
  }

  // filtered: the answer's "filtered" ({matching, exact, method}), or null (no filter was sent)
  function renderCount(filtered) {
    if (!filtered) {
      count.textContent = "";
      count.hidden = true;
      return;
    }
    const n = filtered.matching;
    count.textContent = n === 0 ? "No item matches these filters"
      : n.toLocaleString("en") + (n === 1 ? " item matches" : " items match");
    count.hidden = false;
  }

  function onDate() {
    const { from: a, to: b } = dates();
    if (a && b && a > b) {
      hooks.message("The “taken” range ends (" + b + ") before it starts (" + a + ").");
      return;
    }
    hooks.onChange();
  }
  from.addEventListener("change", onDate);
  to.addEventListener("change", onDate);
  disclosure(button, panel);

  return {
    filter: filter,
    state: state,
    restore: restore,
    // an answer is on screen: chips from its hits, the filters in force, how many items pass them
    update(hits, filtered) {
      lastHits = hits;
      renderFacets(hits);
      renderActive();
      renderCount(filter() ? filtered : null);
      button.hidden = false;
    },
    // a failed search: the filters stay visible (and removable) over the results still on screen
    keep() {
      renderFacets(lastHits);
      renderActive();
      button.hidden = button.hidden && !filter();
    },
  };
}
