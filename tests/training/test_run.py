"""`crossprobe train` end to end on a generated mini-corpus: real backbones, real
feature cache, every stage, a loadable checkpoint; and a killed run resumes."""
import copy
import dataclasses
import math

from crossprobe import checkpoint
from crossprobe.training.rerankers import RerankTrainConfig
from crossprobe.training.run import TrainConfig, train
from crossprobe.training.towers import TowerTrainConfig


def test_train_end_to_end_and_resume(corpus, small_cfg, tmp_path, monkeypatch, bert):
    monkeypatch.setenv("FLICKR8K_DIR", str(corpus))
    model_cfg = copy.deepcopy(small_cfg)
    model_cfg.cp = dataclasses.replace(model_cfg.cp, inputs="backbone")  # the default CP recipe, end to end
    cfg = TrainConfig(
        cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", out=tmp_path / "ckpt", model=model_cfg,
        towers=TowerTrainConfig(epochs=2, batch=8, warmup_steps=1),
        rerank=RerankTrainConfig(epochs=1, queries=4, negatives=3, mine_k=6, dev_k=3, pretrain_batch=4),
        epochs_by_method={"cp": 1, "temde": 1, "sm": 1, "tv": 1}, pretrain_by_method={"cp": 1},
        frontier_settings=[{"d": 32, "n": 4, "layers": 1}, {"d": 16, "n": 2, "layers": 1}],
    )
    fp = train(cfg, log=lambda *_: None)
    model, meta = checkpoint.load(tmp_path / "ckpt", bert)
    assert meta["fingerprint"] == fp
    assert model.cfg.cp.d in (16, 32)  # the frontier's choice is what the checkpoint holds
    assert model.cfg.cp.inputs == "backbone"
    # CP trained standalone: its fusion weight is the one chosen on dev for the chosen setting
    front = meta["training"]["cp"]["frontier"]
    chosen = next(r for r in front["rows"] if r["name"] == front["chosen"])
    w = chosen["fusion_w"]
    if math.isinf(w):
        assert model.cp.fusion.alpha.item() == 0.0
    else:
        assert model.cp.fusion.alpha.item() == 20.0 and math.isclose(model.cp.fusion.beta.item(), 20.0 * w, rel_tol=1e-3)
    for stage in ("cache", "towers", "banks", "cp_frontier", "temde", "sm", "tv"):
        assert stage in meta["training"]["timings_s"], stage
    # every stage finished: running again trains nothing and gives the same weights
    assert train(cfg, log=lambda *_: None) == fp
    # an interrupted run (the towers' final state lost) resumes from its epoch state
    (tmp_path / "run" / "towers.done.pt").unlink()
    log = []
    train(cfg, log=log.append)
    assert any("resuming after epoch 2" in str(m) for m in log)
