"""`crossprobe train` and `crossprobe frontier` end to end on a generated mini-corpus: real
backbones, real feature cache, every stage, a loadable checkpoint; a killed run resumes; the
frontier trains the default's CP shape into the very weights `crossprobe train` gave it."""
import copy
import dataclasses
import json
import math

import torch

from crossprobe.models import checkpoint
from crossprobe.models.research.frontier import frontier, name_of
from crossprobe.models.training.rerankers import RerankTrainConfig
from crossprobe.models.training.run import TrainConfig, train
from crossprobe.models.training.towers import TowerTrainConfig


def test_train_end_to_end_frontier_and_resume(corpus, small_cfg, tmp_path, monkeypatch, bert):
    monkeypatch.setenv("FLICKR8K_DIR", str(corpus))
    model_cfg = copy.deepcopy(small_cfg)
    model_cfg.cp = dataclasses.replace(model_cfg.cp, inputs="backbone")  # the default CP recipe, end to end
    cfg = TrainConfig(
        cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", out=tmp_path / "ckpt", model=model_cfg,
        towers=TowerTrainConfig(epochs=2, batch=8, warmup_steps=1),
        rerank=RerankTrainConfig(epochs=1, queries=4, negatives=3, mine_k=6, dev_k=3, pretrain_batch=4),
        epochs_by_method={"cp": 1, "temde": 1, "sm": 1, "tv": 1}, pretrain_by_method={"cp": 1},
    )
    fp = train(cfg, log=lambda *_: None)
    model, meta = checkpoint.load(tmp_path / "ckpt", bert)
    assert meta["fingerprint"] == fp
    assert (model.cfg.cp.d, model.cfg.cp.n, model.cfg.cp.layers) == (small_cfg.cp.d, small_cfg.cp.n, small_cfg.cp.layers)
    assert model.cfg.cp.inputs == "backbone"
    # CP trained standalone: its fusion weight is the one chosen on dev
    w = meta["training"]["cp"]["fusion_w"]
    if math.isinf(w):
        assert model.cp.fusion.alpha.item() == 0.0
    else:
        assert model.cp.fusion.alpha.item() == 20.0 and math.isclose(model.cp.fusion.beta.item(), 20.0 * w, rel_tol=1e-3)
    for stage in ("cache", "towers", "banks", "cp", "temde", "sm", "tv"):
        assert stage in meta["training"]["timings_s"], stage
    # T-EMDE: three seeded members merged into one module of three times the partitions, which the checkpoint
    # records and serves; its fusion weight fit on dev after the merge
    n_members = cfg.members_by_method["temde"]
    assert n_members == 3 and model.cfg.temde.N == n_members * small_cfg.temde.N
    te = meta["training"]["temde"]
    assert te["member_seeds"] == [0, 1, 2] and len(te["members"]) == 3 and te["member_N"] == small_cfg.temde.N
    assert all((tmp_path / "run" / f"temde.m{i}.done.pt").exists() for i in range(3))
    member_centroids = [torch.load(tmp_path / "run" / f"temde.m{i}.done.pt", weights_only=False)["weights"]["centroids"] for i in range(3)]
    assert not torch.equal(member_centroids[0], member_centroids[1])  # seeded apart, not one draw three times

    # the frontier on the checkpoint's towers: the default's shape and a smaller one
    settings = [{"d": small_cfg.cp.d, "n": small_cfg.cp.n, "layers": small_cfg.cp.layers}, {"d": 16, "n": 2, "layers": 1}]
    fcfg = dataclasses.replace(cfg, run_dir=tmp_path / "frontier")
    docs = tmp_path / "docs"
    res = frontier(tmp_path / "ckpt", docs, "crossprobe frontier", fcfg, log=lambda *_: None, settings=settings)
    assert res["chosen"] in {name_of(s) for s in settings} and len(res["rows"]) == 2
    assert all(r["ort_ms_100"] > 0 and r["train_s"] > 0 for r in res["rows"])
    assert json.loads((docs / "results" / "frontier.json").read_text())["chosen"] == res["chosen"]
    assert "| yes |" in (docs / "frontier.md").read_text()
    # same shape, recipe, seed, initialisation and (float16-stored) towers: the frontier's run is the
    # default's CP bit for bit (the checkpoint keeps it in float16)
    same = checkpoint.stored(torch.load(tmp_path / "frontier" / f"frontier_{name_of(settings[0])}.done.pt", weights_only=False)["weights"])
    assert all(torch.equal(v, same[k].float()) for k, v in model.cp.state_dict().items())
    # resumable: every setting done, nothing trains again (no banks, same rows)
    log = []
    again = frontier(tmp_path / "ckpt", docs, "crossprobe frontier", fcfg, log=log.append, settings=settings)
    assert again["rows"] == res["rows"] and not any(str(m).startswith("cp ") for m in log)  # train_reranker logs "cp ..."
    assert "Budget per setting: 1 in-batch pretraining + 1 listwise epochs." in (docs / "frontier.md").read_text()
    # the CP recipe's budget changed since: a finished setting is retrained under it, never reused
    log = []
    longer = dataclasses.replace(fcfg, epochs_by_method={**fcfg.epochs_by_method, "cp": 2})
    res2 = frontier(tmp_path / "ckpt", docs, "crossprobe frontier", longer, log=log.append, settings=settings[1:])
    assert any("retraining" in str(m) for m in log)
    assert res2["rows"][0]["budget"] == {"pretrain_epochs": 1, "epochs": 2} and len(res2["rows"][0]) == len(res["rows"][1])
    assert "1 in-batch pretraining + 2 listwise epochs" in (docs / "frontier.md").read_text()

    # CP retrained in a later invocation, on towers reloaded from towers.done.pt (a model built in training
    # mode: the banks must still be computed without dropout): the same weights, the same checkpoint
    for f in (tmp_path / "run").glob("cp*"):
        f.unlink()
    assert train(cfg, log=lambda *_: None) == fp
    # every stage finished: running again trains nothing and gives the same weights
    assert train(cfg, log=lambda *_: None) == fp
    # an interrupted run (the towers' final state lost) resumes from its epoch state
    (tmp_path / "run" / "towers.done.pt").unlink()
    log = []
    train(cfg, log=log.append)
    assert any("resuming after epoch 2" in str(m) for m in log)
