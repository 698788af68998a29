"""Issue 53's index-path parity (a correctness check, random weights, not a timing benchmark): coco-mini-dev's 80
photos (640 px COCO photos, which reduced JPEG decoding would shrink; read from /work/shared, never copied) indexed by
`crossprobe index build` with a chosen model at its default settings, served by `crossprobe serve`, 50 queries
(45 COCO captions and 5 queries in Polish, German, Spanish, Russian and Chinese) through POST /v1/search (rerank
none, mode vector), each top 10 against the brute-force ranking of the REFERENCE implementation's own embeddings of
the same photos and queries: every returned score within 1e-4 of the reference's, every difference in order or
membership between items whose reference scores lie within 2e-4 (near-tie swaps). Then the same with
CROSSPROBE_INDEX_DECODE=reduced (JPEG draft for every model: the index path before issue 53), for comparison.

Families (random weights, openai/clip-vit-base-patch32's shape, seed 0, tests/support/reference_models.py):
  hf_clip  hf:<folder>     the reference: transformers' CLIPModel with its CLIPProcessor
  immich   immich:<folder> the same weights written in the layout Immich publishes (tests/core/inference/
                           immich_layout.py); the reference: the same transformers model (Immich's own ML service does
                           not install here; its preprocessing gives the processor's pixels for these photos)
  open_clip open_clip:ViT-B-32/<file>  exported, and its reference (open_clip's own encode_image / encode_text)
                           computed, in the export venv (scripts/openclip-env.sh: open_clip needs torchvision);
                           indexed and served from this venv, torch-free

    .venv/bin/python -m benchmarks.index_path [--families hf_clip,immich,open_clip] [--no-reduced]
        -> docs/research/results/model_choice.json, its "index_path" section (others kept)
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.model_end_to_end import OUT, REPO, SCORE_TOL, TIE_TOL, K, _host, compare_top
from crossprobe.core.atomic import atomic_write

COCO = Path(os.environ.get("COCO_MINI_DEV_DIR", "/work/shared/datasets/coco-mini-dev"))
WORK = REPO / "artifacts" / "index_path"
OTHER_LANGUAGES = ["pies biegnący po plaży", "eine Katze schläft auf dem Sofa", "un hombre montando en bicicleta",
                   "поезд на вокзале", "桌子上的一块生日蛋糕"]


def coco() -> tuple[list[str], list[str]]:
    """The 80 photos' names (sorted) and 50 queries: the first caption of each of the first 45, then 5 others."""
    if not (COCO / "captions.tsv").is_file():
        raise SystemExit(f"coco-mini-dev not found at {COCO} (set COCO_MINI_DEV_DIR)")
    names = sorted(p.name for p in (COCO / "images").glob("*.jpg"))
    first: dict[str, str] = {}
    with open(COCO / "captions.tsv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            first.setdefault(row["image"], row["caption"].strip())
    return names, [first[n] for n in names[:45]] + OTHER_LANGUAGES


def reduced_by_draft(names: list[str], size: int) -> int:
    """How many photos reduced decoding (the indexer's JPEG draft before this fix) would shrink."""
    from crossprobe.core import image_formats

    n = 0
    for name in names:
        with image_formats.open_path(COCO / "images" / name, size) as pic:
            n += pic.image.size != (pic.width, pic.height)
    return n


OPENCLIP_SIDE = r"""
import json, sys
from pathlib import Path
import numpy as np
from tests.support import reference_models as rm
from crossprobe.models import families
work, graphs, photos, queries = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
ref_dir = work / "open_clip_base"
ref = rm.Reference.load(ref_dir) if (ref_dir / rm.META).exists() else rm.build("open_clip", ref_dir, size="base")
spec = f"open_clip:ViT-B-32/{ref.path / 'open_clip_model.safetensors'}"
families.export(spec, graphs)
emb = rm.reference_embeddings(ref, [Path(p) for p in photos], queries)
np.save(work / "open_clip_ref_image.npy", emb.image)
np.save(work / "open_clip_ref_text.npy", emb.text)
print(json.dumps({"spec": spec}))
"""


def open_clip_side(work: Path, graphs: Path, photos: list[Path], queries: list[str]) -> tuple[str, np.ndarray, Any]:
    """open_clip's reference (a random ViT-B-32) built, exported into `graphs` and its own embeddings of the photos
    and queries computed, in the export venv (open_clip needs torchvision) -> (spec, image, text embeddings)."""
    import subprocess

    venv = REPO / "artifacts" / "openclip-venv" / "bin" / "python"
    if not venv.exists():
        raise SystemExit("open_clip needs the export venv: scripts/openclip-env.sh")
    p = subprocess.run([str(venv), "-c", OPENCLIP_SIDE, str(work), str(graphs), json.dumps([str(x) for x in photos]),
                        json.dumps(queries)], cwd=REPO, capture_output=True, text=True, timeout=3600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    if p.returncode:
        raise SystemExit(f"the export venv's side failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    spec = json.loads(p.stdout.strip().splitlines()[-1])["spec"]
    return spec, np.load(work / "open_clip_ref_image.npy"), np.load(work / "open_clip_ref_text.npy")


def model_folder(family: str, work: Path):
    """-> (spec, reference) for a family, built once under work."""
    from tests.support import reference_models as rm

    ref_dir = work / "hf_clip_base"
    ref = rm.Reference.load(ref_dir) if (ref_dir / rm.META).exists() else rm.build("hf_clip", ref_dir, size="base")
    if family == "hf_clip":
        return f"hf:{ref.path}", ref
    if family == "immich":
        folder = work / "immich" / "ViT-B-32__random"
        if not (folder / "config.json").exists():
            from transformers import AutoTokenizer

            from crossprobe.models import families
            from tests.core.inference import immich_layout

            immich_layout.write(folder, families.load(f"hf:{ref.path}"), AutoTokenizer.from_pretrained(ref.path), 77)
        return f"immich:{folder}", ref
    raise SystemExit(f"unknown family {family!r} here (open_clip runs in the export venv: see the docstring)")


def one(family: str, work: Path, decode: str = "reference") -> dict:
    import httpx

    from crossprobe.indexer import build
    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.service.server import running, wait_ready
    from crossprobe.service.settings import Settings
    from tests.support import reference_models as rm

    names, queries = coco()
    out = work / f"{family}-{decode}"
    graphs, root, manifest = out / "graphs", out / "indexes", out / "coco.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    if family == "open_clip":  # exported, and its reference computed, in the export venv; indexed and served here
        spec, ref_image, ref_text = open_clip_side(work, graphs, [COCO / "images" / n for n in names], queries)
        reference = "open_clip's own transforms, tokenizer and encode_image / encode_text (open-clip-torch 3.3.0)"
    else:
        spec, ref = model_folder(family, work)
        reference = "transformers CLIPModel.get_image_features / get_text_features with its CLIPProcessor (PIL)"
    manifest.write_text("".join(json.dumps({"id": n, "uri": str(COCO / "images" / n)}) + "\n" for n in names))
    ixs = IndexerSettings(redis_url=None, index_root=root, model=spec, models_dir=graphs, progress=False, decode=decode)
    t = time.monotonic()
    res = build("coco", manifest=manifest, settings=ixs, log=print)
    index_s = time.monotonic() - t
    settings = Settings(redis_url=None, index_root=root, model=spec, models_dir=graphs, indexes="coco", port=0,
                        reload_interval_s=0, log_level="warning", access_log=False)
    answers = []
    with running(settings) as url, httpx.Client(base_url=url, timeout=120) as http:
        ready = wait_ready(http, timeout_s=600)
        for q in queries:
            r = http.post("/v1/search", json={"query": q, "k": K, "rerank": "none", "mode": "vector"})
            r.raise_for_status()
            answers.append([(h["id"], h["score"]) for h in r.json()["results"]])
    if family != "open_clip":
        want = rm.reference_embeddings(ref, [COCO / "images" / n for n in names], queries)
        ref_image, ref_text = want.image, want.text
    scores = ref_text @ ref_image.T
    per = []
    for qi, api in enumerate(answers):
        ref_top = [names[j] for j in np.argsort(-scores[qi], kind="stable")[:K]]
        per.append(compare_top(api, dict(zip(names, scores[qi].tolist())), ref_top))
    return {"spec_family": family, "queries": len(per), "agree": sum(p["agree"] for p in per),
            "near_tie_swaps": sum(p["near"] for p in per), "other_swaps": sum(p["swaps"] - p["near"] for p in per),
            "max_score_diff": max(p["score_diff"] for p in per), "photos": len(names), "indexed": res.count,
            "photos_reduced_by_draft": reduced_by_draft(names, 224), "index_s": round(index_s, 1),
            "index_version": ready["indexes"]["coco"], "spec": spec.split(":", 1)[0] + ":<folder>",
            "reference": reference}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="hf_clip,immich,open_clip")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--no-reduced", action="store_true", help="skip the run with CROSSPROBE_INDEX_DECODE=reduced")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    section = {"model": "random-weight CLIP ViT-B/32 of each family's shape (openai/clip-vit-base-patch32's config; "
                        "open_clip's ViT-B-32), seed 0",
               "photos": "coco-mini-dev's 80 (640 px JPEGs)", "request": {"k": K, "rerank": "none", "mode": "vector"},
               "queries_from": "the first caption of each of the first 45 photos (sorted by name), and 5 in Polish, "
                               "German, Spanish, Russian and Chinese", "score_tolerance": SCORE_TOL,
               "tie_tolerance": TIE_TOL, "decode": "CROSSPROBE_INDEX_DECODE=reference (the default)",
               "families": {f: one(f, args.work) for f in args.families.split(",")}}
    if not args.no_reduced:  # what the index path gave before: every photo decoded reduced (JPEG draft)
        section["reduced_for_comparison"] = {"decode": "CROSSPROBE_INDEX_DECODE=reduced (the opt-in)", **{
            f: one(f, args.work, "reduced") for f in args.families.split(",")}}
    section.update(command=f"python -m benchmarks.index_path --families {args.families}", host=_host(),
                   wall_s=round(time.monotonic() - t, 1))
    doc = json.loads(OUT.read_text()) if OUT.exists() else {}
    doc["index_path"] = section
    atomic_write(OUT, json.dumps(doc, indent=1) + "\n")
    print(json.dumps(section, indent=1))


if __name__ == "__main__":
    main()
