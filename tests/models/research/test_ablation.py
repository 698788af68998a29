"""`crossprobe ablate` end to end on the generated mini-corpus: every option trains,
is measured against its baseline, lands in docs/research/results/ablation.json in the
issue's shape, and a second run resumes from the stored results."""
import copy
import json

from crossprobe.models.research.ablation import OPTIONS, AblationConfig, Runner
from crossprobe.models.training.rerankers import RerankTrainConfig
from crossprobe.models.training.run import TrainConfig, train
from crossprobe.models.training.towers import TowerTrainConfig


def test_every_option_builds_a_valid_config():
    from crossprobe.models.model import ModelConfig

    for name, opt in OPTIONS.items():
        mc, tc = ModelConfig(), TowerTrainConfig()
        opt.apply(mc, tc)
        assert mc != ModelConfig() or tc != TowerTrainConfig(), f"{name} changes nothing"
        assert opt.stage in ("towers", "cp", "sm", "tv")


def test_ablation_end_to_end_and_resume(corpus, small_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("FLICKR8K_DIR", str(corpus))
    template = TrainConfig(
        cache_dir=tmp_path / "cache", run_dir=tmp_path / "base_run", out=tmp_path / "base", model=copy.deepcopy(small_cfg),
        towers=TowerTrainConfig(epochs=1, batch=8, warmup_steps=1),
        rerank=RerankTrainConfig(epochs=1, queries=4, negatives=3, mine_k=6, dev_k=3),
        epochs_by_method={"cp": 1, "sm": 1, "tv": 1}, methods=("cp", "sm", "tv"),
    )
    train(template, log=lambda *_: None)  # the "committed" default of this test
    cfg = AblationConfig(cache_dir=tmp_path / "cache", run_dir=tmp_path / "abl", base=tmp_path / "base",
                         docs=tmp_path / "docs", template=template, k=3, command="crossprobe ablate (test)")
    out = Runner(cfg, log=lambda *_: None).run()

    j = json.loads((tmp_path / "docs" / "results" / "ablation.json").read_text())
    assert j == json.loads(json.dumps(out))
    assert "default@1ep" not in j  # the default's own budget: tower options compare with the committed default
    for name in ["default", "default CP@3", "default SM@3", "default TV@3", *OPTIONS]:
        row = j[name]
        for d in ("t2i", "i2t"):
            assert set(row[d]) >= {"R@1", "R@5", "R@10", "MRR", "medr"}
            assert 0 <= row[d]["R@1"] <= row[d]["R@10"] <= 100
        assert row["ms_per_query"] > 0
    for name, opt in OPTIONS.items():
        base = j[j[name]["baseline"]]
        assert j[name]["delta_t2i_R@1"] == round(j[name]["t2i"]["R@1"] - base["t2i"]["R@1"], 2)
        assert j[name]["method"] == ("TT" if opt.stage == "towers" else f"{opt.stage.upper()}@3")
        assert j[name]["baseline"] == ("default" if opt.stage == "towers" else f"default {opt.stage.upper()}@3")
    md = (tmp_path / "docs" / "ablation.md").read_text()
    assert "| default |" in md and "| ace-rpe-tv+anchor |" in md

    log = []
    again = Runner(cfg, log=log.append).run()  # everything stored: nothing retrains, same numbers
    assert not any(str(m).startswith("ablation: ") for m in log)
    assert again == out

    log = []
    timed = Runner(cfg, log=log.append).run(retime=True)  # rows rebuilt from disk, only the clocks re-read
    assert sum(str(m).startswith("ablation: re-timing") for m in log) == len(OPTIONS) + 4
    for name in OPTIONS:
        assert timed[name]["t2i"] == out[name]["t2i"] and timed[name]["ms_per_query"] > 0

    # promote: only a tower option that beat the default becomes a checkpoint of its own
    import pytest

    from crossprobe.models import checkpoint
    from crossprobe.models.training.promote import promote

    with pytest.raises(ValueError, match="reranker option"):
        promote("zodiac-cp", cfg, tmp_path / "nope", log=lambda *_: None)
    default_json = tmp_path / "abl" / "default" / "result.json"
    d = json.loads(default_json.read_text())
    d["t2i"]["R@1"] = out["order-loss"]["t2i"]["R@1"]  # a tie is no win
    default_json.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="does not beat"):
        promote("order-loss", cfg, tmp_path / "nope", log=lambda *_: None)
    d["t2i"]["R@1"] = -1.0  # now it wins
    default_json.write_text(json.dumps(d))
    ck = promote("order-loss", cfg, tmp_path / "ck", log=lambda *_: None)
    model, meta = checkpoint.load(ck)
    base, _ = checkpoint.load(tmp_path / "base")
    assert model.cfg.cp == base.cfg.cp  # the default's CP shape
    assert meta["training"]["cp"] and meta["training"]["temde"] and "sm" not in meta["training"]
    res = json.loads((ck / "results.json").read_text())
    assert set(res["t2i"]) == {"TT", "CP@3", "TEMDE@3"}
    card = (ck / "MODEL_CARD.md").read_text()
    assert "order-loss" in card and "NOT trained" in card and "| CP@3 |" in card


def test_a_short_tower_budget_gets_its_own_baseline_and_row_names(tmp_path):
    """--tower-epochs N below the default's: tower rows become <option>@Nep against default@Nep, trained
    the same way; reranker rows keep their names (they use the committed towers either way)."""
    template = TrainConfig(towers=TowerTrainConfig(epochs=16))
    short = Runner(AblationConfig(tower_epochs=5, template=template, run_dir=tmp_path), log=lambda *_: None)
    names = [n for n, _ in short.plan()]
    assert names[:2] == ["default", "default@5ep"]
    assert "seam-4hop@5ep" in names and "seam-4hop" not in names and "zodiac-cp" in names
    full = Runner(AblationConfig(tower_epochs=16, template=template, run_dir=tmp_path), log=lambda *_: None)
    names = [n for n, _ in full.plan()]
    assert "default@16ep" not in names and "seam-4hop" in names and full.tower_epochs == 16
