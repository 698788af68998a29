// crossprobe's page: "Details", the one control behind which the page keeps what an engineer reads and a person
// looking for a photo does not need: how the search ran (index, reranker, stage timings), the reranker and match
// choices, results per page, the explain maps, and each card's scores (shown while the panel is open). Closed by
// default so that the photos come first. Also the show / hide button both "Details" and "Filters" use.
import { ms } from "./api.js";

const $ = (id) => document.getElementById(id);

const STAGES = ["queue", "encode", "decode_image", "encode_image", "like", "ann", "keyword", "fetch", "rerank", "dedup",
  "metadata", "highlight", "load", "decode", "backbone", "attention"];

// a button that shows and hides a panel; aria-expanded tells assistive technology which it is now.
// onToggle(open) after each change -> set(open), to change it from code
export function disclosure(button, panel, onToggle) {
  const set = (open) => {
    button.setAttribute("aria-expanded", String(open));
    panel.hidden = !open;
    if (onToggle) onToggle(open);
  };
  button.addEventListener("click", () => set(panel.hidden));
  set(!panel.hidden);
  return set;
}

export function createDetails() {
  const results = $("results");
  // the scores on the cards go with the panel: both are the numbers behind the order
  disclosure($("details-button"), $("details"), (open) => results.classList.toggle("show-scores", open));

  // the disclosure's heading: each request's total ("search 14 ms, explain 320 ms")
  function timingsSummary() {
    const parts = [];
    for (const [id, name] of [["timings-search", "search"], ["timings-explain", "explain"]]) {
      const el = $(id);
      // a no-break space: "424 ms" never breaks across lines
      if (!el.hidden && el.dataset.total) parts.push(name + " " + el.dataset.total + "\u00a0ms");
    }
    $("timings-summary").textContent = parts.length ? ": " + parts.join(", ") : "";
  }

  // one request's stage timings as bars: dl (#timings-search or #timings-explain), its title, the answer's timings_ms
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
    $("timings").hidden = false;
    timingsSummary();
  }

  // the choices the served model offers (v1/indexes "model"): only its trained rerankers, and "none"; a model without
  // any (a two-tower model) offers no reranker choice at all. A choice it lacks (from the address) falls back to the
  // model's default. Explain only where the model has maps
  function offer(model) {
    if (!model) return;
    const have = new Set(model.rerankers.concat(["none"]));
    let checked = null;
    for (const radio of document.querySelectorAll('input[name="rerank"]')) {
      const on = have.has(radio.value);
      radio.closest("label").hidden = !on;
      radio.disabled = !on;
      if (radio.checked && on) checked = radio;
    }
    if (!checked) document.querySelector('input[name="rerank"][value="' + CSS.escape(model.default_rerank) + '"]').checked = true;
    document.querySelector("fieldset.rerank").hidden = model.rerankers.length === 0;
    const explainBox = $("explain");
    explainBox.closest(".field").hidden = !model.explain;
    if (!model.explain && explainBox.checked) {
      explainBox.checked = false;
      $("legend").hidden = true;
    }
  }

  return {
    // what the served model offers: the reranker radios and the explain switch show only that
    offer: offer,
    // how the answer on screen was made (index, ranking, time, what was degraded): a sentence in the panel
    how(text) {
      $("how").textContent = text;
    },
    showTimings: showTimings,
    timingsSummary: timingsSummary,
  };
}
