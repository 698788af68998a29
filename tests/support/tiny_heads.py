"""Reranker heads trained on a tiny random backbone (issue 47, "Training on a backbone works"), for the tests of
training (tests/models/training/test_backbone_heads.py), serving (tests/core/inference/test_heads.py) and search
(tests/service/test_heads_search.py), built once per session by tests/conftest.py's `tiny_heads`.

The backbone: a random-weight Hugging Face CLIPModel in its users' folder layout (reference_models.build "hf_clip",
"tiny"), exported through the seam (models/families). The data: 64 generated photos (a colour field with
rectangles), each with one caption from reference_text.sample_captions (eight languages, several scripts), as a
captioned folder. The heads are trained by the command line, `crossprobe train --backbone`, at a small shape.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from tests.support import reference_models, reference_text

PAIRS = 64
# small heads and a budget that memorises 64 pairs of a random backbone (whose captions differ in a few token states)
HEADS = ("epochs=12,pretrain_epochs=150,pretrain_batch=16,lr=5e-4,negatives=31,queries=16,"
         "cp.d=32,cp.n=4,cp.m=2,cp.heads=2,cp.dropout=0,temde.N=32")


@dataclass
class TinyHeads:
    backbone: str  # the backbone's spec (hf:<folder>)
    graphs: Path  # exported models' root: the backbone's folder and the heads' graphs
    data: Path  # the captioned folder
    heads: Path  # the heads checkpoint
    output: str  # what `crossprobe train --backbone` printed

    @property
    def config(self) -> dict:
        return json.loads((self.heads / "config.json").read_text())

    @property
    def spec(self) -> str:
        return f"crossprobe:{self.heads}"

    def copy_with(self, dst: Path, **config) -> Path:
        """A copy of the heads checkpoint at dst with config.json's keys changed (its weights as they are)."""
        import shutil

        shutil.copytree(self.heads, dst)
        (dst / "config.json").write_text(json.dumps({**self.config, **config}))
        return dst


def photos_with_captions(folder: Path, n: int = PAIRS, seed: int = 0) -> list[str]:
    """n generated photos under folder/images and folder/captions.tsv (no split column: all train) -> the captions."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    captions = reference_text.sample_captions(n, seed=seed)
    lines = ["image\tcaption"]
    for i, caption in enumerate(captions):
        img = Image.new("RGB", (96, 72), tuple(int(v) for v in rng.integers(0, 256, 3)))
        draw = ImageDraw.Draw(img)
        for _ in range(3):
            x, y, w, h = (int(v) for v in (*rng.integers(0, 80, 2), *rng.integers(8, 40, 2)))
            draw.rectangle([x, y, x + w, y + h], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        img.save(folder / "images" / f"{i:02d}.png")
        lines.append(f"{i:02d}.png\t{caption}")
    (folder / "captions.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return captions


def build(root: Path) -> TinyHeads:
    from typer.testing import CliRunner

    from crossprobe.models import families
    from crossprobe.cli import app

    ref = reference_models.build("hf_clip", root / "hf", "tiny")
    backbone, graphs = f"hf:{ref.path}", root / "graphs"
    families.export(backbone, graphs, log=lambda *_: None)
    photos_with_captions(root / "data")
    res = CliRunner().invoke(app, ["train", "--backbone", backbone, "--data", str(root / "data"), "--out",
                                   str(root / "heads"), "--graphs", str(graphs), "--cache-dir", str(root / "cache"),
                                   "--run-dir", str(root / "runs"), "--heads", HEADS, "--threads", "1"])
    assert res.exit_code == 0, res.output
    return TinyHeads(backbone, graphs, root / "data", root / "heads", res.output)
