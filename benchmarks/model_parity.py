"""Issue 47's parity must-show at full size: crossprobe's exported graphs + its own preprocessing and tokenizer against
each reference library's own preprocess + tokenizer + encoders, random weights, fp32.

    artifacts/openclip-venv/bin/python -m benchmarks.model_parity [--configs open_clip,hf_clip,hf_siglip,mclip]
        -> docs/research/results/model_choice.json, its "parity" section (the file's other sections are kept)

Configurations (tests/support/reference_models.py, size "base"): open_clip ViT-B-32; Hugging Face CLIP with
openai/clip-vit-base-patch32's shapes; SigLIP with google/siglip-base-patch16-224's; M-CLIP with
XLM-Roberta-Large-Vit-B-32's (XLM-R large text tower + projection, open_clip ViT-B-32 image tower). Inputs: the first
16 coco-mini-dev photos (COCO photos at their own sizes, read from /work/shared, never copied) and scikit-image's 16
sample photos (RGB, L, 1-bit), and 64 captions in eight languages (reference_text.sample_captions: English, Spanish,
Russian, Chinese, Japanese, Korean, Arabic, Hindi). Each configuration runs in a process of its own (memory).

Runs in the export venv (scripts/openclip-env.sh): open_clip and M-CLIP need torchvision. There transformers'
image processors default to their torchvision backend, whose pixels differ from the PIL backend's (the main .venv's,
and what crossprobe reproduces: docs/research/model_choice.md); the Hugging Face references are run with the PIL
backend, and the torchvision backend's own difference is recorded beside them. Not a timing benchmark.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "research" / "results" / "model_choice.json"
WORK = REPO / "artifacts" / "model_parity"
CONFIGS = ("open_clip", "hf_clip", "hf_siglip", "mclip")
ARCH = {"open_clip": "ViT-B-32 (open_clip)", "hf_clip": "openai/clip-vit-base-patch32's config",
        "hf_siglip": "google/siglip-base-patch16-224's config",
        "mclip": "M-CLIP XLM-Roberta-Large-Vit-B-32 (XLM-R large + open_clip ViT-B-32)"}


def run_one(family: str) -> dict:
    """Build (or reuse) the reference, export it, compare; -> the configuration's parity record."""
    from crossprobe.core import inference
    from crossprobe.models import families
    from crossprobe.core.inference import RuntimeOptions
    from tests.models.families.parity import CAPTIONS, compare, real_photos
    from tests.support import reference_models as rm

    ref_dir = WORK / "refs" / family
    if (ref_dir / rm.META).exists():
        ref = rm.Reference.load(ref_dir)
    else:
        ref = rm.build(family, ref_dir, size="base")
    spec = (f"open_clip:ViT-B-32/{ref.path / 'open_clip_model.safetensors'}" if family == "open_clip"
            else f"hf:{ref.path}")
    folder = families.export(spec, WORK / "graphs", log=print)  # kept from an earlier run where it exists
    backend = inference.load(spec, RuntimeOptions(graphs=WORK / "graphs"))
    photos, samples = real_photos(16), rm.sample_photos(WORK / "sample_photos")
    if len(photos) < 16:
        raise SystemExit("coco-mini-dev not found (COCO_MINI_DEV_DIR): the parity run needs 16 of its photos")
    pil = {"backend": "pil"} if family.startswith("hf_") else {}
    real, sample = compare(backend, ref, photos, CAPTIONS, **pil), compare(backend, ref, samples, CAPTIONS[:8], **pil)
    out = {"configuration": ARCH[family], "spec_family": spec.split(":", 1)[0], "fingerprint": folder.name,
           "max_abs_diff": max(real.max_abs_diff, sample.max_abs_diff),
           "image_max_abs_diff": max(real.image, sample.image), "text_max_abs_diff": real.text,
           "pixels_max_abs_diff": max(real.pixels, sample.pixels), "ids_equal": real.ids_equal and sample.ids_equal,
           "photos": len(photos), "sample_photos": len(samples), "captions": len(CAPTIONS),
           "photo_set": "coco-mini-dev (first 16 by name) + scikit-image's 16 sample photos",
           "languages": ["en", "es", "ru", "zh", "ja", "ko", "ar", "hi"],
           "graphs_mb": round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6, 1)}
    if pil:  # what a user of the torchvision image processor would see (not what crossprobe reproduces)
        tv = compare(backend, ref, photos, CAPTIONS[:4], backend="torchvision")
        out["torchvision_backend_image_max_abs_diff"] = tv.image
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the per-configuration subprocess
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one)), flush=True)
        return
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    parity = results.get("parity", {})
    for family in args.configs.split(","):
        p = subprocess.run([sys.executable, "-m", "benchmarks.model_parity", "--one", family], cwd=REPO,
                           capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            print(p.stdout[-3000:], p.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{family}: failed (exit {p.returncode})")
        parity[family] = json.loads(lines[-1][len("RESULT "):])
        print(family, json.dumps(parity[family]), flush=True)
        _write(results, parity)  # after each configuration: a later failure keeps the earlier ones
    print(OUT)


def _write(results: dict, parity: dict) -> None:
    host = subprocess.run(["bash", "-c", "lscpu | grep 'Model name' | sed 's/.*: *//'"], capture_output=True,
                          text=True).stdout.strip()
    results["parity"] = {**{k: v for k, v in parity.items() if k != "meta"}, "meta": {
        "command": "artifacts/openclip-venv/bin/python -m benchmarks.model_parity", "host": host,
        "tolerance": 1e-4, "measure": "max |crossprobe - reference| over unit-norm image and text embeddings",
        "weights": "random (tests/support/reference_models.py, seed 0), fp32"}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
