"""`crossprobe train` end to end on a generated mini-corpus: real backbones, real
feature cache, every stage, a loadable checkpoint; and a killed run resumes."""
import copy

import numpy as np
import pytest
from PIL import Image

from crossprobe import checkpoint
from crossprobe.training.rerankers import RerankTrainConfig
from crossprobe.training.run import TrainConfig, train
from crossprobe.training.towers import TowerTrainConfig

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("flickr")
    (root / "images").mkdir()
    (root / "splits").mkdir()
    rng = np.random.default_rng(0)
    names, rows = [], []
    for i in range(24):
        color = list(COLORS)[i % 4]
        arr = np.clip(np.array(COLORS[color]) + rng.normal(0, 20, (64, 64, 3)), 0, 255).astype(np.uint8)
        name = f"{i:04d}_img.jpg"
        Image.fromarray(arr).save(root / "images" / name)
        names.append(name)
        rows += [(name, f"a {color} square number {k}") for k in range(5)]
    (root / "captions.tsv").write_text("image\tcaption\n" + "".join(f"{n}\t{c}\n" for n, c in rows))
    (root / "splits" / "train.txt").write_text("\n".join(names[:16]))
    (root / "splits" / "dev.txt").write_text("\n".join(names[16:20]))
    (root / "splits" / "test.txt").write_text("\n".join(names[20:]))
    return root


def test_train_end_to_end_and_resume(corpus, small_cfg, tmp_path, monkeypatch, bert):
    monkeypatch.setenv("FLICKR8K_DIR", str(corpus))
    cfg = TrainConfig(
        cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", out=tmp_path / "ckpt", model=copy.deepcopy(small_cfg),
        towers=TowerTrainConfig(epochs=2, batch=8, warmup_steps=1),
        rerank=RerankTrainConfig(epochs=1, queries=4, negatives=3, mine_k=6, dev_k=3),
        epochs_by_method={"cp": 1, "temde": 1, "sm": 1, "tv": 1},
        frontier_settings=[{"d": 32, "n": 4, "layers": 1}, {"d": 16, "n": 2, "layers": 1}],
    )
    fp = train(cfg, log=lambda *_: None)
    model, meta = checkpoint.load(tmp_path / "ckpt", bert)
    assert meta["fingerprint"] == fp
    assert model.cfg.cp.d in (16, 32)  # the frontier's choice is what the checkpoint holds
    for stage in ("cache", "towers", "banks", "cp_frontier", "temde", "sm", "tv"):
        assert stage in meta["training"]["timings_s"], stage
    # every stage finished: running again trains nothing and gives the same weights
    assert train(cfg, log=lambda *_: None) == fp
    # an interrupted run (the towers' final state lost) resumes from its epoch state
    (tmp_path / "run" / "towers.done.pt").unlink()
    log = []
    train(cfg, log=log.append)
    assert any("resuming after epoch 2" in str(m) for m in log)
