// crossprobe's page: what a search is made of besides its text. An image (dropped on the search area, chosen
// with the "Search by image" button, or pasted) or an indexed item ("More like this" on a result), shown as a
// chip with a remove button above the box; with a text too, a slider weighs the two (the API's "weight").
// app.js builds the request from query.image() / query.like() / query.weight() and is told of every change.
import { imageUrl, removeButton, showImage, size } from "./api.js";

const $ = (id) => document.getElementById(id);

// what the service decodes (service/query_image.py); an SVG or a PDF is refused here, before any upload
const TYPES = ["image/jpeg", "image/png", "image/webp", "image/gif", "image/bmp", "image/tiff", "image/heic",
  "image/heif", "image/avif", "image/x-adobe-dng"];
// by name too: browsers give HEIC and camera RAW files no type (or one of their own) on many systems
const EXTENSIONS = /\.(jpe?g|png|webp|gif|bmp|tiff?|heic|heif|avif|dng|cr2|cr3|nef|arw|raf|orf|rw2)$/i;
const SHRINK_SIDE = 1024; // px: an over-limit photo is re-encoded at this longest side (the model sees 224)

// hooks: onChange() (something to search with was added or removed), message(text) (a problem, said in the
// status line), limit() (the service's CROSSPROBE_QUERY_IMAGE_MAX_BYTES, from v1/indexes; 0 = not known yet)
export function createQuery(hooks) {
  const form = $("search-form");
  const chips = $("query-chips");
  const fileInput = $("image-file");
  const weightField = $("weight-field");
  const weightInput = $("weight");
  const input = $("q");
  let image = null; // {blob, name, bytes (as sent), original (bytes of the file when it was shrunk), url}
  let like = null; // {id, index}
  let textBeforeLike = ""; // the box's text when "More like this" emptied it: given back when the chip goes

  function render() {
    chips.textContent = "";
    if (image) {
      const what = image.name + ", " + size(image.bytes) +
        (image.original ? " (shrunk from " + size(image.original) + ")" : "");
      chips.appendChild(chip("image", "Searching with the image " + what, what, image.url, null,
        "Remove the image " + image.name, () => clearImage(true)));
    }
    if (like) {
      chips.appendChild(chip("like", "More like " + like.id, "like: " + like.id, null,
        imageUrl(like.id, like.index, 96), "Remove “more like " + like.id + "”", () => clearLike(true)));
    }
    chips.hidden = !image && !like;
    syncWeight();
  }

  // a chip: a small picture, its words, and an "x" button; `label` is what a screen reader hears for it
  function chip(kind, label, text, src, itemUrl, removeLabel, remove) {
    const el = document.createElement("span");
    el.className = "chip query-chip " + kind;
    el.setAttribute("role", "group");
    el.setAttribute("aria-label", label);
    const img = document.createElement("img");
    img.alt = "";
    if (src) img.src = src;
    else showImage(img, itemUrl, true);
    const words = document.createElement("span");
    words.className = "chip-text";
    words.textContent = text;
    words.title = text;
    const x = removeButton(removeLabel, () => {
      remove();
      input.focus();
    });
    el.append(img, words, x);
    return el;
  }

  // the slider matters only when a text is combined with an image or an item
  function syncWeight() {
    const other = image ? "image" : like ? "item" : "";
    weightField.hidden = !(other && input.value.trim());
    $("weight-label").textContent = "Weight of the " + (other || "image");
    $("weight-value").textContent = Number(weightInput.value).toFixed(1);
  }

  function clearImage(search) {
    if (!image) return;
    URL.revokeObjectURL(image.url);
    image = null;
    fileInput.value = "";
    render();
    if (search) hooks.onChange();
  }

  function clearLike(search) {
    if (!like) return;
    like = null;
    if (!input.value.trim() && textBeforeLike) input.value = textBeforeLike;
    textBeforeLike = "";
    render();
    if (search) hooks.onChange();
  }

  // a File (or a pasted Blob) -> the query image, or a message saying why not
  async function useFile(file) {
    const name = file.name || "pasted image";
    const ok = TYPES.includes(file.type) || EXTENSIONS.test(name);
    if (!ok) {
      hooks.message("“" + name + "” is not an image this service reads" + (file.type ? " (" + file.type + ")" : "") +
        ": choose a JPEG, PNG, WebP, GIF, BMP, TIFF, HEIC, AVIF or camera RAW file.");
      return;
    }
    let blob = file;
    let original = 0;
    const limit = hooks.limit();
    if (limit && file.size > limit) {
      // a phone's photo is often over the limit: re-encode it smaller here, as the model only needs 224 px
      blob = await shrink(file, limit);
      if (!blob) {
        hooks.message("“" + name + "” is " + size(file.size) + ", over this service's limit of " + size(limit) +
          " for a query image, and this browser could not make it smaller: choose a smaller file.");
        return;
      }
      original = file.size;
    }
    clearLike(false);
    if (image) URL.revokeObjectURL(image.url);
    image = { blob: blob, name: name, bytes: blob.size, original: original, url: URL.createObjectURL(blob) };
    render();
    hooks.onChange();
  }

  // -> a JPEG of at most SHRINK_SIDE px a side under `limit` bytes, or null (not decodable here, or still too big)
  async function shrink(file, limit) {
    let bitmap;
    try {
      bitmap = await createImageBitmap(file);
    } catch (e) {
      return null;
    }
    const scale = Math.min(1, SHRINK_SIDE / Math.max(bitmap.width, bitmap.height));
    const canvas = document.createElement("canvas");
    canvas.width = Math.max(1, Math.round(bitmap.width * scale));
    canvas.height = Math.max(1, Math.round(bitmap.height * scale));
    canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
    bitmap.close();
    for (const quality of [0.9, 0.75, 0.6]) {
      const out = await new Promise((res) => canvas.toBlob(res, "image/jpeg", quality));
      if (out && out.size <= limit) return new File([out], file.name || "pasted.jpg", { type: "image/jpeg" });
    }
    return null;
  }

  // ---- the ways in: the button, a drop on the search area, a paste of an image (text pastes as usual) --
  $("image-button").addEventListener("click", () => fileInput.click());
  fileInput.addEventListener("change", () => {
    if (fileInput.files.length) useFile(fileInput.files[0]);
  });

  const hasFiles = (ev) => ev.dataTransfer && Array.from(ev.dataTransfer.types).includes("Files");
  let depth = 0; // dragenter / dragleave also fire for the form's children
  form.addEventListener("dragenter", (ev) => {
    if (!hasFiles(ev)) return;
    ev.preventDefault();
    depth += 1;
    form.classList.add("dropping");
  });
  form.addEventListener("dragover", (ev) => {
    if (!hasFiles(ev)) return;
    ev.preventDefault(); // this makes the form a drop target
    ev.dataTransfer.dropEffect = "copy";
  });
  form.addEventListener("dragleave", () => {
    depth = Math.max(0, depth - 1);
    if (!depth) form.classList.remove("dropping");
  });
  form.addEventListener("drop", (ev) => {
    depth = 0;
    form.classList.remove("dropping");
    if (!hasFiles(ev)) return;
    ev.preventDefault(); // else the browser opens the file in place of the page
    if (ev.dataTransfer.files.length) useFile(ev.dataTransfer.files[0]);
  });
  // a file dropped beside the form must not replace the page either
  window.addEventListener("dragover", (ev) => hasFiles(ev) && ev.preventDefault());
  window.addEventListener("drop", (ev) => hasFiles(ev) && ev.preventDefault());

  document.addEventListener("paste", (ev) => {
    const files = ev.clipboardData ? Array.from(ev.clipboardData.files) : [];
    const file = files.find((f) => f.type.startsWith("image/"));
    if (!file) return; // text: pasted as usual
    ev.preventDefault();
    useFile(file);
  });

  input.addEventListener("input", syncWeight);
  weightInput.addEventListener("input", syncWeight);
  weightInput.addEventListener("change", () => (image || like) && input.value.trim() && hooks.onChange());

  return {
    image: () => image,
    like: () => (like ? like.id : null),
    weight: () => Number(weightInput.value),
    // "More like this" on a result: the item replaces an image, and the text (kept to be given back)
    setLike(id, index) {
      clearImage(false);
      if (!like) textBeforeLike = input.value.trim();
      input.value = "";
      like = { id: id, index: index };
      render();
    },
    // a search restored from the address (?like=...): the text stays as it was given
    restoreLike(id, index) {
      like = { id: id, index: index };
      render();
    },
    useFile: useFile,
    syncWeight: syncWeight,
  };
}
