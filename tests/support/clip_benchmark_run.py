"""clip-benchmark (PyPI `clip-benchmark`, the field's zero-shot evaluator) on a local random-weight open_clip model
and a local image-caption set, offline (issue 47: its R@1 / R@5 are compared with `crossprobe eval` on the same model).

Its `flickr8k` dataset is the way in for a local set: given an existing `--dataset_root` (the image folder) and an
`--annotation_file`, it downloads nothing. The file is CSV-like: one header line, then `<name>.jpg,<caption>` per
caption (the loader splits each line at ".jpg,", so images must be .jpg files). `--model_type open_clip` loads
`--model local-dir:<folder>` (or `--model ViT-B-32 --pretrained <weights file>`) through
`open_clip.create_model_and_transforms`; `--no_amp` keeps fp32 (its default autocast runs CPU matmuls in bfloat16).
Runs in the export venv only (clip-benchmark needs open_clip and torchvision).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def write_annotation(path: Path, captions: dict[str, list[str]]) -> Path:
    """clip-benchmark's Flickr annotation file for {image file name (.jpg): [captions]}, in the given order."""
    bad = [name for name in captions if not name.endswith(".jpg")]
    if bad:
        raise ValueError(f"clip-benchmark's Flickr loader needs .jpg names: {bad[:3]}")
    lines = ["image,caption"] + [f"{name},{c}" for name, caps in captions.items() for c in caps]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cli_args(model_dir: Path, image_root: Path, annotation: Path, output: Path, ks=(1, 5),
             batch_size: int = 64) -> list[str]:
    """The `clip_benchmark eval` arguments for an open_clip local folder (reference_models' open_clip layout)."""
    return ["eval", "--model_type", "open_clip", "--model", f"local-dir:{Path(model_dir).resolve()}",
            "--pretrained", "none", "--dataset", "flickr8k", "--dataset_root", str(image_root),
            "--annotation_file", str(annotation), "--task", "zeroshot_retrieval",
            "--recall_k", *map(str, ks), "--no_amp", "--num_workers", "0", "--batch_size", str(batch_size),
            "--output", str(output), "--quiet"]


def run_cli(model_dir: Path, image_root: Path, annotation: Path, output: Path, ks=(1, 5), timeout: float = 900) -> dict:
    """Run `clip_benchmark eval` (this interpreter's, offline) and return its metrics dict."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-c", "import sys; from clip_benchmark.cli import main; sys.exit(main())",
           *cli_args(model_dir, image_root, annotation, output, ks)]
    subprocess.run(cmd, check=True, env=env, timeout=timeout, capture_output=True)
    return json.loads(Path(output).read_text(encoding="utf-8"))["metrics"]


def recalls(text_emb: np.ndarray, image_emb: np.ndarray, text_image: np.ndarray, ks=(1, 5)) -> dict:
    """clip-benchmark's retrieval recalls from normalised embeddings, by its definitions: image_retrieval_recall@k is
    the share of captions whose image is in that caption's top k images; text_retrieval_recall@k the share of images
    with at least one of their captions in the image's top k captions (ties broken by index, as torch.topk does on
    CPU for exact ties)."""
    scores = text_emb @ image_emb.T
    out = {}
    for k in ks:
        top_images = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        out[f"image_retrieval_recall@{k}"] = float(np.mean([t in row for t, row in zip(text_image, top_images)]))
        top_texts = np.argsort(-scores.T, axis=1, kind="stable")[:, :k]
        out[f"text_retrieval_recall@{k}"] = float(np.mean(
            [np.any(text_image[row] == i) for i, row in enumerate(top_texts)]))
    return out


def near_tie_queries(text_emb: np.ndarray, image_emb: np.ndarray, k: int, eps: float) -> int:
    """How many captions have their k-th and (k+1)-th best images within eps of each other: the queries whose
    recall@k may flip between two evaluators computing the same scores to float32 rounding."""
    scores = np.sort(text_emb @ image_emb.T, axis=1)[:, ::-1]
    return int(np.sum(scores[:, k - 1] - scores[:, k] <= eps))
