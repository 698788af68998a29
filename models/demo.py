"""`make demo` / `crossprobe demo`: real models, real ranking, no network.

Encodes a small gallery (scikit-image's bundled photos, or IMAGES=dir), then for
each query ranks the gallery with the two towers, reranks it with the chosen
reranker (the service's default unless told), and prints the top images with both scores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from crossprobe.core import inputs
from crossprobe.models import backbones as bb
from crossprobe.models import checkpoint
from crossprobe.models.region_labels import add_region

# scikit-image photos that ship inside its wheel (others are fetched on demand and fail offline)
SAMPLES = {
    "astronaut": "astronaut",
    "camera": "camera",
    "cat": "chelsea",
    "coffee": "coffee",
    "coins": "coins",
    "horse": "horse",
    "moon": "moon",
    "rocket": "rocket",
    "motorcycle": "stereo_motorcycle",
    "hubble": "hubble_deep_field",
    "clock": "clock",
    "page": "page",
    "brick": "brick",
    "grass": "grass",
    "retina": "retina",
    "colorwheel": "colorwheel",
}
# query -> the gallery photo a person would expect first: one everyday query per photo, each written before
# its result was seen, so the list is not picked to flatter the model
EXPECTED = {
    "a cat": "cat",
    "a cup of coffee": "coffee",
    "a rocket launching into the sky": "rocket",
    "a man riding a motorcycle": "motorcycle",
    "a woman in a space suit": "astronaut",
    "a black and white photo of a horse": "horse",
    "an old clock": "clock",
    "a man with a camera on a tripod": "camera",
    "a pile of coins": "coins",
    "the surface of the moon": "moon",
    "a brick wall": "brick",
    "green grass": "grass",
    "a page of printed text": "page",
    "stars and galaxies in deep space": "hubble",
    "a medical scan of an eye": "retina",
    "a colour wheel": "colorwheel",
}
QUERIES = list(EXPECTED)
IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}


def sample_gallery() -> dict[str, Image.Image]:
    import skimage.data as sd

    out = {}
    for name, fn in SAMPLES.items():
        arr = getattr(sd, fn)()
        arr = arr[0] if isinstance(arr, tuple) else arr  # stereo pairs: left view
        out[name] = Image.fromarray(arr).convert("RGB")
    return out


def write_sample_gallery(folder: Path) -> Path:
    """sample_gallery() as JPEGs in `folder` (the demo's, the tests' and the deploy test's gallery)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, img in sample_gallery().items():
        p = folder / f"{name}.jpg"
        if not p.exists():  # same bytes every run: the indexer's ids and the files stay stable
            img.save(p, "JPEG", quality=90)
    return folder


def folder_gallery(folder: Path) -> dict[str, Image.Image]:
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.suffix.lower() in IMAGE_EXTS:
            try:
                with Image.open(p) as im:
                    out[str(p.relative_to(folder))] = im.copy()
            except (OSError, ValueError) as e:  # unreadable file: say so, keep going
                print(f"skipped {p}: {e}")
    return out


@torch.inference_mode()
def run_demo(
    images: Path | None, queries: list[str] | None, top: int, ckpt: Path | None, echo=print, rerank: str = "cp"
) -> dict:
    """rerank: cp | temde | none, over the whole gallery, with the region term where the checkpoint has one (as the
    service's scorer graphs add it)."""
    if rerank not in ("cp", "temde", "none"):
        raise ValueError(f"rerank {rerank!r}: cp | temde | none")
    torch.set_num_threads(2)
    model, meta = checkpoint.load(ckpt)
    gallery = folder_gallery(images) if images else sample_gallery()
    if not gallery:
        raise SystemExit(f"no images found in {images}")
    names = list(gallery)
    pixels = torch.from_numpy(np.stack([inputs.load_image(gallery[n]) for n in names]))
    grids = bb.ImageBackbone()(pixels)  # (G, 49, 1280)
    v = model.image(grids)  # bridged g_I, as the index stores it
    p_v, b_bar = model.cp.encode_image(v.tokens, grids)
    tok = inputs.load_tokenizer()
    queries = queries or QUERIES
    ids, mask = inputs.tokenize(tok, queries)
    t = model.text(torch.from_numpy(ids), torch.from_numpy(mask))
    p_t, w_bar = model.cp.encode_text(t.tokens, t.mask, t.states)
    s_tt = t.g @ v.g.T  # (Q, G)
    G, Q = len(names), len(queries)
    if rerank == "cp":
        fused = model.cp.rerank(p_t, w_bar, p_v.expand(Q, -1, -1, -1), b_bar.expand(Q, -1, -1), s_tt)
    elif rerank == "temde":
        s_i = model.temde.sketch_image(v.tokens, grids)  # (G, NK)
        fused = model.temde.rerank(model.temde.sketch_text(t.tokens, t.mask, t.states), s_i.expand(Q, -1, -1), s_tt)
    else:
        fused = 20.0 * s_tt  # the two-tower order at its logit scale
    if rerank != "none" and model.cfg.region.weight(rerank) > 0:  # region labels (region_labels.py)
        labels = model.bridge.cell_labels(grids).expand(Q, -1, -1)  # (Q, G, 49)
        fused = add_region(fused, model.cfg.region, rerank, model.bridge.class_sims(t.g), labels)
    echo(
        f"checkpoint {meta['fingerprint']}, gallery of {G} images ({images or 'scikit-image samples'}), rerank {rerank}"
    )
    results = {}
    for qi, q in enumerate(queries):
        order = fused[qi].argsort(descending=True)[:top].tolist()
        results[q] = [names[i] for i in order]
        echo(f'\n"{q}"')
        for rank, i in enumerate(order, 1):
            echo(f"  {rank}. {names[i]:<40} {rerank} logit {fused[qi, i]:7.3f}   two-tower cos {s_tt[qi, i]:.3f}")
    return results
