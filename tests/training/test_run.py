"""`crossprobe train` end to end on a generated mini-corpus: real backbones, real
feature cache, every stage, a loadable checkpoint; and a killed run resumes."""
import copy

from crossprobe import checkpoint
from crossprobe.training.rerankers import RerankTrainConfig
from crossprobe.training.run import TrainConfig, train
from crossprobe.training.towers import TowerTrainConfig


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
